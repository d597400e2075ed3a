//! The command line, and every check of it made before any work: a bad input is one
//! [`InputError`] (exit code 2, on every rank, since every rank parses the same line).

use std::fmt;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use ft::{Rank, Strategy, Topology};

use crate::scheduler::{KillFlag, Options};
use crate::workloads::cholesky::Cholesky;
use crate::workloads::issue624::Issue624;
use crate::workloads::random::RandomDag;
use crate::workloads::Workload;

/// Which backend the ranks run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// In this process, through `ft::sim` (`-n` ranks).
    Sim,
    /// One rank per process under `ftrun` (libfabric).
    Ofi,
    /// One rank per process under `mpiexec --with-ft ulfm`.
    Mpi,
}

/// `fttask`: a dataflow task runtime on ft.
#[derive(Debug, Parser)]
#[command(name = "fttask", version, about)]
pub struct Cli {
    /// The backend.
    #[arg(long, global = true, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Ranks of a simulated job (`--backend sim`); real backends take the launcher's.
    #[arg(short = 'n', long = "ranks", global = true)]
    pub ranks: Option<u32>,
    /// How broadcasts are built: per-class, fetch-for-descendants, per-output.
    #[arg(long, global = true, default_value = "per-class")]
    pub strategy: Strategy,
    /// Tree shape: star, chain, binomial, kary:K (default: the workload's).
    #[arg(long, global = true)]
    pub topology: Option<Topology>,
    /// `RANKS@K`: the ranks (`2`, `2,3`, `4-6`) die right after completing K tasks;
    /// repeat for failures in sequence.
    #[arg(long = "kill", global = true, value_name = "RANKS@K")]
    pub kills: Vec<String>,
    /// Worker threads per rank.
    #[arg(long, global = true, default_value_t = 2)]
    pub workers: usize,
    /// Plain sends from each producer to each consumer, no trees, no recovery.
    #[arg(long, global = true)]
    pub baseline: bool,
    /// Silence after which the detector declares a rank dead, in ms.
    #[arg(long, global = true, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// The longest a job may run, in seconds.
    #[arg(long, global = true, default_value_t = 600)]
    pub limit_s: u64,
    /// Run nothing: print `{"owned":[c0,...],"tasks":T}`, the tasks each of the `-n`
    /// ranks owns failure-free (a `--kill R@K` needs `K` below rank R's count).
    #[arg(long, global = true)]
    pub owned: bool,
    /// The workload.
    #[command(subcommand)]
    pub workload: WorkloadArgs,
}

