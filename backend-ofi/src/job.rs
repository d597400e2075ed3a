//! `ft-jobs`' face of this backend: [`OfiLaunch`] opens an [`OfiTransport`] whose
//! rendezvous (every rank's endpoint name in one directory) is the common start.

use ft_core::{wire, Rank};
use ft_jobs::{JobTransport, Launch};

use crate::{OfiConfig, OfiTransport};

/// A rank of an `ftofi` job.
#[derive(Clone, Debug)]
pub struct OfiLaunch {
    config: OfiConfig,
}

impl OfiLaunch {
    /// The rank `config` opens, its frames up to the stack's largest
    /// ([`wire::frame_capacity`] of the job's size, whatever `config` said).
    pub fn new(mut config: OfiConfig) -> Self {
        config.max_frame = config.max_frame.max(wire::frame_capacity(config.size));
        OfiLaunch { config }
    }
}

impl Launch for OfiLaunch {
    type Transport = OfiTransport;
    fn rank(&self) -> Rank {
        self.config.rank
    }
    fn size(&self) -> u32 {
        self.config.size
    }
    fn connect(&self) -> Result<OfiTransport, String> {
        OfiTransport::open(self.config.clone()).map_err(|e| e.to_string())
    }
}

impl JobTransport for OfiTransport {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("frames_sent", s.sent),
            ("frames_received", s.received),
            ("send_errors", s.send_errors),
            ("oversized", s.oversized),
            ("rma_offered", s.rma_offered),
            ("rma_registrations_reused", s.rma_registrations_reused),
            ("rma_released_unread", s.rma_released_unread),
            ("rma_transfers_open", self.rma_transfers_open() as u64),
            ("rma_reads", s.rma_reads),
            ("rma_bytes_read", s.rma_bytes_read),
            ("rma_fallbacks", s.rma_fallbacks),
            ("rma_lost_reads", s.rma_lost_reads),
            ("rma_bytes_placed", s.rma_bytes_placed),
        ]
    }
    fn saw_failure(&self) -> bool {
        self.stats().send_errors > 0
    }
}

#[cfg(test)]
mod tests {
    use crate::launcher_env;

    /// `ftrun` (and `ftofi` through it) sets the variables every rank reads.
    #[test]
    fn the_launcher_sets_the_names_a_rank_reads() {
        assert_eq!(ft_launch::RANK_VAR, launcher_env::RANK_VAR);
        assert_eq!(ft_launch::SIZE_VAR, launcher_env::SIZE_VAR);
        assert_eq!(ft_launch::RENDEZVOUS_VAR, launcher_env::RENDEZVOUS_VAR);
        assert_eq!(ft_launch::ADDRESS_VAR, launcher_env::ADDRESS_VAR);
        assert_eq!(ft_launch::PROVIDER_VAR, launcher_env::PROVIDER_VAR);
    }
}
