//! The receiver's side of RMA: control messages from peers (offers, done messages),
//! the `fi_read` of an offered payload into a frame buffer or the caller's slot, and
//! the done message that lets the sender release it.

use std::ffi::c_void;
use std::ptr;
use std::time::Instant;

use ft_core::{Rank, Slot};
use ft_runtime::Place;

use super::error::error_code;
use super::recv::Arrival;
use super::send::{Carries, Frame, Posted};
use super::{context, OfiTransport, READ};
use crate::rma::{self, Control, ControlError};
use crate::sys;

/// A posted (or to be posted) RMA read: the frame being assembled.
pub(super) struct PendingRead {
    from: Rank,
    id: u64,
    into: ReadInto,
    head_len: usize,
    frame_len: usize,
    addr: u64,
    key: u64,
}

/// Where an RMA read writes its payload.
enum ReadInto {
    /// The head, then the payload's place; `max_frame` bytes.
    Frame(Box<[u8]>),
    /// The caller's memory ([`OfiTransport::try_recv_placing`]), the head kept aside.
    Slot { head: Vec<u8>, slot: Slot },
}

/// An offer whose read has not started: reads start where the caller can say where
/// the payload goes ([`OfiTransport::try_recv_placing`]).
pub(super) struct OfferedRead {
    from: Rank,
    id: u64,
    addr: u64,
    len: u64,
    key: u64,
    head: Vec<u8>,
}

impl OfiTransport {
    /// Handles a control message of `len` bytes from `from` in receive buffer `slot`
    /// (which goes back to be posted).
    pub(super) fn on_control(&mut self, slot: usize, from: Rank, len: usize) {
        self.unposted.push(slot);
        // Control messages are a few dozen bytes: decoding a copy frees the receive
        // buffer's borrow for the calls below.
        let message = self.recv_bufs[slot][..len].to_vec();
        match rma::decode(&message) {
            Err(e) => self.refuse_control(e),
            Ok(Control::Done { id }) => match self.transfers.get(&id) {
                None => self.refuse_control(ControlError::UnknownTransfer { id }),
                Some(t) if t.to != from => self.refuse_control(ControlError::WrongPeer {
                    id,
                    offered_to: t.to,
                    from,
                }),
                Some(_) => self.release_transfer(id, false),
            },
            // Read at the next receive, which can ask where the payload goes.
            Ok(Control::Offer(offer)) => self.offered.push_back(OfferedRead {
                from,
                id: offer.id,
                addr: offer.addr,
                len: offer.len,
                key: offer.key,
                head: offer.head.to_vec(),
            }),
        }
    }

    pub(super) fn refuse_control(&mut self, error: ControlError) {
        self.stats.bad_control += 1;
        self.last_control_error = Some(error);
    }

    /// Starts reading `offer`'s payload: into the caller's slot if `place` gives one of
    /// the payload's length, else into a frame behind its head.
    pub(super) fn start_read(&mut self, offer: OfferedRead, place: &mut Place<'_>) {
        let from = offer.from;
        let head_len = offer.head.len();
        // `decode` checked that the sum fits.
        let frame_len = head_len + offer.len as usize;
        if frame_len > self.max_frame || offer.len as usize > self.max_msg {
            // As a two-sided frame this long would have been.
            self.stats.oversized += 1;
            self.arrived.push_back(Arrival::Oversized {
                from,
                len: frame_len,
            });
            self.send_done(from, offer.id);
            return;
        }
        if !self.rma_available {
            self.stats.rma_lost_reads += 1;
            self.send_done(from, offer.id);
            return;
        }
        let into = match place(from, &offer.head, offer.len as usize) {
            Some(slot) if slot.len() as u64 == offer.len => ReadInto::Slot {
                head: offer.head,
                slot,
            },
            other => {
                if let Some(slot) = other {
                    // Not of the payload's length: back unwritten.
                    self.arrived.push_back(Arrival::Unplaced { slot });
                }
                let mut buf = self
                    .read_spares
                    .pop()
                    .unwrap_or_else(|| vec![0u8; self.max_frame].into_boxed_slice());
                buf[..head_len].copy_from_slice(&offer.head);
                ReadInto::Frame(buf)
            }
        };
        let read = PendingRead {
            from,
            id: offer.id,
            head_len,
            into,
            frame_len,
            addr: offer.addr,
            key: offer.key,
        };
        let slot = match self.free_read_slots.pop() {
            Some(slot) => {
                self.reads[slot] = Some(read);
                slot
            }
            None => {
                self.reads.push(Some(read));
                self.reads.len() - 1
            }
        };
        self.post_read(slot);
    }

