//! `ft-jobs`' face of this backend: [`MpiLaunch`] opens an [`MpiTransport`] over
//! `MPI_COMM_WORLD` and meets every rank at a barrier (the common start).

use ft_core::Rank;
use ft_jobs::{JobTransport, Launch};
use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::MpiTransport;

/// A rank of an `mpiexec` job (MPI initialized already).
#[derive(Clone, Copy, Debug)]
pub struct MpiLaunch {
    rank: Rank,
    size: u32,
}

impl MpiLaunch {
    /// This process's rank and size in `MPI_COMM_WORLD`.
    pub fn world() -> Self {
        let world = SimpleCommunicator::world();
        MpiLaunch {
            rank: world.rank() as Rank,
            size: world.size() as u32,
        }
    }
}

impl Launch for MpiLaunch {
    type Transport = MpiTransport;
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    /// Collective over `MPI_COMM_WORLD`: the transport's duplicate, then a barrier.
    fn connect(&self) -> Result<MpiTransport, String> {
        // The world handle is taken on the calling thread: a handle may not cross threads.
        let world = SimpleCommunicator::world();
        let transport = MpiTransport::new(&world).map_err(|e| e.to_string())?;
        world.barrier();
        Ok(transport)
    }
}

impl JobTransport for MpiTransport {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("frames_sent", s.sent),
            ("frames_received", s.received),
            ("dropped_to_failed", s.dropped_to_failed),
            ("lost_in_transfer", s.lost_in_transfer),
            ("failure_acks", s.failure_acks),
            ("send_buffers", s.send_buffers),
            ("unattributed_failures", s.unattributed_failures),
            ("payload_bytes_in_place", s.payload_bytes_in_place),
            ("payload_bytes_copied", s.payload_bytes_copied),
            ("payloads_received", s.payloads_received),
            ("payload_buffers_reused", s.payload_buffers_reused),
            ("payload_bytes_placed", s.payload_bytes_placed),
            ("placed_mismatched", s.placed_mismatched),
            ("frames_joined", s.frames_joined),
            ("joined_received", s.joined_received),
            ("heads_sent_early", s.heads_sent_early),
            ("heads_received_early", s.heads_received_early),
            ("withdrawn", s.withdrawn),
            ("completed_pending", s.completed_pending),
        ]
    }
    fn saw_failure(&self) -> bool {
        let s = self.stats();
        s.failure_acks > 0
            || s.dropped_to_failed > 0
            || s.lost_in_transfer > 0
            || s.unattributed_failures > 0
    }
}
