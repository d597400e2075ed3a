//! Opening a transport: `fi_getinfo` with the hints this transport needs, the fabric,
//! domain, address vector, completion queue and endpoint, the peers' addresses; closing
//! them all in `Drop` (endpoint first, so no buffer is freed while libfabric may touch
//! it); and the waker that ends an `fi_cq_sread` from another thread.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use ft_core::Rank;
#[cfg(doc)]
use ft_runtime::Transport;
use ft_runtime::Wake;

use super::error::{call_error, check, error_code};
use super::rendezvous::exchange_names;
use super::{config::validate, OfiConfig, OfiError, OfiStats, OfiTransport, FI_ADDR_UNSPEC};
use crate::sys;

impl OfiTransport {
    /// Opens an endpoint on `config.provider` and meets the other ranks through
    /// `config.rendezvous` (every rank of the job must call it; it returns once all
    /// their names are known, or fails after `config.connect_timeout`).
    pub fn open(config: OfiConfig) -> Result<Self, OfiError> {
        validate(&config)?;
        let provider =
            CString::new(config.provider.clone()).map_err(|_| OfiError::InvalidConfig {
                reason: "the provider name contains a NUL byte".into(),
            })?;
        let address = config
            .address
            .as_deref()
            .map(CString::new)
            .transpose()
            .map_err(|_| OfiError::InvalidConfig {
                reason: "the address contains a NUL byte".into(),
            })?;
        // RMA if the provider offers it (also when this rank sends two-sided: it still
        // serves its peers' offers); plain messages otherwise.
        let (info, rma_available) = match get_info(
            &provider,
            &config.provider,
            address.as_deref(),
            true,
            config.size,
        ) {
            Ok(info) => (info, true),
            Err(OfiError::ProviderNotFound { .. }) => (
                get_info(
                    &provider,
                    &config.provider,
                    address.as_deref(),
                    false,
                    config.size,
                )?,
                false,
            ),
            Err(e) => return Err(e),
        };
        let mut transport = OfiTransport {
            me: config.rank,
            n: config.size,
            max_frame: config.max_frame,
            max_msg: usize::MAX,
            iov_limit: 1,
            inject_size: 0,
            chunk_bytes: config.chunk_bytes,
            stall_timeout: config.stall_timeout,
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            peers: Vec::with_capacity(config.size as usize),
            in_flight: Vec::new(),
            free_send_slots: Vec::new(),
            in_flight_count: 0,
            last_stall_scan: Instant::now(),
            backlog: (0..config.size).map(|_| VecDeque::new()).collect(),
            backlog_count: 0,
            recv_bufs: (0..config.recv_depth)
                .map(|_| vec![0u8; config.max_frame].into_boxed_slice())
                .collect(),
            unposted: (0..config.recv_depth).rev().collect(),
            lent: None,
            arrived: VecDeque::new(),
            rma_threshold: config.rma_threshold,
            rma_available,
            // SAFETY: `info` is the fi_info fi_getinfo returned; its domain_attr is set.
            mr_mode: u64::from(unsafe { (*(*info).domain_attr).mr_mode } as u32),
            next_transfer: 0,
            next_mr_key: 1,
            registrations: HashMap::new(),
            transfers: HashMap::new(),
            transfers_pending: 0,
            last_heard: vec![Instant::now(); config.size as usize],
            retired: VecDeque::new(),
            placed_head: Vec::new(),
            offered: VecDeque::new(),
            reads: Vec::new(),
            free_read_slots: Vec::new(),
            reads_waiting: VecDeque::new(),
            read_spares: Vec::new(),
            recv_depth: config.recv_depth,
            last_control_error: None,
            waitable: false,
            signal: None,
            stats: OfiStats::default(),
        };
        // On any error below, dropping `transport` closes what was opened.
        transport.open_objects(config.size)?;
        transport.post_receives()?;
        let name = transport.endpoint_name()?;
        let names = exchange_names(&config, &name)?;
        for (rank, name) in names.iter().enumerate() {
            let addr = transport.insert_address(rank as Rank, name)?;
            transport.peers.push(addr);
        }
        Ok(transport)
    }

