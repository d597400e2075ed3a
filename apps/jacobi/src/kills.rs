//! The `--kill RANKS@ITER` flags: which ranks die, at which iteration, in which order.
//!
//! Invariants: flags are failure events in sequence. A rank of flag `f` dies as it
//! reaches iteration `ITER` (having completed `ITER` iterations), once every rank of
//! the flags before `f` has been reported failed; ranks are named in the job's first
//! numbering.

use ft::Rank;

/// One `--kill` flag: `ranks` die together at iteration `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillFlag {
    /// The ranks, in the job's first numbering.
    pub ranks: Vec<Rank>,
    /// The iteration at which they die.
    pub at: u32,
}

/// The flags of a job, in the order given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KillPlan {
    /// The flags.
    pub flags: Vec<KillFlag>,
}

impl KillPlan {
    /// Whether any flag is given.
    pub fn is_empty(&self) -> bool {
        self.flags.is_empty()
    }

    /// Whether `rank`, in its `incarnation` (0 for the job's first process, +1 per
    /// replacement), dies at `iteration`, given `failed` (the ranks reported failed so
    /// far, in the job's first numbering): its flag is the `incarnation`-th naming it.
    pub fn due(&self, rank: Rank, incarnation: u32, iteration: u32, failed: &[Rank]) -> bool {
        let Some(index) = self
            .flags
            .iter()
            .enumerate()
            .filter(|(_, f)| f.ranks.contains(&rank))
            .map(|(i, _)| i)
            .nth(incarnation as usize)
        else {
            return false;
        };
        let armed = self.flags[..index]
            .iter()
            .all(|f| f.ranks.iter().all(|r| *r == rank || failed.contains(r)));
        armed && iteration >= self.flags[index].at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_flag_waits_for_the_earlier_ones() {
        let plan = KillPlan {
            flags: vec![
                KillFlag {
                    ranks: vec![1],
                    at: 5,
                },
                KillFlag {
                    ranks: vec![2, 3],
                    at: 2,
                },
                KillFlag {
                    ranks: vec![1],
                    at: 9,
                },
            ],
        };
        assert!(!plan.due(1, 0, 4, &[]));
        assert!(plan.due(1, 0, 5, &[]));
        assert!(!plan.due(2, 0, 3, &[]));
        assert!(plan.due(2, 0, 3, &[1]));
        assert!(!plan.due(1, 1, 9, &[1, 2]));
        assert!(plan.due(1, 1, 9, &[1, 2, 3]));
        assert!(!plan.due(0, 0, 100, &[1, 2, 3]));
    }
}
