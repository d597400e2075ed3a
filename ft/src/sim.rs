//! [`SimGroup`]: a group of `n` ranks simulated in this process. Each rank is a real
//! [`Runtime`] (its stack on its own progress thread, the same code the MPI and
//! libfabric backends run) over an in-memory network ([`MemNet`]); a kill makes a rank
//! fall silent as a `SIGKILL`ed process would, and its handle's calls fail.
//!
//! Collective calls stay collective: a `validate_global` completes once every live rank
//! of the group called it (from its own thread: [`SimGroup::validate_global_all`] does
//! that for demos).

use std::fmt;

use ft_core::wire::FrameKind;
use ft_core::Rank;
use ft_runtime::{GlobalValidation, MemNet, Runtime, RuntimeError};

use crate::Settings;

/// `n` ranks of one process: see the [module docs](self).
pub struct SimGroup {
    net: MemNet,
    ranks: Vec<Runtime>,
}

impl fmt::Debug for SimGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimGroup")
            .field("ranks", &self.ranks.len())
            .field("survivors", &self.survivors())
            .finish()
    }
}

impl SimGroup {
    /// Starts `n` ranks (`n ≥ 1`), each on its own progress thread.
    pub fn open(n: u32, settings: &Settings) -> Result<SimGroup, RuntimeError> {
        if n == 0 {
            return Err(RuntimeError::Stopped(
                "a group needs at least one rank".into(),
            ));
        }
        let net = MemNet::new(n);
        let ranks = (0..n)
            .map(|me| net.spawn_rank(settings.detector(n, me)))
            .collect::<Result<_, _>>()?;
        Ok(SimGroup { net, ranks })
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// Rank `rank`'s handle, if the group has that rank.
    pub fn rank(&self, rank: Rank) -> Option<&Runtime> {
        self.ranks.get(rank as usize)
    }

    /// Kills `rank` (fail-stop): it falls silent to the others, and its handle's calls
    /// fail with [`RuntimeError::Stopped`]. Idempotent; unknown ranks are ignored.
    pub fn kill(&self, rank: Rank) {
        self.net.kill(rank);
        if let Some(runtime) = self.rank(rank) {
            runtime.halt();
        }
    }

    /// Arms a kill at a protocol step: `rank` dies just before it sends its first
    /// frame of `kind` (e.g. a root before its first broadcast data).
    pub fn kill_before_sending(&self, rank: Rank, kind: FrameKind) {
        self.net.kill_before_sending(rank, kind);
    }

    /// Whether `rank` was killed.
    pub fn is_dead(&self, rank: Rank) -> bool {
        self.net.is_dead(rank)
    }

    /// The ranks not killed, in order.
    pub fn survivors(&self) -> Vec<Rank> {
        (0..self.size()).filter(|&r| !self.is_dead(r)).collect()
    }

    /// Runs `validate_global` at every live rank, each on its own thread; each rank's
    /// result, in rank order.
    pub fn validate_global_all(&self) -> Vec<(Rank, Result<GlobalValidation, RuntimeError>)> {
        let survivors = self.survivors();
        std::thread::scope(|s| {
            let threads: Vec<_> = survivors
                .iter()
                .map(|&r| (r, s.spawn(move || self.ranks[r as usize].validate_global())))
                .collect();
            threads
                .into_iter()
                .map(|(r, t)| {
                    let result = t.join().unwrap_or_else(|_| {
                        Err(RuntimeError::Stopped(
                            "the validating thread panicked".into(),
                        ))
                    });
                    (r, result)
                })
                .collect()
        })
    }
}
