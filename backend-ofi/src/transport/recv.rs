//! The receive path: the pool of posted receive buffers, and what
//! [`OfiTransport::try_recv_placing`] hands out of them, or out of a finished RMA read,
//! in arrival order.

use std::ffi::c_void;
use std::ptr;

use ft_core::{Filled, Rank, Slot};
use ft_runtime::{Bytes, Delivery, Place, Received};

use super::error::{call_error, error_code};
use super::{context, OfiError, OfiTransport, FI_ADDR_UNSPEC, RECV};
use crate::sys;

/// Frames at least this long are handed over ([`Received::Owned`]) with the buffer they
/// arrived in, a fresh buffer taking its place, so the broadcaster keeps their chunk
/// without a copy; shorter ones (control frames) are lent and their buffer reposted.
pub const HAND_OVER_FROM: usize = 4096;

/// What a receive completion left for `try_recv`.
#[derive(Debug)]
pub(super) enum Arrival {
    /// A frame of `len` bytes from `from` in receive buffer `slot`.
    Frame { slot: usize, from: Rank, len: usize },
    /// A frame of `len` bytes from `from` whose payload an RMA read placed in `buf`.
    Read {
        from: Rank,
        buf: Box<[u8]>,
        len: usize,
    },
    /// A truncated message (its buffer is already posted again).
    Oversized { from: Rank, len: usize },
    /// A frame whose payload an RMA read placed in the caller's slot
    /// ([`OfiTransport::try_recv_placing`]).
    Placed {
        from: Rank,
        head: Vec<u8>,
        payload: Filled,
    },
    /// A slot the caller gave for a read that failed: back unwritten.
    Unplaced { slot: Slot },
}

impl OfiTransport {
    /// Receives one frame if one has arrived. The frame borrows a receive buffer, which
    /// is posted again at the next call. (An offered payload is read into this
    /// transport's buffer: see [`OfiTransport::try_recv_placing`] for the caller's.)
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, OfiError> {
        Ok(self
            .try_recv_placing(&mut |_, _, _| None)?
            .and_then(Delivery::into_received))
    }

    /// Receives one frame if one has arrived, as [`OfiTransport::try_recv`]; a payload
    /// offered for an RMA read goes where `place(from, head, len)` says, if it gives a
    /// slot of exactly the payload's length ([`Delivery::Placed`] once read,
    /// [`Delivery::Unplaced`] if the read fails), else behind its head in this
    /// transport's buffer. An offer's read is posted by this call once every frame
    /// received before the offer was handed on (offers that [`OfiTransport::progress`]
    /// received wait for it too).
    pub fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, OfiError> {
        self.return_lent();
        self.post_receives()?;
        if self.arrived.is_empty() {
            self.poll_cq()?;
            self.post_receives()?;
            self.retry_reads();
        }
        // An offer's reads start once every frame that came before it was handed on:
        // the activation that announces an output comes before its chunks' offers,
        // and the caller can only say where a chunk goes once it has seen it.
        if self.arrived.is_empty() {
            while let Some(offer) = self.offered.pop_front() {
                self.start_read(offer, place);
            }
        }
        match self.arrived.pop_front() {
            None => Ok(None),
            Some(Arrival::Oversized { from, len }) => {
                Ok(Some(Delivery::Received(Received::Oversized { from, len })))
            }
            Some(Arrival::Frame { slot, from, len }) if len >= HAND_OVER_FROM => {
                self.stats.received += 1;
                self.stats.frames_handed_over += 1;
                let fresh = vec![0u8; self.recv_bufs[slot].len()].into_boxed_slice();
                let full = std::mem::replace(&mut self.recv_bufs[slot], fresh);
                self.unposted.push(slot);
                Ok(Some(Delivery::Received(Received::Owned {
                    from,
                    frame: owned(full, len),
                })))
            }
            Some(Arrival::Frame { slot, from, len }) => {
                self.lent = Some(slot);
                self.stats.received += 1;
                Ok(Some(Delivery::Received(Received::Frame {
                    from,
                    bytes: &self.recv_bufs[slot][..len],
                })))
            }
            Some(Arrival::Read { from, buf, len }) => {
                self.stats.received += 1;
                self.stats.frames_handed_over += 1;
                Ok(Some(Delivery::Received(Received::Owned {
                    from,
                    frame: owned(buf, len),
                })))
            }
            Some(Arrival::Placed {
                from,
                head,
                payload,
            }) => {
                self.stats.received += 1;
                self.placed_head = head;
                Ok(Some(Delivery::Placed {
                    from,
                    head: &self.placed_head,
                    payload,
                }))
            }
            Some(Arrival::Unplaced { slot }) => Ok(Some(Delivery::Unplaced { slot })),
        }
    }

    /// Marks the buffer of the last frame lent out for posting again.
    pub(super) fn return_lent(&mut self) {
        if let Some(slot) = self.lent.take() {
            self.unposted.push(slot);
        }
    }

    /// Keeps a read buffer for the next read, up to `recv_depth` of them.
    pub(super) fn recycle(&mut self, buf: Box<[u8]>) {
        if self.read_spares.len() < self.recv_depth {
            self.read_spares.push(buf);
        }
    }

    /// Posts every receive buffer not posted, until the provider refuses one.
    pub(super) fn post_receives(&mut self) -> Result<(), OfiError> {
        while let Some(&slot) = self.unposted.last() {
            let buf = &mut self.recv_bufs[slot];
            // SAFETY: `ep` is our endpoint; the buffer is `max_frame` writable bytes,
            // boxed in `recv_bufs` (which never grows or shrinks after open), not lent
            // out and not posted, and stays untouched until its completion is read or
            // the endpoint closes.
            let ret = unsafe {
                sys::fi_recv(
                    self.ep,
                    buf.as_mut_ptr().cast::<c_void>(),
                    buf.len(),
                    ptr::null_mut(),
                    FI_ADDR_UNSPEC,
                    context(slot, RECV),
                )
            };
            if ret == 0 {
                self.unposted.pop();
                continue;
            }
            let code = error_code(ret);
            if code == sys::FI_EAGAIN as i32 {
                return Ok(());
            }
            return Err(call_error("fi_recv", code));
        }
        Ok(())
    }

    /// The rank a receive completion's CQ data names, if it names one. Every rank
    /// sends with CQ data, so the data is not required to come with its
    /// `FI_REMOTE_CQ_DATA` flag, which `sockets` (1.17) leaves off some completions.
    pub(super) fn sender(&self, data: u64) -> Option<Rank> {
        Rank::try_from(data).ok().filter(|&rank| rank < self.n)
    }
}

/// The first `len` bytes of `buf` as a frame the caller keeps (no copy).
fn owned(buf: Box<[u8]>, len: usize) -> Bytes {
    let mut frame = Bytes::from(buf);
    frame.truncate(len);
    frame
}
