//! Long edges: the long observer and the long-watched set.
//!
//! A rank heartbeats its long observer, the first rank not in `K_i` at `span` ranks
//! ahead or farther, every other period, and watches the ranks whose long observer it
//! is, each with its own deadline. Distances count every rank, dead or not, so a death
//! moves no other rank's long edge; only ranks that join the set when `pred(i)` moves
//! back past a dead run are asked for heartbeats and get a round trip's grace. The
//! bounds this gives a node failure are in the [detector's documentation](super).

use alloc::vec::Vec;

use super::{Detector, LongWatch, Outgoing, Timer, Watch};
use crate::rank::Rank;
use crate::time::{Duration, Instant};

impl Detector {
    /// Silence after which a long-watched rank is declared: two periods more than the
    /// ring's. One covers the long edge's beat, every other period; the other lets the
    /// ring observer's notice of a lone death (`⌈log2 span⌉` hops away) usually arrive
    /// first, so that the death is declared once.
    pub(super) fn long_timeout(&self) -> Duration {
        self.config.timeout + self.config.period.saturating_mul(2)
    }

    /// Our long observer: the first rank not in `K_i` at `span` ranks ahead or farther
    /// (distance counted over every rank, dead or not), if the long edge is on.
    pub(super) fn long_observer_now(&self) -> Option<Rank> {
        if self.span == 0 {
            return None;
        }
        self.walk(self.config.me, self.span, true)
    }

    /// The ranks whose long observer we are: those not in `K_i` whose rank plus `span`
    /// falls in `(pred(i), i]`, i.e. at backward distance `[span, span + back(pred))`.
    /// Counting over every rank keeps the edges still while ranks die: a rank joins the
    /// set only when our ring predecessor moves back past a dead run, so the watchers
    /// of a block never chase one another, and the ranks just before a dead run stay
    /// watched by the ranks just after it. At most `span` ranks: the distances past
    /// `back(pred)` all land in the dead run between `pred(i)` and us.
    pub(super) fn long_set(&self) -> Vec<Rank> {
        let Some(pred) = self.watched.filter(|_| self.span > 0) else {
            return Vec::new();
        };
        let n = u64::from(self.config.n);
        let me = u64::from(self.config.me);
        let span = u64::from(self.span);
        let stop = (span + u64::from(self.back(pred))).min(n);
        (span..stop)
            .map(|b| ((me + n - b) % n) as Rank)
            .filter(|&r| !self.dead.contains(r))
            .collect()
    }

    /// The LongSuspect timer at the earliest long-watched deadline.
    pub(super) fn arm_long_timer(&mut self) {
        let next = self.long_watched.iter().map(|watch| watch.deadline).min();
        self.set_timer(Timer::LongSuspect, next.unwrap_or(Instant::MAX));
    }

    /// Moves the long observer after `K_i` grew, and drops an extra long observer that
    /// died or has become the long observer.
    pub(super) fn refresh_long_observer(&mut self) {
        self.long_observer = self.long_observer_now();
        if let Some(x) = self.extra_long_observer {
            if self.dead.contains(x) || Some(x) == self.long_observer {
                self.extra_long_observer = None;
            }
        }
    }

    /// Recomputes the long-watched set after `K_i` grew. Members keep their deadlines; a
    /// new one is asked for heartbeats and gets a round trip's grace.
    pub(super) fn refresh_long_watched(&mut self) {
        let grace = self.round_trip_deadline();
        let old = core::mem::take(&mut self.long_watched);
        for rank in self.long_set() {
            match old.iter().find(|watch| watch.rank == rank) {
                Some(&kept) => self.long_watched.push(kept),
                None => {
                    self.outbox.push_back(Outgoing::Observe(rank, Watch::Long));
                    self.long_watched.push(LongWatch {
                        rank,
                        deadline: grace,
                        startup: false,
                    });
                }
            }
        }
        self.arm_long_timer();
    }

    /// A heartbeat from `from`: a long-watched rank's deadline moves to a long timeout
    /// from now.
    pub(super) fn heard_long(&mut self, from: Rank) {
        let long_deadline = self.now + self.long_timeout();
        if let Some(watch) = self.long_watched.iter_mut().find(|w| w.rank == from) {
            if watch.startup {
                // Heard once: the start-up grace ends.
                watch.startup = false;
                watch.deadline = long_deadline;
            } else {
                // Never shorten a re-target grace with an early heartbeat.
                watch.deadline = watch.deadline.max(long_deadline);
            }
            self.arm_long_timer();
        }
    }
}
