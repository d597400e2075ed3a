//! [`Copies`]: what a rank copied of broadcast payloads, from the broadcaster's and the
//! driver's counters, for a test or a runtime that checks its data path is zero-copy.
//!
//! What counts as a copy: a payload byte written from one buffer of this process into
//! another after the application handed it over (at the root) or the transport
//! delivered it (at a destination). The transport's own delivery into its receive
//! buffer is the network's, not counted.

use ft_bcast::BcastStats;

use crate::driver::DriverStats;

/// Payload bytes a rank sent and received, and how many of them were copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copies {
    /// Payload bytes sent (as root or relay).
    pub sent: u64,
    /// Of those, bytes copied on the way out: by the machine (a contiguous
    /// `poll_transmit`) or by the transport (a payload too short to send in place).
    pub sent_copied: u64,
    /// Payload bytes received and kept.
    pub received: u64,
    /// Of those, bytes copied after delivery: out of a frame the transport lent, or to
    /// join an output's chunks into one buffer.
    pub received_copied: u64,
    /// Bytes a language binding copied at its boundary
    /// ([`Runtime::count_api_copies`](crate::Runtime::count_api_copies)).
    pub api_copied: u64,
}

impl Copies {
    /// The counts of a broadcaster's `bcast` and a driver's `driver` statistics, with
    /// `api_copied` bytes copied by a binding.
    pub fn of(bcast: BcastStats, driver: DriverStats, api_copied: u64) -> Self {
        Copies {
            sent: bcast.payload_bytes_sent,
            sent_copied: bcast.payload_bytes_copied + driver.payload_bytes_copied,
            received: bcast.received_bytes_in_place
                + bcast.received_bytes_copied
                + bcast.received_bytes_landed,
            received_copied: bcast.received_bytes_copied + bcast.joined_bytes,
            api_copied,
        }
    }

    /// Every byte copied, on either side or at the binding.
    pub fn copied(&self) -> u64 {
        self.sent_copied + self.received_copied + self.api_copied
    }
}
