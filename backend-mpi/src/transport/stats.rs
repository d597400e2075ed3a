//! [`TransportStats`]: what the transport did, counted.

#[cfg(doc)]
use ft_runtime::Received;

#[cfg(doc)]
use super::{
    MpiTransport, COPY_BELOW, HAND_OVER_FROM, HEAD_TAG, JOINED_HEAD_TAG, JOINED_PROMISED_HEAD_TAG,
    JOINED_TAG, PROMISED_HEAD_TAG,
};

/// Counters of what the transport did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames handed to MPI.
    pub sent: u64,
    /// Frames received.
    pub received: u64,
    /// Sends dropped because their peer died.
    pub dropped_to_failed: u64,
    /// Matched frames lost because their sender died during the transfer.
    pub lost_in_transfer: u64,
    /// Times process failures were acknowledged to re-enable any-source receives.
    pub failure_acks: u64,
    /// Send buffers allocated (the rest of the sends reused a spare one).
    pub send_buffers: u64,
    /// `MPI_Testsome` calls over the sends that returned a process failure as their own
    /// code instead of in a status, so that each send was then tested alone.
    pub unattributed_failures: u64,
    /// Payload bytes of [`MpiTransport::send_parts`] handed to MPI in place, in the
    /// caller's buffer (a send to a dead peer counts too).
    pub payload_bytes_in_place: u64,
    /// Payload bytes of [`MpiTransport::send_parts`] copied into a send buffer
    /// (payloads shorter than [`COPY_BELOW`]).
    pub payload_bytes_copied: u64,
    /// Received frames handed over ([`Received::Owned`], at least
    /// [`HAND_OVER_FROM`] bytes), each costing a new receive buffer; the rest of
    /// [`TransportStats::received`] were lent.
    pub frames_handed_over: u64,
    /// Frames whose payload came as its own message behind a head ([`HEAD_TAG`]):
    /// received straight behind the head in one buffer, handed over.
    pub payloads_received: u64,
    /// Of [`TransportStats::payloads_received`], those received into a buffer an
    /// earlier payload had used ([`crate::pool::ReceivePool`]); the rest allocated one.
    pub payload_buffers_reused: u64,
    /// Heads too short to carry a payload length: dropped.
    pub bad_heads: u64,
    /// Payload bytes received straight into memory the caller gave
    /// ([`MpiTransport::try_recv_placing`]: a broadcast output's buffer).
    pub payload_bytes_placed: u64,
    /// Payloads received into the caller's memory whose length differed from their
    /// head's: the slot goes back unfilled and the frame is lost.
    pub placed_mismatched: u64,
    /// Frames sent at the front of the next frame's message to the same peer
    /// ([`MpiTransport::send_then_parts`]).
    pub frames_joined: u64,
    /// Messages received holding two frames ([`JOINED_TAG`], [`JOINED_HEAD_TAG`],
    /// [`JOINED_PROMISED_HEAD_TAG`]).
    pub joined_received: u64,
    /// Heads sent ahead of their payload ([`MpiTransport::send_head`]).
    pub heads_sent_early: u64,
    /// Heads received ahead of their payload ([`PROMISED_HEAD_TAG`]): the payload's
    /// receive was posted before it left its sender.
    pub heads_received_early: u64,
    /// Promised payloads withdrawn ([`MpiTransport::withdraw`]).
    pub withdrawn: u64,
    /// Ring receives MPI completed but reported as `MPI_ERR_PROC_FAILED_PENDING`,
    /// taken as completed (the `recv` module's docs).
    pub completed_pending: u64,
}
