//! The event queue of a handle, end to end on a simulated group: a destination learns
//! of a broadcast from its `Arrived` event (before any output is ready), then gets one
//! `OutputReady` per output; the eventfd polls readable exactly while events wait; a
//! killed rank is reported once per survivor (`RankFailed`), before the `Validated`
//! that agrees on it; a revoke reaches every survivor; several threads taking events
//! from one handle get each event exactly once, while a rank dies; two roots
//! broadcasting under the same key at once run two broadcasts.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ft::sim::SimGroup;
use ft::{Event, OutputSet, OutputSpec, PlanSpec, Rank, RankSet, Runtime, TaskId, Topology};

mod common;
use common::{settings, WAIT};

/// The next event of `handle`, failing the test after [`WAIT`].
fn next(handle: &Runtime) -> Event {
    handle
        .next_event(Some(WAIT))
        .expect("the handle is running")
        .expect("an event within the wait")
}

/// Whether `handle`'s event descriptor polls readable now.
fn readable(handle: &Runtime) -> bool {
    let fd = handle.event_fd().expect("an eventfd on Linux");
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 && pfd.revents & libc::POLLIN != 0 }
}

// ANCHOR: arrival
#[test]
fn a_destination_learns_of_a_broadcast_from_its_arrival() {
    let group = SimGroup::open(4, &settings()).expect("a group");
    // Output 0 to ranks 1 and 2, output 1 to rank 2 alone (the #624 shape).
    let spec = PlanSpec::new(4, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 3000, vec![1, 2]))
        .with_output(OutputSpec::new("B", 70_000, vec![2]));
    let payloads = [vec![7u8; 3000], vec![9u8; 70_000]];
    // The runtime's own header: a task class and the task's parameters.
    let header = b"class=start k=0".to_vec();
    let task = TaskId::new(0, 11);
    let root = group.rank(0).unwrap();
    root.start_with_header(task.key, header.clone(), spec, payloads.clone())
        .expect("started");
    let needs: BTreeMap<Rank, Vec<u32>> = BTreeMap::from([(1, vec![0]), (2, vec![0, 1])]);
    for (&rank, outputs) in &needs {
        let handle = group.rank(rank).unwrap();
        let Event::Arrived {
            task: arrived_task,
            header: arrived_header,
            outputs: arrived,
            ..
        } = next(handle)
        else {
            panic!("rank {rank}: the first event is not the arrival");
        };
        assert_eq!(arrived_task, task, "rank {rank}");
        assert_eq!(arrived_header, header, "rank {rank}");
        assert_eq!(arrived.iter().collect::<Vec<_>>(), *outputs, "rank {rank}");
        let mut ready: Vec<u32> = outputs
            .iter()
            .map(|_| match next(handle) {
                Event::OutputReady { task: t, output } if t == task => output,
                other => panic!("rank {rank}: {other:?} instead of an output"),
            })
            .collect();
        ready.sort_unstable();
        assert_eq!(ready, *outputs, "rank {rank}: each output ready once");
        // Ready means held: the wait returns at once, with the root's bytes.
        let set = outputs.iter().fold(OutputSet::default(), |mut s, &j| {
            s.insert(j);
            s
        });
        let data = handle
            .wait_outputs(task, set, Some(Duration::ZERO))
            .expect("held");
        for (j, bytes) in data {
            assert_eq!(bytes, payloads[j as usize], "rank {rank}: output {j}");
        }
        assert_eq!(handle.try_next_event().unwrap(), None, "rank {rank}");
    }
    // A rank that needs nothing hears nothing of the broadcast.
    assert_eq!(group.rank(3).unwrap().try_next_event().unwrap(), None);
}
// ANCHOR_END: arrival