    /// Opens fabric, domain, AV, CQ and endpoint, binds them and enables the endpoint.
    fn open_objects(&mut self, size: u32) -> Result<(), OfiError> {
        // SAFETY: `info` is a valid fi_info from fi_getinfo; each call writes the new
        // object's handle into a field of ours, which `Drop` closes (in reverse order)
        // if it is non-null; the attribute structs live across the calls that read them.
        unsafe {
            let info = self.info;
            self.max_msg = (*(*info).ep_attr).max_msg_size;
            self.iov_limit = (*(*info).tx_attr).iov_limit;
            self.inject_size = (*(*info).tx_attr).inject_size;
            check(
                "fi_fabric",
                sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut()),
            )?;
            check(
                "fi_domain",
                sys::fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut()),
            )?;
            let mut av_attr = sys::fi_av_attr {
                type_: sys::fi_av_type_FI_AV_TABLE,
                count: size as usize,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut()),
            )?;
            // A wait object if the provider has one (idle ranks then block in
            // fi_cq_sread instead of polling); else a plain polled CQ.
            for wait_obj in [
                sys::fi_wait_obj_FI_WAIT_UNSPEC,
                sys::fi_wait_obj_FI_WAIT_NONE,
            ] {
                let mut cq_attr = sys::fi_cq_attr {
                    format: sys::fi_cq_format_FI_CQ_FORMAT_DATA,
                    wait_obj,
                    ..Default::default()
                };
                let ret = sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut());
                if ret == 0 {
                    self.waitable = wait_obj != sys::fi_wait_obj_FI_WAIT_NONE;
                    if self.waitable {
                        self.signal = Some(Arc::new(CqSignal {
                            cq: Mutex::new(CqPtr(self.cq)),
                        }));
                    }
                    break;
                }
                if wait_obj == sys::fi_wait_obj_FI_WAIT_NONE {
                    check("fi_cq_open", ret)?;
                }
            }
            check(
                "fi_endpoint",
                sys::fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut()),
            )?;
            check(
                "fi_ep_bind(av)",
                sys::fi_ep_bind(self.ep, &mut (*self.av).fid, 0),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(
                    self.ep,
                    &mut (*self.cq).fid,
                    u64::from(sys::FI_TRANSMIT | sys::FI_RECV),
                ),
            )?;
            check("fi_enable", sys::fi_enable(self.ep))?;
        }
        Ok(())
    }

    /// This endpoint's name (its address, in the provider's format).
    fn endpoint_name(&mut self) -> Result<Vec<u8>, OfiError> {
        let mut name = vec![0u8; 64];
        loop {
            let mut len = name.len();
            // SAFETY: `ep` is our enabled endpoint; libfabric writes at most `len` bytes
            // into `name` and the name's real length into `len`.
            let ret = unsafe {
                sys::fi_getname(
                    &mut (*self.ep).fid,
                    name.as_mut_ptr().cast::<c_void>(),
                    &mut len,
                )
            };
            if ret == 0 {
                name.truncate(len);
                return Ok(name);
            }
            let code = error_code(ret as isize);
            if code != sys::FI_ETOOSMALL as i32 || len <= name.len() {
                return Err(call_error("fi_getname", code));
            }
            name.resize(len, 0);
        }
    }

    fn insert_address(&mut self, rank: Rank, name: &[u8]) -> Result<sys::fi_addr_t, OfiError> {
        let mut addr: sys::fi_addr_t = FI_ADDR_UNSPEC;
        // SAFETY: `av` is our AV; `name` is one address of the provider's format (as
        // another rank's fi_getname wrote it), and libfabric writes one fi_addr_t.
        let ret = unsafe {
            sys::fi_av_insert(
                self.av,
                name.as_ptr().cast::<c_void>(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        match ret {
            1 => Ok(addr),
            0 => Err(OfiError::BadAddress { rank }),
            _ => Err(call_error("fi_av_insert", error_code(ret as isize))),
        }
    }
}

/// The CQ pointer behind [`CqSignal`]'s lock; null once the CQ is closed.
struct CqPtr(*mut sys::fid_cq);

// SAFETY: the pointer is only dereferenced (by fi_cq_signal) under the CqSignal lock,
// and the transport nulls it under that lock before it closes the CQ.
unsafe impl Send for CqPtr {}

/// Ends an `fi_cq_sread` from another thread ([`Transport::waker`]): application threads
/// of `ft_runtime::Runtime` wake the progress thread when they submit a command.
pub(super) struct CqSignal {
    cq: Mutex<CqPtr>,
}

impl Wake for CqSignal {
    fn wake(&self) {
        let cq = self.cq.lock().unwrap_or_else(|e| e.into_inner());
        if !cq.0.is_null() {
            // SAFETY: the CQ is open (the transport nulls the pointer under this lock
            // before closing it). fi_cq_signal only signals the CQ's wait object, which
            // libfabric's utility CQs guard themselves, so it may run beside the owning
            // thread's fi_cq_sread; that is what it exists for.
            unsafe { sys::fi_cq_signal(cq.0) };
        }
    }
}

impl Drop for OfiTransport {
    fn drop(&mut self) {
        // No waker may signal the CQ from here on.
        if let Some(signal) = &self.signal {
            signal.cq.lock().unwrap_or_else(|e| e.into_inner()).0 = ptr::null_mut();
        }
        // Endpoint first: after its close libfabric touches no buffer of ours, and the
        // buffers (fields) are freed only after this body. Then every object before the
        // ones it was opened from or bound to.
        // SAFETY: each pointer is null or an object we opened and have not closed; each
        // starts with its `struct fid`, which fi_close takes.
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&raw mut (*self.ep).fid);
            }
            // Registrations before the domain; their bytes are freed with the fields.
            for (_, registration) in self.registrations.drain() {
                sys::fi_close(&raw mut (*registration.mr).fid);
            }
            if !self.cq.is_null() {
                sys::fi_close(&raw mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&raw mut (*self.av).fid);
            }
            if !self.domain.is_null() {
                sys::fi_close(&raw mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(&raw mut (*self.fabric).fid);
            }
            if !self.info.is_null() {
                sys::fi_freeinfo(self.info);
            }
        }
    }
}

