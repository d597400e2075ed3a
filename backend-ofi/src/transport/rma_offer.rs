//! The sender's side of RMA: a payload at or above the threshold is registered for
//! remote reads (one registration per payload slice, shared by every transfer that
//! offers it) and offered; a transfer ends with its receiver's done message or its
//! death, and the registration closes when its last transfer ends.

use std::ffi::c_void;
use std::ptr;
use std::time::Instant;

use ft_core::Rank;
use ft_runtime::Bytes;

use super::send::{Carries, Frame};
use super::{OfiError, OfiTransport};
use crate::rma::{self, Offer};
use crate::sys;

/// `FI_KEY_NOTAVAIL` (a cast bindgen cannot translate): the key is raw (`FI_MR_RAW`).
const FI_KEY_NOTAVAIL: u64 = u64::MAX;

/// A registered payload, shared by the transfers that offer it (a relay forwards one
/// chunk to each of its children: one registration serves them all).
pub(super) struct Registration {
    pub(super) mr: *mut sys::fid_mr,
    /// The remote address of the payload's first byte.
    addr: u64,
    key: u64,
    /// Keeps the registered bytes alive and unchanged while the registration lives.
    payload: Bytes,
    /// Transfers using it.
    users: usize,
    /// A user's receiver was taken for dead: its provider may still be sending from
    /// these bytes, so they are retired, not freed, when the registration closes.
    tainted: bool,
}

/// An offered payload, until its receiver's done message (or its death).
pub(super) struct Transfer {
    pub(super) to: Rank,
    /// The registration's key in [`OfiTransport::registrations`].
    region: (usize, usize),
    pub(super) offered: Instant,
    /// Counted in [`OfiTransport::pending_sends`] (not abandoned).
    pub(super) counted: bool,
}

impl OfiTransport {
    /// Releases every transfer offered to `rank` that it has not said it is done with:
    /// for a peer the caller knows is dead (the transport finds out by itself when a
    /// send to it fails). Their registrations close once no other transfer uses them.
    pub fn release_transfers_to(&mut self, rank: Rank) {
        let ids: Vec<u64> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.to == rank)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.stats.rma_released_unread += 1;
            self.release_transfer(id, true);
        }
    }

    /// Registers `payload` (or shares the registration of the same bytes) and sends
    /// `to` an offer to read it; falls back to two-sided if registering fails.
    pub(super) fn offer(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        if to >= self.n {
            return Err(OfiError::RankOutOfRange {
                rank: to,
                size: self.n,
            });
        }
        let region = (payload.as_ptr().addr(), payload.len());
        let (addr, key) = match self.registrations.get_mut(&region) {
            Some(registration) => {
                registration.users += 1;
                self.stats.rma_registrations_reused += 1;
                (registration.addr, registration.key)
            }
            None => match self.register(payload) {
                Some(registration) => {
                    let found = (registration.addr, registration.key);
                    self.registrations.insert(region, registration);
                    found
                }
                None => {
                    self.stats.rma_fallbacks += 1;
                    return self.send_two_sided(to, head, payload);
                }
            },
        };
        let id = self.next_transfer;
        self.next_transfer += 1;
        self.transfers.insert(
            id,
            Transfer {
                to,
                region,
                offered: Instant::now(),
                counted: true,
            },
        );
        self.transfers_pending += 1;
        self.stats.rma_offered += 1;
        let message = rma::encode_offer(&Offer {
            id,
            addr,
            len: payload.len() as u64,
            key,
            head,
        });
        self.start(
            to,
            Frame {
                head: message,
                payload: None,
                carries: Carries::Offer,
            },
        )
    }

    /// Registers `payload` for remote reads; `None` if the provider refuses.
    fn register(&mut self, payload: &Bytes) -> Option<Registration> {
        let requested_key = self.next_mr_key;
        self.next_mr_key += 1;
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: `domain` is our open domain; the `len` bytes at `buf` are the heap
        // bytes of `payload`, a clone of which the Registration keeps (immutable, never
        // moved) until after `fi_close` of the MR; the provider only reads them
        // (FI_REMOTE_READ). On success libfabric writes the MR handle into `mr`.
        let ret = unsafe {
            sys::fi_mr_reg(
                self.domain,
                payload.as_ptr().cast::<c_void>(),
                payload.len(),
                u64::from(sys::FI_REMOTE_READ),
                0,
                requested_key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        if ret != 0 || mr.is_null() {
            return None;
        }
        // SAFETY: `mr` is the MR just opened and `ep` our enabled endpoint; under
        // FI_MR_ENDPOINT an MR is bound to the endpoint and enabled before use.
        // fi_mr_key reads the key the provider stored in the MR. On failure the MR is
        // closed and not used again.
        unsafe {
            let endpoint = self.mr_mode & u64::from(sys::FI_MR_ENDPOINT) != 0;
            let bound = !endpoint
                || (sys::fi_mr_bind(mr, &mut (*self.ep).fid, 0) == 0 && sys::fi_mr_enable(mr) == 0);
            let key = sys::fi_mr_key(mr);
            if !bound || key == FI_KEY_NOTAVAIL {
                sys::fi_close(&raw mut (*mr).fid);
                return None;
            }
            let addr = if self.mr_mode & u64::from(sys::FI_MR_VIRT_ADDR) != 0 {
                payload.as_ptr().addr() as u64
            } else {
                0
            };
            Some(Registration {
                mr,
                addr,
                key,
                payload: payload.clone(),
                users: 1,
                tainted: false,
            })
        }
    }

    /// Ends transfer `id` (its receiver is done, or `dead`); closes its registration
    /// when no other transfer uses it.
    pub(super) fn release_transfer(&mut self, id: u64, dead: bool) {
        let Some(transfer) = self.transfers.remove(&id) else {
            return;
        };
        if transfer.counted {
            self.transfers_pending -= 1;
        }
        let Some(registration) = self.registrations.get_mut(&transfer.region) else {
            return;
        };
        registration.tainted |= dead;
        registration.users -= 1;
        if registration.users > 0 {
            return;
        }
        let registration = self
            .registrations
            .remove(&transfer.region)
            .expect("the registration just found");
        // SAFETY: the MR is open (a registration is removed from the map exactly once,
        // here or in Drop) and no read of ours refers to it; remote reads that come
        // after the close fail at the provider.
        unsafe { sys::fi_close(&raw mut (*registration.mr).fid) };
        if registration.tainted {
            self.retired
                .push_back((Instant::now(), registration.payload));
        }
    }

    /// The transport learned that `rank` is dead (a send to it failed): releases the
    /// transfers offered to it.
    pub(super) fn peer_failed(&mut self, rank: Rank) {
        if !self.transfers.is_empty() {
            self.release_transfers_to(rank);
        }
    }
}
