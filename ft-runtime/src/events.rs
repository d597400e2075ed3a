//! [`Event`]s and the `EventQueue` that carries them from the progress thread to the
//! application threads that take them ([`Runtime::next_event`](crate::Runtime::next_event)).
//!
//! A task runtime learns of a remote task from its activation, not by asking for a task
//! id it cannot know yet: the queue tells it, in the order this rank learned it, that an
//! activation arrived ([`Event::Arrived`]), that an output is ready, that a broadcast
//! cannot complete here, that a rank failed, that the survivors agreed on `G`, that
//! the communicator was revoked, and the messages other ranks sent it.
//!
//! Invariants (checked by the loom tests under `cfg(loom)`):
//! - every event pushed is taken exactly once, by one taker, whatever the number of
//!   taking threads; a single taker sees events in push order;
//! - a taker blocked in `EventQueue::next` wakes on a push and on the close (no lost
//!   wake-up); events queued before the close are still handed out after it;
//! - the notification descriptor (`EventQueue::fd`, an eventfd on Linux) is readable
//!   exactly while events are queued: its counter is set on the push that makes the
//!   queue non-empty and reset on the take that empties it, both under the queue's
//!   lock;
//! - memory is bounded: at most `capacity` events wait. Beyond that a push is dropped
//!   and counted, and once there is room again one [`Event::Overflowed`] takes the
//!   dropped events' place in the order (the model of inotify's `IN_Q_OVERFLOW`), so an
//!   application that never takes events pays a bounded amount and one that falls
//!   behind learns it did.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ft_bcast::{BcastError, Bytes, OutputSet, TaskId};
use ft_core::{Rank, RankSet};

use crate::shared::Stopped;
use crate::sync::{Condvar, Mutex, MutexGuard};

/// How many events may wait in a handle's queue by default.
pub const DEFAULT_EVENT_CAPACITY: usize = 1 << 16;

/// Something this rank learned; see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// An activation reached this rank: it is a destination of `outputs` of broadcast
    /// `task` (its root and key) in tree `tree`. Comes before any of these outputs is
    /// ready; once per tree this rank is a destination in.
    Arrived {
        /// The broadcast: the rank that started it and its key there.
        task: TaskId,
        /// The root's activation header ([`Runtime::start_with_header`](crate::Runtime::start_with_header)),
        /// as a slice of the frame it arrived in.
        header: Bytes,
        /// The tree this rank was activated in.
        tree: u32,
        /// The outputs this rank needs from that tree.
        outputs: OutputSet,
    },
    /// This rank holds output `output` of broadcast `task`: read it with
    /// [`Runtime::wait_outputs`](crate::Runtime::wait_outputs), which returns at once.
    /// Once per output.
    OutputReady {
        /// The broadcast.
        task: TaskId,
        /// The output's index.
        output: u32,
    },
    /// Broadcast `task` cannot complete here: no live ancestor is left (the root died).
    Abandoned {
        /// The broadcast.
        task: TaskId,
    },
    /// Broadcast `task` failed here (the communicator was revoked).
    Failed {
        /// The broadcast.
        task: TaskId,
        /// Why.
        error: BcastError,
    },
    /// This rank learned that `rank` failed: from its detector, from a peer's notice,
    /// or from an agreed `G`. Once per rank.
    RankFailed {
        /// The failed rank.
        rank: Rank,
    },
    /// Global validation `epoch` finished here: `failed` is `G`, `new` the ranks this
    /// validation added to it. Every rank named in `failed` had its
    /// [`Event::RankFailed`] before this.
    Validated {
        /// The validation's epoch (1 for the first).
        epoch: u32,
        /// `G`.
        failed: RankSet,
        /// The ranks this validation added to `G`.
        new: RankSet,
    },
    /// The communicator was revoked, first by rank `by` as far as this rank saw.
    Revoked {
        /// The revoking rank.
        by: Rank,
    },
    /// Rank `from` sent this rank `bytes` under `tag`
    /// ([`Runtime::send`](crate::Runtime::send)): in the order `from` sent them.
    Message {
        /// The sender.
        from: Rank,
        /// The sender's tag.
        tag: u64,
        /// The message (the buffer it arrived in, shared: no copy).
        bytes: Bytes,
    },
    /// A spare took failed rank `rank`'s number in this rebuilt group
    /// ([`Runtime::rebuild`](crate::Runtime::rebuild)): it is in its `generation`-th
    /// incarnation. The first events of a rebuilt group's handle, one per rank replaced.
    Replaced {
        /// The rank.
        rank: Rank,
        /// Its incarnation now.
        generation: u32,
    },
    /// This rank, a spare, was admitted into rebuilt group `group` as rank `rank`, in
    /// its `generation`-th incarnation: on the handle it waited on, take the new handle
    /// with [`Runtime::admitted`](crate::Runtime::admitted); the new handle's first
    /// event is this one too.
    Admitted {
        /// The rebuilt group.
        group: crate::GroupId,
        /// This rank's number there.
        rank: Rank,
        /// Its incarnation.
        generation: u32,
    },
    /// The queue was full: `dropped` events were lost here, in this place in the order.
    Overflowed {
        /// How many.
        dropped: u64,
    },
}

