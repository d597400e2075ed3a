//! Progress: reading the completion queue and handing each completion to its part
//! (send, receive, RMA read), blocking on the CQ's wait object when idle, and giving up
//! on sends and transfers stalled past the stall timeout.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use super::error::{call_error, error_code, is_peer_failure};
use super::recv::Arrival;
#[cfg(doc)]
use super::OfiConfig;
use super::{key, OfiError, OfiTransport, READ, RECV, SEND};
use crate::rma::{ControlError, CONTROL_FLAG};
use crate::sys;

/// Completions read per `fi_cq_read`.
const CQ_BATCH: usize = 16;

/// The longest [`OfiTransport::wait`] naps while frames wait for a retry.
const PARKED_NAP: Duration = Duration::from_micros(200);

/// How often [`OfiTransport::progress`] looks for stalled posted sends.
const STALL_SCAN: Duration = Duration::from_millis(100);

impl OfiTransport {
    /// Reads completions (freeing finished sends' buffers, queueing arrived frames),
    /// posts receive buffers again, and retries the backlog (dropping frames stalled
    /// past [`OfiConfig::stall_timeout`]).
    pub fn progress(&mut self) -> Result<(), OfiError> {
        self.return_lent();
        self.poll_cq()?;
        self.post_receives()?;
        self.retry_reads();
        if self.backlog_count > 0 {
            for queue in 0..self.backlog.len() {
                self.flush_backlog(queue)?;
            }
        }
        self.abandon_stalled_sends();
        Ok(())
    }

