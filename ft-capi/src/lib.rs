//! `ft-capi`: the C ABI of the `ft` library, built as `libft.so` and `libft.a`, with
//! the header `include/ft.h` generated from this file by cbindgen (`tests/header.rs`
//! fails when the committed header is stale).
//!
//! Shape of every call: it returns an `int` error code (`FT_SUCCESS` or one of the
//! `FT_ERR_*` codes; [`ft_strerror`] names each), writes results through out-pointers
//! the caller owns, and never lets a panic cross into C (each body runs under
//! `catch_unwind`; a panic is `FT_ERR_INTERNAL`). A null pointer where one is required
//! is `FT_ERR_ARG`, and nothing is written.
//!
//! Handles are opaque (`ft_handle`, `ft_sim`). A handle is one rank's protocol stack on
//! its own progress thread: every call below is thread-safe (any thread, any number of
//! threads at once) unless its documentation says otherwise; only closing a handle
//! needs the caller to have ended every other call on it.
#![allow(non_camel_case_types)]

mod bcast;
mod events;
mod landing;
pub use bcast::*;
pub use events::*;
pub use landing::*;

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use ft::ft_core::node::NodeError;
use ft::sim::SimGroup;
use ft::{
    Counts, Modifier, RankInfo, RankState, Runtime, RuntimeError, Scope, Settings, StackError,
};
use ft::{StateMask, ViewError};

/// Success.
pub const FT_SUCCESS: c_int = 0;
/// An argument is invalid: a null pointer, an unknown scope, topology or strategy, a
/// broadcast spec that cannot be planned.
pub const FT_ERR_ARG: c_int = 1;
/// A rank is out of range for the communicator (or was removed, for
/// `ft_shrink_rank`).
pub const FT_ERR_RANK: c_int = 2;
/// The output buffer is too small: nothing was written, and the count (or length)
/// needed is in the out-parameter (`outcount`, `outlen`).
pub const FT_ERR_SIZE: c_int = 3;
/// `ft_recognize` of a rank that is not in the local failed set.
pub const FT_ERR_NOT_FAILED: c_int = 4;
/// This rank's handle stopped: it was shut down, its backend failed, or (from the
/// core, refusing a command) it had been declared dead.
pub const FT_ERR_STOPPED: c_int = 5;
/// The stack refused the command (a broadcast task id already in use, payloads that
/// do not match the spec, limits exceeded).
pub const FT_ERR_REFUSED: c_int = 6;
/// The communicator was revoked: the broadcast failed here.
pub const FT_ERR_REVOKED: c_int = 7;
/// The broadcast cannot complete here: no live ancestor is left (its root died).
pub const FT_ERR_ABANDONED: c_int = 8;
/// The timeout passed before the outputs arrived (the broadcast goes on).
pub const FT_ERR_TIMEOUT: c_int = 9;
/// The broadcast was released here while the call waited for it.
pub const FT_ERR_RELEASED: c_int = 10;
/// Opening a rank failed (the backend could not start: MPI threading level,
/// rendezvous, provider).
pub const FT_ERR_BACKEND: c_int = 11;
/// A bug in the library (a panic, caught at the boundary).
pub const FT_ERR_INTERNAL: c_int = 12;
/// Its peers declared this rank dead, rightly or not, or an agreed validation excluded
/// it, and its handle stopped for good (fail-stop): the survivors go on without it, so
/// the process must leave as a dead rank does.
pub const FT_ERR_DECLARED_DEAD: c_int = 13;
/// `ft_rebuild`: the agreed `G` holds more ranks than there are spares left to take
/// their numbers (`ft_split_spares`); nothing changed, and the handle keeps working
/// (`ft_shrink` still can).
pub const FT_ERR_NO_SPARES: c_int = 14;

/// Query scope: `L_i`, this rank's validated local view.
pub const FT_SCOPE_LOCAL: c_int = 0;
/// Query scope: `G`, the view all survivors agreed on.
pub const FT_SCOPE_GLOBAL: c_int = 1;

/// State (and mask bit): alive, as far as the scope knows.
pub const FT_STATE_OK: u32 = 1;
/// State (and mask bit): failed, not recognized yet.
pub const FT_STATE_FAILED: u32 = 2;
/// State (and mask bit): failed and recognized (`ft_recognize`).
pub const FT_STATE_NULL: u32 = 4;
/// Mask bit: only ranks that entered their state at the scope's latest validation.
pub const FT_STATE_NEW: u32 = 8;
/// Mask bit: only ranks known before the scope's latest validation.
pub const FT_STATE_OLD: u32 = 16;

