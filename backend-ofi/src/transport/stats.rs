//! [`OfiStats`], the counters of what a transport did.

#[cfg(doc)]
use ft_runtime::Received;

#[cfg(doc)]
use super::{OfiConfig, OfiTransport};

/// Counters of what the transport did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfiStats {
    /// Frames handed to the provider (whole, or as an RMA offer).
    pub sent: u64,
    /// Of [`OfiStats::sent`], frames short enough to go by `fi_injectdata` (no send
    /// slot, no completion).
    pub injected: u64,
    /// Frames received (handed out by `try_recv`).
    pub received: u64,
    /// Sends dropped because the provider refused or failed them (a dead peer).
    pub send_errors: u64,
    /// Frames dropped after waiting [`OfiConfig::stall_timeout`] in the backlog.
    pub send_stalled: u64,
    /// Posted sends given up after [`OfiConfig::stall_timeout`] without a completion.
    pub send_abandoned: u64,
    /// Messages longer than `max_frame`, reported as [`Received::Oversized`].
    pub oversized: u64,
    /// Messages dropped because their CQ data named no rank of the job.
    pub bad_sender: u64,
    /// Receives that completed with an error other than truncation (dropped).
    pub recv_errors: u64,
    /// Posts refused with `-FI_EAGAIN` (and retried later).
    pub eagain_retries: u64,
    /// Payloads offered for RMA (a registration and an offer sent instead of the frame).
    pub rma_offered: u64,
    /// Offers served from a registration another transfer of the same bytes had made.
    pub rma_registrations_reused: u64,
    /// RMA reads completed (each delivered as one frame).
    pub rma_reads: u64,
    /// Payload bytes those reads moved.
    pub rma_bytes_read: u64,
    /// Payloads at or above the RMA threshold sent two-sided: the provider has no
    /// `FI_RMA`, or registering the payload failed.
    pub rma_fallbacks: u64,
    /// RMA reads that failed (the sender died, or its offer was bad): lost frames.
    pub rma_lost_reads: u64,
    /// Payload bytes RMA reads wrote straight into memory the caller gave
    /// ([`OfiTransport::try_recv_placing`]: a broadcast output's buffer).
    pub rma_bytes_placed: u64,
    /// Transfers released without a done message, their receiver taken for dead.
    pub rma_released_unread: u64,
    /// Transfers no longer counted as pending after [`OfiConfig::stall_timeout`]
    /// without a done message (their registration stays until one comes or the peer
    /// is found dead).
    pub rma_abandoned: u64,
    /// Control messages refused as malformed or stale ([`crate::rma::ControlError`]).
    pub bad_control: u64,
    /// Frames handed over with their buffer (at least
    /// [`HAND_OVER_FROM`](crate::HAND_OVER_FROM) bytes, or read by RMA): kept
    /// by the receiver without a copy.
    pub frames_handed_over: u64,
}