    /// Waits at most `timeout` for a completion, without the CPU when the CQ has a wait
    /// object (`fi_cq_sread`, in whole milliseconds; a shorter wait, or frames parked
    /// for a retry, nap instead, then retry those frames). Completions it reads are
    /// handled as [`OfiTransport::try_recv`]'s are.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), OfiError> {
        if !self.arrived.is_empty() {
            return Ok(());
        }
        self.return_lent();
        self.post_receives()?;
        let millis = timeout.as_millis();
        if !self.waitable || millis == 0 || self.backlog_count > 0 || !self.reads_waiting.is_empty()
        {
            std::thread::sleep(timeout.min(PARKED_NAP));
            // A caller that only waits and receives still gets its parked frames out.
            if self.backlog_count > 0 {
                for queue in 0..self.backlog.len() {
                    self.flush_backlog(queue)?;
                }
            }
            return Ok(());
        }
        let millis = c_int::try_from(millis).unwrap_or(c_int::MAX);
        let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
        // SAFETY: as in `poll_cq`; no wait condition is passed.
        let ret = unsafe {
            sys::fi_cq_sread(
                self.cq,
                entries.as_mut_ptr().cast::<c_void>(),
                CQ_BATCH,
                ptr::null(),
                millis,
            )
        };
        if ret > 0 {
            for entry in &entries[..ret as usize] {
                self.on_completion(entry);
            }
            return Ok(());
        }
        let code = error_code(ret);
        // Nothing came (EAGAIN, ETIMEDOUT), or a waker signalled the CQ (ECANCELED on
        // `sockets`).
        let woken_empty = [sys::FI_EAGAIN, sys::FI_ETIMEDOUT, sys::FI_ECANCELED];
        if ret == 0 || woken_empty.iter().any(|&c| code == c as i32) || is_peer_failure(code) {
            // (A peer failure: as in `poll_cq`.)
            Ok(())
        } else if code == sys::FI_EAVAIL as i32 {
            self.poll_cq()
        } else {
            Err(call_error("fi_cq_sread", code))
        }
    }

    /// Reads the completion queue until it is empty.
    pub(super) fn poll_cq(&mut self) -> Result<(), OfiError> {
        let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
        loop {
            // SAFETY: `cq` is our CQ, opened with FI_CQ_FORMAT_DATA, so each entry is
            // an fi_cq_data_entry; the array holds CQ_BATCH of them.
            let ret = unsafe {
                sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast::<c_void>(), CQ_BATCH)
            };
            if ret > 0 {
                for entry in &entries[..ret as usize] {
                    self.on_completion(entry);
                }
                continue;
            }
            let code = error_code(ret);
            // A peer's broken connection can surface here too (`tcp;ofi_rxm` progress
            // serving an RMA read of a rank that died): a dead peer is never our error.
            if ret == 0 || code == sys::FI_EAGAIN as i32 || is_peer_failure(code) {
                return Ok(());
            }
            if code != sys::FI_EAVAIL as i32 {
                return Err(call_error("fi_cq_read", code));
            }
            let mut err = sys::fi_cq_err_entry::default();
            // SAFETY: `cq` is our CQ; `err` is a zeroed entry whose err_data_size of 0
            // lets the provider point err_data at its own storage.
            let ret = unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
            if ret == 1 {
                self.on_error_completion(&err);
            } else if ret < 0 && error_code(ret) != sys::FI_EAGAIN as i32 {
                return Err(call_error("fi_cq_readerr", error_code(ret)));
            } else {
                // Announced but not there (yet): the next poll reads it.
                return Ok(());
            }
        }
    }

    fn on_completion(&mut self, entry: &sys::fi_cq_data_entry) {
        match key(entry.op_context) {
            (slot, SEND) => {
                self.finish_send(slot);
            }
            (slot, READ) => self.finish_read(slot, true),
            (slot, RECV) if slot < self.recv_bufs.len() => {
                let control = entry.data & CONTROL_FLAG != 0;
                let from = self.sender(entry.data & !CONTROL_FLAG);
                if let Some(from) = from {
                    self.last_heard[from as usize] = Instant::now();
                }
                match from {
                    Some(from) if control => {
                        self.on_control(slot, from, entry.len.min(self.max_frame))
                    }
                    Some(from) => self.arrived.push_back(Arrival::Frame {
                        slot,
                        from,
                        len: entry.len.min(self.max_frame),
                    }),
                    None => {
                        self.stats.bad_sender += 1;
                        self.unposted.push(slot);
                    }
                }
            }
            // Not a key of ours: nothing to free.
            _ => {}
        }
    }

    fn on_error_completion(&mut self, err: &sys::fi_cq_err_entry) {
        match key(err.op_context) {
            (slot, SEND) => {
                let to = self
                    .in_flight
                    .get(slot)
                    .and_then(Option::as_ref)
                    .map(|s| s.to);
                // An abandoned send was counted already.
                let counted = self.finish_send(slot);
                self.stats.send_errors += u64::from(counted);
                if let Some(to) = to {
                    self.peer_failed(to);
                }
            }
            (slot, READ) => self.finish_read(slot, false),
            (slot, RECV) if slot < self.recv_bufs.len() => {
                self.unposted.push(slot);
                if err.err != sys::FI_ETRUNC as i32 {
                    self.stats.recv_errors += 1;
                    return;
                }
                if err.data & CONTROL_FLAG != 0 {
                    self.refuse_control(ControlError::Oversized);
                    return;
                }
                match self.sender(err.data) {
                    Some(from) => {
                        self.stats.oversized += 1;
                        // `len` is the bytes placed and `olen` the rest, as the
                        // spec says, or (ofi_rxm) `len` is the whole message.
                        let len = if err.len > self.max_frame {
                            err.len
                        } else {
                            err.len.saturating_add(err.olen)
                        };
                        self.arrived.push_back(Arrival::Oversized { from, len });
                    }
                    None => self.stats.bad_sender += 1,
                }
            }
            _ => {}
        }
    }

    /// Stops counting posted sends that saw no completion for the stall timeout
    /// (`tcp;ofi_rxm` may never complete a send whose connection broke). Their buffers
    /// stay until a completion comes or the endpoint closes.
    fn abandon_stalled_sends(&mut self) {
        let idle =
            self.in_flight_count == 0 && self.transfers_pending == 0 && self.retired.is_empty();
        if idle || self.last_stall_scan.elapsed() < STALL_SCAN {
            return;
        }
        self.last_stall_scan = Instant::now();
        let mut silent = Vec::new();
        for transfer in self.transfers.values_mut() {
            if transfer.offered.elapsed() < self.stall_timeout {
                continue;
            }
            if transfer.counted {
                transfer.counted = false;
                self.transfers_pending -= 1;
                self.stats.rma_abandoned += 1;
            }
            if self.last_heard[transfer.to as usize].elapsed() >= self.stall_timeout {
                silent.push(transfer.to);
            }
        }
        // Unanswered for the stall timeout by a peer that sent nothing in that time:
        // taken for dead (a live reader answers, and the protocol's own traffic shows
        // it alive).
        silent.sort_unstable();
        silent.dedup();
        for rank in silent {
            self.release_transfers_to(rank);
        }
        while self
            .retired
            .front()
            .is_some_and(|(since, _)| since.elapsed() >= self.stall_timeout)
        {
            self.retired.pop_front();
        }
        for send in self.in_flight.iter_mut().flatten() {
            if !send.abandoned && send.posted.elapsed() >= self.stall_timeout {
                send.abandoned = true;
                self.in_flight_count -= 1;
                self.stats.send_abandoned += 1;
            }
        }
    }
}
