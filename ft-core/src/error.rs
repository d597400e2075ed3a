//! Error types, kept apart by cause: [`FrameError`] for what a peer sent,
//! [`ViewError`] for misuse of the query/command API, [`BufferTooShort`] for a transmit
//! buffer the caller sized too small.

use core::fmt;

use crate::rank::Rank;

/// A frame from a peer was rejected. Nothing a peer sends can do worse than this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame ended before a field it announced.
    Truncated,
    /// The frame was longer than its content.
    TrailingBytes,
    /// The header's format version is not ours.
    BadVersion(u8),
    /// The header names a frame kind this build does not know.
    UnknownKind(u8),
    /// The frame belongs to another communicator.
    WrongCommunicator {
        /// Our communicator id.
        expected: u32,
        /// The frame's.
        got: u32,
    },
    /// A rank in the frame is not in `0..n`.
    RankOutOfRange {
        /// The offending rank.
        rank: u64,
        /// The communicator size.
        n: u32,
    },
    /// The header's sender differs from the transport's source rank.
    SenderMismatch {
        /// Sender according to the transport.
        transport: Rank,
        /// Sender according to the header.
        header: Rank,
    },
    /// The sender is already declared failed here; its frames are dropped (fail-stop).
    FromFailedRank(Rank),
    /// The frame belongs to an epoch that is over.
    StaleEpoch {
        /// Our current epoch.
        current: u32,
        /// The frame's.
        got: u32,
    },
    /// The frame belongs to an epoch that has not started here.
    FutureEpoch {
        /// Our current epoch.
        current: u32,
        /// The frame's.
        got: u32,
    },
    /// A field holds a value that no correct peer sends (named by the string).
    Malformed(&'static str),
    /// The frame's kind is valid but not one this machine accepts.
    UnexpectedKind(u8),
    /// The communicator is revoked; frames of its operations are dropped.
    Revoked,
    /// A fast-path sweep frame names a round the epoch's sweeps do not have
    /// (`rounds` is 0 when the epoch runs the tree path instead).
    BadSweepRound {
        /// The frame's round.
        round: u32,
        /// Rounds per sweep in this epoch.
        rounds: u32,
    },
    /// The sender is not a participant of the frame's epoch (it was agreed failed before).
    NotParticipant(Rank),
    /// A participant sent a sweep frame of a round in which it does not send to this rank.
    NotSweepPeer {
        /// The frame's round.
        round: u32,
        /// The sender.
        sender: Rank,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated => f.write_str("frame truncated"),
            FrameError::TrailingBytes => f.write_str("frame has trailing bytes"),
            FrameError::BadVersion(v) => write!(f, "unsupported frame version {v}"),
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::WrongCommunicator { expected, got } => {
                write!(f, "frame for communicator {got}, expected {expected}")
            }
            FrameError::RankOutOfRange { rank, n } => {
                write!(f, "rank {rank} out of range for a communicator of {n}")
            }
            FrameError::SenderMismatch { transport, header } => {
                write!(f, "frame claims sender {header} but came from {transport}")
            }
            FrameError::FromFailedRank(r) => {
                write!(f, "frame from rank {r}, already declared failed")
            }
            FrameError::StaleEpoch { current, got } => {
                write!(f, "stale frame of epoch {got} (current {current})")
            }
            FrameError::FutureEpoch { current, got } => {
                write!(f, "frame of future epoch {got} (current {current})")
            }
            FrameError::Malformed(what) => write!(f, "malformed frame: {what}"),
            FrameError::UnexpectedKind(k) => write!(f, "frame kind {k} not accepted here"),
            FrameError::Revoked => f.write_str("communicator revoked: frame dropped"),
            FrameError::BadSweepRound { round, rounds } => {
                write!(
                    f,
                    "sweep round {round} out of range ({rounds} rounds per sweep)"
                )
            }
            FrameError::NotParticipant(r) => {
                write!(f, "rank {r} is not a participant of the frame's epoch")
            }
            FrameError::NotSweepPeer { round, sender } => {
                write!(
                    f,
                    "rank {sender} does not send to this rank in sweep round {round}"
                )
            }
        }
    }
}

/// `poll_transmit` was given a buffer shorter than the next frame. Nothing was sent and
/// nothing is lost: the frame stays queued, and a call with at least `needed` bytes
/// sends it intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferTooShort {
    /// Bytes the next frame takes.
    pub needed: usize,
    /// Bytes the caller's buffer had.
    pub available: usize,
}

impl fmt::Display for BufferTooShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "transmit buffer of {} bytes is shorter than the {}-byte frame",
            self.available, self.needed
        )
    }
}

/// A call of the failure-view API was rejected; the view is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewError {
    /// The rank is not in `0..n`.
    RankOutOfRange {
        /// The offending rank.
        rank: Rank,
        /// The communicator size.
        n: u32,
    },
    /// `recognize` was called for a rank that is not in the local failed set.
    NotFailed(Rank),
    /// The output buffer holds fewer entries than the answer; nothing was written.
    BufferTooSmall {
        /// Entries the answer needs.
        needed: usize,
    },
    /// A rank reported itself failed; a process cannot observe its own death.
    SelfReported,
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::RankOutOfRange { rank, n } => {
                write!(f, "rank {rank} out of range for a communicator of {n}")
            }
            ViewError::NotFailed(r) => write!(f, "rank {r} is not known to have failed"),
            ViewError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: the answer needs {needed} entries")
            }
            ViewError::SelfReported => f.write_str("a rank cannot report itself failed"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for FrameError {}
#[cfg(feature = "std")]
impl std::error::Error for ViewError {}
#[cfg(feature = "std")]
impl std::error::Error for BufferTooShort {}
