//! The event queue in C: `ft_next_event` fills a tagged [`ft_event`]; its arrays
//! (the outputs of an arrival, the ranks of a validation) live in one allocation the
//! event owns until `ft_event_done`, and an arrival's header or a message's bytes are
//! the library's buffer (the frame they came in), referenced by the event until then;
//! `ft_event_fd` gives the eventfd that polls readable while events are queued.
//!
//! Invariant: an `ft_event` the library filled owns at most one array allocation
//! (`storage`, `storage_len` u32s, which `outputs`, `failed` and `added` point into;
//! else `storage` and every array pointer are null) and at most one buffer reference
//! (`owner`, a boxed `Bytes` that `header` or `data` points into; else all three
//! null);
//! `ft_event_done` frees each once and nulls the pointers, so a second `ft_event_done`
//! is harmless.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use ft::ft_bcast::Bytes;
use ft::{Event, RankSet, Runtime, TaskId};

use crate::{code_of, count, ft_handle, guard, put, runtime};
use crate::{FT_ERR_ARG, FT_ERR_REFUSED, FT_ERR_REVOKED, FT_ERR_TIMEOUT};

/// `ft_event.kind`: an activation made this rank a destination of `outputs` of
/// broadcast (`root`, `key`) (tree `tree`), with the root's `header`; before any of
/// them is ready.
pub const FT_EVENT_ARRIVED: u32 = 1;
/// `ft_event.kind`: this rank holds output `output` of broadcast (`root`, `key`)
/// (`ft_bcast_take` and `ft_bcast_wait` return it at once).
pub const FT_EVENT_OUTPUT_READY: u32 = 2;
/// `ft_event.kind`: broadcast (`root`, `key`) cannot complete here (the root died).
pub const FT_EVENT_ABANDONED: u32 = 3;
/// `ft_event.kind`: broadcast (`root`, `key`) failed here; `error` says why
/// (`FT_ERR_REVOKED`).
pub const FT_EVENT_FAILED: u32 = 4;
/// `ft_event.kind`: this rank learned that `rank` failed (once per rank).
pub const FT_EVENT_RANK_FAILED: u32 = 5;
/// `ft_event.kind`: global validation `epoch` finished: `G` is `failed`, of which
/// `added` are new.
pub const FT_EVENT_VALIDATED: u32 = 6;
/// `ft_event.kind`: the communicator was revoked, by `rank` first as far as this rank
/// saw.
pub const FT_EVENT_REVOKED: u32 = 7;
/// `ft_event.kind`: the queue was full; `dropped` events were lost in this place.
pub const FT_EVENT_OVERFLOWED: u32 = 8;
/// `ft_event.kind`: rank `rank` sent this rank `data` (`data_len` bytes) under `tag`
/// (`ft_send`); messages from one rank come in the order it sent them.
pub const FT_EVENT_MESSAGE: u32 = 9;
/// `ft_event.kind`: a spare took failed rank `rank`'s number in this rebuilt group
/// (`ft_rebuild`): it runs in its `generation`-th incarnation. The first events of a
/// rebuilt group's handle, one per rank replaced.
pub const FT_EVENT_REPLACED: u32 = 10;
/// `ft_event.kind`: this rank, a spare, was admitted into rebuilt group `group` as rank
/// `rank`, in its `generation`-th incarnation: take its handle with
/// `ft_admitted(h, group, &out)` on the handle the event came from. The new handle's
/// first event is this one too.
pub const FT_EVENT_ADMITTED: u32 = 11;

/// One event (see `FT_EVENT_*` for which fields each kind sets; the others are 0 or
/// null). The arrays stay valid until `ft_event_done`.
#[repr(C)]
#[derive(Debug)]
pub struct ft_event {
    /// One of `FT_EVENT_*`.
    pub kind: u32,
    /// The broadcast's key at its root (`ARRIVED`, `OUTPUT_READY`, `ABANDONED`,
    /// `FAILED`).
    pub key: u64,
    /// The broadcast's root (the same kinds).
    pub root: u32,
    /// The tree this rank was activated in (`ARRIVED`).
    pub tree: u32,
    /// The output (`OUTPUT_READY`).
    pub output: u32,
    /// The failed rank (`RANK_FAILED`), the revoking one (`REVOKED`), the sender
    /// (`MESSAGE`), the rank replaced (`REPLACED`) or this rank's number in the rebuilt
    /// group (`ADMITTED`).
    pub rank: u32,
    /// The validation's epoch (`VALIDATED`).
    pub epoch: u32,
    /// The incarnation `rank` runs in now (`REPLACED`, `ADMITTED`): 0 for the job's
    /// first process, one more for each spare that took the number since.
    pub generation: u32,
    /// The rebuilt group this rank was admitted into, for `ft_admitted` (`ADMITTED`).
    pub group: u32,
    /// Why the broadcast failed, an `FT_ERR_*` code (`FAILED`).
    pub error: c_int,
    /// How many events were lost (`OVERFLOWED`).
    pub dropped: u64,
    /// The outputs this rank needs, ascending (`ARRIVED`).
    pub outputs: *const u32,
    /// How many.
    pub noutputs: u32,
    /// `G`, ascending (`VALIDATED`).
    pub failed: *const u32,
    /// How many.
    pub nfailed: u32,
    /// The ranks this validation added to `G`, ascending (`VALIDATED`).
    pub added: *const u32,
    /// How many.
    pub nadded: u32,
    /// The library's allocation behind the arrays (do not touch; `ft_event_done`
    /// frees it).
    pub storage: *mut u32,
    /// Its length, in u32s.
    pub storage_len: u32,
    /// The root's activation header (`ARRIVED`; null when empty).
    pub header: *const u8,
    /// Its length.
    pub header_len: u64,
    /// The sender's tag (`MESSAGE`).
    pub tag: u64,
    /// The message (`MESSAGE`; null when empty): the library's buffer, not a copy.
    pub data: *const u8,
    /// Its length.
    pub data_len: u64,
    /// The library's reference to the buffer behind `header` or `data` (do not touch;
    /// `ft_event_done` drops it).
    pub owner: *mut c_void,
}