/// Sets two `ofi_rxm` variables the environment leaves unset, once per process
/// (libfabric reads them when its providers load, at the process's first `fi_getinfo`,
/// so the first endpoint's job size decides for the process):
///
/// - `FI_OFI_RXM_ENABLE_DYN_RBUF=0`: no dynamic receive buffers (received data placed
///   straight into the application's buffer by the `tcp` provider). In libfabric 1.17 a
///   message longer than its receive buffer then completes with `FI_ETRUNC` but no
///   length or CQ data, and breaks the connection, so later sends to that rank fail.
///   With rxm's own bounce buffers a truncated message is reported whole and the
///   connection lives on.
/// - `FI_OFI_RXM_MSG_RX_SIZE` from [`rxm_rx_size`]: rxm allocates and zeroes that many
///   bounce buffers (16 KiB each) for every connection when it is made, which is on the
///   first send to a peer, inside the send call. At rxm's default of 128 a connection
///   costs 2 MiB of page faults; with 64 ranks on 2 cores the progress loops making
///   their first connections stalled for longer than the detector's timeout and live
///   ranks were declared dead. Fewer buffers per connection in larger jobs keep the
///   cost of a connection, and the memory, bounded.
fn configure_rxm_once(size: u32) {
    static ONCE: Once = Once::new();
    const DYN_RBUF: &str = "FI_OFI_RXM_ENABLE_DYN_RBUF";
    const RX_SIZE: &str = "FI_OFI_RXM_MSG_RX_SIZE";
    ONCE.call_once(|| {
        // Every fi_getinfo of this crate runs after this (the Once blocks them).
        if std::env::var_os(DYN_RBUF).is_none() {
            std::env::set_var(DYN_RBUF, "0");
        }
        if std::env::var_os(RX_SIZE).is_none() {
            std::env::set_var(RX_SIZE, rxm_rx_size(size).to_string());
        }
    });
}

