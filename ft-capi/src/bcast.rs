//! Broadcasts and messages in C: `ft_bcast_start` at the root, `ft_bcast_take` (no
//! copy) or `ft_bcast_wait` (into the caller's buffer) at a destination,
//! `ft_bcast_release`, `ft_send` for a message, and `ft_bcast_copies` to count what was
//! copied.
//!
//! **Who owns which buffer.**
//! - At the root, an output whose `release` callback is set stays the caller's: the
//!   library sends from it in place (every chunk it sends or a relay forwards is a
//!   slice of it) and calls `release(release_arg, data, bytes)` exactly once, when no
//!   rank needs the buffer from this rank any more: when the broadcast is released
//!   here (`ft_bcast_release`), or the handle closes. A destination dying mid-broadcast
//!   changes nothing to that. Until then the caller must neither free nor change the
//!   bytes. An output without a callback is copied once before `ft_bcast_start`
//!   returns, and the buffer is the caller's again at once.
//! - At a destination, `ft_bcast_take` hands over the library's own buffer of the
//!   output (the frame it arrived in, or the buffer the transport received it into):
//!   `ft_buffer.data` is valid until `ft_buffer_free`, also after `ft_bcast_release`.
//!
//! Invariant: a `CallerBuffer`'s release runs once, from the drop of the last `Bytes`
//! sharing it (the broadcaster's and any pending send's), never before.

use std::borrow::Cow;
use std::ffi::{c_int, c_void};
use std::time::Duration;

use ft::ft_bcast::{Bytes, OutputSet, OutputSpec, PlanSpec, Strategy, Topology};
use ft::{Runtime, TaskId};

use crate::{code_of, ft_handle, guard, put, runtime, FT_ERR_ARG, FT_ERR_INTERNAL, FT_ERR_SIZE};

/// Broadcast topology: the root sends to every destination.
pub const FT_TOPO_STAR: c_int = 0;
/// Broadcast topology: a chain.
pub const FT_TOPO_CHAIN: c_int = 1;
/// Broadcast topology: a binomial tree.
pub const FT_TOPO_BINOMIAL: c_int = 2;
/// Broadcast topology: a k-ary tree (`arity` gives k).
pub const FT_TOPO_KARY: c_int = 3;

/// Broadcast strategy: one tree per class of destinations needing the same outputs.
pub const FT_STRATEGY_PER_CLASS: c_int = 0;
/// Broadcast strategy: one merged tree; each rank fetches what its subtree needs.
pub const FT_STRATEGY_FETCH_FOR_DESCENDANTS: c_int = 1;
/// Broadcast strategy: one tree per output.
pub const FT_STRATEGY_PER_OUTPUT: c_int = 2;

/// Called once when the library no longer needs an output buffer the root lent it:
/// `(release_arg, data, bytes)` as given in its `ft_bcast_output`. It runs on one of
/// the library's threads (or in `ft_bcast_release` / `ft_close`), must not block for
/// long and must not call into the handle.
pub type ft_release_fn =
    Option<unsafe extern "C" fn(arg: *mut c_void, data: *const u8, bytes: u64)>;

/// One output of a broadcast, as the root describes it: `bytes` bytes at `data`,
/// needed by the `ndests` ranks at `dests`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ft_bcast_output {
    /// The output's bytes.
    pub data: *const u8,
    /// How many.
    pub bytes: u64,
    /// The ranks that need it.
    pub dests: *const u32,
    /// How many.
    pub ndests: u32,
    /// Set: the library sends from `data` in place and calls it once when done with it
    /// (see `ft_release_fn`). Null: `data` is copied during `ft_bcast_start`.
    pub release: ft_release_fn,
    /// The first argument of `release`.
    pub release_arg: *mut c_void,
}

/// An output's bytes handed over by the library (`ft_bcast_take`): `len` bytes at
/// `data`, valid until `ft_buffer_free`.
#[repr(C)]
#[derive(Debug)]
pub struct ft_buffer {
    /// The bytes (null when `len` is 0).
    pub data: *const u8,
    /// How many.
    pub len: u64,
    /// The library's reference to the buffer (do not touch; `ft_buffer_free` drops it).
    pub owner: *mut c_void,
}