impl ft_event {
    fn empty(kind: u32) -> Self {
        ft_event {
            kind,
            key: 0,
            root: 0,
            tree: 0,
            output: 0,
            rank: 0,
            epoch: 0,
            generation: 0,
            group: 0,
            error: 0,
            dropped: 0,
            outputs: std::ptr::null(),
            noutputs: 0,
            failed: std::ptr::null(),
            nfailed: 0,
            added: std::ptr::null(),
            nadded: 0,
            storage: std::ptr::null_mut(),
            storage_len: 0,
            header: std::ptr::null(),
            header_len: 0,
            tag: 0,
            data: std::ptr::null(),
            data_len: 0,
            owner: std::ptr::null_mut(),
        }
    }

    /// An event of `kind` about broadcast `task`.
    fn of_task(kind: u32, task: TaskId) -> Self {
        let mut ev = ft_event::empty(kind);
        (ev.root, ev.key) = (task.root, task.key);
        ev
    }

    /// Keeps `bytes` referenced by the event (no copy) until `ft_event_done`; where
    /// they start and their length (null and 0 when empty).
    fn hold(&mut self, bytes: Bytes) -> (*const u8, u64) {
        if bytes.is_empty() {
            return (std::ptr::null(), 0);
        }
        let at = (bytes.as_ptr(), bytes.len() as u64);
        self.owner = Box::into_raw(Box::new(bytes)).cast::<c_void>();
        at
    }

    /// Moves `lists` into one allocation owned by the event; the start of each list in
    /// it (null for an empty one) and its length.
    fn own(&mut self, lists: &[Vec<u32>]) -> Vec<(*const u32, u32)> {
        let all: Box<[u32]> = lists.concat().into_boxed_slice();
        if all.is_empty() {
            return lists.iter().map(|_| (std::ptr::null(), 0)).collect();
        }
        self.storage_len = count(all.len());
        self.storage = Box::into_raw(all).cast::<u32>();
        let mut at = 0usize;
        lists
            .iter()
            .map(|list| {
                let start = if list.is_empty() {
                    std::ptr::null()
                } else {
                    // SAFETY: `at + list.len() <= storage_len`: the lists were
                    // concatenated in this order.
                    unsafe { self.storage.add(at) }.cast_const()
                };
                at += list.len();
                (start, count(list.len()))
            })
            .collect()
    }
}

fn ranks(set: &RankSet) -> Vec<u32> {
    set.iter().collect()
}

fn event_of(event: Event) -> ft_event {
    match event {
        Event::Arrived {
            task,
            header,
            tree,
            outputs,
        } => {
            let mut ev = ft_event::of_task(FT_EVENT_ARRIVED, task);
            ev.tree = tree;
            let lists = ev.own(&[outputs.iter().collect()]);
            (ev.outputs, ev.noutputs) = lists[0];
            (ev.header, ev.header_len) = ev.hold(header);
            ev
        }
        Event::OutputReady { task, output } => {
            let mut ev = ft_event::of_task(FT_EVENT_OUTPUT_READY, task);
            ev.output = output;
            ev
        }
        Event::Abandoned { task } => ft_event::of_task(FT_EVENT_ABANDONED, task),
        Event::Failed { task, error } => {
            let mut ev = ft_event::of_task(FT_EVENT_FAILED, task);
            ev.error = match error {
                ft::BcastError::Revoked => FT_ERR_REVOKED,
                _ => FT_ERR_REFUSED,
            };
            ev
        }
        Event::RankFailed { rank } => {
            let mut ev = ft_event::empty(FT_EVENT_RANK_FAILED);
            ev.rank = rank;
            ev
        }
        Event::Validated { epoch, failed, new } => {
            let mut ev = ft_event::empty(FT_EVENT_VALIDATED);
            ev.epoch = epoch;
            let lists = ev.own(&[ranks(&failed), ranks(&new)]);
            ((ev.failed, ev.nfailed), (ev.added, ev.nadded)) = (lists[0], lists[1]);
            ev
        }
        Event::Revoked { by } => {
            let mut ev = ft_event::empty(FT_EVENT_REVOKED);
            ev.rank = by;
            ev
        }
        Event::Message { from, tag, bytes } => {
            let mut ev = ft_event::empty(FT_EVENT_MESSAGE);
            (ev.rank, ev.tag) = (from, tag);
            (ev.data, ev.data_len) = ev.hold(bytes);
            ev
        }
        Event::Replaced { rank, generation } => {
            let mut ev = ft_event::empty(FT_EVENT_REPLACED);
            (ev.rank, ev.generation) = (rank, generation);
            ev
        }
        Event::Admitted {
            group,
            rank,
            generation,
        } => {
            let mut ev = ft_event::empty(FT_EVENT_ADMITTED);
            // Group ids are small (a process makes a bounded number of groups).
            ev.group = count(group);
            (ev.rank, ev.generation) = (rank, generation);
            ev
        }
        Event::Overflowed { dropped } => {
            let mut ev = ft_event::empty(FT_EVENT_OVERFLOWED);
            ev.dropped = dropped;
            ev
        }
        // A kind this version of the C API does not know: told as an overflow of one,
        // so the caller learns something was not delivered.
        _ => {
            let mut ev = ft_event::empty(FT_EVENT_OVERFLOWED);
            ev.dropped = 1;
            ev
        }
    }
}

