//! What a rank does when a failure interrupts the solver. Today: nothing but say so,
//! in one place ([`recover`]), so that the recovery (agree on `G`; rebuild, or shrink
//! and hand the lost strips to the survivors; restore the last committed checkpoint;
//! roll back) has one function to fill in and the solver's loop already calls it.

use std::fmt;

use crate::checkpoint::Checkpoints;
use crate::cli::Mode;
use crate::halo::Mailbox;
use crate::layout::Layout;
use crate::solver::Interrupted;
use crate::strip::Strip;

/// Where the solver goes on from after a recovery.
#[derive(Clone, Debug)]
pub struct Resume {
    /// Who owns which rows now (in the numbering of the mailbox's handle).
    pub layout: Layout,
    /// This rank's strip, holding the values after `start` iterations.
    pub strip: Strip,
    /// The iteration to go on from.
    pub start: u32,
}

/// Why a rank cannot go on after a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryError {
    /// This build has no recovery after a failure yet.
    Unsupported {
        /// The failure that interrupted the solver.
        interrupted: Interrupted,
        /// The mode asked for.
        mode: Mode,
    },
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryError::Unsupported { interrupted, mode } => write!(
                f,
                "{interrupted}; recovery after a failure is not built yet (--mode {})",
                mode.name()
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Recovers from `interrupted` in `mode`: the layout, strip and iteration to resume
/// from. `layout` is the one the solver ran under, `checkpoints` this rank's.
pub fn recover(
    mailbox: &mut Mailbox<'_>,
    mode: Mode,
    layout: &Layout,
    checkpoints: &Checkpoints,
    interrupted: Interrupted,
) -> Result<Resume, RecoveryError> {
    let _ = (mailbox, layout, checkpoints);
    Err(RecoveryError::Unsupported { interrupted, mode })
}