/// What the library copied of broadcast payloads at this rank so far (bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ft_copies {
    /// Payload bytes this rank sent (as root or relay).
    pub sent: u64,
    /// Of those, bytes copied on the way out (by the machine or the transport).
    pub sent_copied: u64,
    /// Payload bytes this rank received and kept.
    pub received: u64,
    /// Of those, bytes copied after the transport delivered them (out of a lent frame,
    /// or to join an output's chunks).
    pub received_copied: u64,
    /// Bytes the C API copied: outputs started without a `release` callback, and
    /// outputs read with `ft_bcast_wait`.
    pub api_copied: u64,
}

/// A buffer the root lent through C: released once, when the last `Bytes` over it
/// drops.
struct CallerBuffer {
    data: *const u8,
    len: usize,
    release: unsafe extern "C" fn(*mut c_void, *const u8, u64),
    arg: *mut c_void,
}

// SAFETY: the caller's contract: the bytes stay valid and unchanged until the release,
// and the release may run on any thread (`ft_release_fn`).
unsafe impl Send for CallerBuffer {}

impl AsRef<[u8]> for CallerBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: non-null, readable for `len` bytes until the release (the contract).
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

impl Drop for CallerBuffer {
    fn drop(&mut self) {
        // SAFETY: the caller's callback with its own argument, called once (drop).
        unsafe { (self.release)(self.arg, self.data, self.len as u64) };
    }
}

/// The caller's `bytes` bytes at `data` as a buffer the library keeps: lent (no copy)
/// with a `release` callback, else copied (the second value: the bytes copied).
///
/// # Safety
/// `data` is readable for `bytes` bytes (until `release` is called, if set).
pub(crate) unsafe fn caller_bytes(
    data: *const u8,
    bytes: u64,
    release: ft_release_fn,
    arg: *mut c_void,
) -> Result<(Bytes, u64), c_int> {
    let len = usize::try_from(bytes).map_err(|_| FT_ERR_ARG)?;
    match release {
        Some(release) if len > 0 && !data.is_null() => Ok((
            Bytes::from_owner(CallerBuffer {
                data,
                len,
                release,
                arg,
            }),
            0,
        )),
        release => {
            // SAFETY: the caller's contract.
            let copy = Bytes::copy_from_slice(unsafe { slice(data, len) }?);
            if let Some(release) = release {
                // SAFETY: an empty (or null) buffer is done with at once.
                unsafe { release(arg, data, bytes) };
            }
            let copied = copy.len() as u64;
            Ok((copy, copied))
        }
    }
}

fn topology_of(topology: c_int, arity: u32) -> Result<Topology, c_int> {
    match topology {
        FT_TOPO_STAR => Ok(Topology::Star),
        FT_TOPO_CHAIN => Ok(Topology::Chain),
        FT_TOPO_BINOMIAL => Ok(Topology::Binomial),
        FT_TOPO_KARY => std::num::NonZeroU32::new(arity)
            .map(Topology::Kary)
            .ok_or(FT_ERR_ARG),
        _ => Err(FT_ERR_ARG),
    }
}

fn strategy_of(strategy: c_int) -> Result<Strategy, c_int> {
    match strategy {
        FT_STRATEGY_PER_CLASS => Ok(Strategy::PerClass),
        FT_STRATEGY_FETCH_FOR_DESCENDANTS => Ok(Strategy::FetchForDescendants),
        FT_STRATEGY_PER_OUTPUT => Ok(Strategy::PerOutput),
        _ => Err(FT_ERR_ARG),
    }
}

/// `len` bytes at `ptr` (null allowed when `len` is 0).
///
/// # Safety
/// `ptr` is readable for `len` bytes when `len > 0`.
unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> Result<&'a [T], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(FT_ERR_ARG);
    }
    // SAFETY: non-null and readable for `len` elements (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The name the C API gives output `j` (outputs are known by position): borrowed for
/// the first 16, so a small task allocates no name.
fn output_name(j: usize) -> Cow<'static, str> {
    const NAMES: [&str; 16] = [
        "o0", "o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8", "o9", "o10", "o11", "o12", "o13",
        "o14", "o15",
    ];
    NAMES
        .get(j)
        .map_or_else(|| Cow::Owned(format!("o{j}")), |&name| Cow::Borrowed(name))
}

