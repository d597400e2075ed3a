//! The crate's calls into the C library: signalling process groups, noting `SIGINT`
//! and `SIGTERM` while a job runs, and dying by a signal.
//!
//! The handler only counts signals in atomics (async-signal-safe); the launcher's loop
//! reads them. The handlers are installed while at least one [`Forwarding`] lives and
//! the previous dispositions are restored when the last one is dropped.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Sends `signal` to the process group `group` (a rank's pid: each rank leads its own).
/// A group that no longer exists is not an error: its processes are gone.
pub(crate) fn signal_group(group: u32, signal: i32) {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is
    // involved. The group is a rank this launcher started; its id stays taken while
    // any process is in it, and an empty group's id is only reused after the pids wrap.
    unsafe { libc::kill(-group, signal) };
}

/// The signals the launcher passes on to its ranks.
pub(crate) const FORWARDED: [i32; 2] = [libc::SIGINT, libc::SIGTERM];

/// How many forwarded signals arrived since the process started, and the last one.
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static LAST: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(signal: libc::c_int) {
    LAST.store(signal, Ordering::SeqCst);
    RECEIVED.fetch_add(1, Ordering::SeqCst);
}

/// How many [`Forwarding`]s live, and the dispositions they replaced.
static INSTALLED: Mutex<(usize, Vec<(i32, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

/// While it lives, `SIGINT` and `SIGTERM` do not end this process but are noted;
/// [`Forwarding::take`] says whether one arrived since it last looked.
pub(crate) struct Forwarding {
    seen: u64,
}

impl Forwarding {
    pub(crate) fn install() -> Forwarding {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if installed.0 == 0 {
            for signal in FORWARDED {
                // SAFETY: sigaction(2) with a zeroed (valid: empty mask, no flags)
                // struct whose handler is `note`, an extern "C" fn that only touches
                // atomics; the old disposition is written into `old`.
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = note as extern "C" fn(libc::c_int) as libc::sighandler_t;
                    libc::sigemptyset(&mut action.sa_mask);
                    action.sa_flags = libc::SA_RESTART;
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(signal, &action, &mut old) == 0 {
                        installed.1.push((signal, old));
                    }
                }
            }
        }
        installed.0 += 1;
        Forwarding {
            seen: RECEIVED.load(Ordering::SeqCst),
        }
    }

    /// The last forwarded signal, if any arrived since the last call.
    pub(crate) fn take(&mut self) -> Option<i32> {
        let received = RECEIVED.load(Ordering::SeqCst);
        (received != self.seen).then(|| {
            self.seen = received;
            LAST.load(Ordering::SeqCst)
        })
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed.0 -= 1;
        if installed.0 == 0 {
            for (signal, old) in installed.1.drain(..) {
                // SAFETY: restores the disposition sigaction(2) returned for `signal`.
                unsafe { libc::sigaction(signal, &old, std::ptr::null_mut()) };
            }
        }
    }
}

/// Ends this process the way `signal` would (its default action), so that a shell sees
/// a launcher that was interrupted as interrupted; exits with `128 + signal` if the
/// signal's default action does not end it.
pub fn exit_like_signal(signal: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: signal(2) to the default action and raise(3); no memory is involved.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
    std::process::exit(128 + signal)
}
