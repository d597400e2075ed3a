//! One rank of a libfabric job, opened from its launcher's environment: under `ftrun`,
//! `mpiexec` or srun alike (`ft::ofi::open_from_env`). With `--kill R`, rank `R` dies by
//! a signal once it is connected; the others wait until their detector declares it,
//! agree on `G` with `validate_global`, and each prints one line.
//!
//! Run: `cargo build --release -p ft-launch --bin ftrun -p ft-examples --features ft-examples/ofi --example ofi_validate`,
//! then `target/release/ftrun -n 4 -- target/release/examples/ofi_validate --kill 2`.

use std::time::{Duration, Instant};

use ft::Settings;

/// How long a survivor waits for its detector to declare the killed rank.
const DETECTION_LIMIT: Duration = Duration::from_secs(30);

fn main() {
    let kill: Option<u32> = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, rank] if flag == "--kill" => Some(rank.parse().expect("--kill takes a rank")),
        _ => panic!("usage: ofi_validate [--kill RANK]"),
    };
    let handle = ft::ofi::open_from_env(&Settings::default()).expect("the rank opens");
    let (me, size) = (handle.view().rank(), handle.view().size());
    if let Some(k) = kill.filter(|&k| k >= size) {
        panic!("--kill {k} is outside 0..{size}");
    }
    // Every rank holds the others' connections before one of them dies.
    handle.validate_global().expect("the first validation");
    if kill == Some(me) {
        // SIGKILL, as a node failure ends a process: no clean-up, no goodbye.
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
    // A closing barrier: nobody leaves while a peer may still wait on it.
    handle.validate_global().expect("the closing validation");
    handle
        .shutdown(Duration::from_millis(200))
        .expect("shut down");
}