    /// Posts the read in `slot`; queues it for a retry if the provider refuses it for
    /// now, and gives it up (a lost frame) on any other refusal.
    fn post_read(&mut self, slot: usize) {
        let Some(read) = self.reads.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let len = read.frame_len - read.head_len;
        let dest = match &mut read.into {
            ReadInto::Frame(buf) => buf[read.head_len..read.frame_len].as_mut_ptr(),
            ReadInto::Slot { slot, .. } => slot.as_mut_ptr(),
        };
        // SAFETY: `ep` is our endpoint; `dest` is `len` writable bytes of a boxed buffer
        // owned by read slot `slot`, or of the caller's slot it holds (`ft_core::landing`:
        // ours to write until filled or given back), neither moved nor touched until
        // the read's completion is read or the endpoint closes (Drop closes the
        // endpoint before the slab is freed). No descriptor is needed (no FI_MR_LOCAL).
        // A bad address or key from the peer fails the read at the provider, into an
        // error completion.
        let ret = unsafe {
            sys::fi_read(
                self.ep,
                dest.cast::<c_void>(),
                len,
                ptr::null_mut(),
                self.peers[read.from as usize],
                read.addr,
                read.key,
                context(slot, READ),
            )
        };
        if ret == 0 {
            return;
        }
        if error_code(ret) == sys::FI_EAGAIN as i32 {
            self.stats.eagain_retries += 1;
            self.reads_waiting.push_back(slot);
        } else {
            self.finish_read(slot, false);
        }
    }

    /// Posts the reads the provider refused earlier, until it refuses one again.
    pub(super) fn retry_reads(&mut self) {
        for _ in 0..self.reads_waiting.len() {
            let Some(slot) = self.reads_waiting.pop_front() else {
                return;
            };
            let before = self.reads_waiting.len();
            self.post_read(slot);
            if self.reads_waiting.len() > before {
                return;
            }
        }
    }

    /// A read ended: delivers its frame if it succeeded, and tells the sender it may
    /// release the payload either way.
    pub(super) fn finish_read(&mut self, slot: usize, ok: bool) {
        let Some(read) = self.reads.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_read_slots.push(slot);
        if ok {
            self.last_heard[read.from as usize] = Instant::now();
            self.stats.rma_reads += 1;
            self.stats.rma_bytes_read += (read.frame_len - read.head_len) as u64;
            match read.into {
                ReadInto::Frame(buf) => self.arrived.push_back(Arrival::Read {
                    from: read.from,
                    buf,
                    len: read.frame_len,
                }),
                ReadInto::Slot { head, slot } => {
                    self.stats.rma_bytes_placed += slot.len() as u64;
                    // SAFETY: the read completed without error: the provider wrote
                    // all the slot's bytes (the read's length is the slot's).
                    let payload = unsafe { slot.filled() };
                    self.arrived.push_back(Arrival::Placed {
                        from: read.from,
                        head,
                        payload,
                    });
                }
            }
        } else {
            self.stats.rma_lost_reads += 1;
            match read.into {
                ReadInto::Frame(buf) => self.recycle(buf),
                ReadInto::Slot { slot, .. } => self.arrived.push_back(Arrival::Unplaced { slot }),
            }
        }
        self.send_done(read.from, read.id);
    }

    /// Sends a done message for transfer `id` to `to`, without polling the CQ (this
    /// runs while completions are handled): a refused one waits in the backlog.
    fn send_done(&mut self, to: Rank, id: u64) {
        let frame = Frame {
            head: rma::encode_done(id),
            payload: None,
            carries: Carries::Done,
        };
        let queue = to as usize;
        if !self.backlog[queue].is_empty() {
            self.park(queue, frame, Instant::now());
            return;
        }
        match self.post_send(to, frame) {
            Ok(Posted::Again(frame)) => self.park(queue, frame, Instant::now()),
            // Posted, dropped (the sender is dead), or refused for good: the sender's
            // registration then waits for its own release rules.
            Ok(Posted::Yes | Posted::Dropped) | Err(_) => {}
        }
    }
}
