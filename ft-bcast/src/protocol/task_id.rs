//! A broadcast's name, [`TaskId`]: the rank that started it and the 64-bit key that
//! rank chose, so roots never coordinate their keys (two roots may start key 7 at
//! once: they are two broadcasts).
//!
//! On the wire every broadcast frame's body starts with it: the root (a varint, below
//! the communicator size) then the key (a varint). The header's epoch field of a
//! broadcast frame is written 0 and not read.

use core::fmt;

use ft_core::wire::{Reader, Sink, Writer};
use ft_core::{FrameError, Rank};

use super::codec::varint_len;

/// A broadcast: started by `root`, named `key` there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The rank that started the broadcast.
    pub root: Rank,
    /// The key the root gave it (a task runtime's task key).
    pub key: u64,
}

impl TaskId {
    /// Broadcast `key` of `root`.
    pub const fn new(root: Rank, key: u64) -> Self {
        TaskId { root, key }
    }

    /// Its encoded length at the start of a frame's body.
    pub(super) fn wire_len(self) -> usize {
        varint_len(self.root.into()) + varint_len(self.key)
    }

    /// Writes it at the start of a frame's body.
    pub(super) fn put<S: Sink>(self, w: &mut Writer<S>) {
        w.put_rank(self.root).put_varint(self.key);
    }

    /// Reads it from the start of a frame's body (the root checked against the
    /// communicator's size).
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, FrameError> {
        let root = r.rank()?;
        let key = r.varint()?;
        Ok(TaskId { root, key })
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.root, self.key)
    }
}
