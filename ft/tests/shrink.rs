//! Shrinking a simulated group through its handles: after the survivors agree on `G`,
//! each shrinks into a group of the survivors, renumbered in order, with an empty
//! view; the shrunk group validates, broadcasts and carries messages under the new
//! numbering, detects and agrees on a later death on its own, shrinks again, and the
//! old handles keep answering (and validating) under the old numbering.

use std::time::Duration;

use ft::sim::SimGroup;
use ft::{OutputSet, OutputSpec, PlanSpec, Rank, RankSet, Runtime, TaskId, Topology};

mod common;
use common::{next_message, settings, WAIT};

/// Runs `validate_global` on every handle of `handles`, each on its own thread; the
/// agreed `G` (the same at each, checked) and its epoch.
fn validate_all(handles: &[&Runtime]) -> (u32, Vec<Rank>) {
    let results: Vec<_> = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .iter()
            .map(|h| s.spawn(move || h.validate_global().expect("validates")))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let first = &results[0];
    for r in &results {
        assert_eq!(r.agreed, first.agreed, "uniform G");
        assert_eq!(r.epoch, first.epoch);
    }
    (first.epoch, first.agreed.iter().collect())
}

/// Output 0's payload.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + (i >> 9)) as u8).collect()
}

#[test]
fn survivors_shrink_into_a_renumbered_group_that_validates_broadcasts_and_shrinks_again() {
    let group = SimGroup::open(6, &settings()).expect("a group");
    let old = |r: Rank| group.rank(r).unwrap();
    group.kill(1);
    group.kill(4);
    let live: Vec<&Runtime> = group.survivors().iter().map(|&r| old(r)).collect();
    // Validate until both deaths are in G (a validation may come before a detection).
    let agreed = loop {
        let (_, g) = validate_all(&live);
        if g == [1, 4] {
            break g;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(agreed, [1, 4]);

    // Ranks 0, 2, 3, 5 become 0, 1, 2, 3. A slow survivor shrinks later than the
    // others: their first frames wait for it.
    let shrunk: Vec<Runtime> = live
        .iter()
        .enumerate()
        .map(|(k, h)| {
            if k == 3 {
                std::thread::sleep(Duration::from_millis(150));
            }
            h.shrink().expect("shrinks")
        })
        .collect();
    for (new, h) in shrunk.iter().enumerate() {
        let view = h.view();
        assert_eq!((view.rank(), view.size()), (new as Rank, 4));
        assert!(
            view.global().is_empty() && view.epoch() == 0,
            "an empty view"
        );
        assert_ne!(h.group(), 0);
    }
    let handles: Vec<&Runtime> = shrunk.iter().collect();
    assert_eq!(validate_all(&handles), (1, vec![]), "nobody failed since");

    // A broadcast under the new numbering: new rank 0 (old 0) to new 1..3.
    let bytes = payload(300_000);
    let spec = PlanSpec::new(4, 0)
        .with_topology(Topology::Binomial)
        .with_output(OutputSpec::new("A", bytes.len() as u64, vec![1, 2, 3]));
    shrunk[0]
        .start_broadcast(9, spec, vec![bytes.clone()])
        .expect("started");
    for h in &shrunk[1..] {
        let got = h
            .wait_outputs(TaskId::new(0, 9), OutputSet::single(0), Some(WAIT))
            .expect("the output arrives");
        assert!(got[0].1 == bytes, "whole");
    }
    // A message: new rank 3 (old 5) to new rank 0, which sees it from 3.
    shrunk[3].send(0, 77, b"halo".to_vec()).expect("sent");
    assert_eq!(next_message(&shrunk[0]), (3, 77, b"halo".to_vec()));

    // The old handles still answer under the old numbering.
    let view = old(5).view();
    assert_eq!((view.rank(), view.size(), view.epoch()), (5, 6, 1));
    assert_eq!(view.global(), &RankSet::from_ranks(6, [1, 4]));

    // A death in the shrunk group: old rank 3 is new rank 2.
    group.kill(3);
    let live_new: Vec<&Runtime> = [0, 1, 3].iter().map(|&k| &shrunk[k]).collect();
    let agreed = loop {
        let (_, g) = validate_all(&live_new);
        if !g.is_empty() {
            break g;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(agreed, [2], "old rank 3 under the new numbering");

    // The old group sees it too, under the old numbering.
    let live_old: Vec<&Runtime> = [0, 2, 5].iter().map(|&r| old(r)).collect();
    let agreed = loop {
        let (_, g) = validate_all(&live_old);
        if g.len() == 3 {
            break g;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(agreed, [1, 3, 4]);

    // Shrinking the shrunk group: old ranks 0, 2, 5 become 0, 1, 2.
    let twice: Vec<Runtime> = live_new.iter().map(|h| h.shrink().unwrap()).collect();
    let handles: Vec<&Runtime> = twice.iter().collect();
    assert_eq!(validate_all(&handles), (1, vec![]));
    twice[2].send(1, 5, b"again".to_vec()).expect("sent");
    assert_eq!(next_message(&twice[1]), (2, 5, b"again".to_vec()));
}

#[test]
fn a_shrunk_handle_outlives_the_handle_it_came_from() {
    let net = ft::ft_runtime::MemNet::new(4);
    let first: Vec<Runtime> = (0..4)
        .map(|me| net.spawn_rank(settings().detector(4, me)).unwrap())
        .collect();
    let handles: Vec<&Runtime> = first.iter().collect();
    // No failure: the shrink is a duplicate, with its own detector and view.
    assert_eq!(validate_all(&handles), (1, vec![]));
    let dup: Vec<Runtime> = handles.iter().map(|h| h.shrink().unwrap()).collect();
    // Two shrinks after the same validation are two groups.
    let second = handles[0].shrink().expect("a second shrink");
    assert_ne!(second.group(), dup[0].group());
    second.shutdown(Duration::ZERO).expect("closes");
    // The groups the ranks started in close; the shrunk ones go on, their detectors
    // quiet (nobody is declared dead) over more than a timeout.
    for h in first {
        h.shutdown(Duration::ZERO).expect("closes");
    }
    std::thread::sleep(settings().timeout * 2);
    let dup_refs: Vec<&Runtime> = dup.iter().collect();
    assert_eq!(validate_all(&dup_refs), (1, vec![]));
    dup[1].send(2, 1, vec![1u8; 10]).expect("sent");
    assert_eq!(next_message(&dup[2]).0, 1);
}
