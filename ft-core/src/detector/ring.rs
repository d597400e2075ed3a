//! The ring: `K_i`, the watched predecessor and re-targeting.
//!
//! Over the ranks not in `K_i`, `pred(i)` (the field `watched`) is always the nearest
//! predecessor and the observer the nearest successor. Whenever `K_i` grows, the ring is
//! walked again: a new `pred(i)` is sent an `Observe` and given a round trip to be heard
//! from, unless a probe window (module `windows`) holds it. Distances are counted over
//! every rank, dead or not.

use super::{Detector, Outgoing, Timer, Watch, STARTUP_GRACE_TIMEOUTS, TIMERS};
use crate::rank::Rank;
use crate::time::{Duration, Instant};

impl Detector {
    /// When a rank just asked for heartbeats (a re-target, a new long-watched rank) must
    /// have answered: a round trip, `2 · timeout` from now.
    pub(super) fn round_trip_deadline(&self) -> Instant {
        self.now + self.config.timeout.saturating_mul(2)
    }

    /// How long a watched rank has from the detector's creation to be heard from once:
    /// [`STARTUP_GRACE_TIMEOUTS`] timeouts.
    pub(super) fn startup_grace(&self) -> Duration {
        self.config
            .timeout
            .saturating_mul(STARTUP_GRACE_TIMEOUTS.into())
    }

    /// How far back from us `rank` is on the ring (`1` for our ring neighbour).
    pub(super) fn back(&self, rank: Rank) -> u32 {
        let n = u64::from(self.config.n);
        ((u64::from(self.config.me) + n - u64::from(rank)) % n) as u32
    }

    /// The first rank not in `K_i` and not us, starting `dist` away from `from` and
    /// walking forward (towards higher ranks) or backward, modulo `n`.
    pub(super) fn walk(&self, from: Rank, dist: u32, forward: bool) -> Option<Rank> {
        let n = u64::from(self.config.n);
        let step = |r: u64, d: u64| {
            if forward {
                (r + d) % n
            } else {
                (r + n - d % n) % n
            }
        };
        let mut r = step(u64::from(from), u64::from(dist));
        for _ in 0..n {
            let rank = r as Rank;
            if rank == self.config.me {
                return None;
            }
            if !self.dead.contains(rank) {
                return Some(rank);
            }
            r = step(r, 1);
        }
        None
    }

    /// Adds `fresh` (not yet in `K_i`, not us) to `K_i`, then: sends `K_i` to our ring
    /// predecessor, hands the sub-range of every tree child now known dead to the next
    /// live rank of that range, re-targets the watch and updates the long edges.
    pub(super) fn learn(&mut self, fresh: &[Rank], hops: u32) {
        if fresh.is_empty() {
            return;
        }
        for &r in fresh {
            self.dead.insert(r);
        }
        let watched = self.walk(self.config.me, 1, false);
        self.ring_edge_due = watched.map(|p| (p, hops));
        self.repair_children(fresh, hops);
        self.refresh_long_observer();
        if let Some(x) = self.extra_observer {
            if self.dead.contains(x) || Some(x) == self.observer() {
                self.extra_observer = None;
            }
        }
        if watched != self.watched {
            self.watched = watched;
            match watched {
                Some(p) => self.retarget(p),
                None => {
                    self.window = None;
                    self.timers = [Instant::MAX; TIMERS];
                }
            }
        }
        self.refresh_long_watched();
    }

    /// Our ring predecessor became `p` (every rank between it and us is known dead):
    /// ask it for heartbeats, and give it two delays' worth of grace, unless a probe
    /// window holds it (see [`Detector::window_on_retarget`]).
    fn retarget(&mut self, p: Rank) {
        self.awaiting_first = false;
        self.outbox.push_back(Outgoing::Observe(p, Watch::Ring));
        if !self.window_on_retarget(p) {
            let grace = self.round_trip_deadline();
            self.set_timer(Timer::Suspect, grace);
        }
    }
}