/// Starts broadcast `key` with this rank as its root (the broadcast is (this rank,
/// `key`): keys are each root's own). Every destination receives the `header_len`
/// bytes at `header` (copied; at most 1 KiB by default, else `FT_ERR_REFUSED`) with its
/// `FT_EVENT_ARRIVED`. `noutputs` outputs are described by `outputs` (see
/// `ft_bcast_output` for who owns their bytes), sent over `topology` (`FT_TOPO_*`;
/// `arity` for `FT_TOPO_KARY`) with `strategy` (`FT_STRATEGY_*`). Ranks known failed
/// are left out. On an error no `release` callback is kept: each is called before
/// this returns. Thread-safe; blocks for one turn of the progress thread.
///
/// # Safety
/// `h` is null or an open handle; `header` is valid for `header_len` reads; `outputs`
/// is valid for `noutputs` reads, and each output's `data` for `bytes` reads (until its
/// `release` if set) and `dests` for `ndests` reads.
#[no_mangle]
pub unsafe extern "C" fn ft_bcast_start(
    h: *const ft_handle,
    key: u64,
    header: *const u8,
    header_len: u64,
    topology: c_int,
    arity: u32,
    strategy: c_int,
    noutputs: u32,
    outputs: *const ft_bcast_output,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        let view = runtime.view();
        // SAFETY: the caller's contract.
        let outputs = unsafe { slice(outputs, noutputs as usize) }?;
        // Every lent buffer is owned from here on, so an error below releases it.
        let mut payloads = Vec::with_capacity(outputs.len());
        let mut copied = 0u64;
        for output in outputs {
            // SAFETY: the caller's contract.
            let (bytes, copies) = unsafe {
                caller_bytes(
                    output.data,
                    output.bytes,
                    output.release,
                    output.release_arg,
                )
            }?;
            payloads.push(bytes);
            copied += copies;
        }
        let mut spec = PlanSpec::new(view.size(), view.rank())
            .with_topology(topology_of(topology, arity)?)
            .with_strategy(strategy_of(strategy)?);
        spec.outputs.reserve(outputs.len());
        for (j, output) in outputs.iter().enumerate() {
            // SAFETY: the caller's contract.
            let dests = unsafe { slice(output.dests, output.ndests as usize) }?;
            spec = spec.with_output(OutputSpec::new(
                output_name(j),
                output.bytes,
                dests.to_vec(),
            ));
        }
        let header_len = usize::try_from(header_len).map_err(|_| FT_ERR_ARG)?;
        // SAFETY: the caller's contract.
        let header = Bytes::copy_from_slice(unsafe { slice(header, header_len) }?);
        runtime
            .start_with_header(key, header, spec, payloads)
            .map_err(|e| code_of(&e))?;
        api_copies(runtime, copied);
        Ok(())
    })
}

/// Sends the `len` bytes at `data` to rank `to` under `tag`: they arrive there as an
/// `FT_EVENT_MESSAGE`, after every message this rank sent `to` before. With a
/// `release` callback the buffer is lent (sent in place, released once when sent or
/// dropped; see `ft_release_fn`), else copied before this returns. `FT_ERR_RANK` for a
/// rank out of range, `FT_ERR_REFUSED` for a rank known dead (nothing is sent; the
/// buffer is released at once). Thread-safe; blocks for one turn of the progress
/// thread.
///
/// # Safety
/// `h` is null or an open handle; `data` is valid for `len` reads (until its `release`
/// if set).
#[no_mangle]
pub unsafe extern "C" fn ft_send(
    h: *const ft_handle,
    to: u32,
    tag: u64,
    data: *const u8,
    len: u64,
    release: ft_release_fn,
    release_arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        // SAFETY: the caller's contract.
        let (bytes, copied) = unsafe { caller_bytes(data, len, release, release_arg) }?;
        runtime.send(to, tag, bytes).map_err(|e| code_of(&e))?;
        api_copies(runtime, copied);
        Ok(())
    })
}

/// Counts `bytes` copied by the C API on `runtime`'s handle.
fn api_copies(runtime: &Runtime, bytes: u64) {
    if bytes > 0 {
        runtime.count_api_copies(bytes);
    }
}

/// Waits for output `output` of broadcast (`root`, `key`) at this rank: the shared
/// buffer, once held.
fn wait_one(
    runtime: &Runtime,
    root: u32,
    key: u64,
    output: u32,
    timeout_ms: i64,
) -> Result<Bytes, c_int> {
    let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    let task = TaskId::new(root, key);
    let data = runtime
        .wait_outputs(task, OutputSet::single(output), timeout)
        .map_err(|e| code_of(&e))?;
    data.into_iter()
        .find(|(j, _)| *j == output)
        .map(|(_, bytes)| bytes)
        .ok_or(FT_ERR_INTERNAL)
}

