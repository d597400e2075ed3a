//! The command line, and every check of it made before any work: a bad input is one
//! [`InputError`] (exit code 2, on every rank, since every rank parses the same line
//! and knows the same group size).

mod input_error;

use std::time::Duration;

use clap::{Parser, ValueEnum};
use ft::Rank;

pub use input_error::InputError;

use crate::kills::{KillFlag, KillPlan};

/// The largest grid side accepted (a grid of 8 GiB).
pub const MAX_GRID: u32 = 1 << 15;

/// Which backend the ranks run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// In this process, through `ft::sim` (`-n` ranks, plus `--spares`).
    Sim,
    /// One rank per process under `ftrun` (libfabric).
    Ofi,
    /// One rank per process under `mpiexec --with-ft ulfm`.
    Mpi,
}

impl Backend {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Ofi => "ofi",
            Backend::Mpi => "mpi",
        }
    }
}

/// How the job goes on after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A spare or respawned rank takes the failed rank's place and number.
    Rebuild,
    /// The survivors go on as a smaller group and share the lost rows.
    Shrink,
}

impl Mode {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Rebuild => "rebuild",
            Mode::Shrink => "shrink",
        }
    }
}

/// `ftjacobi`: a 2D Jacobi (heat) solver over row strips on ft.
#[derive(Debug, Parser)]
#[command(name = "ftjacobi", version, about)]
pub struct Cli {
    /// The backend.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: Backend,
    /// Working ranks of a simulated job (`--backend sim`; default 4); real backends
    /// take the launcher's.
    #[arg(short = 'n', long = "ranks")]
    pub ranks: Option<u32>,
    /// The grid's side: N×N cells, fixed boundary.
    #[arg(long, default_value_t = 256)]
    pub grid: u32,
    /// Jacobi iterations.
    #[arg(long, default_value_t = 150)]
    pub iterations: u32,
    /// A checkpoint every K iterations.
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub checkpoint_every: u32,
    /// How the job goes on after a failure.
    #[arg(long, value_enum, default_value = "shrink")]
    pub mode: Mode,
    /// Ranks started idle to replace failed ones: the last K of the group (on sim,
    /// K more than `-n`); `ftrun --spares K` sets it for every rank.
    #[arg(long, env = "FT_SPARES", default_value_t = 0, value_name = "K")]
    pub spares: u32,
    /// Failed ranks are replaced by processes the launcher respawns (`ftrun --respawn`).
    #[arg(long)]
    pub respawn: bool,
    /// Ranks per node, for the detector and the checkpoint copies (default: the whole
    /// group on one node).
    #[arg(long, value_name = "R")]
    pub ranks_per_node: Option<u32>,
    /// `RANKS@ITER`: the ranks (`2`, `2,3`, `4-6`) die as they reach iteration ITER;
    /// repeat for failures in sequence.
    #[arg(long = "kill", value_name = "RANKS@ITER")]
    pub kills: Vec<String>,
    /// Silence after which the detector declares a rank dead, in ms.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// The longest a job may run, in seconds.
    #[arg(long, default_value_t = 600)]
    pub limit_s: u64,
}

