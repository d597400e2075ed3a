//! MPI request and status helpers the parts share.

use std::os::raw::c_int;

use mpi::ffi;

/// Cancels a posted receive of ours (an unmatched receive then completes at once) and
/// frees `buffer`, or leaks it if the receive was matched and is still in transfer
/// (MPI may still write it). Returns whether the receive is done with.
pub(super) fn cancel_receive(request: &mut ffi::MPI_Request, buffer: Vec<u8>) -> bool {
    if *request == null_request() {
        return true;
    }
    let mut flag: c_int = 0;
    let mut status = empty_status();
    // SAFETY: a posted receive of ours: cancelled, then tested; MPI writes the flag and
    // the status.
    unsafe {
        ffi::MPI_Cancel(request);
        ffi::MPI_Test(request, &mut flag, &mut status);
    }
    if flag == 0 && *request != null_request() {
        // SAFETY: a live request of ours, given up.
        unsafe { ffi::MPI_Request_free(request) };
        std::mem::forget(buffer);
        return false;
    }
    true
}

/// `MPI_Testsome` over `requests` (live requests of ours), with `completed` and
/// `statuses` as its scratch: MPI's code and the count it completed.
pub(super) fn test_some(
    requests: &mut [ffi::MPI_Request],
    completed: &mut Vec<c_int>,
    statuses: &mut Vec<ffi::MPI_Status>,
) -> (c_int, c_int) {
    let count = requests.len();
    completed.resize(count, 0);
    statuses.resize_with(count, empty_status);
    let mut done: c_int = 0;
    // SAFETY: `requests` holds `count` live requests of ours; MPI writes at most `count`
    // indices and statuses, and sets completed requests to null.
    let code = unsafe {
        ffi::MPI_Testsome(
            count as c_int,
            requests.as_mut_ptr(),
            &mut done,
            completed.as_mut_ptr(),
            statuses.as_mut_ptr(),
        )
    };
    (code, done)
}

pub(super) fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an MPI constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

pub(super) fn empty_status() -> ffi::MPI_Status {
    // SAFETY: `MPI_Status` is a C struct of integers; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}
