//! A task runtime's allocation hook, end to end through the handles of a simulated
//! group: every output a destination or relay receives lands in the memory the hook
//! gave for it (the waited-for bytes are that memory), byte-exact, and each buffer the
//! hook gave comes back exactly once, after the broadcast is released and the last view
//! of it dropped, also when a relay dies mid-broadcast.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ft::{Landing, OutputSet, OutputSpec, PlanSpec, Rank, Runtime, TaskId, Topology};

mod common;
use common::{settings, WAIT};

/// A runtime's pool of buffers: what it lent, by address, and what came back.
#[derive(Clone, Default)]
struct Pool {
    state: Arc<Mutex<PoolState>>,
}

#[derive(Default)]
struct PoolState {
    /// Address of each buffer out: (broadcast, output, length).
    out: BTreeMap<usize, (TaskId, u32, usize)>,
    lent: usize,
    returned: usize,
}

impl Pool {
    /// Sets the pool as `handle`'s allocation hook.
    fn serve(&self, handle: &Runtime) {
        let pool = self.clone();
        handle
            .set_allocator(move |task: TaskId, output: u32, len: usize| {
                let buffer = vec![0u8; len];
                let addr = buffer.as_ptr() as usize;
                let mut state = pool.state.lock().unwrap();
                state.out.insert(addr, (task, output, len));
                state.lent += 1;
                let back = Arc::clone(&pool.state);
                Some(Landing::lent_vec(buffer, move |buffer| {
                    let mut state = back.lock().unwrap();
                    let addr = buffer.as_ptr() as usize;
                    assert!(state.out.remove(&addr).is_some(), "given back once");
                    state.returned += 1;
                }))
            })
            .expect("the handle runs");
    }

    /// Whether `bytes` is the buffer lent for output `output` of `task`.
    fn holds(&self, bytes: &[u8], task: TaskId, output: u32) -> bool {
        let state = self.state.lock().unwrap();
        state.out.get(&(bytes.as_ptr() as usize)) == Some(&(task, output, bytes.len()))
    }

    /// Buffers lent and returned.
    fn counts(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.lent, state.returned)
    }
}

/// Output `j`'s payload of `len` bytes.
fn payload(j: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 13 + j * 101 + (i >> 12)) as u8)
        .collect()
}

#[test]
fn outputs_land_in_the_runtimes_memory_and_each_buffer_comes_back_once() {
    let group = ft::sim::SimGroup::open(5, &settings()).expect("a group");
    let pools: Vec<Pool> = (0..5).map(|_| Pool::default()).collect();
    for (rank, pool) in pools.iter().enumerate().skip(1) {
        pool.serve(group.rank(rank as Rank).unwrap());
    }
    // A 1-byte output, one of a chunk or so, and a 1 MiB one, to overlapping sets.
    let sizes = [1usize, 70_000, 1 << 20];
    let spec = PlanSpec::new(5, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("tiny", sizes[0] as u64, vec![1, 2, 3, 4]))
        .with_output(OutputSpec::new("tile", sizes[1] as u64, vec![2, 4]))
        .with_output(OutputSpec::new("panel", sizes[2] as u64, vec![3]));
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(j, &n)| payload(j, n))
        .collect();
    let task = TaskId::new(0, 42);
    group
        .rank(0)
        .unwrap()
        .start_broadcast(42, spec, payloads.clone())
        .expect("started");
    let wants: [&[u32]; 5] = [&[], &[0], &[0, 1], &[0, 2], &[0, 1]];
    let mut kept = Vec::new();
    for rank in 1..5 {
        let handle = group.rank(rank as Rank).unwrap();
        let outputs: OutputSet = wants[rank].iter().copied().collect();
        let got = handle
            .wait_outputs(task, outputs, Some(WAIT))
            .expect("outputs");
        for (output, bytes) in got {
            assert!(
                bytes == payloads[output as usize],
                "rank {rank}: output {output} exact"
            );
            assert!(
                pools[rank].holds(&bytes, task, output),
                "rank {rank}: output {output} is the pool's buffer"
            );
            kept.push(bytes);
        }
        handle.release(task).unwrap();
    }
    // The runtime still reads what it kept; the buffers come back once it drops them.
    for pool in &pools[1..] {
        let (lent, returned) = pool.counts();
        assert!(lent > 0);
        assert!(returned < lent, "views are still held");
    }
    drop(kept);
    for (rank, pool) in pools.iter().enumerate().skip(1) {
        let (lent, returned) = pool.counts();
        assert_eq!(returned, lent, "rank {rank}: every buffer back once");
    }
}

#[test]
fn a_relays_death_mid_broadcast_loses_no_buffer_and_no_byte() {
    const LEN: usize = 4 << 20;
    for round in 0..3u64 {
        let group = ft::sim::SimGroup::open(4, &settings()).expect("a group");
        let pools: Vec<Pool> = (0..4).map(|_| Pool::default()).collect();
        for (rank, pool) in pools.iter().enumerate().skip(1) {
            pool.serve(group.rank(rank as Rank).unwrap());
        }
        // Chain 0 -> 1 -> 2 -> 3: rank 1 relays, and dies while the data flows.
        let spec = PlanSpec::new(4, 0)
            .with_topology(Topology::Chain)
            .with_output(OutputSpec::new("A", LEN as u64, vec![1, 2, 3]));
        let data = payload(round as usize, LEN);
        group
            .rank(0)
            .unwrap()
            .start_broadcast(round, spec, [data.clone()])
            .expect("started");
        std::thread::sleep(std::time::Duration::from_millis(2 * round));
        group.kill(1);
        let task = TaskId::new(0, round);
        for rank in [2, 3] {
            let handle = group.rank(rank).unwrap();
            let got = handle
                .wait_outputs(task, [0].into_iter().collect(), Some(WAIT))
                .expect("the output, through the repaired tree");
            assert!(got[0].1 == data, "rank {rank}: exact");
            assert!(
                pools[rank as usize].holds(&got[0].1, task, 0),
                "rank {rank}: in the pool"
            );
            drop(got);
            handle.release(task).unwrap();
        }
        drop(group);
        for (rank, pool) in pools.iter().enumerate().skip(2) {
            let (lent, returned) = pool.counts();
            assert!(lent >= 1);
            assert_eq!(
                returned, lent,
                "round {round}, rank {rank}: every buffer back once"
            );
        }
    }
}
