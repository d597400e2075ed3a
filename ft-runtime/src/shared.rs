//! [`Shared`]: everything the application threads and the progress thread share, behind
//! one mutex and one condition variable.
//!
//! - **Commands** go from application threads to the progress thread: `submit` queues
//!   one under a fresh ticket, the progress thread drains the queue with
//!   `take_commands` at every turn of its loop.
//! - **Outcomes** come back by ticket: the progress thread `complete`s a ticket, and the
//!   application thread that holds it `wait`s for it (on the condition variable).
//! - **The published snapshot** (the failure view as of the progress thread's last
//!   change) is replaced whole by `publish` and read by `snapshot` as an `Arc`, so a
//!   reader never sees half of an update and never blocks the progress thread for
//!   longer than an `Arc` clone.
//! - **Closing** (`close`: the progress thread ended, with the reason) wakes every
//!   waiter; a ticket that was not completed before the close fails with
//!   [`Stopped`], and later submissions fail at once.
//!
//! The queues are heap-allocated, not fixed-capacity (`heapless`): a bounded command
//! queue would have to refuse or block an application thread when full, yet the number
//! of commands in flight is bounded only by the application's threads, and commands
//! and outcomes own heap data anyway (broadcast payloads, agreed sets of any size).
//!
//! Invariants (checked by the loom tests under `cfg(loom)`): every outcome reaches the
//! holder of its ticket exactly once; a waiter never sleeps through its completion or
//! the close (no lost wake-up); snapshot versions seen by any one reader never go back.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use ft_core::Rank;

use crate::sync::{Condvar, Mutex, MutexGuard};

/// Names one submitted command and its outcome.
pub(crate) type Ticket = u64;

