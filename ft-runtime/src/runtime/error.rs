//! [`RuntimeError`]: why a command of a [`Runtime`](super::Runtime) failed.

use std::fmt;

use ft_bcast::{BcastError, StackError, TaskId};
use ft_core::{Rank, ViewError};

use crate::groups::GroupError;
use crate::shared::Stopped;

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The stack refused the command (this rank was declared dead, a broadcast spec
    /// that cannot be planned, a task id in use, ...); nothing changed.
    Stack(StackError),
    /// A failure-view call was rejected (a rank out of range, a rank not failed, a
    /// buffer too small); nothing changed.
    View(ViewError),
    /// Broadcast `task` cannot complete at this rank: no live ancestor is left (the
    /// root died).
    Abandoned {
        /// The broadcast.
        task: TaskId,
    },
    /// Broadcast `task` failed at this rank (the communicator was revoked).
    BroadcastFailed {
        /// The broadcast.
        task: TaskId,
        /// Why.
        error: BcastError,
    },
    /// The wait's timeout passed before the outputs arrived; the broadcast goes on.
    TimedOut {
        /// The broadcast.
        task: TaskId,
    },
    /// The wait was pending when the application released `task` here.
    Released {
        /// The broadcast.
        task: TaskId,
    },
    /// Rank `by` declared this rank dead, rightly or not, and the progress thread has
    /// stopped for good (fail-stop): the peers go on without this rank, so it must
    /// leave as a dead rank does (exit, or at least never act as a live rank again).
    DeclaredDead {
        /// The observer whose declaration reached this rank.
        by: Rank,
    },
    /// The global validation `epoch` agreed that this rank failed; it has stopped for
    /// good, as under [`DeclaredDead`](RuntimeError::DeclaredDead).
    Excluded {
        /// The validation's epoch.
        epoch: u32,
    },
    /// [`Runtime::shrink`](super::Runtime::shrink) refused; nothing changed.
    Group(GroupError),
    /// The progress thread has ended otherwise (shut down, a backend error), or this
    /// handle was shut down.
    Stopped(String),
}

impl RuntimeError {
    /// Whether the peers put this rank out of the group (a declaration, or an
    /// exclusion by agreement): the rank must leave as a dead one does.
    pub fn is_fail_stop(&self) -> bool {
        matches!(
            self,
            RuntimeError::DeclaredDead { .. } | RuntimeError::Excluded { .. }
        )
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Stack(e) => write!(f, "command refused: {e}"),
            RuntimeError::View(e) => write!(f, "failure view: {e}"),
            RuntimeError::Abandoned { task } => {
                write!(
                    f,
                    "broadcast {task} abandoned: no live ancestor (the root died)"
                )
            }
            RuntimeError::BroadcastFailed { task, error } => {
                write!(f, "broadcast {task} failed: {error}")
            }
            RuntimeError::TimedOut { task } => {
                write!(f, "timed out waiting for outputs of broadcast {task}")
            }
            RuntimeError::Released { task } => {
                write!(f, "broadcast {task} was released while waited for")
            }
            // The fail-stop reasons read as the progress thread's own.
            RuntimeError::DeclaredDead { by } => Stopped::DeclaredDead { by: *by }.fmt(f),
            RuntimeError::Excluded { epoch } => Stopped::Excluded { epoch: *epoch }.fmt(f),
            RuntimeError::Group(e) => write!(f, "cannot shrink: {e}"),
            RuntimeError::Stopped(why) => write!(f, "the progress thread has stopped: {why}"),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Stack(e) => Some(e),
            RuntimeError::View(e) => Some(e),
            RuntimeError::Group(e) => Some(e),
            RuntimeError::BroadcastFailed { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<Stopped> for RuntimeError {
    fn from(e: Stopped) -> Self {
        match e {
            Stopped::DeclaredDead { by } => RuntimeError::DeclaredDead { by },
            Stopped::Excluded { epoch } => RuntimeError::Excluded { epoch },
            Stopped::Ended(why) => RuntimeError::Stopped(why),
        }
    }
}

impl From<StackError> for RuntimeError {
    fn from(e: StackError) -> Self {
        RuntimeError::Stack(e)
    }
}

impl From<ViewError> for RuntimeError {
    fn from(e: ViewError) -> Self {
        RuntimeError::View(e)
    }
}