/// One row of a state query.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ft_rank_info {
    /// The rank.
    pub rank: u32,
    /// `FT_STATE_OK`, `FT_STATE_FAILED` or `FT_STATE_NULL`.
    pub state: u32,
    /// The scope's validation epoch at which the rank entered its state (0 for ranks
    /// alive since the start).
    pub epoch: u32,
    /// The rank's incarnation: 0 for the job's first process, one more for each
    /// process that took its number since (a rebuild).
    pub generation: u32,
}

/// One rank's handle (opaque): its protocol stack on its own progress thread.
pub struct ft_handle {
    _opaque: [u8; 0],
}

/// A group of ranks simulated in this process (opaque).
pub struct ft_sim {
    _opaque: [u8; 0],
}

/// Runs `body`, turning a panic into `FT_ERR_INTERNAL`.
fn guard(body: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => FT_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => FT_ERR_INTERNAL,
    }
}

/// The runtime behind a handle pointer.
///
/// # Safety
/// `h` is null or a handle this library returned and that is not closed.
unsafe fn runtime<'a>(h: *const ft_handle) -> Result<&'a Runtime, c_int> {
    // SAFETY: non-null handles point at a live `Runtime` (the caller's contract).
    unsafe { h.cast::<Runtime>().as_ref() }.ok_or(FT_ERR_ARG)
}

/// Writes `value` through `out`, which must not be null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), c_int> {
    if out.is_null() {
        return Err(FT_ERR_ARG);
    }
    // SAFETY: non-null and valid for writes (the caller's contract).
    unsafe { out.write(value) };
    Ok(())
}

/// Drops what `p` points at (a box this library handed out); null is `FT_ERR_ARG`.
///
/// # Safety
/// `p` is null or from `Box::into_raw` of a `T`, not used again.
unsafe fn free<T>(p: *mut T) -> c_int {
    guard(|| {
        if p.is_null() {
            return Err(FT_ERR_ARG);
        }
        // SAFETY: the caller's contract.
        drop(unsafe { Box::from_raw(p) });
        Ok(())
    })
}

fn code_of(e: &RuntimeError) -> c_int {
    match e {
        RuntimeError::Stack(StackError::Node(NodeError::Stopped)) => FT_ERR_STOPPED,
        RuntimeError::Stack(StackError::Spec(_)) => FT_ERR_ARG,
        RuntimeError::Stack(StackError::Bcast(ft::BcastError::Revoked)) => FT_ERR_REVOKED,
        RuntimeError::Stack(StackError::Send(ft::ft_core::SendError::RankOutOfRange {
            ..
        })) => FT_ERR_RANK,
        RuntimeError::Stack(_) => FT_ERR_REFUSED,
        RuntimeError::View(e) => view_code(e),
        RuntimeError::Abandoned { .. } => FT_ERR_ABANDONED,
        RuntimeError::BroadcastFailed { .. } => FT_ERR_REVOKED,
        RuntimeError::TimedOut { .. } => FT_ERR_TIMEOUT,
        RuntimeError::Released { .. } => FT_ERR_RELEASED,
        RuntimeError::DeclaredDead { .. } | RuntimeError::Excluded { .. } => FT_ERR_DECLARED_DEAD,
        RuntimeError::Stopped(_) => FT_ERR_STOPPED,
        RuntimeError::Group(ft::GroupError::Stopped) => FT_ERR_DECLARED_DEAD,
        RuntimeError::Group(ft::GroupError::NoSpares { .. }) => FT_ERR_NO_SPARES,
        RuntimeError::Group(_) => FT_ERR_REFUSED,
        _ => FT_ERR_INTERNAL,
    }
}

fn view_code(e: &ViewError) -> c_int {
    match e {
        ViewError::RankOutOfRange { .. } => FT_ERR_RANK,
        ViewError::NotFailed(_) => FT_ERR_NOT_FAILED,
        ViewError::BufferTooSmall { .. } => FT_ERR_SIZE,
        _ => FT_ERR_ARG,
    }
}

