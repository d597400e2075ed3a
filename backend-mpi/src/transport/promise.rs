//! Heads sent ahead of their payloads ([`MpiTransport::send_head`]), for a relay that
//! activates a child before it holds the child's data (`ft_core::Promise`).
//!
//! The head goes as a message tagged [`PROMISED_HEAD_TAG`] (or
//! [`JOINED_PROMISED_HEAD_TAG`] behind the activation), ending with the payload's length
//! and a tag of its own, taken in turn from the tags above the frames' own up to
//! `MPI_TAG_UB`. The receiver posts the payload's receive on that tag at once, exactly
//! as for a head; the payload follows on it whenever the sender holds it
//! ([`MpiTransport::send_promised`]), in any order with other payloads, and lands with
//! no step at the receiver in between. A withdrawn promise ([`MpiTransport::withdraw`])
//! sends an empty message on the tag, which ends the receive as a payload of the wrong
//! length (the frame lost); promises to a peer that died are dropped
//! ([`MpiTransport::forget_peer`]), and the receiver's receive from a dead sender fails
//! (ULFM) and gives its slot back.

use std::os::raw::{c_int, c_void};

use bytes::Bytes;
use ft_core::Rank;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::framing::{
    Follows, FIRST_PROMISE_TAG, FRAME_TAG, JOINED_PROMISED_HEAD_TAG, PROMISED_HEAD_TAG,
};
use super::send::Sending;
use super::{MpiError, MpiTransport, MAX_PAYLOAD};

/// Promise tags needed for [`MpiTransport::sends_heads_early`]: an MPI whose
/// `MPI_TAG_UB` leaves fewer (the standard's least is 32767) sends heads with their
/// payloads.
const PROMISE_TAGS_NEEDED: c_int = 1 << 20;

/// A payload promised to `to` under `tag` ([`MpiTransport::send_head`]), `len` bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Promised {
    to: Rank,
    tag: c_int,
    len: usize,
}

impl MpiTransport {
    /// Whether [`MpiTransport::send_head`] sends heads ahead of their payloads: when
    /// `MPI_TAG_UB` leaves room for their tags (Open MPI's does).
    pub fn sends_heads_early(&self) -> bool {
        self.promise_tags.is_some()
    }

    /// Starts sending `head` to `to`, the head of a frame whose payload of `len` bytes
    /// follows later ([`MpiTransport::send_promised`]) under `promise`, behind `first` (a
    /// whole frame, in the same message as in [`MpiTransport::send_then_parts`]). The
    /// head's message ([`PROMISED_HEAD_TAG`]) names the payload's own tag, so the
    /// receiver posts the payload's receive into its place as soon as the head arrives,
    /// and the payload, once sent, lands there with no further step at the receiver.
    /// A dead peer is not an error (nothing is promised to it).
    ///
    /// # Panics
    /// As [`MpiTransport::send_parts`]; or if heads are not sent early here
    /// ([`MpiTransport::sends_heads_early`]).
    pub fn send_head(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        len: usize,
        promise: u64,
    ) -> Result<(), MpiError> {
        self.check_peer(to);
        assert!(len <= MAX_PAYLOAD, "payload over MAX_PAYLOAD");
        let (next, last) = self.promise_tags.expect("heads are not sent early here");
        let tag = next;
        self.promise_tags = Some((
            if next == last {
                FIRST_PROMISE_TAG
            } else {
                next + 1
            },
            last,
        ));
        let mut first = first;
        if let Some(frame) = first {
            let joined = 4 + frame.len() + head.len() + Follows::PromisedPayload.trailer();
            if joined > self.ring.capacity {
                self.send_copied(to, &[frame], FRAME_TAG)?;
                first = None;
            }
        }
        let first_len = first.map(|f| (f.len() as u32).to_le_bytes());
        let mut parts: [&[u8]; 5] = [&[], &[], head, &[], &[]];
        if let (Some(len), Some(frame)) = (&first_len, first) {
            parts[0] = len;
            parts[1] = frame;
            self.stats.frames_joined += 1;
        }
        let trailer_len = (len as u32).to_le_bytes();
        let trailer_tag = tag.to_le_bytes();
        parts[3] = &trailer_len;
        parts[4] = &trailer_tag;
        let message_tag = if first.is_some() {
            JOINED_PROMISED_HEAD_TAG
        } else {
            PROMISED_HEAD_TAG
        };
        if self.send_copied(to, &parts, message_tag)? {
            self.stats.heads_sent_early += 1;
            self.promised.insert(promise, Promised { to, tag, len });
        }
        Ok(())
    }

    /// Starts sending the payload promised under `promise` ([`MpiTransport::send_head`])
    /// on its tag, from the caller's buffer (a clone is kept until the send completes).
    /// A promise to a peer that died ([`MpiTransport::forget_peer`]) sends nothing.
    pub fn send_promised(&mut self, promise: u64, payload: &Bytes) -> Result<(), MpiError> {
        let Some(Promised { to, tag, len }) = self.promised.remove(&promise) else {
            return Ok(());
        };
        // A payload of another length than promised goes anyway: the receiver's slot
        // comes back unfilled (`placed_mismatched`), as for a head that lied.
        debug_assert_eq!(payload.len(), len, "a promised payload's length");
        if self.isend_payload(to, payload, tag)? {
            self.stats.payload_bytes_in_place += payload.len() as u64;
        }
        Ok(())
    }

    /// The payload promised under `promise` will not come: an empty message on its tag
    /// ends the receiver's wait (its slot comes back unfilled; the frame is lost).
    pub fn withdraw(&mut self, promise: u64) -> Result<(), MpiError> {
        let Some(Promised { to, tag, .. }) = self.promised.remove(&promise) else {
            return Ok(());
        };
        self.stats.withdrawn += 1;
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let data = self.data_comm.as_raw();
        let pending = Sending {
            bytes: self.take_buffer(),
            payload: None,
        };
        self.isend(to, pending, 0, byte, tag, data).map(drop)
    }

    /// Drops the promises to `rank`, which died: their payloads go nowhere.
    pub fn forget_peer(&mut self, rank: Rank) {
        self.promised.retain(|_, p| p.to != rank);
    }
}

/// The tags promised payloads take on `comm`: the first and the last
/// (`MPI_TAG_UB`), or `None` if MPI offers fewer than [`PROMISE_TAGS_NEEDED`].
pub(super) fn promise_tags(comm: &SimpleCommunicator) -> Option<(c_int, c_int)> {
    tag_ub(comm)
        .filter(|&ub| ub - FIRST_PROMISE_TAG >= PROMISE_TAGS_NEEDED)
        .map(|ub| (FIRST_PROMISE_TAG, ub))
}

/// `MPI_TAG_UB` of `comm`, the largest tag MPI takes there, if MPI says.
fn tag_ub(comm: &SimpleCommunicator) -> Option<c_int> {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI writes a pointer to the attribute's value (an int it owns, alive as
    // long as the communicator) and the flag.
    let code = unsafe {
        ffi::MPI_Comm_get_attr(
            comm.as_raw(),
            ffi::MPI_TAG_UB as c_int,
            (&mut value as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        )
    };
    if code != ffi::MPI_SUCCESS as c_int || flag == 0 || value.is_null() {
        return None;
    }
    // SAFETY: MPI gave a valid pointer to the attribute's int.
    Some(unsafe { *value })
}
