//! The activation floor of `ftmpi bench-bcast`: what an activation-based broadcast
//! costs over MPI's point-to-point calls alone, with no state machine, driver or
//! transport of ours, timed beside the stack and `MPI_Bcast` in every repetition.
//!
//! What makes a broadcast activation-based is that its destinations are not inside a
//! collective call when it starts: a task runtime's ranks learn that a task's output is
//! coming (and from whom, and how large) from a message, and only then can post the
//! receive that takes the data into place. The floor does exactly that and nothing
//! more, per output, on the same binomial tree over the output's members as the stack
//! (children with the largest subtree first):
//!
//! - the root sends each child a 16-byte activation (`MPI_Send`, eager) and the payload
//!   (`MPI_Isend`, straight from the case's buffer);
//! - every other member waits for activations from any source (`MPI_Irecv` of
//!   `MPI_ANY_SOURCE`, `MPI_Waitany`, which spins in Open MPI's progress as
//!   `MPI_Bcast` does); an activation makes it post the payload's receive from that
//!   sender into the output's buffer (allocated once per case, as the baseline's) and
//!   pass the activation on to its children at once; a payload that lands is sent on
//!   to the children.
//!
//! A rank's time runs from the repetition's barrier until it holds every output it
//! needs (the root's until it has posted its sends), as the stack's does. Two messages
//! per tree edge, the least an activation that announces a payload receivable in place
//! takes; the stack adds its protocol (ancestors, subtree, repair state), its driver and
//! its transport on top. The gap between the floor and `MPI_Bcast` is therefore what
//! any design that activates its destinations pays on this machine, and the gap between
//! the stack and the floor what ours adds.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::time::Instant as WallInstant;

use ft_core::Rank;
use ft_jobs::bench_bcast::{phase, raw_trees, Case};
use ft_runtime::timeline::{self, Mark};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

/// The activation's tag; output `j`'s payload goes with tag `DATA_TAG + j`.
const ACTIVATION_TAG: c_int = 1;
const DATA_TAG: c_int = 16;

/// An activation: the repetition, the output and its length, little-endian `u32`s
/// (the length in two).
type Activation = [u8; 16];

fn encode(rep: u32, j: usize, len: usize) -> Activation {
    let len = len as u64;
    let mut a = [0; 16];
    for (k, word) in [rep, j as u32, len as u32, (len >> 32) as u32]
        .into_iter()
        .enumerate()
    {
        a[4 * k..4 * k + 4].copy_from_slice(&word.to_le_bytes());
    }
    a
}

/// The repetition, output and length an activation names.
fn decode(a: &Activation) -> (u32, usize, usize) {
    let word = |k: usize| u32::from_le_bytes([a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]]);
    let len = u64::from(word(3)) << 32 | u64::from(word(2));
    (word(0), word(1) as usize, len as usize)
}

/// One case's activation floor at one rank: per output, its parent and its children
/// (largest subtree first).
pub struct Floor {
    trees: Vec<(Option<Rank>, Vec<Rank>)>,
    root: bool,
}

impl Floor {
    /// Rank `me`'s place in `case`'s trees.
    pub fn new(case: &Case, me: Rank) -> Self {
        let spec = case.spec();
        let mut trees = raw_trees(case, me);
        for (j, (_, children)) in trees.iter_mut().enumerate() {
            let edges = ft_bcast::tree_edges(
                spec.topology,
                spec.root,
                &case.members(j as u32),
                &ft_bcast::NoFailures,
            );
            // Edges come parent-first, so one pass from the last adds each subtree's
            // size into its parent's.
            let mut size: HashMap<Rank, usize> = HashMap::new();
            for &(parent, child) in edges.iter().rev() {
                let below = *size.entry(child).or_insert(1);
                *size.entry(parent).or_insert(1) += below;
            }
            children.sort_by_key(|c| Reverse(size.get(c).copied().unwrap_or(1)));
        }
        Floor {
            trees,
            root: me == spec.root,
        }
    }

