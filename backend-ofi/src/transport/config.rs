//! [`OfiConfig`], how to open an [`OfiTransport`], and its defaults.

use std::path::PathBuf;
use std::time::Duration;

use ft_core::{wire, Rank};
#[cfg(doc)]
use ft_runtime::{Received, Transport};

use super::OfiError;
#[cfg(doc)]
use super::OfiTransport;

/// The provider used unless the configuration names another.
pub const DEFAULT_PROVIDER: &str = "tcp;ofi_rxm";

/// Receive buffers posted unless the configuration says otherwise.
pub const DEFAULT_RECV_DEPTH: usize = 64;

/// The broadcast chunk size unless the configuration says otherwise
/// ([`OfiConfig::chunk_bytes`]): 256 KiB. Smaller chunks pay more per-message cost on
/// `tcp;ofi_rxm`, larger ones leave too few chunks to pipeline down the tree. The price
/// is receive memory: `recv_depth` buffers of about this size each (16 MiB per rank
/// with the defaults).
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;

/// The smallest payload [`OfiTransport::send_parts`] moves by RMA unless the
/// configuration says otherwise ([`OfiConfig::rma_threshold`]): 64 KiB. Below it the
/// offer → read → done round trip costs more than the copy a two-sided send makes.
pub const DEFAULT_RMA_THRESHOLD: usize = 64 * 1024;

/// How to open an [`OfiTransport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfiConfig {
    /// This rank.
    pub rank: Rank,
    /// Ranks in the job.
    pub size: u32,
    /// The libfabric provider, as `fi_info -l` names it (`tcp;ofi_rxm`, `sockets`, ...).
    pub provider: String,
    /// The local address the endpoint binds to (`fi_getinfo`'s node with `FI_SOURCE`),
    /// e.g. `127.0.0.1` for a job on one machine; `None` takes the provider's first
    /// interface, which is what ranks on several hosts need.
    pub address: Option<String>,
    /// A directory every rank of the job can read and write, fresh for this job.
    pub rendezvous: PathBuf,
    /// The longest frame received; longer ones arrive as [`Received::Oversized`] (and
    /// are lost). [`OfiConfig::new`] sets it to the stack's largest frame,
    /// [`wire::frame_capacity_for`] of `size` and `chunk_bytes`: set it lower only for
    /// traffic of your own. Every posted receive buffer has this size.
    pub max_frame: usize,
    /// The broadcast chunk this transport asks its stack to send
    /// ([`Transport::chunk_bytes`], at most what `max_frame` fits). Change `max_frame`
    /// with it ([`OfiConfig::with_chunk_bytes`]).
    pub chunk_bytes: usize,
    /// Receive buffers kept posted.
    pub recv_depth: usize,
    /// How long [`OfiTransport::open`] waits for the other ranks' names.
    pub connect_timeout: Duration,
    /// How long a frame may wait for the provider to accept it, or a posted send for
    /// its completion, before it is given up (its peer taken for dead).
    pub stall_timeout: Duration,
    /// Payloads of [`Transport::send_parts`] at least this long move by one-sided RMA
    /// (see [`crate::rma`]) when the provider offers `FI_RMA`; `None` forces two-sided
    /// sends (for comparison runs). Every rank of a job should agree on it only in
    /// that a rank with `None` still serves the offers of the others, so the ranks may
    /// differ.
    pub rma_threshold: Option<usize>,
}

impl OfiConfig {
    /// Rank `rank` of a job of `size` ranks (size first, then rank, as every config of
    /// the workspace takes them), meeting the others in `rendezvous`, with the
    /// defaults: [`DEFAULT_PROVIDER`], frames up to the stack's largest
    /// ([`wire::frame_capacity`] of `size`, so a broadcast's full data chunks fit),
    /// [`DEFAULT_RECV_DEPTH`], 30 s to connect, 10 s before a stalled send is given up,
    /// chunks of [`DEFAULT_CHUNK_BYTES`], payloads of [`DEFAULT_RMA_THRESHOLD`] bytes and
    /// more by RMA.
    pub fn new(size: u32, rank: Rank, rendezvous: impl Into<PathBuf>) -> Self {
        OfiConfig {
            rank,
            size,
            provider: DEFAULT_PROVIDER.to_owned(),
            address: None,
            rendezvous: rendezvous.into(),
            max_frame: wire::frame_capacity_for(size, DEFAULT_CHUNK_BYTES),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            recv_depth: DEFAULT_RECV_DEPTH,
            connect_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(10),
            rma_threshold: Some(DEFAULT_RMA_THRESHOLD),
        }
    }
}

impl OfiConfig {
    /// This configuration with broadcast chunks of `bytes`, and frames (receive buffers)
    /// long enough for them.
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self.max_frame = wire::frame_capacity_for(self.size, bytes);
        self
    }
}

pub(super) fn validate(config: &OfiConfig) -> Result<(), OfiError> {
    let reason = if config.size == 0 {
        "a job has at least one rank".to_owned()
    } else if config.rank >= config.size {
        format!("rank {} outside a job of {}", config.rank, config.size)
    } else if config.max_frame == 0 {
        "max_frame must be positive".to_owned()
    } else if config.recv_depth == 0 {
        "recv_depth must be positive".to_owned()
    } else {
        return Ok(());
    };
    Err(OfiError::InvalidConfig { reason })
}
