//! The progress thread's commands over a group of ranks that are threads of this
//! process ([`MemNet`]): broadcasts whose root dies, releases, timeouts, revoke, and
//! the seed's queries on the published view.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use ft_bcast::{OutputSet, OutputSpec, PlanSpec, TaskId, Topology};
use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
use ft_core::wire::FrameKind;
use ft_core::{Counts, Duration, Rank, RankState, Scope, StateMask, ViewError};
use ft_runtime::{MemNet, Runtime, RuntimeError};

/// The longest a test waits for outputs: a regression fails the test instead of
/// hanging it.
const LIMIT: StdDuration = StdDuration::from_secs(120);

/// Generous: a loaded 2-core machine must not make a live rank look dead.
fn config(n: u32, me: Rank) -> DetectorConfig {
    DetectorConfig {
        comm: 0,
        n,
        me,
        period: Duration::from_millis(20),
        timeout: Duration::from_millis(400),
        phase: Duration::from_millis(u64::from(me)),
        span: DEFAULT_SPAN,
    }
}

fn group(n: u32) -> (MemNet, Vec<Runtime>) {
    let net = MemNet::new(n);
    let ranks = (0..n)
        .map(|r| net.spawn_rank(config(n, r)).expect("a progress thread"))
        .collect();
    (net, ranks)
}

/// Blocks (bounded) until `rank` sees every rank of `dead` failed, in `L_i` or pending.
fn await_deaths(rank: &Runtime, dead: &[Rank]) {
    for _ in 0..3000 {
        let view = rank.view();
        if dead
            .iter()
            .all(|&d| view.local().contains(d) || view.pending().contains(d))
        {
            return;
        }
        std::thread::sleep(StdDuration::from_millis(5));
    }
    panic!("rank {} never learned of {dead:?}", rank.view().rank());
}

/// Every survivor runs `validate_global` on its own thread; their results.
fn validate_all(ranks: &[Runtime], survivors: &[Rank]) -> Vec<ft_runtime::GlobalValidation> {
    std::thread::scope(|s| {
        let threads: Vec<_> = survivors
            .iter()
            .map(|&r| s.spawn(move || ranks[r as usize].validate_global()))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap().expect("the survivors agree"))
            .collect()
    })
}