/// A checked command line, on a group of known size.
#[derive(Clone, Debug)]
pub struct Config {
    /// The backend.
    pub backend: Backend,
    /// Ranks that own strips at the start: `0..ranks`.
    pub ranks: u32,
    /// Spare ranks: `ranks..ranks + spares`.
    pub spares: u32,
    /// The grid's side.
    pub grid: u32,
    /// Iterations.
    pub iterations: u32,
    /// The checkpoint period.
    pub checkpoint_every: u32,
    /// The recovery mode.
    pub mode: Mode,
    /// Whether the launcher respawns failed ranks.
    pub respawn: bool,
    /// Ranks per node (the detector's span).
    pub ranks_per_node: u32,
    /// The `--kill` flags.
    pub kills: KillPlan,
    /// The detector's timeout.
    pub timeout: Duration,
    /// The job's time limit.
    pub limit: Duration,
}
/// Parses one `RANKS@ITER`.
fn parse_kill(s: &str) -> Result<KillFlag, InputError> {
    let bad = || InputError::KillSyntax(s.to_string());
    let (ranks, at) = s.split_once('@').ok_or_else(bad)?;
    let at = at.parse().map_err(|_| bad())?;
    let mut list: Vec<Rank> = Vec::new();
    for part in ranks.split(',') {
        let (a, b): (Rank, Rank) = match part.split_once('-') {
            Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
            None => {
                let r = part.parse().map_err(|_| bad())?;
                (r, r)
            }
        };
        if a > b {
            return Err(bad());
        }
        for rank in a..=b {
            if list.contains(&rank) {
                return Err(InputError::KillTwice(rank));
            }
            list.push(rank);
        }
    }
    Ok(KillFlag { ranks: list, at })
}
/// Checks `cli` for a group of `group` ranks started (on sim, `-n` plus `--spares`).
pub fn prepare(cli: &Cli, group: u32) -> Result<Config, InputError> {
    if group == 0 {
        return Err(InputError::Zero("the number of ranks"));
    }
    if !(3..=MAX_GRID).contains(&cli.grid) {
        return Err(InputError::GridSize(cli.grid));
    }
    for (value, what) in [
        (cli.iterations, "--iterations"),
        (cli.checkpoint_every, "--checkpoint-every"),
        (cli.ranks_per_node.unwrap_or(1), "--ranks-per-node"),
    ] {
        if value == 0 {
            return Err(InputError::Zero(what));
        }
    }
    if cli.timeout_ms == 0 {
        return Err(InputError::Zero("--timeout-ms"));
    }
    if cli.spares >= group {
        return Err(InputError::TooManySpares {
            spares: cli.spares,
            group,
        });
    }
    let ranks = group - cli.spares;
    if cli.grid < ranks {
        return Err(InputError::GridTooSmall {
            grid: cli.grid,
            ranks,
        });
    }
    let kills = KillPlan {
        flags: cli
            .kills
            .iter()
            .map(|s| parse_kill(s))
            .collect::<Result<_, _>>()?,
    };
    let mut named: Vec<Rank> = Vec::new();
    let mut deaths = 0;
    for flag in &kills.flags {
        if flag.at >= cli.iterations {
            return Err(InputError::KillPastEnd {
                at: flag.at,
                iterations: cli.iterations,
            });
        }
        for &rank in &flag.ranks {
            if rank >= ranks {
                return Err(InputError::KillOutOfRange { rank, ranks });
            }
            if named.contains(&rank) && cli.mode == Mode::Shrink {
                return Err(InputError::KillTwice(rank));
            }
            deaths += 1;
            named.push(rank);
        }
    }
    named.sort_unstable();
    named.dedup();
    if named.len() as u32 >= ranks {
        return Err(InputError::KillEveryRank);
    }
    if cli.respawn {
        return Err(InputError::Respawn(
            "respawning a failed rank's process is not supported: use --spares K",
        ));
    }
    if cli.mode == Mode::Shrink && cli.spares > 0 {
        return Err(InputError::SparesUnderShrink(cli.spares));
    }
    if cli.mode == Mode::Rebuild && !kills.is_empty() && !cli.respawn {
        if cli.spares == 0 {
            return Err(InputError::RebuildWithoutReplacements);
        }
        if deaths > cli.spares {
            return Err(InputError::NotEnoughSpares {
                deaths,
                spares: cli.spares,
            });
        }
    }
    Ok(Config {
        backend: cli.backend,
        ranks,
        spares: cli.spares,
        grid: cli.grid,
        iterations: cli.iterations,
        checkpoint_every: cli.checkpoint_every,
        mode: cli.mode,
        respawn: cli.respawn,
        ranks_per_node: cli.ranks_per_node.unwrap_or(group),
        kills,
        timeout: Duration::from_millis(cli.timeout_ms),
        limit: Duration::from_secs(cli.limit_s),
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], group: u32) -> Option<InputError> {
        let cli = Cli::try_parse_from(std::iter::once("ftjacobi").chain(args.iter().copied()))
            .expect("a command line clap accepts");
        prepare(&cli, group).err()
    }

    #[test]
    fn kills_parse_as_lists_and_ranges() {
        assert_eq!(
            parse_kill("2@3"),
            Ok(KillFlag {
                ranks: vec![2],
                at: 3
            })
        );
        assert_eq!(parse_kill("1,4-6@0").unwrap().ranks, [1, 4, 5, 6]);
        assert_eq!(parse_kill("1,1@0"), Err(InputError::KillTwice(1)));
        for bad in ["2", "6-4@1", "a@1", "1@", "@3", "1@-1"] {
            assert!(parse_kill(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_inputs_are_refused_before_any_work() {
        assert_eq!(check(&["--grid", "2"], 1), Some(InputError::GridSize(2)));
        assert_eq!(
            check(&["--grid", "7"], 8),
            Some(InputError::GridTooSmall { grid: 7, ranks: 8 })
        );
        assert_eq!(
            check(&["--iterations", "0"], 4),
            Some(InputError::Zero("--iterations"))
        );
        assert_eq!(
            check(&["--spares", "4"], 4),
            Some(InputError::TooManySpares {
                spares: 4,
                group: 4
            })
        );
        assert_eq!(
            check(&["--kill", "0-3@1"], 4),
            Some(InputError::KillEveryRank)
        );
        assert_eq!(
            check(&["--kill", "0,1@1", "--kill", "2-3@5"], 4),
            Some(InputError::KillEveryRank)
        );
        assert_eq!(
            check(&["--kill", "4@1"], 4),
            Some(InputError::KillOutOfRange { rank: 4, ranks: 4 })
        );
        assert_eq!(
            check(&["--kill", "1@150"], 4),
            Some(InputError::KillPastEnd {
                at: 150,
                iterations: 150
            })
        );
        assert_eq!(
            check(&["--kill", "1@3", "--kill", "1@9"], 4),
            Some(InputError::KillTwice(1))
        );
        assert_eq!(
            check(&["--mode", "rebuild", "--kill", "1@3"], 4),
            Some(InputError::RebuildWithoutReplacements)
        );
        assert!(matches!(
            check(
                &["--mode", "rebuild", "--spares", "1", "--kill", "1,2@3"],
                5
            ),
            Some(InputError::NotEnoughSpares {
                deaths: 2,
                spares: 1
            })
        ));
        assert!(matches!(
            check(&["--respawn", "--mode", "rebuild"], 4),
            Some(InputError::Respawn(_))
        ));
        assert!(matches!(
            check(&["--backend", "ofi", "--respawn"], 4),
            Some(InputError::Respawn(_))
        ));
    }

    #[test]
    fn good_inputs_are_taken_as_given() {
        assert_eq!(
            check(
                &["--mode", "rebuild", "--spares", "2", "--kill", "1@3", "--kill", "1@9"],
                6
            ),
            None
        );
        let cli = Cli::try_parse_from([
            "ftjacobi", "--mode", "rebuild", "--spares", "2", "--grid", "6",
        ])
        .unwrap();
        let config = prepare(&cli, 6).unwrap();
        assert_eq!(
            (config.ranks, config.spares, config.ranks_per_node),
            (4, 2, 6)
        );
        assert!(Cli::try_parse_from(["ftjacobi", "--mode", "blank"]).is_err());
    }
}