fn scope_of(scope: c_int) -> Result<Scope, c_int> {
    match scope {
        FT_SCOPE_LOCAL => Ok(Scope::Local),
        FT_SCOPE_GLOBAL => Ok(Scope::Global),
        _ => Err(FT_ERR_ARG),
    }
}

fn mask_of(mask: u32) -> Result<StateMask, c_int> {
    let bits = u8::try_from(mask).map_err(|_| FT_ERR_ARG)?;
    let mask = StateMask::from_bits_truncate(bits);
    if u32::from(mask.bits()) != u32::from(bits) {
        return Err(FT_ERR_ARG);
    }
    Ok(mask)
}

fn info_of(info: RankInfo) -> ft_rank_info {
    ft_rank_info {
        rank: info.rank,
        state: match info.state {
            RankState::Ok => FT_STATE_OK,
            RankState::Failed => FT_STATE_FAILED,
            RankState::Null => FT_STATE_NULL,
        },
        epoch: info.epoch,
        generation: info.generation,
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The message of an error code (a static string; never null; unknown codes get a
/// message saying so). Thread-safe.
#[no_mangle]
pub extern "C" fn ft_strerror(code: c_int) -> *const c_char {
    let text: &'static [u8] = match code {
        FT_SUCCESS => b"success\0",
        FT_ERR_ARG => b"invalid argument (null pointer, unknown scope, topology or strategy, bad broadcast spec)\0",
        FT_ERR_RANK => b"rank out of range (or removed by the shrink)\0",
        FT_ERR_SIZE => b"buffer too small: the size needed was written to the out-parameter\0",
        FT_ERR_NOT_FAILED => b"the rank is not known to have failed\0",
        FT_ERR_STOPPED => b"this rank's handle stopped (shut down, or its backend failed)\0",
        FT_ERR_REFUSED => b"command refused (broadcast key in use, payloads that do not match the spec, header or output over the limits)\0",
        FT_ERR_REVOKED => b"the communicator was revoked\0",
        FT_ERR_ABANDONED => b"broadcast abandoned: no live ancestor (the root died)\0",
        FT_ERR_TIMEOUT => b"timed out\0",
        FT_ERR_RELEASED => b"the broadcast was released while waited for\0",
        FT_ERR_BACKEND => b"the backend could not open the rank\0",
        FT_ERR_INTERNAL => b"internal error (a bug in the library)\0",
        FT_ERR_DECLARED_DEAD => b"this rank was declared dead by its peers and stopped for good (fail-stop)\0",
        FT_ERR_NO_SPARES => b"no spare left to rebuild from: more ranks failed than spares remain\0",
        _ => b"unknown error code\0",
    };
    text.as_ptr().cast()
}

// ----- opening and closing -----

fn settings(period_ms: u32, timeout_ms: u32) -> Settings {
    let mut settings = Settings::default();
    if period_ms > 0 {
        settings.period = Duration::from_millis(u64::from(period_ms));
    }
    if timeout_ms > 0 {
        settings.timeout = Duration::from_millis(u64::from(timeout_ms));
    }
    settings
}

/// Starts a group of `n` ranks simulated in this process (one progress thread per
/// rank over an in-memory network), heartbeats every `period_ms` and a rank declared
/// dead after `timeout_ms` of silence (0 for either: 20 ms and 300 ms). Writes the
/// group to `*out`; close it with `ft_sim_close`. Thread-safe.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_sim_open(
    n: u32,
    period_ms: u32,
    timeout_ms: u32,
    out: *mut *mut ft_sim,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(FT_ERR_ARG);
        }
        let group = SimGroup::open(n, &settings(period_ms, timeout_ms)).map_err(|e| match e {
            RuntimeError::Stopped(_) if n == 0 => FT_ERR_ARG,
            _ => FT_ERR_BACKEND,
        })?;
        // SAFETY: checked non-null; valid for a write (the caller's contract).
        unsafe { put(out, Box::into_raw(Box::new(group)).cast::<ft_sim>()) }
    })
}

/// # Safety
/// `g` is null or an open group.
unsafe fn group<'a>(g: *const ft_sim) -> Result<&'a SimGroup, c_int> {
    // SAFETY: non-null groups point at a live `SimGroup` (the caller's contract).
    unsafe { g.cast::<SimGroup>().as_ref() }.ok_or(FT_ERR_ARG)
}

