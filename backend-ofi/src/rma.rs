//! The rendezvous that moves bulk payloads with one-sided RMA under the
//! [`ft_runtime::Transport`] face: its two control messages, their codec, and the
//! typed errors a malformed one decodes to.
//!
//! A sender whose payload is at least [`crate::OfiConfig::rma_threshold`] registers it
//! (`FI_REMOTE_READ`) and sends an [`Offer`] instead of the frame: the frame's head, and
//! where the payload is (address, length, key) under a transfer id. The receiver reads
//! the payload with `fi_read` behind a copy of the head, delivers `head + payload` as
//! the one frame the sender meant, and answers [`Control::Done`] so the sender drops
//! its registration. Control messages travel as ordinary messages whose CQ data has
//! [`CONTROL_FLAG`] set beside the sender's rank, so they never reach the protocol.
//!
//! Wire format (little-endian):
//!
//! | kind | bytes |
//! |---|---|
//! | offer | `1`, id `u64`, address `u64`, length `u64`, key `u64`, then the head |
//! | done | `2`, id `u64` |
//!
//! Invariant: decoding never panics and never trusts a length before checking it
//! against the bytes at hand; every malformed message is a [`ControlError`].

use std::fmt;

/// Set in a message's CQ data (beside the sender's rank, below 2^31) when the message
/// is a control message of this module rather than a protocol frame.
pub const CONTROL_FLAG: u64 = 1 << 31;

const KIND_OFFER: u8 = 1;
const KIND_DONE: u8 = 2;
/// Kind, id, address, length and key.
const OFFER_FIXED: usize = 1 + 4 * 8;
/// Kind and id.
const DONE_LEN: usize = 1 + 8;

/// "Read my payload": what a receiver needs to fetch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer<'a> {
    /// The sender's transfer id, echoed in the [`Control::Done`].
    pub id: u64,
    /// The payload's remote address: its virtual address under `FI_MR_VIRT_ADDR`, else
    /// its offset in the registration (0).
    pub addr: u64,
    /// The payload's length in bytes (positive).
    pub len: u64,
    /// The registration's remote key (`fi_mr_key`).
    pub key: u64,
    /// The frame's head, which the delivered frame starts with.
    pub head: &'a [u8],
}

/// One decoded control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control<'a> {
    /// A payload offered for reading.
    Offer(Offer<'a>),
    /// The receiver is done with transfer `id` (read, or given up).
    Done {
        /// The sender's transfer id.
        id: u64,
    },
}

/// Why a control message was refused. Every variant is the peer's doing (a malformed
/// or stale message); the message is dropped and counted in
/// [`crate::OfiStats::bad_control`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlError {
    /// The message is empty.
    Empty,
    /// The first byte names no kind of control message.
    UnknownKind {
        /// The byte.
        kind: u8,
    },
    /// The message is shorter than its kind's fixed part.
    Truncated {
        /// The message's length.
        len: usize,
        /// The fixed part's length.
        need: usize,
    },
    /// A done message carries bytes after its id.
    TrailingBytes {
        /// The message's length.
        len: usize,
    },
    /// An offer of an empty payload.
    EmptyPayload,
    /// An offer whose payload and head overflow the address space or the length the
    /// provider can read.
    PayloadTooLong {
        /// The offered length.
        len: u64,
    },
    /// A done message names no transfer in flight.
    UnknownTransfer {
        /// The id named.
        id: u64,
    },
    /// A done message came from a rank the transfer was not offered to.
    WrongPeer {
        /// The transfer's id.
        id: u64,
        /// The rank it was offered to.
        offered_to: u32,
        /// The rank the done message came from.
        from: u32,
    },
    /// A control message was longer than the receive buffer (truncated by the
    /// provider).
    Oversized,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Empty => write!(f, "empty control message"),
            ControlError::UnknownKind { kind } => write!(f, "unknown control kind {kind}"),
            ControlError::Truncated { len, need } => {
                write!(f, "control message of {len} bytes, its kind needs {need}")
            }
            ControlError::TrailingBytes { len } => {
                write!(f, "done message of {len} bytes, expected {DONE_LEN}")
            }
            ControlError::EmptyPayload => write!(f, "offer of an empty payload"),
            ControlError::PayloadTooLong { len } => {
                write!(f, "offer of {len} bytes, more than can be read")
            }
            ControlError::UnknownTransfer { id } => {
                write!(f, "done message for transfer {id}, which is not in flight")
            }
            ControlError::WrongPeer {
                id,
                offered_to,
                from,
            } => write!(
                f,
                "done message for transfer {id} from rank {from}; it was offered to {offered_to}"
            ),
            ControlError::Oversized => write!(f, "control message longer than a receive buffer"),
        }
    }
}