fn take(runtime: &Runtime, timeout_ms: i64) -> Result<Option<Event>, ft::RuntimeError> {
    match timeout_ms {
        0 => runtime.try_next_event(),
        t if t < 0 => runtime.next_event(None),
        t => runtime.next_event(Some(Duration::from_millis(t as u64))),
    }
}

/// Takes the oldest event of the handle into `*ev`, waiting up to `timeout_ms`
/// milliseconds for one (0: do not wait; negative: no timeout). `FT_ERR_TIMEOUT` when
/// none came; once the progress thread ended and every event queued before was taken,
/// `FT_ERR_DECLARED_DEAD` if the peers declared this rank dead (fail-stop), else
/// `FT_ERR_STOPPED`. Each event goes to exactly one caller, whatever the number of
/// threads calling. Hand every filled event to `ft_event_done`. Thread-safe; blocks.
///
/// # Safety
/// `h` is null or an open handle; `ev` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_next_event(
    h: *const ft_handle,
    ev: *mut ft_event,
    timeout_ms: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        if ev.is_null() {
            return Err(FT_ERR_ARG);
        }
        let event = take(runtime, timeout_ms)
            .map_err(|e| code_of(&e))?
            .ok_or(FT_ERR_TIMEOUT)?;
        // SAFETY: checked non-null, valid for a write.
        unsafe { put(ev, event_of(event)) }
    })
}

/// Frees what event `*ev` owns (its arrays, its reference to the header) and nulls its
/// pointers; a second call on
/// the same event does nothing. Thread-safe.
///
/// # Safety
/// `h` is null or an open handle; `ev` is null or an event `ft_next_event` filled, not
/// copied (free each filled event once, through the struct it was written to).
#[no_mangle]
pub unsafe extern "C" fn ft_event_done(h: *const ft_handle, ev: *mut ft_event) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { runtime(h) }?;
        // SAFETY: null or valid (the contract).
        let ev = unsafe { ev.as_mut() }.ok_or(FT_ERR_ARG)?;
        if !ev.storage.is_null() {
            let slice = std::ptr::slice_from_raw_parts_mut(ev.storage, ev.storage_len as usize);
            // SAFETY: `storage` is the boxed slice `own` leaked, of `storage_len`
            // u32s, freed once (nulled below).
            drop(unsafe { Box::from_raw(slice) });
        }
        if !ev.owner.is_null() {
            // SAFETY: `owner` is the boxed `Bytes` `hold` leaked, freed once (nulled
            // below).
            drop(unsafe { Box::from_raw(ev.owner.cast::<Bytes>()) });
        }
        let kind = ev.kind;
        *ev = ft_event::empty(kind);
        Ok(())
    })
}

/// Writes a descriptor into `*fd` that polls readable (`POLLIN`) while events are
/// queued: add it to your own poll loop and take events with `ft_next_event(h, &ev, 0)`
/// until `FT_ERR_TIMEOUT`. The descriptor belongs to the handle (do not read or close
/// it); it lives until the handle is closed. `FT_ERR_REFUSED` where the platform has
/// no eventfd. Thread-safe; does not block.
///
/// # Safety
/// `h` is null or an open handle; `fd` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ft_event_fd(h: *const ft_handle, fd: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        if fd.is_null() {
            return Err(FT_ERR_ARG);
        }
        let raw = event_fd(runtime).ok_or(FT_ERR_REFUSED)?;
        // SAFETY: checked non-null, valid for a write.
        unsafe { put(fd, raw) }
    })
}

#[cfg(unix)]
fn event_fd(runtime: &Runtime) -> Option<c_int> {
    use std::os::fd::AsRawFd;
    runtime.event_fd().map(|fd| fd.as_raw_fd())
}

#[cfg(not(unix))]
fn event_fd(_: &Runtime) -> Option<c_int> {
    None
}
