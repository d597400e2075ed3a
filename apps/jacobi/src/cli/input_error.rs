//! [`InputError`]: why a command line cannot run, each variant a caller mistake with
//! the one message every rank prints before exiting with code 2.

use std::fmt;

use ft::Rank;

use super::MAX_GRID;

/// A command line that cannot run. Every variant is a caller mistake.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputError {
    /// A count that must be positive is 0.
    Zero(&'static str),
    /// `-n` given to a real backend, not matching its launcher.
    Ranks(String),
    /// The grid is below 3 or above [`MAX_GRID`].
    GridSize(u32),
    /// Fewer rows than working ranks: a strip would be empty.
    GridTooSmall {
        /// The grid's side.
        grid: u32,
        /// The working ranks.
        ranks: u32,
    },
    /// The spares leave no working rank.
    TooManySpares {
        /// `--spares`.
        spares: u32,
        /// The ranks started.
        group: u32,
    },
    /// A `--kill` not of the form `RANKS@ITER`.
    KillSyntax(String),
    /// A killed rank outside the working ranks.
    KillOutOfRange {
        /// The rank.
        rank: Rank,
        /// The working ranks.
        ranks: u32,
    },
    /// A rank named twice in one flag, or, under shrink, in two flags.
    KillTwice(Rank),
    /// Every working rank would die.
    KillEveryRank,
    /// A kill at or past the last iteration.
    KillPastEnd {
        /// The iteration asked.
        at: u32,
        /// The iterations of the job.
        iterations: u32,
    },
    /// Rebuild with kills, but no spare and no respawn to rebuild from.
    RebuildWithoutReplacements,
    /// Spares under shrink, which gives the lost rows to the survivors.
    SparesUnderShrink(u32),
    /// Rebuild with more deaths than spares, and no respawn.
    NotEnoughSpares {
        /// The ranks the kills take.
        deaths: u32,
        /// `--spares`.
        spares: u32,
    },
    /// `--respawn` where nothing can respawn a rank, or under shrink.
    Respawn(&'static str),
    /// The backend was not built into this binary.
    BackendMissing(&'static str),
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Zero(what) => write!(f, "{what} must be at least 1"),
            InputError::Ranks(why) => f.write_str(why),
            InputError::GridSize(n) => write!(f, "--grid {n}: the grid needs 3 to {MAX_GRID}"),
            InputError::GridTooSmall { grid, ranks } => write!(
                f,
                "--grid {grid} has fewer rows than the {ranks} working ranks (a strip needs a row)"
            ),
            InputError::TooManySpares { spares, group } => write!(
                f,
                "--spares {spares} leaves no working rank of the {group} started"
            ),
            InputError::KillSyntax(s) => {
                write!(
                    f,
                    "--kill {s}: expected RANKS@ITER, e.g. 2@30, 2,3@10 or 4-6@0"
                )
            }
            InputError::KillOutOfRange { rank, ranks } => {
                write!(
                    f,
                    "--kill: rank {rank} is outside the working ranks 0..{ranks}"
                )
            }
            InputError::KillTwice(r) => write!(
                f,
                "--kill: rank {r} is named twice (in one flag, or in two under --mode shrink)"
            ),
            InputError::KillEveryRank => write!(f, "--kill: every working rank would die"),
            InputError::KillPastEnd { at, iterations } => {
                write!(f, "--kill @{at}: the job runs iterations 0..{iterations}")
            }
            InputError::SparesUnderShrink(spares) => write!(
                f,
                "--spares {spares} with --mode shrink: a shrink hands the lost rows to the \
                 survivors, spares are for --mode rebuild"
            ),
            InputError::RebuildWithoutReplacements => write!(
                f,
                "--mode rebuild with --kill needs --spares K or --respawn to rebuild from"
            ),
            InputError::NotEnoughSpares { deaths, spares } => write!(
                f,
                "--mode rebuild: the kills take {deaths} ranks but there are {spares} spares \
                 (add spares, or --respawn)"
            ),
            InputError::Respawn(why) => write!(f, "--respawn: {why}"),
            InputError::BackendMissing(b) => write!(
                f,
                "--backend {b}: this ftjacobi was built without the `{b}` feature"
            ),
        }
    }
}

impl std::error::Error for InputError {}
