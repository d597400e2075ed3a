//! How frames map onto MPI messages: the tags that tell the messages apart on the frame
//! communicator, and the layouts they stand for.
//!
//! - [`FRAME_TAG`]: a whole frame; on the payload communicator, a payload that follows
//!   its head at once;
//! - [`HEAD_TAG`]: a frame's head, then its payload's length (4 bytes, little-endian);
//!   the payload follows as a message of its own on the payload communicator;
//! - [`PROMISED_HEAD_TAG`]: a head, then its payload's length and the payload's own tag
//!   (4 bytes each), taken in turn from [`FIRST_PROMISE_TAG`] up to `MPI_TAG_UB`; the
//!   payload follows on that tag whenever its sender holds it;
//! - [`JOINED_TAG`], [`JOINED_HEAD_TAG`], [`JOINED_PROMISED_HEAD_TAG`]: one of the three
//!   above with another whole frame in front of it, that frame's length (4 bytes,
//!   little-endian) first. A joined message is never longer than a receive slot
//!   ([`joined_len`]).
//!
//! All integers are little-endian. [`Follows`] names what comes after a frame in its
//! message, and so how long the trailer behind a head is.

use std::os::raw::c_int;

#[cfg(doc)]
use super::MpiTransport;
use super::COPY_BELOW;

/// The tag of a whole frame, and of a payload on the payload communicator.
pub(super) const FRAME_TAG: c_int = 0x6674;

/// The tag of a frame's head whose payload follows as its own message
/// ([`MpiTransport::send_parts`]): the head's bytes, then the payload's length (4 bytes,
/// little-endian).
pub const HEAD_TAG: c_int = 0x6675;

/// The tag of a whole frame sent together with the frame before it to the same peer
/// ([`MpiTransport::send_then_parts`]): that frame's length (4 bytes, little-endian),
/// its bytes, then this frame's.
pub const JOINED_TAG: c_int = 0x6676;

/// [`HEAD_TAG`] with the frame before it in front ([`MpiTransport::send_then_parts`]):
/// that frame's length (4 bytes, little-endian), its bytes, then the head as a
/// [`HEAD_TAG`] message holds it (its payload follows on the payload communicator).
pub const JOINED_HEAD_TAG: c_int = 0x6677;

/// The tag of a head sent ahead of its payload ([`MpiTransport::send_head`]): after the
/// head, the payload's length and the payload's own tag (4 bytes each), under which the
/// payload follows on the payload communicator when the sender holds it.
pub const PROMISED_HEAD_TAG: c_int = 0x6678;

/// [`PROMISED_HEAD_TAG`] with the frame before it in front, as [`JOINED_HEAD_TAG`].
pub const JOINED_PROMISED_HEAD_TAG: c_int = 0x6679;

/// The first tag a promised payload takes on the payload communicator (below it:
/// [`FRAME_TAG`], the tag of payloads that follow their head at once). Promised
/// payloads take the tags from here to `MPI_TAG_UB` in turn, so two promises in flight
/// share a tag only after that many others (over two billion with Open MPI).
pub(super) const FIRST_PROMISE_TAG: c_int = 0x10000;

/// What follows a frame in a message: nothing (a whole frame), or its payload as a
/// message of its own on the payload communicator, right behind it ([`HEAD_TAG`]: the
/// head ends with the payload's length) or later under its own tag
/// ([`PROMISED_HEAD_TAG`]: the head ends with the payload's length and tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Follows {
    Nothing,
    Payload,
    PromisedPayload,
}

impl Follows {
    /// The bytes after the head that say where its payload comes.
    pub(super) fn trailer(self) -> usize {
        match self {
            Follows::Nothing => 0,
            Follows::Payload => 4,
            Follows::PromisedPayload => 8,
        }
    }
}

/// The length of the message [`MpiTransport::send_then_parts`] sends for a frame of
/// `frame` bytes followed by a head of `head` bytes and a payload of `payload` bytes:
/// the frame's length and bytes, then the head and either the payload (copied, under
/// [`COPY_BELOW`]) or its length (the payload follows as its own message).
pub(super) fn joined_len(frame: usize, head: usize, payload: usize) -> usize {
    let behind = if payload < COPY_BELOW { payload } else { 4 };
    4 + frame + head + behind
}

/// The length of the frame at the front of a joined message ([`JOINED_TAG`],
/// [`JOINED_HEAD_TAG`]), if the message holds it whole.
pub(super) fn joined_front(message: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(message.get(..4)?.try_into().ok()?) as usize;
    (len <= message.len() - 4).then_some(len)
}

#[cfg(test)]
mod tests {
    use ft_core::wire;

    use super::*;

    #[test]
    fn a_joined_message_fits_a_receive_slot_or_is_not_joined() {
        let capacity = wire::frame_capacity(8);
        // An activation of a few dozen bytes and a chunk's head: a small message.
        assert_eq!(joined_len(45, 26, 65_536), 4 + 45 + 26 + 4);
        assert_eq!(
            joined_len(45, 26, 100),
            4 + 45 + 26 + 100,
            "a copied payload"
        );
        // The largest activation frame the broadcaster makes (its cap is the frame
        // capacity less 32 bytes) cannot ride in front of a head in one slot.
        assert!(joined_len(capacity - 32, 26, 65_536) > capacity);
    }

    #[test]
    fn the_front_of_a_joined_message_must_lie_within_it() {
        let mut message = 3u32.to_le_bytes().to_vec();
        message.extend_from_slice(b"abcde");
        assert_eq!(joined_front(&message), Some(3));
        message[0] = 6;
        assert_eq!(joined_front(&message), None, "longer than what follows");
        assert_eq!(joined_front(&[1, 0]), None, "no length");
        assert_eq!(joined_front(&0u32.to_le_bytes()), Some(0));
    }
}
