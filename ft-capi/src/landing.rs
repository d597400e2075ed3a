//! The allocation hook in C, `ft_set_allocator`: a task runtime gives the memory each
//! broadcast output lands in at this rank (its data arena, registered memory), so the
//! output is received into it without a copy over MPI and libfabric (one copy, counted,
//! for an output that came in frames) and `ft_bcast_take` hands back that very memory.
//!
//! Invariant: each buffer `alloc` returned is released once (`release(arg, data,
//! bytes)`), when the library holds no view of it any more (after `ft_bcast_release`
//! and `ft_buffer_free` of every take of it, or when the handle closes), never before.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use ft::{Landing, TaskId};

use crate::bcast::ft_release_fn;
use crate::{code_of, ft_handle, guard, runtime, FT_ERR_ARG};

/// Asked for the memory output `output` of broadcast (`root`, `key`) lands in at this
/// rank: `bytes` bytes (never 0), writable, that nobody touches until the library
/// releases them; NULL lets the library use its own memory for this output. It runs on
/// the library's progress thread, must not block for long and must not call into the
/// handle.
pub type ft_alloc_fn = Option<
    unsafe extern "C" fn(arg: *mut c_void, root: u32, key: u64, output: u32, bytes: u64) -> *mut u8,
>;

/// The hook as the library holds it: the caller's functions and their argument.
#[derive(Clone, Copy)]
struct Hook {
    alloc: unsafe extern "C" fn(*mut c_void, u32, u64, u32, u64) -> *mut u8,
    release: unsafe extern "C" fn(*mut c_void, *const u8, u64),
    arg: *mut c_void,
}

// SAFETY: the caller's contract (`ft_set_allocator`): both functions may be called from
// any of the library's threads, with `arg`.
unsafe impl Send for Hook {}

/// A buffer `alloc` gave, as its release holds it.
struct Lent {
    hook: Hook,
    data: NonNull<u8>,
}

// SAFETY: the release may run on any thread (`ft_set_allocator`), and `data` is the
// caller's buffer, which only the release hands back.
unsafe impl Send for Lent {}

impl Hook {
    /// The caller's memory for output `output` of `task`, if it gives some.
    fn lend(self, task: TaskId, output: u32, len: usize) -> Option<Landing> {
        // SAFETY: the caller's function with its own argument.
        let data = unsafe { (self.alloc)(self.arg, task.root, task.key, output, len as u64) };
        let data = NonNull::new(data)?;
        let buffer = Lent { hook: self, data };
        // SAFETY: the caller's contract: `len` writable bytes at `data`, untouched by
        // anyone else until the release, which the landing calls once.
        Some(unsafe {
            Landing::lent(data, len, move || {
                let buffer: Lent = buffer; // (the whole of it, which is `Send`)
                let Hook { release, arg, .. } = buffer.hook;
                // SAFETY: the caller's function, with its own argument and buffer, once.
                release(arg, buffer.data.as_ptr().cast_const(), len as u64)
            })
        })
    }
}

/// Makes `alloc` give the memory in which this rank's broadcast outputs land, from the
/// next output whose first byte arrives; `release(arg, data, bytes)` gives each buffer
/// back, once. Both are called with `arg`, from the library's threads. Returns
/// `FT_ERR_ARG` if either function is null.
///
/// # Safety
/// `h` is null or an open handle. Until its release, a buffer `alloc` returned stays
/// allocated and is neither written nor freed by the caller; the caller reads an output
/// only once it is ready (`FT_EVENT_OUTPUT_READY`, `ft_bcast_take`).
#[no_mangle]
pub unsafe extern "C" fn ft_set_allocator(
    h: *const ft_handle,
    alloc: ft_alloc_fn,
    release: ft_release_fn,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let runtime = unsafe { runtime(h) }?;
        let (Some(alloc), Some(release)) = (alloc, release) else {
            return Err(FT_ERR_ARG);
        };
        let hook = Hook {
            alloc,
            release,
            arg,
        };
        runtime
            .set_allocator(move |task: TaskId, output: u32, len: usize| {
                hook.lend(task, output, len)
            })
            .map_err(|e| code_of(&e))
    })
}