/// Rank `rank`'s handle in the group, or null if there is no such rank. The handle
/// belongs to the group (do not `ft_close` it) and lives until `ft_sim_close`.
/// Thread-safe.
///
/// # Safety
/// `g` is null or an open group.
#[no_mangle]
pub unsafe extern "C" fn ft_sim_rank(g: *const ft_sim, rank: u32) -> *mut ft_handle {
    let found = catch_unwind(|| {
        // SAFETY: the caller's contract.
        let group = unsafe { group(g) }.ok()?;
        group
            .rank(rank)
            .map(|r| (r as *const Runtime).cast_mut().cast::<ft_handle>())
    });
    found.ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// Kills `rank` as `SIGKILL` would a process: it falls silent to the others, and calls
/// on its handle fail with `FT_ERR_STOPPED`. Thread-safe.
///
/// # Safety
/// `g` is null or an open group.
#[no_mangle]
pub unsafe extern "C" fn ft_sim_kill(g: *const ft_sim, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let group = unsafe { group(g) }?;
        if rank >= group.size() {
            return Err(FT_ERR_RANK);
        }
        group.kill(rank);
        Ok(())
    })
}

/// Stops every rank of the group and frees it (and its ranks' handles). Not
/// thread-safe: no other call may use the group or its handles, during or after.
///
/// # Safety
/// `g` is null or an open group, not used again.
#[no_mangle]
pub unsafe extern "C" fn ft_sim_close(g: *mut ft_sim) -> c_int {
    // SAFETY: an open group from `ft_sim_open`, given back once (the contract).
    unsafe { free(g.cast::<SimGroup>()) }
}

fn boxed(runtime: Runtime) -> *mut ft_handle {
    Box::into_raw(Box::new(runtime)).cast::<ft_handle>()
}

/// Runs `open` (a call that makes a handle on a new group: shrink, split, rebuild,
/// admission) on the runtime behind `h` and writes the handle it made, or null for
/// `None`, through `out`. A null `out` is `FT_ERR_ARG` before `open` runs, so no group
/// is made whose handle nobody could close.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
unsafe fn open_group(
    h: *const ft_handle,
    out: *mut *mut ft_handle,
    open: impl FnOnce(&Runtime) -> Result<Option<Runtime>, RuntimeError>,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(FT_ERR_ARG);
        }
        // SAFETY: the caller's contract.
        let handle = open(unsafe { runtime(h) }?).map_err(|e| code_of(&e))?;
        // SAFETY: checked non-null.
        unsafe { put(out, handle.map_or(std::ptr::null_mut(), boxed)) }
    })
}

/// Opens this process's rank of the application's communicator `comm` (collective:
/// every rank of `comm` calls it; the library duplicates `comm`). MPI must be
/// initialized with `MPI_THREAD_SERIALIZED` or more (`MPI_THREAD_MULTIPLE` if
/// application threads call MPI while the handle is open). `period_ms`, `timeout_ms`
/// as for `ft_sim_open`. Close the handle with `ft_close` before `MPI_Finalize`.
///
/// # Safety
/// `comm` is a live intracommunicator; `out` is null or valid for a write.
#[cfg(feature = "mpi")]
#[no_mangle]
pub unsafe extern "C" fn ft_open_mpi(
    comm: mpi::ffi::MPI_Comm,
    period_ms: u32,
    timeout_ms: u32,
    out: *mut *mut ft_handle,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(FT_ERR_ARG);
        }
        // SAFETY: the caller's contract.
        let runtime = unsafe { ft::mpi::open_raw(comm, &settings(period_ms, timeout_ms)) }
            .map_err(|_| FT_ERR_BACKEND)?;
        // SAFETY: checked non-null.
        unsafe { put(out, boxed(runtime)) }
    })
}

/// Opens this process's rank of a libfabric job started by the `ftofi` launcher (its
/// `FTOFI_RANK`, `FTOFI_SIZE`, `FTOFI_RENDEZVOUS` variables): blocks until every rank
/// met at the rendezvous. Close the handle with `ft_close`.
///
/// # Safety
/// `out` is null or valid for a write.
#[cfg(feature = "ofi")]
#[no_mangle]
pub unsafe extern "C" fn ft_open_ofi_env(
    period_ms: u32,
    timeout_ms: u32,
    out: *mut *mut ft_handle,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(FT_ERR_ARG);
        }
        let runtime =
            ft::ofi::open_from_env(&settings(period_ms, timeout_ms)).map_err(|_| FT_ERR_BACKEND)?;
        // SAFETY: checked non-null.
        unsafe { put(out, boxed(runtime)) }
    })
}

