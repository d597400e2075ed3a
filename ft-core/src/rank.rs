//! Ranks, rank states, state masks and the query record.
//!
//! A rank of a communicator of size `n` is a number in `0..n`. Its state, in a given
//! [`Scope`], is [`RankState::Ok`] (not in that scope's failed set), [`RankState::Failed`]
//! (in it, not yet recognized by the application) or [`RankState::Null`] (in it and
//! recognized). A failed rank's [`Modifier`] is [`Modifier::New`] when it entered that
//! scope's failed set at the scope's latest validation, [`Modifier::Old`] otherwise; an
//! `Ok` rank is always `Old`.

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

/// A rank of a communicator: a number in `0..n`.
pub type Rank = u32;

/// Which failed set a query reads: the local view `L_i` or the agreed view `G`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `L_i`: what this rank knows to have failed, as of its last validation.
    Local,
    /// `G`: what every survivor agreed on at the last global validation.
    Global,
}

/// The state of a rank within one scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RankState {
    /// Alive, as far as this scope knows.
    Ok,
    /// Failed and not yet recognized by the application.
    Failed,
    /// Failed and recognized by the application (see `FailureView::recognize`).
    Null,
}

/// Whether a rank's state appeared at the latest validation of its scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Modifier {
    /// The rank entered the scope's failed set at the scope's latest validation.
    New,
    /// Anything else: known before the latest validation, or `Ok`.
    Old,
}

/// An OR-able set of states and modifiers used to select ranks in queries.
///
/// A rank matches when its state's bit is set and, if the mask names any modifier
/// ([`StateMask::NEW`] or [`StateMask::OLD`]), its modifier's bit is set too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateMask(u8);

impl StateMask {
    /// Ranks in state [`RankState::Ok`].
    pub const OK: StateMask = StateMask(1);
    /// Ranks in state [`RankState::Failed`].
    pub const FAILED: StateMask = StateMask(2);
    /// Ranks in state [`RankState::Null`].
    pub const NULL: StateMask = StateMask(4);
    /// Restricts to ranks with modifier [`Modifier::New`].
    pub const NEW: StateMask = StateMask(8);
    /// Restricts to ranks with modifier [`Modifier::Old`].
    pub const OLD: StateMask = StateMask(16);
    /// Every state, no modifier restriction.
    pub const ALL: StateMask = StateMask(7);
    const STATES: u8 = 7;
    const MODIFIERS: u8 = 24;

    /// The raw bits (for FFI layers that mirror the C constants).
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// A mask from raw bits; bits outside the five named flags are dropped.
    pub const fn from_bits_truncate(bits: u8) -> Self {
        StateMask(bits & (Self::STATES | Self::MODIFIERS))
    }
    /// True when every bit of `other` is set in `self`.
    pub const fn contains(self, other: StateMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether a rank with `state` and `modifier` is selected by this mask.
    pub const fn matches(self, state: RankState, modifier: Modifier) -> bool {
        let state_bit = match state {
            RankState::Ok => Self::OK.0,
            RankState::Failed => Self::FAILED.0,
            RankState::Null => Self::NULL.0,
        };
        if self.0 & state_bit == 0 {
            return false;
        }
        if self.0 & Self::MODIFIERS == 0 {
            return true;
        }
        let modifier_bit = match modifier {
            Modifier::New => Self::NEW.0,
            Modifier::Old => Self::OLD.0,
        };
        self.0 & modifier_bit != 0
    }
}

impl BitOr for StateMask {
    type Output = StateMask;
    fn bitor(self, rhs: StateMask) -> StateMask {
        StateMask(self.0 | rhs.0)
    }
}

impl BitOrAssign for StateMask {
    fn bitor_assign(&mut self, rhs: StateMask) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for StateMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (1, "OK"),
            (2, "FAILED"),
            (4, "NULL"),
            (8, "NEW"),
            (16, "OLD"),
        ];
        let mut first = true;
        f.write_str("StateMask(")?;
        for (bit, name) in names {
            if self.0 & bit != 0 {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// One row of a state query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankInfo {
    /// The rank.
    pub rank: Rank,
    /// Its state in the queried scope.
    pub state: RankState,
    /// The validation epoch of the queried scope at which the rank entered `state`
    /// (0 for ranks that have been `Ok` since the start).
    pub epoch: u32,
    /// The rank's incarnation: 0 for the job's first process, one more for each process
    /// that took the rank's number since (a rebuild).
    pub generation: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn mask_without_modifiers_selects_by_state_only() {
        let m = StateMask::FAILED | StateMask::NULL;
        assert!(m.matches(RankState::Failed, Modifier::New));
        assert!(m.matches(RankState::Null, Modifier::Old));
        assert!(!m.matches(RankState::Ok, Modifier::Old));
    }

    #[test]
    fn mask_with_a_modifier_restricts_to_it() {
        let m = StateMask::FAILED | StateMask::NEW;
        assert!(m.matches(RankState::Failed, Modifier::New));
        assert!(!m.matches(RankState::Failed, Modifier::Old));
        let both = m | StateMask::OLD;
        assert!(both.matches(RankState::Failed, Modifier::Old));
        assert_eq!(format!("{both:?}"), "StateMask(FAILED | NEW | OLD)");
    }
}
