//! The message channel as the solver uses it: typed tags, a [`Mailbox`] that keeps
//! messages which came early, and the halo exchange of one iteration ([`exchange`]).
//!
//! Invariants:
//! - a tag names the message's kind, the iteration and the side it fills ([`Tag`]):
//!   two messages of one sender never share a tag within a group, so a message is
//!   never taken for one of another iteration (a recovery goes on in a new group, so a
//!   message sent before a rollback never reaches the group that rolled back);
//! - bit 63 of a tag stays clear (the library reserves it for its own messages);
//! - a message that arrives before it is asked for is kept until it is; a repeated
//!   one is dropped. A neighbour is at most one
//!   iteration ahead (it needs this rank's halo of each iteration to finish the next),
//!   so the mailbox holds at most two halos per neighbour;
//! - every rank failure reported while waiting ends the wait with a [`HaloError`]: the
//!   recovery that follows is collective, so a rank does not wait for a halo from a
//!   neighbour that is itself recovering.

mod mailbox;
mod tag;

use std::fmt;

use ft::{GlobalValidation, Rank, RuntimeError};

pub use mailbox::{Handle, Mailbox};
pub use tag::{Kind, Tag};

use crate::layout::Layout;
use crate::strip::{row_bytes, Side, Strip};

/// Why a wait for a message, or a send, did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HaloError {
    /// A rank this one exchanges with failed (reported, or refused a send).
    NeighbourFailed(Rank),
    /// Another rank of the group failed: the group recovers together.
    PeerFailed(Rank),
    /// The communicator was revoked by `by`.
    Revoked {
        /// The revoking rank.
        by: Rank,
    },
    /// Events were lost in this handle's queue (some messages may be among them).
    Overflowed(u64),
    /// A peer sent a message of the awaited tag that cannot be what it should carry.
    Malformed {
        /// The sender.
        from: Rank,
        /// Its tag.
        tag: Tag,
        /// Its length.
        len: usize,
    },
    /// The job's time limit passed while waiting.
    TimedOut {
        /// The awaited sender (`None`: any).
        from: Option<Rank>,
        /// The awaited tag.
        tag: Tag,
    },
    /// A checkpoint commit failed: ranks died since the group started. The
    /// validation it made is the agreement a recovery starts from.
    CommitFailed(GlobalValidation),
    /// This rank's handle failed (stopped, declared dead, ...).
    Runtime(RuntimeError),
}

impl fmt::Display for HaloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HaloError::NeighbourFailed(r) => write!(f, "neighbour rank {r} failed"),
            HaloError::PeerFailed(r) => write!(f, "rank {r} failed"),
            HaloError::Revoked { by } => write!(f, "rank {by} revoked the communicator"),
            HaloError::Overflowed(n) => write!(f, "{n} events were lost (the queue was full)"),
            HaloError::Malformed { from, tag, len } => {
                write!(f, "rank {from} sent {len} bytes for {tag:?}")
            }
            HaloError::TimedOut { from: Some(r), tag } => {
                write!(f, "the time limit passed waiting for {tag:?} from rank {r}")
            }
            HaloError::TimedOut { from: None, tag } => {
                write!(
                    f,
                    "the time limit passed waiting for a {:?} message",
                    tag.kind
                )
            }
            HaloError::CommitFailed(v) => write!(
                f,
                "the checkpoint was not committed: ranks {:?} failed",
                v.agreed.iter().collect::<Vec<_>>()
            ),
            HaloError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HaloError {}
/// Iteration `iteration`'s halo exchange of `me`: sends its edge rows to its
/// neighbours in `layout`, then fills its ghosts with theirs.
pub fn exchange(
    mailbox: &mut Mailbox<'_>,
    layout: &Layout,
    me: Rank,
    strip: &mut Strip,
    iteration: u32,
) -> Result<(), HaloError> {
    let (above, below) = (layout.above(me), layout.below(me));
    let neighbours: Vec<Rank> = above.into_iter().chain(below).collect();
    // My first row fills the ghost below of the rank above, and my last row its ghost
    // above of the rank below.
    for (to, edge, fills) in [
        (above, Side::Above, Side::Below),
        (below, Side::Below, Side::Above),
    ] {
        if let Some(to) = to {
            let tag = mailbox.tag(Kind::Halo, iteration, fills);
            mailbox.send(to, tag, row_bytes(strip.edge_row(edge)))?;
        }
    }
    for (from, side) in [(above, Side::Above), (below, Side::Below)] {
        let Some(from) = from else { continue };
        let tag = mailbox.tag(Kind::Halo, iteration, side);
        let bytes = mailbox.receive(from, tag, &neighbours)?;
        let ghost = strip.ghost_mut(side);
        if bytes.len() != 8 * ghost.len() {
            return Err(HaloError::Malformed {
                from,
                tag,
                len: bytes.len(),
            });
        }
        for (cell, value) in ghost.iter_mut().zip(bytes.chunks_exact(8)) {
            *cell = f64::from_bits(u64::from_le_bytes(value.try_into().unwrap()));
        }
    }
    Ok(())
}