/// The workloads and their parameters.
#[derive(Clone, Debug, Subcommand)]
pub enum WorkloadArgs {
    /// The seed's #624 graph on 3 ranks.
    Issue624,
    /// A tiled Cholesky of a random SPD matrix.
    Cholesky {
        /// Tiles per side.
        #[arg(long, default_value_t = 8)]
        tiles: u32,
        /// Tile side, in doubles.
        #[arg(long, default_value_t = 64)]
        tile_size: u32,
        /// The matrix's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// A random multi-output DAG.
    Random {
        /// Tasks.
        #[arg(long, default_value_t = 200)]
        tasks: u32,
        /// The largest output, in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        max_bytes: u64,
        /// The DAG's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// A command line that cannot run. Every variant is a caller mistake.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputError {
    /// A count that must be positive is 0.
    Zero(&'static str),
    /// `-n` is missing, 0, or given to a real backend.
    Ranks(String),
    /// issue624 needs 3 ranks at least (tile `i` on rank `i`).
    TooFewRanks(u32),
    /// A `--kill` not of the form `RANKS@K`.
    KillSyntax(String),
    /// A killed rank outside the job.
    KillOutOfRange {
        /// The rank.
        rank: Rank,
        /// The job's size.
        ranks: u32,
    },
    /// A rank named in two kills (it dies once).
    KillTwice(Rank),
    /// Every rank would die.
    KillEveryRank,
    /// `K` at or past the tasks the rank owns.
    KillPastTasks {
        /// The rank.
        rank: Rank,
        /// The `K` asked.
        after: u32,
        /// The tasks it owns failure-free.
        owned: u32,
    },
    /// The baseline has no recovery.
    KillWithBaseline,
    /// The backend was not built into this binary.
    BackendMissing(&'static str),
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Zero(what) => write!(f, "{what} must be at least 1"),
            InputError::Ranks(why) => f.write_str(why),
            InputError::TooFewRanks(n) => write!(f, "issue624 needs at least 3 ranks, not {n}"),
            InputError::KillSyntax(s) => {
                write!(f, "--kill {s}: expected RANKS@K, e.g. 2@3, 2,3@1 or 4-6@0")
            }
            InputError::KillOutOfRange { rank, ranks } => {
                write!(f, "--kill: rank {rank} is outside the job's 0..{ranks}")
            }
            InputError::KillTwice(r) => write!(f, "--kill: rank {r} is named twice"),
            InputError::KillEveryRank => write!(f, "--kill: every rank would die"),
            InputError::KillPastTasks { rank, after, owned } => write!(
                f,
                "--kill: rank {rank} owns {owned} tasks, so it cannot die after completing {after}"
            ),
            InputError::KillWithBaseline => write!(f, "--baseline has no recovery: no --kill"),
            InputError::BackendMissing(b) => {
                write!(
                    f,
                    "--backend {b}: this fttask was built without the `{b}` feature"
                )
            }
        }
    }
}

impl std::error::Error for InputError {}

/// Parses one `RANKS@K`.
fn parse_kill(s: &str) -> Result<KillFlag, InputError> {
    let bad = || InputError::KillSyntax(s.to_string());
    let (ranks, after) = s.split_once('@').ok_or_else(bad)?;
    let after = after.parse().map_err(|_| bad())?;
    let mut list = Vec::new();
    for part in ranks.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (Rank, Rank) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                list.extend(a..=b);
            }
            None => list.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(KillFlag { ranks: list, after })
}

/// The `--owned` line of `cli` (`-n` required, on every backend): the tasks each rank
/// owns in the failure-free mapping, and the work tasks in all, as one JSON object.
pub fn owned_line(cli: &Cli) -> Result<String, InputError> {
    let n = cli
        .ranks
        .ok_or_else(|| InputError::Ranks("--owned needs -n".into()))?;
    if n == 0 {
        return Err(InputError::Zero("the number of ranks"));
    }
    let work = workload(cli, n)?;
    let graph = work.graph();
    Ok(
        serde_json::json!({"owned": graph.owned_counts(n), "tasks": graph.work_tasks()})
            .to_string(),
    )
}

/// The workload of `cli` on `n` ranks, its parameters checked.
fn workload(cli: &Cli, n: u32) -> Result<Box<dyn Workload>, InputError> {
    Ok(match cli.workload {
        WorkloadArgs::Issue624 => {
            if n < 3 {
                return Err(InputError::TooFewRanks(n));
            }
            Box::new(Issue624::new(n))
        }
        WorkloadArgs::Cholesky {
            tiles,
            tile_size,
            seed,
        } => {
            if tiles == 0 {
                return Err(InputError::Zero("--tiles"));
            }
            if tile_size == 0 {
                return Err(InputError::Zero("--tile-size"));
            }
            Box::new(Cholesky::new(tiles, tile_size, seed, n))
        }
        WorkloadArgs::Random {
            tasks,
            max_bytes,
            seed,
        } => {
            if tasks == 0 {
                return Err(InputError::Zero("--tasks"));
            }
            if max_bytes == 0 {
                return Err(InputError::Zero("--max-bytes"));
            }
            Box::new(RandomDag::new(tasks, max_bytes, seed, n))
        }
    })
}

/// The workload and options of `cli` on `n` ranks, every input checked.
pub fn prepare(cli: &Cli, n: u32) -> Result<(Box<dyn Workload>, Options), InputError> {
    if n == 0 {
        return Err(InputError::Zero("the number of ranks"));
    }
    if cli.workers == 0 {
        return Err(InputError::Zero("--workers"));
    }
    let work = workload(cli, n)?;
    let kills = cli
        .kills
        .iter()
        .map(|s| parse_kill(s))
        .collect::<Result<Vec<_>, _>>()?;
    if cli.baseline && !kills.is_empty() {
        return Err(InputError::KillWithBaseline);
    }
    let owned = work.graph().owned_counts(n);
    let mut named = Vec::new();
    for flag in &kills {
        for &rank in &flag.ranks {
            if rank >= n {
                return Err(InputError::KillOutOfRange { rank, ranks: n });
            }
            if named.contains(&rank) {
                return Err(InputError::KillTwice(rank));
            }
            named.push(rank);
            let owns = owned[rank as usize];
            if flag.after >= owns {
                return Err(InputError::KillPastTasks {
                    rank,
                    after: flag.after,
                    owned: owns,
                });
            }
        }
    }
    if named.len() as u32 >= n {
        return Err(InputError::KillEveryRank);
    }
    let options = Options {
        strategy: cli.strategy,
        topology: cli.topology.unwrap_or_else(|| work.default_topology()),
        workers: cli.workers,
        kills,
        baseline: cli.baseline,
        limit: Duration::from_secs(cli.limit_s),
        log: None,
    };
    Ok((work, options))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("fttask").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn kills_parse_as_lists_and_ranges() {
        assert_eq!(
            parse_kill("2@3"),
            Ok(KillFlag {
                ranks: vec![2],
                after: 3
            })
        );
        assert_eq!(parse_kill("1,4-6@0").unwrap().ranks, [1, 4, 5, 6]);
        assert!(parse_kill("2").is_err());
        assert!(parse_kill("6-4@1").is_err());
    }

    #[test]
    fn bad_inputs_are_refused_before_any_work() {
        let check = |args: &[&str], n: u32| prepare(&cli(args), n).err();
        assert_eq!(
            check(&["cholesky", "--tile-size", "0"], 4),
            Some(InputError::Zero("--tile-size"))
        );
        assert_eq!(
            check(&["--kill", "0-3@0", "cholesky"], 4),
            Some(InputError::KillEveryRank)
        );
        assert_eq!(
            check(&["--kill", "9@0", "cholesky"], 4),
            Some(InputError::KillOutOfRange { rank: 9, ranks: 4 })
        );
        assert_eq!(
            check(&["--kill", "1@1", "issue624"], 3),
            Some(InputError::KillPastTasks {
                rank: 1,
                after: 1,
                owned: 1
            })
        );
        assert_eq!(
            check(&["--kill", "1@0", "--kill", "1@0", "random"], 4),
            Some(InputError::KillTwice(1))
        );
        assert!(check(&["--kill", "1@0", "issue624"], 3).is_none());
        assert!(Cli::try_parse_from(["fttask", "--strategy", "nope", "issue624"]).is_err());
        assert!(Cli::try_parse_from(["fttask", "lu"]).is_err());
    }

    #[test]
    fn owned_counts_are_printed_without_running() {
        let line = owned_line(&cli(&["-n", "3", "--owned", "issue624"])).unwrap();
        assert_eq!(line, r#"{"owned":[1,1,1],"tasks":3}"#);
        let line = owned_line(&cli(&["--owned", "-n", "4", "cholesky", "--tiles", "4"])).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let owned: Vec<u64> = serde_json::from_value(v["owned"].clone()).unwrap();
        assert_eq!(owned.len(), 4);
        assert_eq!(owned.iter().sum::<u64>(), v["tasks"].as_u64().unwrap());
        assert!(matches!(
            owned_line(&cli(&["--owned", "random"])),
            Err(InputError::Ranks(_))
        ));
    }
}