/// Receive buffers per `ofi_rxm` connection in a job of `size` ranks: rxm's own default
/// (128) up to 32 ranks, then a budget of 4096 buffers over the `size - 1` possible
/// peers, and never fewer than 32 (what jobs of 128 ranks run with on 2 cores with no
/// false declaration).
pub(crate) fn rxm_rx_size(size: u32) -> u32 {
    const DEFAULT: u32 = 128;
    const FLOOR: u32 = 32;
    const BUDGET: u32 = 4096;
    (BUDGET / size.saturating_sub(1).max(1)).clamp(FLOOR, DEFAULT)
}

/// The first `fi_info` of `provider` (`name` for messages) for an RDM endpoint bound to
/// `address` if one is given, with RMA reads of registered memory if `rma`, for a job of
/// `size` ranks (it sizes rxm's receive buffers: [`configure_rxm_once`]).
fn get_info(
    provider: &CStr,
    name: &str,
    address: Option<&CStr>,
    rma: bool,
    size: u32,
) -> Result<*mut sys::fi_info, OfiError> {
    configure_rxm_once(size);
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs
    // allocated (or null); the provider name is a malloc'd copy that fi_freeinfo frees
    // with the hints; fi_getinfo reads the hints and writes the list it allocates.
    unsafe {
        let hints = sys::fi_allocinfo();
        if hints.is_null() {
            return Err(call_error("fi_allocinfo", sys::FI_ENOMEM as i32));
        }
        (*hints).caps = u64::from(sys::FI_MSG);
        if rma {
            (*hints).caps |= u64::from(sys::FI_RMA | sys::FI_READ | sys::FI_REMOTE_READ);
        }
        // Contexts are keys, not fi_context structs: no FI_CONTEXT. Receives are always
        // posted, so FI_RX_CQ_DATA costs nothing.
        (*hints).mode = sys::FI_RX_CQ_DATA;
        (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
        let domain = (*hints).domain_attr;
        (*domain).threading = sys::fi_threading_FI_THREAD_DOMAIN;
        (*domain).av_type = sys::fi_av_type_FI_AV_TABLE;
        // Sends and receives use plain heap memory: no FI_MR_LOCAL (so no descriptors).
        // For RMA the transport copes with these modes: remote addresses as virtual
        // addresses, keys the provider picks, registrations of allocated memory only,
        // registrations bound to the endpoint. Not FI_MR_RAW (keys wider than 64 bits).
        (*domain).mr_mode = if rma {
            (sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_PROV_KEY
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_ENDPOINT) as i32
        } else {
            0
        };
        // The sender's rank travels as CQ data.
        (*domain).cq_data_size = 4;
        let prov_name = libc::strdup(provider.as_ptr());
        if prov_name.is_null() {
            sys::fi_freeinfo(hints);
            return Err(call_error("strdup", sys::FI_ENOMEM as i32));
        }
        (*(*hints).fabric_attr).prov_name = prov_name;
        let mut info: *mut sys::fi_info = ptr::null_mut();
        let (node, flags) = match address {
            Some(address) => (address.as_ptr(), sys::FI_SOURCE),
            None => (ptr::null(), 0),
        };
        let ret = sys::fi_getinfo(
            (sys::FI_MAJOR_VERSION << 16) | sys::FI_MINOR_VERSION,
            node,
            ptr::null(),
            flags,
            hints,
            &mut info,
        );
        sys::fi_freeinfo(hints);
        if ret == -(sys::FI_ENODATA as i32) || (ret == 0 && info.is_null()) {
            return Err(OfiError::ProviderNotFound {
                provider: name.to_owned(),
            });
        }
        check("fi_getinfo", ret)?;
        // Keep the first match only.
        if !(*info).next.is_null() {
            sys::fi_freeinfo((*info).next);
            (*info).next = ptr::null_mut();
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::rxm_rx_size;

    #[test]
    fn rxm_receive_buffers_shrink_with_the_job_between_the_floor_and_rxms_default() {
        assert_eq!(rxm_rx_size(1), 128);
        assert_eq!(rxm_rx_size(2), 128);
        assert_eq!(rxm_rx_size(32), 128);
        assert_eq!(rxm_rx_size(64), 65);
        assert_eq!(rxm_rx_size(128), 32);
        assert_eq!(rxm_rx_size(1024), 32);
        assert_eq!(rxm_rx_size(u32::MAX), 32);
    }
}