fn one_output(n: u32, bytes: u64, dests: Vec<Rank>) -> PlanSpec {
    PlanSpec::new(n, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", bytes, dests))
}

/// The defect: `Abandoned` was dropped, so a destination whose root died before its
/// data left waited forever. Now the wait fails with the typed error.
#[test]
fn wait_outputs_fails_when_the_root_dies() {
    let (net, ranks) = group(3);
    // The root dies just before its first data frame: rank 1 is activated, asks for
    // its data and never gets it.
    net.kill_before_sending(0, FrameKind::BcastData);
    ranks[0]
        .start_broadcast(7, one_output(3, 4096, vec![1]), vec![vec![1; 4096]])
        .expect("started");
    let wait = ranks[1].wait_outputs(TaskId::new(0, 7), OutputSet::single(0), Some(LIMIT));
    assert_eq!(
        wait,
        Err(RuntimeError::Abandoned {
            task: TaskId { root: 0, key: 7 }
        })
    );
    // A later wait for the same task fails at once, until the task is released.
    assert_eq!(
        ranks[1].wait_outputs(TaskId::new(0, 7), OutputSet::single(0), Some(LIMIT)),
        Err(RuntimeError::Abandoned {
            task: TaskId { root: 0, key: 7 }
        })
    );
    assert!(net.is_dead(0));
}

/// The defect: finished broadcasts were kept for the life of the process. `release`
/// frees their payloads at every rank.
#[test]
fn released_broadcasts_free_their_payloads() {
    let (_net, ranks) = group(4);
    let bytes = 1 << 20;
    let payload: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    ranks[0]
        .start_broadcast(
            3,
            one_output(4, bytes, vec![1, 2, 3]),
            vec![payload.clone()],
        )
        .expect("started");
    for rank in &ranks[1..] {
        let got = rank
            .wait_outputs(TaskId::new(0, 3), OutputSet::single(0), Some(LIMIT))
            .expect("the outputs");
        assert_eq!(got, vec![(0, payload.clone().into())]);
    }
    for (r, rank) in ranks.iter().enumerate() {
        let held = rank.inspect(|stack| stack.held_bytes()).unwrap();
        assert_eq!(
            held, bytes as usize,
            "rank {r} holds the payload before release"
        );
    }
    for (r, rank) in ranks.iter().enumerate() {
        rank.release(TaskId::new(0, 3)).unwrap();
        let held = rank.inspect(|stack| stack.held_bytes()).unwrap();
        assert_eq!(held, 0, "rank {r} after release");
    }
}

/// A wait pending when the task is released fails with `Released`; a wait for a task
/// that never comes ends at its timeout.
#[test]
fn waits_end_on_release_and_on_timeout() {
    let (_net, ranks) = group(2);
    let rank = Arc::new(ranks.into_iter().nth(1).unwrap());
    let waiter = {
        let rank = Arc::clone(&rank);
        std::thread::spawn(move || {
            rank.wait_outputs(TaskId::new(0, 9), OutputSet::single(0), Some(LIMIT))
        })
    };
    // Released while (or before) the waiter waits: either way it must not hang.
    loop {
        rank.release(TaskId::new(0, 9)).unwrap();
        if waiter.is_finished() {
            break;
        }
        std::thread::sleep(StdDuration::from_millis(5));
    }
    let result = waiter.join().unwrap();
    assert!(
        matches!(
            result,
            Err(RuntimeError::Released {
                task: TaskId { root: 0, key: 9 }
            })
        ),
        "{result:?}"
    );
    assert_eq!(
        rank.wait_outputs(
            TaskId::new(0, 11),
            OutputSet::single(0),
            Some(StdDuration::from_millis(20))
        ),
        Err(RuntimeError::TimedOut {
            task: TaskId { root: 0, key: 11 }
        })
    );
}

/// A rank dies; the survivors validate, then rank 0 queries states, with a buffer too small first, and recognize the dead rank.
#[test]
fn the_seed_calls_on_the_published_view() {
    let (net, ranks) = group(4);
    net.kill(3);
    ranks[3].halt();
    await_deaths(&ranks[0], &[3]);
    let counts = ranks[0].validate_local().unwrap();
    assert_eq!(counts, Counts { failed: 1, new: 1 });
    for result in validate_all(&ranks, &[0, 1, 2]) {
        assert_eq!(result.agreed.iter().collect::<Vec<_>>(), [3]);
        assert_eq!(result.counts, Counts { failed: 1, new: 1 });
        assert_eq!(result.epoch, 1);
    }
    let view = ranks[0].view();
    assert_eq!(view.epoch(), 1);
    let mask = StateMask::FAILED | StateMask::NEW;
    assert_eq!(view.num_state(Scope::Global, mask), 1);
    let mut small = [];
    assert_eq!(
        view.get_state(Scope::Global, StateMask::ALL, &mut small),
        Err(ViewError::BufferTooSmall { needed: 4 })
    );
    ranks[0].recognize(3).unwrap();
    assert_eq!(
        ranks[0].recognize(1),
        Err(RuntimeError::View(ViewError::NotFailed(1)))
    );
    let info = ranks[0].view().rank_info(Scope::Global, 3).unwrap().0;
    assert_eq!(info.state, RankState::Null);
    assert_eq!(ranks[0].view().survivors().new_rank(2), Some(2));
    // The killed rank's handle reports the stop.
    assert!(matches!(
        ranks[3].validate_local(),
        Err(RuntimeError::Stopped(_))
    ));
}

/// Revoke reaches every survivor's published view, and a broadcast started afterwards
/// is refused with the stack's typed error.
#[test]
fn revoke_is_published_and_typed_errors_come_back() {
    let (_net, ranks) = group(3);
    ranks[1].revoke().unwrap();
    for rank in &ranks {
        for _ in 0..3000 {
            if rank.view().revoked_by().is_some() {
                break;
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
        assert_eq!(rank.view().revoked_by(), Some(1));
    }
    let refused = ranks[0].start_broadcast(1, one_output(3, 8, vec![1]), vec![vec![0; 8]]);
    assert!(
        matches!(refused, Err(RuntimeError::Stack(_))),
        "{refused:?}"
    );
}

/// A live rank whose peers cannot hear it is declared dead; once the notice reaches it,
/// its handle stops for good with the typed reason, and the survivors agree on it.
#[test]
fn a_live_rank_declared_dead_stops_with_the_reason() {
    let (net, ranks) = group(4);
    net.mute(2);
    for &r in &[0, 1, 3] {
        await_deaths(&ranks[r], &[2]);
    }
    for result in validate_all(&ranks, &[0, 1, 3]) {
        assert_eq!(result.agreed.iter().collect::<Vec<_>>(), vec![2]);
    }
    let end = loop {
        match ranks[2].next_event(Some(LIMIT)) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("rank 2 never learned it was declared dead"),
            Err(e) => break e,
        }
    };
    assert!(end.is_fail_stop(), "{end:?}");
    assert!(
        matches!(
            end,
            RuntimeError::DeclaredDead { by } if by != 2
        ) || matches!(end, RuntimeError::Excluded { .. }),
        "{end:?}"
    );
    let later = ranks[2].validate_local().unwrap_err();
    assert_eq!(later, end, "every later call gives the same reason");
    assert!(
        !net.is_dead(2),
        "muted, not killed: the rank stopped itself"
    );
}

#[test]
fn a_runtime_is_send_and_sync() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Runtime>();
}
