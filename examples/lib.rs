//! Examples of the fault-tolerance library, run with
//! `cargo run --release -p ft-examples --example NAME`. Each one asserts on its result.
//!
//! The library part holds what the one-rank-per-process examples (`ofi_validate`,
//! `mpi_validate`) share: the `--kill RANK` flag and the job each rank runs once it is
//! open, whatever network opened it.

use std::time::{Duration, Instant};

use ft::Runtime;

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

/// One rank's job: a first validation (every rank holds the others' connections); then
/// rank `kill` dies by SIGKILL, as a node failure ends a process; the others wait until
/// their detector declares it, agree on `G`, print one line, and close with a last
/// validation so nobody leaves while a peer may still wait on it. Panics on any
/// departure from that, so the job's status says whether it held.
pub fn validate_with_kill(handle: &Runtime, kill: Option<u32>) {
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
    handle.validate_global().expect("the closing validation");
}