/// Waits until this rank holds output `output` of broadcast (`root`, `key`), then
/// hands over the library's buffer of it without a copy: `out->data`, `out->len`,
/// valid until `ft_buffer_free(out)`. Fails with `FT_ERR_ABANDONED` when the root died
/// before this rank got it, `FT_ERR_REVOKED` on a revoked communicator,
/// `FT_ERR_TIMEOUT` after `timeout_ms` milliseconds (negative: no timeout), and
/// `out` is then untouched. Thread-safe; blocks.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_bcast_take(
    h: *const ft_handle,
    root: u32,
    key: u64,
    output: u32,
    out: *mut ft_buffer,
    timeout_ms: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        if out.is_null() {
            return Err(FT_ERR_ARG);
        }
        let bytes = wait_one(runtime, root, key, output, timeout_ms)?;
        let (data, len) = if bytes.is_empty() {
            (std::ptr::null(), 0)
        } else {
            (bytes.as_ptr(), bytes.len() as u64)
        };
        let owner = Box::into_raw(Box::new(bytes)).cast::<c_void>();
        // SAFETY: checked non-null, valid for a write.
        unsafe { put(out, ft_buffer { data, len, owner }) }
    })
}

/// Gives back a buffer `ft_bcast_take` handed over and nulls `*b`; a second call on
/// the same buffer does nothing. Thread-safe.
///
/// # Safety
/// `b` is null or a buffer `ft_bcast_take` filled (or one this call already freed).
#[no_mangle]
pub unsafe extern "C" fn ft_buffer_free(b: *mut ft_buffer) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { b.as_mut() }.ok_or(FT_ERR_ARG)?;
        if !b.owner.is_null() {
            // SAFETY: `owner` came from `Box::into_raw` in `ft_bcast_take`, once.
            drop(unsafe { Box::from_raw(b.owner.cast::<Bytes>()) });
        }
        *b = ft_buffer {
            data: std::ptr::null(),
            len: 0,
            owner: std::ptr::null_mut(),
        };
        Ok(())
    })
}

/// Waits until this rank holds output `output` of broadcast (`root`, `key`), then
/// copies it into `buf` (`len` bytes available) and its length into `*outlen`
/// (`ft_bcast_take` hands it over without the copy). A `buf` too small: `FT_ERR_SIZE`,
/// the length needed in `*outlen`, `buf` untouched. Fails as `ft_bcast_take`.
/// Thread-safe; blocks.
///
/// # Safety
/// `h` is null or an open handle; `buf` is valid for `len` writes (or null when `len`
/// is 0); `outlen` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_bcast_wait(
    h: *const ft_handle,
    root: u32,
    key: u64,
    output: u32,
    buf: *mut u8,
    len: u64,
    outlen: *mut u64,
    timeout_ms: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        if outlen.is_null() || (buf.is_null() && len > 0) {
            return Err(FT_ERR_ARG);
        }
        let bytes = wait_one(runtime, root, key, output, timeout_ms)?;
        // SAFETY: checked non-null.
        unsafe { put(outlen, bytes.len() as u64) }?;
        if (len as usize) < bytes.len() {
            return Err(FT_ERR_SIZE);
        }
        if !bytes.is_empty() {
            // SAFETY: `buf` is writable for `len >= bytes.len()` bytes (the contract).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
            api_copies(runtime, bytes.len() as u64);
        }
        Ok(())
    })
}

/// Frees everything this rank keeps for broadcast (`root`, `key`) (its payloads
/// included: a root's lent buffers are released here, once no pending send holds
/// them); waits pending for it fail with `FT_ERR_RELEASED`. Release a broadcast once
/// no rank will ask this one for its data any more (every destination has its
/// outputs). Thread-safe; blocks for one turn of the progress thread.
///
/// # Safety
/// `h` is null or an open handle.
#[no_mangle]
pub unsafe extern "C" fn ft_bcast_release(h: *const ft_handle, root: u32, key: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        runtime
            .release(TaskId::new(root, key))
            .map_err(|e| code_of(&e))
    })
}

/// What the library copied of broadcast payloads at this rank so far, into `*out`.
/// Thread-safe; blocks for one turn of the progress thread.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_bcast_copies(h: *const ft_handle, out: *mut ft_copies) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        let c = runtime.copies().map_err(|e| code_of(&e))?;
        let copies = ft_copies {
            sent: c.sent,
            sent_copied: c.sent_copied,
            received: c.received,
            received_copied: c.received_copied,
            api_copied: c.api_copied,
        };
        // SAFETY: the caller's contract (checked for null by `put`).
        unsafe { put(out, copies) }
    })
}
