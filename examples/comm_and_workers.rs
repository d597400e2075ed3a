//! The shape of a task runtime embedding `ft`: at every rank one comm thread owns the
//! collective calls (broadcasts it roots, `validate_global`, `release`) and 8 worker
//! threads share the same handle to wait for the task outputs they consume and to read
//! the failure view, all at once. Four ranks simulated in this process; rank 3 is
//! killed after the broadcast, and the survivors agree on it.
//!
//! Run: `cargo run --release -p ft-examples --example comm_and_workers`

use std::time::Duration;

use ft::sim::SimGroup;
use ft::{OutputSet, OutputSpec, PlanSpec, Rank, Scope, Settings, StateMask, TaskId, Topology};

const WORKERS: u32 = 8;
/// The broadcast: key 1 of rank 0.
const TASK: TaskId = TaskId::new(0, 1);

/// Output `j`'s bytes.
fn payload(j: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32 * 31 + j * 7) as u8).collect()
}

/// The outputs rank `me` consumes: A everywhere but the root, B at rank 2 only.
fn needs(me: Rank) -> Vec<u32> {
    match me {
        0 => vec![],
        2 => vec![0, 1],
        _ => vec![0],
    }
}

fn main() {
    let group = SimGroup::open(4, &Settings::default()).expect("the group starts");
    let spec = PlanSpec::new(4, 0)
        .with_topology(Topology::Binomial)
        .with_output(OutputSpec::new("A", 64 << 10, vec![1, 2, 3]))
        .with_output(OutputSpec::new("B", 1 << 20, vec![2]));
    let sizes = [64 << 10, 1 << 20];

    std::thread::scope(|s| {
        for me in 0..group.size() {
            let handle = group.rank(me).expect("a rank");
            // The comm thread: roots the broadcast at rank 0, then waits for its workers.
            let spec = spec.clone();
            s.spawn(move || {
                if me == 0 {
                    let payloads = (0..2).map(|j| payload(j, sizes[j as usize]));
                    handle
                        .start_broadcast(TASK.key, spec, payloads)
                        .expect("started");
                }
                // 8 workers share the handle: each consumes the outputs this rank needs.
                std::thread::scope(|workers| {
                    for w in 0..WORKERS {
                        workers.spawn(move || {
                            for j in needs(me) {
                                let got = handle
                                    .wait_outputs(
                                        TASK,
                                        OutputSet::single(j),
                                        Some(Duration::from_secs(60)),
                                    )
                                    .unwrap_or_else(|e| panic!("rank {me} worker {w}: {e}"));
                                assert_eq!(got, vec![(j, payload(j, sizes[j as usize]).into())]);
                            }
                            // Reading the view never blocks on the network.
                            let view = handle.view();
                            assert_eq!(view.num_state(Scope::Global, StateMask::OK), 4);
                        });
                    }
                });
            });
        }
    });
    println!("broadcast: every consumer got its outputs, 8 workers per rank");

    // Rank 3 dies; every survivor's comm thread validates globally.
    group.kill(3);
    let handle0 = group.rank(0).unwrap();
    while handle0.view().pending().is_empty() && handle0.view().local().is_empty() {
        std::thread::sleep(Duration::from_millis(5));
    }
    for (rank, result) in group.validate_global_all() {
        let validation = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(validation.agreed.iter().collect::<Vec<_>>(), [3]);
        assert_eq!((validation.counts.failed, validation.counts.new), (1, 1));
    }
    // Workers see the agreed view as soon as validate_global returns.
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            s.spawn(move || {
                let view = handle0.view();
                assert!(view.epoch() >= 1, "worker {w}");
                assert_eq!(
                    view.num_state(Scope::Global, StateMask::FAILED | StateMask::NEW),
                    1
                );
            });
        }
    });
    println!("rank 3 killed: the survivors agreed on G = [3]");

    // Every destination has its outputs: the comm threads release the task.
    for rank in group.survivors() {
        group.rank(rank).unwrap().release(TASK).expect("released");
    }
    println!("task released at every survivor");
}
