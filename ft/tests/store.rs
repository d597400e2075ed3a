//! The redundant store through the handles of a simulated group of three nodes of two
//! ranks: every rank's entry is copied to a rank of the next node; a commit counts
//! only with no failure since the base, and is decided alike everywhere; when a whole
//! node dies, its ranks' last committed entries are read at their holders, and after a
//! rebase commits succeed again.

use std::time::Duration;

use ft::sim::SimGroup;
use ft::{Rank, Runtime, Settings};

mod common;
use common::{settings, WAIT};

/// Rank `me`'s entry at `version`.
fn entry(me: Rank, version: u64) -> Vec<u8> {
    (0..10_000)
        .map(|i| (i as u64 * 3 + version * 11 + u64::from(me)) as u8)
        .collect()
}

/// Runs `f` on every handle, each on its own thread; the results in order.
fn on_all<R: Send>(handles: &[&Runtime], f: impl Fn(&Runtime) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let threads: Vec<_> = handles.iter().map(|h| s.spawn(|| f(h))).collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn a_nodes_committed_entries_survive_at_their_holders_and_commits_are_uniform() {
    let settings = Settings {
        span: 2,
        ..settings()
    };
    let group = SimGroup::open(6, &settings).expect("a group");
    let all: Vec<&Runtime> = (0..6).map(|r| group.rank(r).unwrap()).collect();
    for (me, h) in all.iter().enumerate() {
        h.store_put(0, 1, entry(me as Rank, 1)).expect("put");
    }
    let commits = on_all(&all, |h| h.store_commit(1).expect("commits"));
    assert!(commits
        .iter()
        .all(|c| c.committed && c.validation.agreed.is_empty()));
    assert_eq!(all[0].store_holder(0).unwrap(), 2, "the next node");
    assert_eq!(all[0].store_holder(5).unwrap(), 1, "wraps around");
    let stats = all[4].store_stats().unwrap();
    assert_eq!((stats.own_bytes, stats.held_bytes), (10_000, 10_000));
    assert_eq!((stats.bytes_sent, stats.commits), (10_000, 1));

    // Node 1 (ranks 2 and 3) dies while version 2 is put: nobody commits it.
    group.kill(2);
    group.kill(3);
    let live: Vec<&Runtime> = [0, 1, 4, 5].iter().map(|&r| all[r]).collect();
    for (k, h) in live.iter().enumerate() {
        h.store_put(0, 2, entry([0, 1, 4, 5][k], 2)).expect("put");
    }
    let deadline = std::time::Instant::now() + WAIT;
    let commits = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the deaths are agreed"
        );
        let commits = on_all(&live, |h| h.store_commit(2).expect("decides"));
        if commits[0].validation.agreed.len() == 2 {
            break commits;
        }
        // A validation before the deaths were known cannot commit either: G grew
        // only once they are. Both deaths are in G at the next try.
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        commits.iter().all(|c| !c.committed),
        "G grew: nobody commits"
    );
    assert!(commits
        .iter()
        .all(|c| c.validation.agreed.iter().eq([2, 3])));

    // Their last committed entries are at their holders, on node 2.
    for dead in [2, 3] {
        let holder = live[0].store_holder(dead).unwrap();
        assert_eq!(holder, dead + 2);
        let (version, bytes) = all[holder as usize].store_get(dead, 0).unwrap().unwrap();
        assert_eq!(version, 1);
        assert!(bytes == entry(dead, 1));
    }
    // Each survivor's own entry is back at version 1 too.
    for &r in &[0, 1, 4, 5] {
        assert_eq!(all[r as usize].store_get(r, 0).unwrap().unwrap().0, 1);
    }

    // After the rebase, commits succeed again.
    on_all(&live, |h| h.store_rebase().unwrap());
    for (k, h) in live.iter().enumerate() {
        h.store_put(0, 3, entry([0, 1, 4, 5][k], 3)).expect("put");
    }
    let commits = on_all(&live, |h| h.store_commit(3).expect("commits"));
    assert!(commits.iter().all(|c| c.committed));
    // Rank 1's holder was rank 3: its copy now goes to the next live rank, 4.
    let (version, bytes) = all[4].store_get(1, 0).unwrap().unwrap();
    assert_eq!(version, 3);
    assert!(bytes == entry(1, 3));
}

#[test]
fn application_messages_may_not_use_the_stores_tags() {
    let group = SimGroup::open(2, &settings()).expect("a group");
    let err = group
        .rank(0)
        .unwrap()
        .send(1, ft::ft_bcast::STORE_TAG | 5, vec![1u8])
        .unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
}
