//! An opt-in record of when this rank's steps happened, for finding where a
//! broadcast's time goes rank by rank (`ftmpi bench-bcast --timeline`,
//! `scripts/bcast-timeline`).
//!
//! [`mark`] notes a step ([`Mark`], with an argument whose meaning the mark defines)
//! at the wall clock, in the calling thread's own buffer. Recording is off until
//! [`enable`]: then a mark costs a clock read (about 25 ns) and a push; off, a relaxed
//! atomic load. [`take`] returns the calling thread's marks.
//!
//! Invariants: a thread keeps at most the capacity given to [`enable`] marks (later
//! ones are counted in [`Recorded::dropped`], never grow the buffer), so recording
//! allocates once per thread, at its first mark. Marks of one thread are in the order
//! they were made; their times are nanoseconds of the system clock, which ranks on one
//! node share (ranks on different nodes are only as aligned as their clocks: compare
//! windows within a rank there, not instants across ranks).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What happened at a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mark {
    /// A timed repetition starts at this rank (argument: the caller's phase number).
    RepStart,
    /// This rank's part of the repetition is over (argument: the phase).
    RepDone,
    /// The driver hands a received frame to the machine (argument: its sender).
    FrameReceived,
    /// The machine has handled it (argument: its sender).
    FrameHandled,
    /// The driver has sent what the machine queued in answer (argument: 0).
    Flushed,
    /// A transport posted the receive of a payload that follows its head (argument:
    /// the sender).
    PayloadPosted,
    /// A transport saw payload receives complete (argument: how many).
    PayloadLanded,
}

impl Mark {
    /// The mark's name in a written timeline.
    pub fn name(self) -> &'static str {
        match self {
            Mark::RepStart => "rep_start",
            Mark::RepDone => "rep_done",
            Mark::FrameReceived => "frame_received",
            Mark::FrameHandled => "frame_handled",
            Mark::Flushed => "flushed",
            Mark::PayloadPosted => "payload_posted",
            Mark::PayloadLanded => "payload_landed",
        }
    }
}

/// One thread's marks: (nanoseconds since the Unix epoch, mark, argument).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The marks kept, oldest first.
    pub marks: Vec<(u64, Mark, u32)>,
    /// Marks made once the buffer was full.
    pub dropped: u64,
}

static ON: AtomicBool = AtomicBool::new(false);
static CAPACITY: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MINE: RefCell<Recorded> = RefCell::new(Recorded::default());
}

/// Turns recording on for every thread of the process, each keeping at most
/// `capacity` marks (a thread that has already started a buffer keeps that buffer's
/// room until [`take`] empties it).
pub fn enable(capacity: usize) {
    CAPACITY.store(capacity, Ordering::Relaxed);
    ON.store(true, Ordering::Release);
}

/// Whether marks are being recorded.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Notes `what` (with `arg`) now, if recording is on.
#[inline]
pub fn mark(what: Mark, arg: u32) {
    if enabled() {
        record(what, arg);
    }
}

#[cold]
fn record(what: Mark, arg: u32) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    MINE.with(|mine| {
        let mut mine = mine.borrow_mut();
        if mine.marks.capacity() == 0 {
            mine.marks.reserve_exact(CAPACITY.load(Ordering::Relaxed));
        }
        // Bounded by what was reserved, so the buffer never grows (nor reallocates).
        if mine.marks.len() < mine.marks.capacity() {
            mine.marks.push((nanos, what, arg));
        } else {
            mine.dropped += 1;
        }
    });
}

/// The calling thread's marks so far (its buffer starts empty again).
pub fn take() -> Recorded {
    MINE.with(|mine| std::mem::take(&mut *mine.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: recording is process-wide and the crate's tests share the process, so
    // the off case is checked before anything turns it on (no other test enables it).
    #[test]
    fn marks_are_kept_in_order_up_to_the_capacity_once_enabled() {
        let thread_off = std::thread::spawn(|| {
            mark(Mark::RepStart, 1);
            take()
        });
        let off = thread_off.join().unwrap();
        if !enabled() {
            assert_eq!(off, Recorded::default(), "nothing is kept while off");
        }
        enable(3);
        let thread_on = std::thread::spawn(|| {
            mark(Mark::RepStart, 7);
            mark(Mark::FrameReceived, 2);
            mark(Mark::FrameHandled, 2);
            mark(Mark::RepDone, 7);
            take()
        });
        let on = thread_on.join().unwrap();
        let kinds: Vec<(Mark, u32)> = on.marks.iter().map(|&(_, m, a)| (m, a)).collect();
        assert_eq!(
            kinds,
            [
                (Mark::RepStart, 7),
                (Mark::FrameReceived, 2),
                (Mark::FrameHandled, 2)
            ]
        );
        assert_eq!(on.dropped, 1, "the fourth mark is past the capacity");
        assert_eq!(take(), Recorded::default(), "each thread keeps its own");
    }
}
