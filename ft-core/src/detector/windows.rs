//! Probe windows: the ranks past a long run of known-dead ranks, probed at once.
//!
//! A run of more than `span` dead ranks outruns the long edges. When the ring
//! predecessor moves back past a known-dead run of `run ≥ span` ranks, the next `3 · run`
//! ranks not in `K_i` are probed together (`Observe` with the probe relation: one
//! heartbeat back, no subscription) and given `2 · timeout - period`; then every probed
//! rank nearer than the nearest answer is declared in one declaration, so the known run
//! grows fourfold per window. A heartbeat from the watched predecessor closes the
//! window: what lies behind a live rank is that rank's watch.

use alloc::vec::Vec;

use super::{Detector, Outgoing, Timer, Watch};
use crate::rank::Rank;
use crate::time::Duration;

/// The predecessors probed at once after a re-target past a long run of dead ranks:
/// every rank not known dead at backward distance `[back(watched), far]` got a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Window {
    /// Backward distance of the farthest probed rank.
    far: u32,
    /// Backward distance of the nearest probed rank that answered.
    nearest_reply: Option<u32>,
}

impl Detector {
    /// Grace given to the window's probes: two delays (probe and answer) fit in it while
    /// delays stay below `timeout - period`, with a period to spare.
    fn window_grace(&self) -> Duration {
        self.config
            .timeout
            .saturating_mul(2)
            .saturating_sub(self.config.period)
    }

    /// Whether a probe window holds the Suspect timer for the new ring predecessor `p`:
    /// an open window in which `p` was probed and has not answered yet keeps its grace;
    /// past a run of at least `span` known-dead ranks (the long edges may have missed the
    /// rest of a block) a new window probes the next `3 · run` predecessors at once, and
    /// when its grace ends every probed rank nearer than the nearest answer is declared
    /// in one go. Otherwise (no long run, or `p` answered its probe) the caller gives `p`
    /// a round trip.
    pub(super) fn window_on_retarget(&mut self, p: Rank) -> bool {
        let back = self.back(p);
        if let Some(w) = self.window {
            if back <= w.far && w.nearest_reply.is_none_or(|b| back < b) {
                // `p` was probed and has not answered yet: the window's grace holds.
                return true;
            }
            self.window = None;
            if w.nearest_reply == Some(back) {
                // `p` answered its probe: it is alive, no window behind it is ours.
                return false;
            }
        }
        let run = back - 1;
        if self.span == 0 || run < self.span {
            return false;
        }
        let width = run.saturating_mul(3);
        let (mut at, mut far) = (p, back);
        for _ in 1..width {
            let Some(next) = self.walk(at, 1, false) else {
                break;
            };
            self.outbox.push_back(Outgoing::Observe(next, Watch::Probe));
            far = self.back(next);
            at = next;
        }
        self.window = Some(Window {
            far,
            nearest_reply: None,
        });
        let grace = self.now + self.window_grace();
        self.set_timer(Timer::Suspect, grace);
        true
    }

    /// A heartbeat from `from`: if it was probed by the open window, it may be the
    /// nearest answer.
    pub(super) fn heard_probed(&mut self, from: Rank) {
        let back = self.back(from);
        if let Some(w) = self.window.as_mut() {
            if back <= w.far && w.nearest_reply.is_none_or(|b| back < b) {
                w.nearest_reply = Some(back);
            }
        }
    }

    /// The ranks the Suspect timer declares: the watched predecessor, or with a window,
    /// every rank not known dead from it back to (not including) the nearest answer.
    pub(super) fn suspects(&self) -> Vec<Rank> {
        let Some(p) = self.watched else {
            return Vec::new();
        };
        let Some(w) = self.window else {
            return alloc::vec![p];
        };
        let n = u64::from(self.config.n);
        let me = u64::from(self.config.me);
        let stop = w.nearest_reply.unwrap_or(w.far + 1);
        (self.back(p)..stop)
            .map(|b| ((me + n - u64::from(b)) % n) as Rank)
            .filter(|&r| !self.dead.contains(r))
            .collect()
    }
}