struct State {
    events: VecDeque<Event>,
    capacity: usize,
    dropped: u64,
    closed: Option<Stopped>,
}

impl State {
    /// Queues `event` if there is room (after an `Overflowed` for what was dropped
    /// before, if any); whether the queue went from empty to non-empty.
    fn push(&mut self, event: Event) -> bool {
        let was_empty = self.events.is_empty();
        self.make_up_for_drops();
        if self.events.len() < self.capacity {
            self.events.push_back(event);
        } else {
            self.dropped += 1;
        }
        was_empty && !self.events.is_empty()
    }

    fn make_up_for_drops(&mut self) {
        if self.dropped > 0 && self.events.len() < self.capacity {
            self.events.push_back(Event::Overflowed {
                dropped: self.dropped,
            });
            self.dropped = 0;
        }
    }
}

/// The queue a handle's events go through, from its progress thread to any number of
/// taking threads (public for bindings and the `events` benchmark): see the
/// [module docs](self).
pub struct EventQueue {
    state: Mutex<State>,
    ready: Condvar,
    fd: Option<notify::EventFd>,
}

impl EventQueue {
    /// An empty queue of at most `capacity` (at least 1) events, with a notification
    /// descriptor where the platform has one.
    pub fn new(capacity: usize) -> Self {
        EventQueue {
            state: Mutex::new(State {
                events: VecDeque::new(),
                capacity: capacity.max(1),
                dropped: 0,
                closed: None,
            }),
            ready: Condvar::new(),
            fd: notify::EventFd::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single push, pop or assignment: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `events` in order (the progress thread's side) and wakes the takers.
    pub fn push_all(&self, events: impl IntoIterator<Item = Event>) {
        let mut state = self.lock();
        let mut became_ready = false;
        for event in events {
            became_ready |= state.push(event);
        }
        if became_ready {
            if let Some(fd) = &self.fd {
                fd.set();
            }
        }
        let queued = !state.events.is_empty();
        drop(state);
        if queued {
            self.ready.notify_all();
        }
    }

    /// Marks the progress thread ended (the first reason stays); wakes every taker.
    pub fn close(&self, why: Stopped) {
        let mut state = self.lock();
        state.closed.get_or_insert(why);
        drop(state);
        self.ready.notify_all();
    }

    /// Takes the oldest event; resets the descriptor when it was the last one.
    fn take(&self, state: &mut State) -> Option<Event> {
        let event = state.events.pop_front()?;
        state.make_up_for_drops();
        if state.events.is_empty() {
            if let Some(fd) = &self.fd {
                fd.reset();
            }
        }
        Some(event)
    }

    /// The oldest event, if one is queued; [`Stopped`] once the queue is empty and the
    /// progress thread has ended.
    pub fn try_next(&self) -> Result<Option<Event>, Stopped> {
        let mut state = self.lock();
        match self.take(&mut state) {
            Some(event) => Ok(Some(event)),
            None => match &state.closed {
                Some(why) => Err(why.clone()),
                None => Ok(None),
            },
        }
    }

    /// The oldest event, waiting for one for up to `timeout` (forever with `None`);
    /// `Ok(None)` when the timeout passed first; [`Stopped`] once the queue is empty and
    /// the progress thread has ended.
    pub fn next(&self, timeout: Option<Duration>) -> Result<Option<Event>, Stopped> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.lock();
        loop {
            if let Some(event) = self.take(&mut state) {
                return Ok(Some(event));
            }
            if let Some(why) = &state.closed {
                return Err(why.clone());
            }
            state = match deadline {
                None => self.ready.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.ready
                        .wait_timeout(state, left)
                        .map(|(state, _)| state)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            };
        }
    }

    /// The descriptor that is readable while events are queued, if there is one.
    #[cfg(unix)]
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.fd.as_ref().map(notify::EventFd::borrow)
    }
}

/// The notification descriptor: an eventfd on Linux (outside loom, which cannot model
/// a kernel object); nothing elsewhere.
#[cfg(all(target_os = "linux", not(loom)))]
mod notify {
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    pub(super) struct EventFd(OwnedFd);