/// Closes and frees a handle from `ft_open_mpi`, `ft_open_ofi_env`, `ft_shrink`,
/// `ft_split_spares`, `ft_rebuild` or `ft_admitted` (never one from `ft_sim_rank`): its
/// communicator's stack stops, and the rank's progress thread with it once the rank's
/// last handle is closed. Close a derived handle before the handle it came from. Not
/// thread-safe: no other call may use the handle, during or after.
///
/// # Safety
/// `h` is null or an open handle from an `ft_open_*` call, `ft_shrink`,
/// `ft_split_spares`, `ft_rebuild` or `ft_admitted`, not used again.
#[no_mangle]
pub unsafe extern "C" fn ft_close(h: *mut ft_handle) -> c_int {
    // SAFETY: a handle from `boxed`, given back once (the contract).
    unsafe { free(h.cast::<Runtime>()) }
}

// ----- the failure view -----

/// This rank and the communicator's size. Thread-safe; does not block.
///
/// # Safety
/// `h` is null or an open handle; `rank`, `size` are null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ft_rank(h: *const ft_handle, rank: *mut u32, size: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        if rank.is_null() || size.is_null() {
            return Err(FT_ERR_ARG);
        }
        // SAFETY: checked non-null, valid for writes.
        unsafe {
            put(rank, view.rank())?;
            put(size, view.size())
        }
    })
}

/// Runs a validation on `h` and writes its counts.
///
/// # Safety
/// `h` is null or an open handle; the out-pointers are null or valid for writes.
unsafe fn validation(
    h: *const ft_handle,
    num_failed: *mut u32,
    num_new: *mut u32,
    validate: impl FnOnce(&Runtime) -> Result<Counts, RuntimeError>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        if num_failed.is_null() || num_new.is_null() {
            return Err(FT_ERR_ARG);
        }
        let counts = validate(runtime).map_err(|e| code_of(&e))?;
        // SAFETY: checked non-null, valid for writes.
        unsafe {
            put(num_failed, count(counts.failed))?;
            put(num_new, count(counts.new))
        }
    })
}

/// `validate_local`: folds the detector's news into `L_i`; writes `|L_i|` and how many
/// of them are new. Thread-safe; blocks for one turn of the progress thread.
///
/// # Safety
/// `h` is null or an open handle; the out-pointers are null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ft_validate_local(
    h: *const ft_handle,
    num_failed: *mut u32,
    num_new: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { validation(h, num_failed, num_new, Runtime::validate_local) }
}

/// `validate_global`, collective: every live rank calls it; blocks until the
/// survivors agree on `G` (they do even when ranks die during the call), then writes
/// `|G|` and how many ranks this validation added to it. Thread-safe, but collective
/// per rank: a second thread's call that arrives while a validation runs here joins
/// it, one that arrives after starts the next validation, so let one thread per rank
/// (the comm thread) make the collective calls.
///
/// # Safety
/// `h` is null or an open handle; the out-pointers are null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ft_validate_global(
    h: *const ft_handle,
    num_failed: *mut u32,
    num_new: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        validation(h, num_failed, num_new, |r| {
            r.validate_global().map(|v| v.counts)
        })
    }
}