/// Why the progress thread has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Rank `by` declared this rank dead, rightly or not. The rank stops for good
    /// (fail-stop): its peers go on without it, so it must not act as a live rank.
    DeclaredDead {
        /// The observer whose declaration reached this rank.
        by: Rank,
    },
    /// The global validation `epoch` agreed that this rank failed; it stops for good,
    /// as under [`DeclaredDead`](Stopped::DeclaredDead).
    Excluded {
        /// The validation's epoch.
        epoch: u32,
    },
    /// Any other end: a shutdown, a backend error, a thread that could not start.
    Ended(String),
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stopped::DeclaredDead { by } => write!(f, "declared dead by rank {by} (fail-stop)"),
            Stopped::Excluded { epoch } => {
                write!(f, "excluded by global validation {epoch} (fail-stop)")
            }
            Stopped::Ended(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Stopped {}

struct State<C, O, S> {
    commands: VecDeque<(Ticket, C)>,
    outcomes: Vec<(Ticket, O)>,
    next_ticket: Ticket,
    snapshot: (u64, Arc<S>),
    closed: Option<Stopped>,
}

/// See the [module docs](self).
pub(crate) struct Shared<C, O, S> {
    state: Mutex<State<C, O, S>>,
    changed: Condvar,
}

impl<C, O, S> Shared<C, O, S> {
    /// Nothing queued; `snapshot` published as version 0.
    pub(crate) fn new(snapshot: S) -> Self {
        Shared {
            state: Mutex::new(State {
                commands: VecDeque::new(),
                outcomes: Vec::new(),
                next_ticket: 0,
                snapshot: (0, Arc::new(snapshot)),
                closed: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<C, O, S>> {
        // A panic while holding the lock leaves the state consistent (every update is
        // a single push, pop or assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ----- application side -----

    /// Queues `command`; its outcome comes to `wait` of the returned ticket.
    pub(crate) fn submit(&self, command: C) -> Result<Ticket, Stopped> {
        let mut state = self.lock();
        if let Some(why) = &state.closed {
            return Err(why.clone());
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.commands.push_back((ticket, command));
        Ok(ticket)
    }

    /// Blocks until `ticket` is completed (its outcome) or the progress thread ends
    /// without completing it.
    pub(crate) fn wait(&self, ticket: Ticket) -> Result<O, Stopped> {
        let mut state = self.lock();
        loop {
            if let Some(at) = state.outcomes.iter().position(|(t, _)| *t == ticket) {
                return Ok(state.outcomes.swap_remove(at).1);
            }
            if let Some(why) = &state.closed {
                return Err(why.clone());
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Why the progress thread ended, once it has (submissions fail with it).
    pub(crate) fn closed(&self) -> Option<Stopped> {
        self.lock().closed.clone()
    }

    /// The latest published snapshot and its version (0 for the initial one).
    pub(crate) fn snapshot(&self) -> (u64, Arc<S>) {
        let state = self.lock();
        (state.snapshot.0, Arc::clone(&state.snapshot.1))
    }

    // ----- progress side -----

    /// Every command queued so far, oldest first.
    pub(crate) fn take_commands(&self) -> Vec<(Ticket, C)> {
        self.lock().commands.drain(..).collect()
    }

    /// Hands `outcome` to the holder of `ticket`.
    pub(crate) fn complete(&self, ticket: Ticket, outcome: O) {
        self.lock().outcomes.push((ticket, outcome));
        self.changed.notify_all();
    }

    /// Replaces the published snapshot (the next version).
    pub(crate) fn publish(&self, snapshot: S) {
        let snapshot = Arc::new(snapshot);
        let mut state = self.lock();
        state.snapshot = (state.snapshot.0 + 1, snapshot);
    }

    /// Marks the progress thread ended (the first reason given stays): queued
    /// commands are dropped, waiters without an outcome get [`Stopped`].
    pub(crate) fn close(&self, why: Stopped) {
        let mut state = self.lock();
        state.closed.get_or_insert(why);
        state.commands.clear();
        drop(state);
        self.changed.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn outcomes_go_to_their_tickets() {
        let shared: Shared<&str, u32, ()> = Shared::new(());
        let a = shared.submit("a").unwrap();
        let b = shared.submit("b").unwrap();
        assert_eq!(shared.take_commands(), [(a, "a"), (b, "b")]);
        shared.complete(b, 2);
        shared.complete(a, 1);
        assert_eq!(shared.wait(a), Ok(1));
        assert_eq!(shared.wait(b), Ok(2));
    }

    #[test]
    fn close_fails_open_tickets_and_later_submissions() {
        let shared: Shared<&str, u32, ()> = Shared::new(());
        let done = shared.submit("done").unwrap();
        let open = shared.submit("open").unwrap();
        shared.complete(done, 7);
        shared.close(Stopped::Ended("MPI error".into()));
        shared.close(Stopped::Ended("second reason".into()));
        assert_eq!(shared.wait(done), Ok(7), "completed before the close");
        assert_eq!(shared.wait(open), Err(Stopped::Ended("MPI error".into())));
        assert_eq!(
            shared.submit("late"),
            Err(Stopped::Ended("MPI error".into()))
        );
        assert!(shared.take_commands().is_empty());
    }

    #[test]
    fn snapshots_are_versioned() {
        let shared: Shared<(), (), u32> = Shared::new(10);
        assert_eq!(*shared.snapshot().1, 10);
        shared.publish(11);
        shared.publish(12);
        let (version, value) = shared.snapshot();
        assert_eq!((version, *value), (2, 12));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom_model::model;
    use loom::sync::Arc as LoomArc;
    use loom::thread;

    /// An application thread submits and waits while the progress thread serves it:
    /// the outcome arrives, once, in every interleaving (no lost wake-up).
    #[test]
    fn a_waiter_gets_its_outcome() {
        model("a_waiter_gets_its_outcome", || {
            let shared: LoomArc<Shared<u32, u32, ()>> = LoomArc::new(Shared::new(()));
            let app = {
                let shared = LoomArc::clone(&shared);
                thread::spawn(move || {
                    let ticket = shared.submit(20).unwrap();
                    shared.wait(ticket)
                })
            };
            // The progress thread's loop, until it has served one command.
            loop {
                let commands = shared.take_commands();
                if let Some(&(ticket, command)) = commands.first() {
                    shared.complete(ticket, command + 1);
                    break;
                }
                thread::yield_now();
            }
            assert_eq!(app.join().unwrap(), Ok(21));
        });
    }

    /// The progress thread ends while a command is queued or being waited for: the
    /// waiter wakes with `Stopped`, never sleeps forever.
    #[test]
    fn close_wakes_every_waiter() {
        model("close_wakes_every_waiter", || {
            let shared: LoomArc<Shared<u32, u32, ()>> = LoomArc::new(Shared::new(()));
            let app = {
                let shared = LoomArc::clone(&shared);
                thread::spawn(move || match shared.submit(1) {
                    Ok(ticket) => shared.wait(ticket),
                    Err(stopped) => Err(stopped),
                })
            };
            shared.close(Stopped::Ended("gone".into()));
            assert_eq!(app.join().unwrap(), Err(Stopped::Ended("gone".into())));
        });
    }

    /// Two waiters, one completion each, completed in either order by the progress
    /// thread: each gets its own outcome.
    #[test]
    fn outcomes_never_cross() {
        model("outcomes_never_cross", || {
            let shared: LoomArc<Shared<u32, u32, ()>> = LoomArc::new(Shared::new(()));
            let waiters: Vec<_> = [1u32, 2]
                .into_iter()
                .map(|value| {
                    let shared = LoomArc::clone(&shared);
                    thread::spawn(move || {
                        let ticket = shared.submit(value).unwrap();
                        (value, shared.wait(ticket))
                    })
                })
                .collect();
            let mut served = 0;
            while served < 2 {
                for (ticket, value) in shared.take_commands() {
                    shared.complete(ticket, value * 10);
                    served += 1;
                }
                thread::yield_now();
            }
            for waiter in waiters {
                let (value, outcome) = waiter.join().unwrap();
                assert_eq!(outcome, Ok(value * 10));
            }
        });
    }

    /// A reader racing two publications sees versions that never go back, each with
    /// the value published under it.
    #[test]
    fn snapshot_versions_only_grow() {
        model("snapshot_versions_only_grow", || {
            let shared: LoomArc<Shared<(), (), u64>> = LoomArc::new(Shared::new(0));
            let reader = {
                let shared = LoomArc::clone(&shared);
                thread::spawn(move || {
                    let (v1, s1) = shared.snapshot();
                    let (v2, s2) = shared.snapshot();
                    assert!(v1 <= v2);
                    assert_eq!((*s1, *s2), (v1 * 100, v2 * 100));
                })
            };
            shared.publish(100);
            shared.publish(200);
            reader.join().unwrap();
        });
    }
}
