//! The one face every protocol state machine shows to a backend.
//!
//! A backend owns the clock and the network and runs this loop for each rank:
//!
//! 1. on a received frame: [`Protocol::handle_message`]`(now, from, bytes)`;
//! 2. when the clock passes [`Protocol::poll_timeout`]: [`Protocol::handle_timeout`]`(now)`;
//! 3. after either, and after any application command: drain
//!    [`Protocol::poll_transmit`] (send each frame to `Transmit::to`; machines queue
//!    typed messages and encode each one only here, in place, into the caller's
//!    buffer), then drain
//!    [`Protocol::poll_event`];
//! 4. sleep until the next frame or the new `poll_timeout`.
//!
//! Time passed in only moves forward; a machine treats an `Instant` earlier than one it
//! saw as equal to it, and a `handle_timeout` that comes early does nothing.

use crate::error::{BufferTooShort, FrameError};
use crate::rank::Rank;
use crate::time::Instant;

/// A frame ready to send: `len` bytes at the start of the caller's buffer go to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination rank.
    pub to: Rank,
    /// Length of the frame written into the caller's buffer.
    pub len: usize,
}

/// The sans-IO protocol face: frames and time in; frames, a deadline and events out.
pub trait Protocol {
    /// What the machine reports to the application.
    type Event;

    /// Feeds one frame received from `from`. A rejected frame changes nothing and its
    /// error says why (the backend may log it; it must not stop the rank).
    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError>;

    /// Tells the machine the clock reached `now`; timers due by then fire.
    fn handle_timeout(&mut self, now: Instant);

    /// Encodes the next queued frame in place at the start of `buf`: `Ok(None)` when
    /// nothing is queued.
    ///
    /// A frame longer than `buf` is [`BufferTooShort`] (with the size it needs): the
    /// frame stays queued, and the next call with a large enough buffer sends it intact.
    /// [`crate::wire::frame_capacity`] of the communicator size always suffices.
    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort>;

    /// The earliest instant at which `handle_timeout` has work to do.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next event for the application.
    fn poll_event(&mut self) -> Option<Self::Event>;
}
