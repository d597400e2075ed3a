//! The send path: short frames by `fi_injectdata`, whole frames by `fi_senddata`, a
//! head and a shared payload by `fi_sendmsg` (or by RMA, `rma_offer`), each posted send
//! kept in the send slab until its completion, and the per-destination backlog of
//! frames the provider refused for now.

use std::ffi::c_void;
use std::ptr;
use std::time::Instant;

use ft_core::Rank;
use ft_runtime::Bytes;

use super::error::{call_error, error_code, is_peer_failure};
use super::{context, OfiError, OfiTransport, SEND};
use crate::rma::CONTROL_FLAG;
use crate::sys;

/// A frame to send: a whole frame, or a head followed by a shared payload.
pub(super) struct Frame {
    pub(super) head: Box<[u8]>,
    pub(super) payload: Option<Bytes>,
    /// What the message carries.
    pub(super) carries: Carries,
}

/// What a sent message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Carries {
    /// A frame, whole.
    Frame,
    /// An RMA offer of a frame (a control message, flagged in the CQ data).
    Offer,
    /// A done message (a control message that stands for no frame).
    Done,
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.payload.as_ref().map_or(0, Bytes::len)
    }
}

/// A posted send: its buffers, until its completion (or the endpoint's close).
pub(super) struct InFlight {
    /// What libfabric reads until the completion.
    frame: Frame,
    /// The destination, taken for dead if the send fails.
    pub(super) to: Rank,
    pub(super) posted: Instant,
    /// No completion within the stall timeout: no longer counted as pending (the
    /// provider may still read the buffer, so it stays).
    pub(super) abandoned: bool,
}

/// A frame the provider has not accepted yet.
pub(super) struct Parked {
    frame: Frame,
    since: Instant,
}

/// What posting a send did.
pub(super) enum Posted {
    Yes,
    /// `-FI_EAGAIN`: the frame comes back to be retried.
    Again(Frame),
    /// The provider refused it for a peer's sake: dropped.
    Dropped,
}