    impl EventFd {
        /// A non-blocking eventfd with its counter at 0; `None` if the kernel refuses.
        pub(super) fn new() -> Option<Self> {
            // SAFETY: eventfd takes no pointers; a non-negative result is a new
            // descriptor that nothing else owns.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            // SAFETY: `fd` is a fresh descriptor owned by nobody else.
            (fd >= 0).then(|| EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
        }

        /// Makes the descriptor readable (the counter becomes non-zero).
        pub(super) fn set(&self) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own descriptor. It cannot
            // block (non-blocking) and cannot overflow from 1-increments between resets.
            let _ = unsafe {
                libc::write(
                    self.0.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }

        /// Makes the descriptor unreadable again (reads the counter back to 0).
        pub(super) fn reset(&self) {
            let mut count: u64 = 0;
            // SAFETY: reads at most 8 bytes into a live u64 from our own descriptor;
            // non-blocking, so a counter already at 0 returns EAGAIN at once.
            let _ = unsafe {
                libc::read(
                    self.0.as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }

        pub(super) fn borrow(&self) -> BorrowedFd<'_> {
            self.0.as_fd()
        }
    }
}

#[cfg(not(all(target_os = "linux", not(loom))))]
mod notify {
    /// No descriptor on this platform (or under loom).
    pub(super) enum EventFd {}

    impl EventFd {
        pub(super) fn new() -> Option<Self> {
            None
        }

        pub(super) fn set(&self) {
            match *self {}
        }

        pub(super) fn reset(&self) {
            match *self {}
        }

        #[cfg(unix)]
        pub(super) fn borrow(&self) -> std::os::fd::BorrowedFd<'_> {
            match *self {}
        }
    }
}

/// The event the tests push: a failed rank.
#[cfg(test)]
fn failed(rank: Rank) -> Event {
    Event::RankFailed { rank }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Whether the descriptor polls readable now.
    fn readable(queue: &EventQueue) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: queue.fd().expect("an eventfd on Linux").as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 1 && pfd.revents & libc::POLLIN != 0
    }

    #[test]
    fn events_come_out_in_order_and_once() {
        let queue = EventQueue::new(8);
        queue.push_all([failed(1), failed(2)]);
        queue.push_all([failed(3)]);
        assert_eq!(queue.try_next(), Ok(Some(failed(1))));
        assert_eq!(queue.next(None), Ok(Some(failed(2))));
        assert_eq!(queue.next(Some(Duration::ZERO)), Ok(Some(failed(3))));
        assert_eq!(queue.try_next(), Ok(None));
        assert_eq!(queue.next(Some(Duration::from_millis(5))), Ok(None));
    }

    #[test]
    fn the_descriptor_is_readable_exactly_while_events_wait() {
        let queue = EventQueue::new(8);
        assert!(!readable(&queue));
        queue.push_all([failed(1), failed(2)]);
        assert!(readable(&queue));
        queue.try_next().unwrap();
        assert!(readable(&queue), "one event still waits");
        queue.try_next().unwrap();
        assert!(!readable(&queue));
        queue.push_all([failed(3)]);
        assert!(readable(&queue));
    }

