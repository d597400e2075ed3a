//! [`OfiError`], and the reading of libfabric's return codes: which mean a dead peer
//! (never our error) and which a failed call.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use ft_core::Rank;

use crate::sys;

/// Why the transport failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OfiError {
    /// A libfabric call returned an error code.
    Call {
        /// The libfabric function.
        call: &'static str,
        /// Its error code, positive (`FI_E*`).
        code: i32,
        /// `fi_strerror` of the code.
        message: String,
    },
    /// No provider by this name offers reliable datagram message endpoints here.
    ProviderNotFound {
        /// The provider asked for.
        provider: String,
    },
    /// The configuration cannot work (API misuse).
    InvalidConfig {
        /// What is wrong with it.
        reason: String,
    },
    /// A send named a rank outside the job (API misuse).
    RankOutOfRange {
        /// The rank named.
        rank: Rank,
        /// Ranks in the job.
        size: u32,
    },
    /// A frame is longer than the provider can send in one message (API misuse).
    FrameTooLong {
        /// The frame's length.
        len: usize,
        /// The provider's limit.
        max: usize,
    },
    /// Reading or writing the rendezvous directory failed.
    Rendezvous {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Some ranks did not publish their names before the connect timeout.
    RendezvousTimeout {
        /// The ranks still missing.
        missing: Vec<Rank>,
        /// How long the transport waited.
        waited: Duration,
    },
    /// A rank's published name is not an address of this provider.
    BadAddress {
        /// The rank.
        rank: Rank,
    },
}

impl fmt::Display for OfiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OfiError::Call {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {message} (-{code})"),
            OfiError::ProviderNotFound { provider } => write!(
                f,
                "libfabric provider {provider:?} offers no reliable datagram (FI_EP_RDM) \
                 message endpoint here (`fi_info -l` lists the providers)"
            ),
            OfiError::InvalidConfig { reason } => write!(f, "invalid configuration: {reason}"),
            OfiError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is outside a job of {size} ranks")
            }
            OfiError::FrameTooLong { len, max } => write!(
                f,
                "a frame of {len} bytes is longer than the provider's {max}-byte messages"
            ),
            OfiError::Rendezvous { path, source } => {
                write!(f, "rendezvous at {}: {source}", path.display())
            }
            OfiError::RendezvousTimeout { missing, waited } => write!(
                f,
                "ranks {missing:?} published no endpoint name within {:.1} s",
                waited.as_secs_f64()
            ),
            OfiError::BadAddress { rank } => {
                write!(f, "rank {rank}'s endpoint name is not an address")
            }
        }
    }
}

impl std::error::Error for OfiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OfiError::Rendezvous { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Errors of a send that mean the peer is dead or unreachable, not that we erred.
pub(super) fn is_peer_failure(code: i32) -> bool {
    [
        sys::FI_ECONNREFUSED,
        sys::FI_ECONNRESET,
        sys::FI_ECONNABORTED,
        sys::FI_ENOTCONN,
        sys::FI_ESHUTDOWN,
        sys::FI_EHOSTDOWN,
        sys::FI_EHOSTUNREACH,
        sys::FI_ENETUNREACH,
        sys::FI_ENETDOWN,
        sys::FI_ETIMEDOUT,
        sys::FI_EIO,
        // `sockets` (1.17): no connection to the peer could be made.
        sys::FI_ENOENT,
    ]
    .iter()
    .any(|&peer| code == peer as i32)
}

/// The positive error code of a negative return value.
pub(super) fn error_code(ret: isize) -> i32 {
    i32::try_from(-ret).unwrap_or(i32::MAX)
}

pub(super) fn check(call: &'static str, ret: i32) -> Result<(), OfiError> {
    if ret >= 0 {
        Ok(())
    } else {
        Err(call_error(call, -ret))
    }
}

pub(super) fn call_error(call: &'static str, code: i32) -> OfiError {
    // SAFETY: fi_strerror returns a static NUL-terminated string for any code.
    let message = unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
        .to_string_lossy()
        .into_owned();
    OfiError::Call {
        call,
        code,
        message,
    }
}
