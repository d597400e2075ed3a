//! One handle driven from 8 worker threads at once, against a simulated group with
//! kills, over many seeds: every worker sees the published view move forward only
//! (epochs never go back, `G ⊆ L_i`, `G` only holds killed ranks), the queries of one
//! snapshot agree with each other, every global validation gives the same `G` at every
//! survivor, and once the group is quiet each survivor's published view equals its
//! machine's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ft::ft_core::SplitMix;
use ft::sim::SimGroup;
use ft::{Rank, RankInfo, RankState, RuntimeError, Scope, Settings, StateMask, ViewError};

const RANKS: u32 = 5;
const ROUNDS: u32 = 3;
const WORKERS: usize = 8;
const SEEDS: u64 = 10;

fn settings() -> Settings {
    Settings {
        // Generous: 5 progress threads, 5 comm threads and 8 workers share 2 cores, and
        // a false suspicion would stop a live rank for good.
        period: Duration::from_millis(20),
        timeout: Duration::from_millis(400),
        ..Settings::default()
    }
}

/// What one worker checks on every snapshot it reads; the number of reads.
fn worker(group: &SimGroup, id: usize, killed: &BTreeSet<Rank>, stop: &AtomicBool) -> u64 {
    let handle = group.rank(0).expect("rank 0");
    let mut last_epoch = 0;
    let mut reads = 0;
    let blank = RankInfo {
        rank: 0,
        state: RankState::Ok,
        epoch: 0,
        generation: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let view = handle.view();
        reads += 1;
        assert!(
            view.epoch() >= last_epoch,
            "worker {id}: the epoch went back"
        );
        last_epoch = view.epoch();
        let (local, global) = (view.local(), view.global().clone());
        assert!(
            global.iter().all(|r| local.contains(r)),
            "worker {id}: G ⊄ L_i"
        );
        assert!(
            global.iter().all(|r| killed.contains(&r)),
            "worker {id}: G = {global:?} names a live rank"
        );
        // The queries of one snapshot agree with each other.
        let failed = StateMask::FAILED | StateMask::NULL;
        let needed = view.num_state(Scope::Global, failed);
        assert_eq!(needed, global.len());
        if needed > 0 {
            let mut small = vec![blank; needed - 1];
            assert_eq!(
                view.get_state(Scope::Global, failed, &mut small),
                Err(ViewError::BufferTooSmall { needed })
            );
            assert!(small.iter().all(|row| *row == blank), "left untouched");
        }
        let mut rows = vec![blank; needed];
        assert_eq!(view.get_state(Scope::Global, failed, &mut rows), Ok(needed));
        assert!(rows.iter().map(|row| row.rank).eq(global.iter()));
        // Commands from many threads at once.
        match id % 4 {
            0 => {
                let counts = handle.validate_local().expect("validate_local");
                assert!(counts.new <= counts.failed);
            }
            1 => {
                for rank in local.iter() {
                    match handle.recognize(rank) {
                        Ok(()) | Err(RuntimeError::View(ViewError::NotFailed(_))) => {}
                        Err(e) => panic!("worker {id}: recognize({rank}): {e}"),
                    }
                }
            }
            2 => {
                // The published view never runs ahead of the machine.
                let machine_epoch = handle
                    .inspect(|stack| stack.node().view().epoch(Scope::Global))
                    .expect("inspect");
                assert!(machine_epoch >= view.view().epoch(Scope::Global));
            }
            _ => std::thread::yield_now(),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    reads
}

/// Every live rank of the group runs `rounds` global validations on its own comm
/// thread; each validation's `G` by epoch, as every rank saw it.
type Agreed = BTreeMap<u32, Vec<(Rank, Vec<Rank>)>>;

fn run_seed(seed: u64) -> u64 {
    let group = SimGroup::open(RANKS, &settings()).expect("the group starts");
    let mut rng = SplitMix::new(seed);
    // One or two victims among ranks 1.. (rank 0 is the handle under test), each
    // killed once rank 0 has finished a seeded number of rounds.
    let mut victims: BTreeMap<Rank, u32> = BTreeMap::new();
    for _ in 0..1 + rng.below(2) {
        let victim = 1 + rng.below(u64::from(RANKS - 1)) as Rank;
        victims.insert(victim, rng.below(u64::from(ROUNDS)) as u32);
    }
    let killed: BTreeSet<Rank> = victims.keys().copied().collect();
    let rounds_done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let agreed: std::sync::Mutex<Agreed> = Default::default();
    let reads = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (group, killed, stop) = (&group, &killed, &stop);
                s.spawn(move || worker(group, id, killed, stop))
            })
            .collect();
        let comms: Vec<_> = (0..RANKS)
            .map(|me| {
                let (group, agreed, rounds_done) = (&group, &agreed, &rounds_done);
                s.spawn(move || {
                    let handle = group.rank(me).expect("a rank");
                    let mut last = 0;
                    for _ in 0..ROUNDS {
                        match handle.validate_global() {
                            Ok(v) => {
                                assert!(v.epoch > last, "rank {me}: epochs strictly grow");
                                last = v.epoch;
                                let g = v.agreed.iter().collect();
                                agreed
                                    .lock()
                                    .unwrap()
                                    .entry(v.epoch)
                                    .or_default()
                                    .push((me, g));
                            }
                            Err(RuntimeError::Stopped(_)) if group.is_dead(me) => return,
                            Err(e) => panic!("rank {me}: validate_global: {e}"),
                        }
                        if me == 0 {
                            rounds_done.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        // The killer: each victim dies once rank 0 finished its round.
        for (&victim, &after) in &victims {
            while rounds_done.load(Ordering::SeqCst) < u64::from(after) {
                std::thread::sleep(Duration::from_millis(2));
            }
            group.kill(victim);
        }
        for comm in comms {
            comm.join().expect("a comm thread");
        }
        // The final, collective validation, once rank 0 knows every death: it agrees
        // on exactly the killed ranks.
        let handle = group.rank(0).unwrap();
        for _ in 0..5000 {
            let view = handle.view();
            if killed
                .iter()
                .all(|&r| view.local().contains(r) || view.pending().contains(r))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for (rank, result) in group.validate_global_all() {
            let g: Vec<Rank> = result
                .expect("the final validation")
                .agreed
                .iter()
                .collect();
            assert!(
                g.iter().copied().eq(killed.iter().copied()),
                "seed {seed}: rank {rank}: G = {g:?}"
            );
        }
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker"))
            .sum::<u64>()
    });
    for (epoch, seen) in agreed.into_inner().unwrap() {
        let first = &seen[0].1;
        assert!(
            seen.iter().all(|(_, g)| g == first),
            "seed {seed}: epoch {epoch}: survivors disagree: {seen:?}"
        );
    }
    // Quiet now: every survivor's published view is its machine's.
    for rank in group.survivors() {
        let handle = group.rank(rank).unwrap();
        let machine = handle
            .inspect(|stack| stack.node().view().clone())
            .expect("inspect");
        let published = handle.view();
        assert_eq!(
            published.local(),
            machine.local(),
            "seed {seed}: rank {rank}: L_i"
        );
        assert_eq!(
            published.global(),
            machine.global(),
            "seed {seed}: rank {rank}: G"
        );
        assert_eq!(
            published.pending(),
            machine.pending(),
            "seed {seed}: rank {rank}"
        );
        for scope in [Scope::Local, Scope::Global] {
            for r in 0..RANKS {
                assert_eq!(
                    published.rank_info(scope, r),
                    machine.rank_info(scope, r),
                    "seed {seed}: rank {rank}: state of {r} in {scope:?}"
                );
            }
        }
    }
    reads
}

#[test]
fn eight_workers_share_one_handle_across_kills() {
    let mut reads = 0;
    for seed in 0..SEEDS {
        reads += run_seed(seed);
    }
    eprintln!("{SEEDS} seeds, {WORKERS} workers: {reads} snapshot reads checked");
}