    #[test]
    fn a_full_queue_drops_and_says_how_many() {
        let queue = EventQueue::new(2);
        queue.push_all((0..5).map(failed));
        assert_eq!(queue.try_next(), Ok(Some(failed(0))));
        // Room again: the three dropped events are reported where they would have been.
        assert_eq!(queue.try_next(), Ok(Some(failed(1))));
        assert_eq!(queue.try_next(), Ok(Some(Event::Overflowed { dropped: 3 })));
        queue.push_all([failed(9)]);
        assert_eq!(queue.try_next(), Ok(Some(failed(9))));
        assert_eq!(queue.try_next(), Ok(None));
    }

    #[test]
    fn queued_events_outlive_the_close() {
        let queue = EventQueue::new(8);
        queue.push_all([failed(4)]);
        queue.close(Stopped::Ended("declared dead".into()));
        queue.close(Stopped::Ended("later reason".into()));
        assert_eq!(queue.next(None), Ok(Some(failed(4))));
        assert_eq!(
            queue.next(None),
            Err(Stopped::Ended("declared dead".into()))
        );
        assert_eq!(
            queue.try_next(),
            Err(Stopped::Ended("declared dead".into()))
        );
    }

    #[test]
    fn a_blocked_taker_wakes_on_a_push_from_another_thread() {
        let queue = std::sync::Arc::new(EventQueue::new(8));
        let taker = {
            let queue = std::sync::Arc::clone(&queue);
            std::thread::spawn(move || queue.next(Some(Duration::from_secs(30))))
        };
        std::thread::sleep(Duration::from_millis(20));
        queue.push_all([failed(7)]);
        assert_eq!(taker.join().unwrap(), Ok(Some(failed(7))));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom_model::model;
    use loom::sync::Arc;
    use loom::thread;

    fn rank_of(event: Event) -> Rank {
        match event {
            Event::RankFailed { rank } => rank,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Two takers block while the progress thread pushes two events in two pushes:
    /// each event reaches exactly one taker, nobody sleeps through a push.
    #[test]
    fn each_event_reaches_exactly_one_taker() {
        model("each_event_reaches_exactly_one_taker", || {
            let queue = Arc::new(EventQueue::new(8));
            let takers: Vec<_> = (0..2)
                .map(|_| {
                    let queue = Arc::clone(&queue);
                    thread::spawn(move || rank_of(queue.next(None).unwrap().unwrap()))
                })
                .collect();
            queue.push_all([failed(1)]);
            queue.push_all([failed(2)]);
            let mut got: Vec<Rank> = takers.into_iter().map(|t| t.join().unwrap()).collect();
            got.sort_unstable();
            assert_eq!(got, [1, 2]);
        });
    }

    /// One taker sees events in push order, across pushes racing its takes.
    #[test]
    fn one_taker_sees_push_order() {
        model("one_taker_sees_push_order", || {
            let queue = Arc::new(EventQueue::new(8));
            let taker = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || {
                    let a = rank_of(queue.next(None).unwrap().unwrap());
                    let b = rank_of(queue.next(None).unwrap().unwrap());
                    (a, b)
                })
            };
            queue.push_all([failed(1)]);
            queue.push_all([failed(2)]);
            assert_eq!(taker.join().unwrap(), (1, 2));
        });
    }

    /// The progress thread pushes and then ends while a taker waits: the taker gets the
    /// event and then `Stopped`, in every interleaving.
    #[test]
    fn the_close_wakes_a_taker_after_the_last_event() {
        model("the_close_wakes_a_taker_after_the_last_event", || {
            let queue = Arc::new(EventQueue::new(8));
            let taker = {
                let queue = Arc::clone(&queue);
                thread::spawn(move || (queue.next(None), queue.next(None)))
            };
            queue.push_all([failed(3)]);
            queue.close(Stopped::Ended("gone".into()));
            let (first, second) = taker.join().unwrap();
            assert_eq!(first, Ok(Some(failed(3))));
            assert_eq!(second, Err(Stopped::Ended("gone".into())));
        });
    }
}
