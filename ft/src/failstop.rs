//! Fail-stop for a real process: a rank whose peers declared it dead, rightly or not,
//! must leave as a dead rank does, so that the job goes on without it and its launcher
//! counts a killed rank (`ftrun`, `mpiexec --with-ft ulfm`).
//!
//! Two ways a process learns it must go:
//! - its handle says so: a call fails with a fail-stop error
//!   ([`RuntimeError::is_fail_stop`](crate::RuntimeError::is_fail_stop)); [`leave_if_declared`] checks and goes;
//! - its progress thread stalls. That thread sends the rank's heartbeats, so once it
//!   made no turn for two timeouts and a second, the rank's observer has declared it
//!   dead; but a stalled thread never reads the notice, and the process would stay
//!   until its launcher gave up. [`watch`] asks for one turn every period (a
//!   [`Runtime::copies`], which changes nothing) from a helper thread, and ends the
//!   process when none came back in time.
//!
//! Leaving is [`die`]: `SIGKILL` to this process, so nothing of it runs after (no
//! destructor, no `atexit`, no `MPI_Finalize`, which a job that lost ranks cannot
//! complete).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ft_runtime::Runtime;

use crate::Settings;

/// Ends this process at once, as a kill would (`SIGKILL`).
pub fn die() -> ! {
    // SAFETY: raising a signal has no memory effects; SIGKILL cannot be caught.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    unreachable!("SIGKILL ends the process")
}

/// Ends this process ([`die`]) if `handle` stopped for fail-stop: its peers declared
/// this rank dead, or an agreement excluded it. `program` and `why` (what failed)
/// go to stderr first.
pub fn leave_if_declared(handle: &Runtime, program: &str, why: &dyn std::fmt::Display) {
    if let Err(stop) = handle.copies() {
        if stop.is_fail_stop() {
            eprintln!("{program}: {why}: {stop}");
            die();
        }
    }
}

// ANCHOR: watch
/// Watches `handle`'s progress thread until `done` is set, ending this process
/// ([`die`]) once the thread made no turn for two timeouts of `settings` and a second
/// (see the [module docs](self)); `program` names the process in the message. Run it
/// on a thread of its own, beside the rank's work.
pub fn watch(handle: &Runtime, settings: &Settings, done: &AtomicBool, program: &str) {
    let origin = Instant::now();
    let turned = AtomicU64::new(0);
    let bound = 2 * settings.timeout + Duration::from_secs(1);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) && handle.copies().is_ok() {
                turned.store(origin.elapsed().as_millis() as u64, Ordering::Relaxed);
                std::thread::sleep(settings.period);
            }
        });
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(settings.period);
            let since = origin.elapsed() - Duration::from_millis(turned.load(Ordering::Relaxed));
            if since > bound {
                eprintln!(
                    "{program}: rank {}: the progress thread made no turn for {since:?}: its \
                     peers have declared it dead, so it stops (fail-stop)",
                    handle.view().rank()
                );
                die();
            }
        }
    });
}
// ANCHOR_END: watch