#[test]
fn the_descriptor_is_readable_while_events_wait() {
    let group = SimGroup::open(3, &settings()).expect("a group");
    let handle = group.rank(1).unwrap();
    assert!(!readable(handle), "nothing happened yet");
    let spec = PlanSpec::new(3, 0).with_output(OutputSpec::new("A", 100, vec![1]));
    group
        .rank(0)
        .unwrap()
        .start_broadcast(3, spec, [vec![1u8; 100]])
        .expect("started");
    let since = Instant::now();
    while !readable(handle) {
        assert!(
            since.elapsed() < WAIT,
            "the arrival never made the fd readable"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let task = TaskId::new(0, 3);
    assert!(matches!(next(handle), Event::Arrived { task: t, .. } if t == task));
    assert!(matches!(
        next(handle),
        Event::OutputReady { task: t, output: 0 } if t == task
    ));
    assert!(!readable(handle), "drained");
}

#[test]
fn a_killed_rank_is_told_once_then_agreed_and_a_revoke_reaches_everyone() {
    let group = SimGroup::open(5, &settings()).expect("a group");
    group.kill(3);
    let survivors = [0, 1, 2, 4];
    for &rank in &survivors {
        assert_eq!(
            next(group.rank(rank).unwrap()),
            Event::RankFailed { rank: 3 }
        );
    }
    // The first validation agrees on the death (told before, so no second RankFailed
    // comes first); the second adds nothing.
    let g = RankSet::from_ranks(5, [3]);
    for (epoch, new) in [(1, g.clone()), (2, RankSet::new(5))] {
        for (rank, result) in group.validate_global_all() {
            result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
        for &rank in &survivors {
            assert_eq!(
                next(group.rank(rank).unwrap()),
                Event::Validated {
                    epoch,
                    failed: g.clone(),
                    new: new.clone()
                },
                "rank {rank}"
            );
        }
    }
    group.rank(1).unwrap().revoke().expect("revoked");
    for &rank in &survivors {
        assert_eq!(next(group.rank(rank).unwrap()), Event::Revoked { by: 1 });
    }
}

#[test]
fn threads_taking_from_one_handle_get_each_event_once_while_a_rank_dies() {
    const TASKS: u64 = 40;
    let group = SimGroup::open(3, &settings()).expect("a group");
    let handle = group.rank(1).unwrap();
    let taken: Vec<Event> = std::thread::scope(|s| {
        let takers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(event) = handle.next_event(Some(Duration::from_secs(2))).unwrap()
                    {
                        mine.push(event);
                    }
                    mine
                })
            })
            .collect();
        for task in 0..TASKS {
            // Rank 2, the other destination, dies halfway through.
            if task == TASKS / 2 {
                group.kill(2);
            }
            let spec = PlanSpec::new(3, 0).with_output(OutputSpec::new("A", 64, vec![1, 2]));
            group
                .rank(0)
                .unwrap()
                .start_broadcast(task, spec, [vec![task as u8; 64]])
                .expect("started");
        }
        takers.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let mut arrived: Vec<u64> = Vec::new();
    let mut ready: Vec<u64> = Vec::new();
    let mut failed: Vec<Rank> = Vec::new();
    for event in taken {
        match event {
            Event::Arrived { task, .. } => arrived.push(task.key),
            Event::OutputReady { task, output: 0 } => ready.push(task.key),
            Event::RankFailed { rank } => failed.push(rank),
            other => panic!("unexpected {other:?}"),
        }
    }
    arrived.sort_unstable();
    ready.sort_unstable();
    let all: Vec<u64> = (0..TASKS).collect();
    assert_eq!(arrived, all, "each arrival taken exactly once");
    assert_eq!(ready, all, "each output taken exactly once");
    assert_eq!(failed, [2], "the death told once");
}

#[test]
fn two_roots_broadcasting_the_same_key_at_once_run_two_broadcasts() {
    let group = SimGroup::open(4, &settings()).expect("a group");
    // Roots 0 and 1 both start key 7, at once, to rank 3 (and to each other's side).
    let key = 7;
    let specs = [
        PlanSpec::new(4, 0).with_output(OutputSpec::new("A", 5000, vec![2, 3])),
        PlanSpec::new(4, 1).with_output(OutputSpec::new("A", 9000, vec![3, 0])),
    ];
    std::thread::scope(|s| {
        for (root, spec) in specs.into_iter().enumerate() {
            let handle = group.rank(root as Rank).unwrap();
            s.spawn(move || {
                let payload = vec![root as u8 + 1; spec.outputs[0].bytes as usize];
                handle
                    .start_with_header(key, vec![b'r', root as u8], spec, [payload])
                    .expect("started");
            });
        }
    });
    let rank3 = group.rank(3).unwrap();
    let mut headers = BTreeMap::new();
    for _ in 0..4 {
        match next(rank3) {
            Event::Arrived { task, header, .. } => {
                assert_eq!(task.key, key);
                headers.insert(task.root, header);
            }
            Event::OutputReady { task, output: 0 } => assert_eq!(task.key, key),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(headers.len(), 2, "one arrival per root: {headers:?}");
    for root in [0, 1] {
        assert_eq!(
            headers[&root],
            vec![b'r', root as u8],
            "root {root}'s own header"
        );
        let data = rank3
            .wait_outputs(TaskId::new(root, key), OutputSet::single(0), Some(WAIT))
            .expect("held");
        let size = if root == 0 { 5000 } else { 9000 };
        assert_eq!(data[0].1, vec![root as u8 + 1; size], "root {root}'s bytes");
    }
}