    /// One repetition (tag `rep`) over `comm`, the caller's barrier just passed;
    /// `buffers[j]` receives output `j` here. Returns this rank's microseconds.
    pub fn rep(
        &self,
        comm: &SimpleCommunicator,
        case: &Case,
        buffers: &mut [Vec<u8>],
        rep: u32,
    ) -> Result<f64, String> {
        let since = WallInstant::now();
        timeline::mark(Mark::RepStart, phase::ACTIVATION_FLOOR);
        let mut sends: Vec<ffi::MPI_Request> = Vec::new();
        if self.root {
            for (j, (_, children)) in self.trees.iter().enumerate() {
                let payload = &case.payloads[j];
                for &child in children {
                    activate(comm, child, rep, j, payload.len())?;
                    sends.push(isend(comm, child, payload, j)?);
                }
            }
            let took = since.elapsed().as_secs_f64() * 1e6;
            timeline::mark(Mark::RepDone, phase::ACTIVATION_FLOOR);
            wait_all(&mut sends)?;
            return Ok(took);
        }
        let mut missing = case.needs.len();
        let mut activations_due = missing;
        // Request 0: the next activation; request 1 + j: output j's payload.
        let mut requests = vec![null(); 1 + buffers.len()];
        let mut activation: Activation = [0; 16];
        if activations_due > 0 {
            requests[0] = irecv(comm, any_source(), ACTIVATION_TAG, &mut activation)?;
        }
        while missing > 0 {
            let mut index: c_int = 0;
            let mut status = empty_status();
            // SAFETY: every request is ours, posted or null; MPI writes the index and
            // the status.
            let code = unsafe {
                ffi::MPI_Waitany(
                    requests.len() as c_int,
                    requests.as_mut_ptr(),
                    &mut index,
                    &mut status,
                )
            };
            check("MPI_Waitany", code)?;
            let index = usize::try_from(index).map_err(|_| "MPI_Waitany: no request")?;
            if index == 0 {
                let from = status.MPI_SOURCE as Rank;
                timeline::mark(Mark::FrameReceived, from);
                let (tag, j, len) = decode(&activation);
                if tag != rep || j >= buffers.len() || buffers[j].len() != len {
                    return Err(format!(
                        "activation floor: a stray activation {activation:?}"
                    ));
                }
                timeline::mark(Mark::FrameHandled, from);
                requests[1 + j] =
                    irecv(comm, from as c_int, DATA_TAG + j as c_int, &mut buffers[j])?;
                timeline::mark(Mark::PayloadPosted, from);
                for &child in &self.trees[j].1 {
                    activate(comm, child, rep, j, len)?;
                }
                activations_due -= 1;
                if activations_due > 0 {
                    requests[0] = irecv(comm, any_source(), ACTIVATION_TAG, &mut activation)?;
                }
            } else {
                let j = index - 1;
                timeline::mark(Mark::PayloadLanded, 1);
                for &child in &self.trees[j].1 {
                    sends.push(isend(comm, child, &buffers[j], j)?);
                }
                missing -= 1;
            }
        }
        let took = since.elapsed().as_secs_f64() * 1e6;
        timeline::mark(Mark::RepDone, phase::ACTIVATION_FLOOR);
        wait_all(&mut sends)?;
        Ok(took)
    }
}

fn activate(
    comm: &SimpleCommunicator,
    to: Rank,
    rep: u32,
    j: usize,
    len: usize,
) -> Result<(), String> {
    let activation = encode(rep, j, len);
    // SAFETY: 16 bytes of ours, read by MPI within the call.
    let code = unsafe {
        ffi::MPI_Send(
            activation.as_ptr().cast::<c_void>(),
            16,
            ffi::RSMPI_UINT8_T,
            to as c_int,
            ACTIVATION_TAG,
            comm.as_raw(),
        )
    };
    check("MPI_Send", code)
}

fn isend(
    comm: &SimpleCommunicator,
    to: Rank,
    payload: &[u8],
    j: usize,
) -> Result<ffi::MPI_Request, String> {
    let mut request = null();
    // SAFETY: the payload (the case's or this rank's output buffer) outlives the
    // request: every send is completed (`wait_all`) before the repetition returns.
    let code = unsafe {
        ffi::MPI_Isend(
            payload.as_ptr().cast::<c_void>(),
            payload.len() as c_int,
            ffi::RSMPI_UINT8_T,
            to as c_int,
            DATA_TAG + j as c_int,
            comm.as_raw(),
            &mut request,
        )
    };
    check("MPI_Isend", code).map(|()| request)
}

/// Posts a receive of `into.len()` bytes from `source` (a rank or
/// `MPI_ANY_SOURCE`) with `tag`.
fn irecv(
    comm: &SimpleCommunicator,
    source: c_int,
    tag: c_int,
    into: &mut [u8],
) -> Result<ffi::MPI_Request, String> {
    let mut request = null();
    // SAFETY: the buffer (an activation of the repetition's or an output's) stays alive
    // and unread until the request completes: the repetition waits for every request it
    // posts.
    let code = unsafe {
        ffi::MPI_Irecv(
            into.as_mut_ptr().cast::<c_void>(),
            into.len() as c_int,
            ffi::RSMPI_UINT8_T,
            source,
            tag,
            comm.as_raw(),
            &mut request,
        )
    };
    check("MPI_Irecv", code).map(|()| request)
}

fn wait_all(requests: &mut [ffi::MPI_Request]) -> Result<(), String> {
    // SAFETY: our requests; MPI ignores the statuses.
    let code = unsafe {
        ffi::MPI_Waitall(
            requests.len() as c_int,
            requests.as_mut_ptr(),
            ffi::RSMPI_STATUSES_IGNORE,
        )
    };
    check("MPI_Waitall", code)
}

fn check(call: &str, code: c_int) -> Result<(), String> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(format!(
            "activation floor: {call} failed with MPI error {code}"
        ))
    }
}

fn any_source() -> c_int {
    // SAFETY: reads Open MPI's any-source constant.
    unsafe { ffi::RSMPI_ANY_SOURCE }
}

fn null() -> ffi::MPI_Request {
    // SAFETY: reads Open MPI's null request handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: a plain C struct that MPI fills in; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