impl std::error::Error for ControlError {}

/// Decodes one control message (the bytes of a message whose CQ data carries
/// [`CONTROL_FLAG`]).
pub fn decode(bytes: &[u8]) -> Result<Control<'_>, ControlError> {
    let (&kind, _) = bytes.split_first().ok_or(ControlError::Empty)?;
    let word = |i: usize| -> u64 {
        let at = 1 + 8 * i;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(raw)
    };
    match kind {
        KIND_OFFER => {
            if bytes.len() < OFFER_FIXED {
                return Err(ControlError::Truncated {
                    len: bytes.len(),
                    need: OFFER_FIXED,
                });
            }
            let offer = Offer {
                id: word(0),
                addr: word(1),
                len: word(2),
                key: word(3),
                head: &bytes[OFFER_FIXED..],
            };
            if offer.len == 0 {
                return Err(ControlError::EmptyPayload);
            }
            let total = usize::try_from(offer.len)
                .ok()
                .and_then(|len| len.checked_add(offer.head.len()));
            if total.is_none() || offer.addr.checked_add(offer.len).is_none() {
                return Err(ControlError::PayloadTooLong { len: offer.len });
            }
            Ok(Control::Offer(offer))
        }
        KIND_DONE => match bytes.len() {
            DONE_LEN => Ok(Control::Done { id: word(0) }),
            len if len < DONE_LEN => Err(ControlError::Truncated {
                len,
                need: DONE_LEN,
            }),
            len => Err(ControlError::TrailingBytes { len }),
        },
        kind => Err(ControlError::UnknownKind { kind }),
    }
}

/// Encodes an offer.
pub fn encode_offer(offer: &Offer<'_>) -> Box<[u8]> {
    let mut out = Vec::with_capacity(OFFER_FIXED + offer.head.len());
    out.push(KIND_OFFER);
    for word in [offer.id, offer.addr, offer.len, offer.key] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(offer.head);
    out.into_boxed_slice()
}

/// Encodes a done message for transfer `id`.
pub fn encode_done(id: u64) -> Box<[u8]> {
    let mut out = Vec::with_capacity(DONE_LEN);
    out.push(KIND_DONE);
    out.extend_from_slice(&id.to_le_bytes());
    out.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_and_dones_round_trip() {
        let offer = Offer {
            id: 7,
            addr: 0x7f00_0000_1000,
            len: 262_144,
            key: 42,
            head: b"head bytes",
        };
        assert_eq!(decode(&encode_offer(&offer)), Ok(Control::Offer(offer)));
        assert_eq!(decode(&encode_done(9)), Ok(Control::Done { id: 9 }));
    }

    #[test]
    fn malformed_messages_are_typed_errors() {
        assert_eq!(decode(&[]), Err(ControlError::Empty));
        assert_eq!(decode(&[9]), Err(ControlError::UnknownKind { kind: 9 }));
        assert_eq!(
            decode(&[KIND_OFFER, 1, 2]),
            Err(ControlError::Truncated { len: 3, need: 33 })
        );
        assert_eq!(
            decode(&[KIND_DONE; 5]),
            Err(ControlError::Truncated { len: 5, need: 9 })
        );
        let mut done = encode_done(1).into_vec();
        done.push(0);
        assert_eq!(decode(&done), Err(ControlError::TrailingBytes { len: 10 }));
        let empty = Offer {
            id: 1,
            addr: 0,
            len: 0,
            key: 0,
            head: &[],
        };
        assert_eq!(
            decode(&encode_offer(&empty)),
            Err(ControlError::EmptyPayload)
        );
        let wraps = Offer {
            addr: u64::MAX - 1,
            len: 16,
            ..empty
        };
        assert_eq!(
            decode(&encode_offer(&wraps)),
            Err(ControlError::PayloadTooLong { len: 16 })
        );
    }

    /// Every prefix and every one-byte corruption of valid messages decodes to a value
    /// or a typed error, never a panic.
    #[test]
    fn no_input_panics() {
        let offer = encode_offer(&Offer {
            id: u64::MAX,
            addr: 1 << 40,
            len: 1 << 20,
            key: 3,
            head: &[0xAB; 24],
        });
        for message in [offer, encode_done(5)] {
            for cut in 0..=message.len() {
                let _ = decode(&message[..cut]);
            }
            for at in 0..message.len() {
                for value in [0u8, 1, 2, 0x7f, 0xff] {
                    let mut bad = message.to_vec();
                    bad[at] = value;
                    let _ = decode(&bad);
                }
            }
        }
    }
}