/// The ranks of `scope` (`FT_SCOPE_LOCAL`, `FT_SCOPE_GLOBAL`) whose state matches
/// `mask` (an OR of `FT_STATE_*`; with `FT_STATE_NEW` or `FT_STATE_OLD`, only ranks
/// with that modifier), in rank order, into `infos[0..incount]`; their number goes to
/// `*outcount`. If `incount` is too small: `FT_ERR_SIZE`, the number needed in
/// `*outcount`, and `infos` untouched (it may be null then). Reads the view of the
/// last validation. Thread-safe; does not block.
///
/// # Safety
/// `h` is null or an open handle; `outcount` is null or valid for a write; `infos` is
/// valid for `incount` writes (or null when `incount` is 0).
#[no_mangle]
pub unsafe extern "C" fn ft_get_state(
    h: *const ft_handle,
    scope: c_int,
    mask: u32,
    incount: u32,
    outcount: *mut u32,
    infos: *mut ft_rank_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        let (scope, mask) = (scope_of(scope)?, mask_of(mask)?);
        if outcount.is_null() || (infos.is_null() && incount > 0) {
            return Err(FT_ERR_ARG);
        }
        let needed = view.num_state(scope, mask);
        if (incount as usize) < needed {
            // SAFETY: checked non-null.
            unsafe { put(outcount, count(needed)) }?;
            return Err(FT_ERR_SIZE);
        }
        let mut rows = vec![
            RankInfo {
                rank: 0,
                state: RankState::Ok,
                epoch: 0,
                generation: 0,
            };
            needed
        ];
        let written = view
            .get_state(scope, mask, &mut rows)
            .map_err(|e| view_code(&e))?;
        for (k, row) in rows[..written].iter().enumerate() {
            // SAFETY: `k < needed <= incount` entries the caller made writable.
            unsafe { infos.add(k).write(info_of(*row)) };
        }
        // SAFETY: checked non-null.
        unsafe { put(outcount, count(written)) }
    })
}

/// How many ranks of `scope` match `mask` (as for `ft_get_state`), into `*count`.
/// Thread-safe; does not block.
///
/// # Safety
/// `h` is null or an open handle; `count` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_num_state(
    h: *const ft_handle,
    scope: c_int,
    mask: u32,
    count_out: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        let n = view.num_state(scope_of(scope)?, mask_of(mask)?);
        // SAFETY: the caller's contract (checked for null by `put`).
        unsafe { put(count_out, count(n)) }
    })
}

/// The state of `rank` in `scope` into `*info`, and whether it is new
/// (`FT_STATE_NEW`) or not (`FT_STATE_OLD`) into `*modifier`. Thread-safe; does not
/// block.
///
/// # Safety
/// `h` is null or an open handle; `info`, `modifier` are null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn ft_get_rank_info(
    h: *const ft_handle,
    scope: c_int,
    rank: u32,
    info: *mut ft_rank_info,
    modifier: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        if info.is_null() || modifier.is_null() {
            return Err(FT_ERR_ARG);
        }
        let (row, m) = view
            .rank_info(scope_of(scope)?, rank)
            .map_err(|e| view_code(&e))?;
        let m = match m {
            Modifier::New => FT_STATE_NEW,
            Modifier::Old => FT_STATE_OLD,
        };
        // SAFETY: checked non-null, valid for writes.
        unsafe {
            put(info, info_of(row))?;
            put(modifier, m)
        }
    })
}

/// The number of global validations finished at this rank. Thread-safe; does not
/// block.
///
/// # Safety
/// `h` is null or an open handle; `epoch` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_epoch(h: *const ft_handle, epoch: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        // SAFETY: the caller's contract (checked for null by `put`).
        unsafe { put(epoch, view.epoch()) }
    })
}

/// The application has dealt with failed `rank` (in `L_i`): it becomes
/// `FT_STATE_NULL`. Thread-safe; blocks for one turn of the progress thread.
///
/// # Safety
/// `h` is null or an open handle.
#[no_mangle]
pub unsafe extern "C" fn ft_recognize(h: *const ft_handle, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        runtime.recognize(rank).map_err(|e| code_of(&e))
    })
}

/// Revokes the communicator: every survivor learns it, and broadcasts in flight fail
/// with `FT_ERR_REVOKED`; validations keep working. Thread-safe; blocks for one turn
/// of the progress thread.
///
/// # Safety
/// `h` is null or an open handle.
#[no_mangle]
pub unsafe extern "C" fn ft_revoke(h: *const ft_handle) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        runtime.revoke().map_err(|e| code_of(&e))
    })
}

/// The shrink renumbering: `old_rank`'s rank in the communicator without `G` (the
/// survivors keep their order) into `*new_rank`; `FT_ERR_RANK` if `old_rank` is in `G`
/// or out of range. Thread-safe; does not block.
///
/// # Safety
/// `h` is null or an open handle; `new_rank` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_shrink_rank(
    h: *const ft_handle,
    old_rank: u32,
    new_rank: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let view = unsafe { runtime(h) }?.view();
        let new = view.survivors().new_rank(old_rank).ok_or(FT_ERR_RANK)?;
        // SAFETY: the caller's contract (checked for null by `put`).
        unsafe { put(new_rank, new) }
    })
}