impl OfiTransport {
    /// Starts sending `frame` to `to` (any rank of the job, this one included). A peer
    /// that died is not an error: the frame is dropped and counted.
    pub fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), OfiError> {
        if frame.len() <= self.inject_size
            && to < self.n
            && self.backlog[to as usize].is_empty()
            && self.inject(to, frame)?
        {
            return Ok(());
        }
        self.start(
            to,
            Frame {
                head: frame.into(),
                payload: None,
                carries: Carries::Frame,
            },
        )
    }

    /// Starts sending `head` followed by `payload` to `to` as one frame: the payload is
    /// posted in place (a clone of it kept until the completion), unless the provider
    /// cannot gather two buffers, when the two are copied into one frame.
    pub fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        if let Some(threshold) = self.rma_threshold {
            if payload.len() >= threshold && !payload.is_empty() {
                if self.rma_available {
                    return self.offer(to, head, payload);
                }
                self.stats.rma_fallbacks += 1;
            }
        }
        self.send_two_sided(to, head, payload)
    }

    /// `head` and `payload` as one two-sided frame (gathered, or copied if the provider
    /// cannot gather).
    pub(super) fn send_two_sided(
        &mut self,
        to: Rank,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), OfiError> {
        if self.iov_limit < 2 {
            let mut frame = Vec::with_capacity(head.len() + payload.len());
            frame.extend_from_slice(head);
            frame.extend_from_slice(payload);
            return self.send(to, &frame);
        }
        self.start(
            to,
            Frame {
                head: head.into(),
                payload: Some(payload.clone()),
                carries: Carries::Frame,
            },
        )
    }

    /// Posts `frame` to `to`, or parks it behind earlier frames to `to` or when the
    /// provider refuses it for now.
    pub(super) fn start(&mut self, to: Rank, frame: Frame) -> Result<(), OfiError> {
        if to >= self.n {
            return Err(OfiError::RankOutOfRange {
                rank: to,
                size: self.n,
            });
        }
        if frame.len() > self.max_msg {
            return Err(OfiError::FrameTooLong {
                len: frame.len(),
                max: self.max_msg,
            });
        }
        self.return_lent();
        let queue = to as usize;
        if !self.backlog[queue].is_empty() {
            // Behind earlier frames to the same peer, to keep the posting order.
            self.park(queue, frame, Instant::now());
            return self.flush_backlog(queue);
        }
        match self.post_send(to, frame)? {
            Posted::Yes | Posted::Dropped => Ok(()),
            Posted::Again(frame) => {
                self.park(queue, frame, Instant::now());
                // Connection set-up (tcp;ofi_rxm) moves only when the CQ is polled.
                self.poll_cq()
            }
        }
    }

    pub(super) fn park(&mut self, queue: usize, frame: Frame, since: Instant) {
        self.backlog[queue].push_back(Parked { frame, since });
        self.backlog_count += 1;
    }

    /// Posts the frames parked for `queue` until the provider refuses one; drops those
    /// it refused for longer than the stall timeout.
    pub(super) fn flush_backlog(&mut self, queue: usize) -> Result<(), OfiError> {
        while let Some(parked) = self.backlog[queue].pop_front() {
            self.backlog_count -= 1;
            match self.post_send(queue as Rank, parked.frame)? {
                Posted::Yes | Posted::Dropped => {}
                Posted::Again(frame) => {
                    if parked.since.elapsed() >= self.stall_timeout {
                        self.stats.send_stalled += 1;
                        self.peer_failed(queue as Rank);
                        continue;
                    }
                    self.backlog[queue].push_front(Parked {
                        frame,
                        since: parked.since,
                    });
                    self.backlog_count += 1;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Posts one frame to `to`, its buffers kept in the send slab until its completion.
    pub(super) fn post_send(&mut self, to: Rank, frame: Frame) -> Result<Posted, OfiError> {
        let slot = match self.free_send_slots.pop() {
            Some(slot) => slot,
            None => {
                self.in_flight.push(None);
                self.in_flight.len() - 1
            }
        };
        let head = (
            frame.head.as_ptr().cast_mut().cast::<c_void>(),
            frame.head.len(),
        );
        let payload = frame
            .payload
            .as_ref()
            .map(|p| (p.as_ptr().cast_mut().cast::<c_void>(), p.len()));
        // The box and the `Bytes` handle move into the slab; the heap bytes they point
        // to, which libfabric reads, do not.
        let carries = frame.carries;
        let data = u64::from(self.me)
            | if carries == Carries::Frame {
                0
            } else {
                CONTROL_FLAG
            };
        self.in_flight[slot] = Some(InFlight {
            frame,
            to,
            posted: Instant::now(),
            abandoned: false,
        });
        let ret = match payload {
            // SAFETY: `ep` is our enabled endpoint; `head` is `head.1` readable bytes
            // owned by the slab entry `slot`, which stays put until the completion for
            // the context key (or the endpoint's close); no descriptor is needed (no
            // FI_MR_LOCAL).
            None => unsafe {
                sys::fi_senddata(
                    self.ep,
                    head.0,
                    head.1,
                    ptr::null_mut(),
                    data,
                    self.peers[to as usize],
                    context(slot, SEND),
                )
            },
            Some(payload) => {
                let iov = [
                    sys::iovec {
                        iov_base: head.0,
                        iov_len: head.1,
                    },
                    sys::iovec {
                        iov_base: payload.0,
                        iov_len: payload.1,
                    },
                ];
                let msg = sys::fi_msg {
                    msg_iov: iov.as_ptr(),
                    desc: ptr::null_mut(),
                    iov_count: iov.len(),
                    addr: self.peers[to as usize],
                    context: context(slot, SEND),
                    data,
                };
                // SAFETY: as for `fi_senddata`, and the payload's bytes are kept alive,
                // unchanged (a `Bytes` is immutable), by the clone in slab entry `slot`;
                // `msg` and `iov` are read during the call only; the provider's
                // iov_limit is at least 2 (`send_parts` checked); no descriptors (no
                // FI_MR_LOCAL).
                unsafe {
                    sys::fi_sendmsg(
                        self.ep,
                        &msg,
                        u64::from(sys::FI_REMOTE_CQ_DATA | sys::FI_COMPLETION),
                    )
                }
            }
        };
        if ret == 0 {
            self.in_flight_count += 1;
            self.stats.sent += u64::from(carries != Carries::Done);
            return Ok(Posted::Yes);
        }
        let frame = self.in_flight[slot]
            .take()
            .expect("the frame just stored")
            .frame;
        self.free_send_slots.push(slot);
        let code = error_code(ret);
        if code == sys::FI_EAGAIN as i32 {
            self.stats.eagain_retries += 1;
            Ok(Posted::Again(frame))
        } else if is_peer_failure(code) {
            self.stats.send_errors += 1;
            self.peer_failed(to);
            Ok(Posted::Dropped)
        } else {
            Err(call_error("fi_senddata/fi_sendmsg", code))
        }
    }

    /// Sends a short frame by `fi_injectdata`: the provider copies it at once and
    /// reports no completion, so the frame takes no send slot, no allocation and no
    /// CQ entry (a control frame of the agreement or the detector, most of a
    /// `validate_global`'s frames). Whether it went (or was dropped for a dead peer);
    /// `false` when the provider has no room now (`-FI_EAGAIN`) and the caller must post
    /// it the ordinary way (later frames to `to` then queue behind it).
    fn inject(&mut self, to: Rank, frame: &[u8]) -> Result<bool, OfiError> {
        // SAFETY: `ep` is our enabled endpoint; `frame` is `frame.len()` readable bytes,
        // no more than the provider's inject size, read during the call only (inject
        // semantics: the buffer may be reused on return).
        let ret = unsafe {
            sys::fi_injectdata(
                self.ep,
                frame.as_ptr().cast::<c_void>(),
                frame.len(),
                u64::from(self.me),
                self.peers[to as usize],
            )
        };
        if ret == 0 {
            self.stats.sent += 1;
            self.stats.injected += 1;
            return Ok(true);
        }
        let code = error_code(ret);
        if code == sys::FI_EAGAIN as i32 {
            Ok(false)
        } else if is_peer_failure(code) {
            self.stats.send_errors += 1;
            self.peer_failed(to);
            Ok(true)
        } else {
            Err(call_error("fi_injectdata", code))
        }
    }

    /// Frees a completed send's buffer; whether it was still counted as pending (not
    /// abandoned, and `slot` held a send at all).
    pub(super) fn finish_send(&mut self, slot: usize) -> bool {
        match self.in_flight.get_mut(slot).and_then(Option::take) {
            Some(send) => {
                self.free_send_slots.push(slot);
                if !send.abandoned {
                    self.in_flight_count -= 1;
                }
                !send.abandoned
            }
            None => false,
        }
    }
}
