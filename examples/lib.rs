//! Examples of the fault-tolerance library, run with
//! `cargo run --release -p ft-examples --example NAME`. Each one asserts on its result.
//!
//! The library part holds what the one-rank-per-process examples (`ofi_validate`,
//! `mpi_validate`) share: the `--kill RANK` flag and the job each rank runs once it is
//! open, whatever network opened it ([`run_job`]).

use std::time::{Duration, Instant};

use ft::ft_core::SendError;
use ft::{Event, Rank, RankSet, Runtime, RuntimeError, StackError};

/// How many messages each survivor sends the next one ([`exchange_messages`]).
pub const MESSAGES: u64 = 12;

/// How long a survivor waits for its detector to declare the killed rank.
pub const DETECTION_LIMIT: Duration = Duration::from_secs(30);

/// The rank named by `--kill RANK` on the command line, if any.
pub fn kill_flag(program: &str) -> Option<u32> {
    match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, rank] if flag == "--kill" => Some(rank.parse().expect("--kill takes a rank")),
        _ => panic!("usage: {program} [--kill RANK]"),
    }
}

/// One rank's job: [`validate_with_kill`], then [`exchange_messages`] among the
/// survivors, then a last validation so nobody leaves while a peer may still wait on
/// it. Panics on any departure from that, so the job's status says whether it held.
pub fn run_job(handle: &Runtime, kill: Option<u32>) {
    let g = validate_with_kill(handle, kill);
    exchange_messages(handle, &g);
    handle.validate_global().expect("the closing validation");
}

/// A first validation (every rank holds the others' connections); then rank `kill`
/// dies by SIGKILL, as a node failure ends a process; the others wait until their
/// detector declares it, agree on `G` and print one line. Returns `G`.
pub fn validate_with_kill(handle: &Runtime, kill: Option<u32>) -> RankSet {
    let (me, size) = (handle.view().rank(), handle.view().size());
    if let Some(k) = kill.filter(|&k| k >= size) {
        panic!("--kill {k} is outside 0..{size}");
    }
    handle.validate_global().expect("the first validation");
    if kill == Some(me) {
        // No clean-up, no goodbye.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        std::thread::sleep(DETECTION_LIMIT);
        unreachable!("rank {me} outlived its SIGKILL");
    }
    if let Some(dead) = kill {
        let since = Instant::now();
        // The detector's news waits in `pending` until a validation folds it into L_i.
        while !handle.view().pending().contains(dead) && !handle.view().local().contains(dead) {
            assert!(
                since.elapsed() < DETECTION_LIMIT,
                "rank {me}: {dead} never declared"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let g = handle.validate_global().expect("the survivors agree");
    let agreed: Vec<u32> = g.agreed.iter().collect();
    assert_eq!(agreed, kill.into_iter().collect::<Vec<_>>(), "rank {me}: G");
    println!("rank {me}: G = {agreed:?} at epoch {}", g.epoch);
    g.agreed
}

/// Message `k` of rank `from`: from 1 byte to 2 MiB (several fragments on every
/// transport).
pub fn message(from: Rank, k: u64) -> Vec<u8> {
    let len = [1usize, 100, 5000, 70_000, 300 << 10, 2 << 20][k as usize % 6];
    (0..len)
        .map(|i| (i as u64 * 31 + k * 7 + u64::from(from) + (i as u64 >> 12)) as u8)
        .collect()
}

/// The survivors (the ranks outside `dead`) in a ring: each sends [`MESSAGES`] messages
/// to the next and receives as many from the one before, in the order they were sent
/// and whole; a send to a dead rank is refused with the typed error, and nothing comes
/// from one. The handle's events told of each dead rank exactly once
/// (`Event::RankFailed`), and of no live one. Prints one line.
pub fn exchange_messages(handle: &Runtime, dead: &RankSet) {
    let (me, size) = (handle.view().rank(), handle.view().size());
    let ring: Vec<Rank> = (0..size).filter(|&r| !dead.contains(r)).collect();
    let at = ring
        .iter()
        .position(|&r| r == me)
        .expect("a survivor is in the ring");
    let (next, prev) = (
        ring[(at + 1) % ring.len()],
        ring[(at + ring.len() - 1) % ring.len()],
    );
    for k in 0..MESSAGES {
        handle
            .send(next, k, message(me, k))
            .expect("a send to a live rank");
    }
    for d in dead.iter() {
        match handle.send(d, 0, vec![0]) {
            Err(RuntimeError::Stack(StackError::Send(SendError::DeadRank(r)))) if r == d => {}
            other => panic!("rank {me}: a send to dead rank {d} gave {other:?}"),
        }
    }
    let since = Instant::now();
    let mut k = 0;
    let mut told_failed = RankSet::new(size);
    let mut note = |event: &Event| {
        if let Event::RankFailed { rank } = *event {
            assert!(
                dead.contains(rank),
                "rank {me}: told that live rank {rank} failed"
            );
            assert!(
                told_failed.insert(rank),
                "rank {me}: told twice that {rank} failed"
            );
        }
    };
    while k < MESSAGES {
        let left = DETECTION_LIMIT.saturating_sub(since.elapsed());
        match handle.next_event(Some(left)).expect("the handle runs") {
            Some(Event::Message { from, tag, bytes }) => {
                assert!(from == prev, "rank {me}: a message from {from}, not {prev}");
                assert_eq!(tag, k, "rank {me}: messages in the order sent");
                assert!(bytes == message(prev, k), "rank {me}: message {k} whole");
                k += 1;
            }
            Some(event) => note(&event),
            None => panic!("rank {me}: {k} of {MESSAGES} messages from {prev}"),
        }
    }
    while let Some(event) = handle.try_next_event().expect("the handle runs") {
        note(&event);
    }
    assert_eq!(&told_failed, dead, "rank {me}: told of each dead rank once");
    let dead: Vec<Rank> = dead.iter().collect();
    println!("rank {me}: {MESSAGES} messages from rank {prev} in order; sends to {dead:?} refused");
}