/// Shrinks the handle's communicator by its last agreed `G` (after
/// `MPIX_Comm_shrink`): writes to `*out` a new handle on a new communicator of the
/// survivors, renumbered in their order (`ft_shrink_rank`), with an empty view and its
/// own failure detector, over the same connections. Collective over the survivors:
/// each calls it after the same `ft_validate_global`. The old handle keeps working;
/// close the new one with `ft_close` (before the old one's `ft_sim_close`, for a
/// simulated rank). `FT_ERR_REFUSED` if the process made too many groups, and
/// `FT_ERR_DECLARED_DEAD` if this rank was declared dead. Thread-safe.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_shrink(h: *const ft_handle, out: *mut *mut ft_handle) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { open_group(h, out, |runtime| runtime.shrink().map(Some)) }
}

/// Splits the handle's last `spares` ranks off as spares (before any failure, after
/// FT-MPI's *rebuild* mode): at a working rank, writes to `*out` a new handle on the
/// group of the first `size - spares` ranks, numbered as here, with an empty view and
/// its own failure detector, over the same connections; at a spare, writes null and
/// the rank keeps waiting on `h` for an `FT_EVENT_ADMITTED` (`ft_admitted`). The
/// working group keeps its size through failures: `ft_rebuild` gives a failed rank's
/// number to the next spare. Collective over the group: every rank calls it with the
/// same `spares` (one thread per rank). Keep `h` open at every rank while the split's
/// groups live (admissions travel over it); close the new handle with `ft_close`
/// before `h` (before `ft_sim_close`, for a simulated rank). `FT_ERR_REFUSED` if
/// `spares` leaves no working rank or the process made too many groups, and
/// `FT_ERR_DECLARED_DEAD` if this rank was declared dead. Thread-safe.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_split_spares(
    h: *const ft_handle,
    spares: u32,
    out: *mut *mut ft_handle,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { open_group(h, out, |runtime| runtime.split_spares(spares)) }
}

/// Rebuilds the handle's group (from `ft_split_spares`, or an earlier `ft_rebuild`)
/// after its last agreed `G`: writes to `*out` a new handle on a group of the same
/// size and numbering in which each rank of `G` runs on the next spare, in its next
/// incarnation (`ft_rank_info.generation`), with an empty view and its own failure
/// detector, over the same connections. The new handle's first events are one
/// `FT_EVENT_REPLACED` per rank replaced; each spare taken gets an
/// `FT_EVENT_ADMITTED` on the handle it waits on (`ft_admitted`). Collective over the
/// survivors: each calls it after the same `ft_validate_global`. A spare that dies is a
/// failure of the new group, replaced by the next rebuild. The old handle keeps
/// working; close the new one with `ft_close` before the old one. `FT_ERR_NO_SPARES`
/// if `G` holds more ranks than spares are left (nothing changed), `FT_ERR_REFUSED` if
/// the process made too many groups, and `FT_ERR_DECLARED_DEAD` if this rank was
/// declared dead. Thread-safe.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_rebuild(h: *const ft_handle, out: *mut *mut ft_handle) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { open_group(h, out, |runtime| runtime.rebuild().map(Some)) }
}

/// At a spare: writes to `*out` its handle on rebuilt group `group`, which it was
/// admitted into (the `group` of an `FT_EVENT_ADMITTED` on `h`, the handle it waits
/// on), as the failed rank's number in its next incarnation; null if that handle was
/// taken already (each admission gives one handle) or `group` is not a group this rank
/// was admitted into. The new handle's first event is the `FT_EVENT_ADMITTED` too. Not
/// collective: it does not wait for the group's other ranks. Keep `h` open while the
/// new handle lives; close the new one with `ft_close` first. `FT_ERR_DECLARED_DEAD` if
/// this rank was declared dead, `FT_ERR_STOPPED` if its handle stopped. Thread-safe.
///
/// # Safety
/// `h` is null or an open handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_admitted(
    h: *const ft_handle,
    group: u32,
    out: *mut *mut ft_handle,
) -> c_int {
    let Ok(group) = usize::try_from(group) else {
        return FT_ERR_ARG;
    };
    // SAFETY: the caller's contract.
    unsafe { open_group(h, out, |runtime| runtime.admitted(group)) }
}
