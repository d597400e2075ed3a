//! The re-execution count, checked against what every simulated rank ran: each test
//! runs a job in this process with a [`RunLog`] that every rank, the killed ones too,
//! fills as it completes task runs, then counts the re-runs itself and compares them
//! with the report. It also checks how each kind of failure unfolds: a killed rank of
//! the first flag completes exactly `K` runs, a block of adjacent ranks dies together,
//! and a rank of a second flag with `K = 0` dies the moment the survivors agree on the
//! first failure, that is while they recover from it.

use std::collections::HashSet;
use std::sync::Arc;

use clap::Parser;
use ft_taskgraph::backends::{run_sim_logged, JobEnd};
use ft_taskgraph::cli::Cli;
use ft_taskgraph::scheduler::RunLog;
use ft_taskgraph::Report;

/// Runs `fttask args` on the simulator; its report and every completed run.
fn job(args: &[&str]) -> (Report, Vec<(u32, u32)>) {
    let cli = Cli::try_parse_from(
        ["fttask", "--timeout-ms", "300", "--limit-s", "120"]
            .iter()
            .chain(args),
    )
    .expect("a valid command line");
    let log = Arc::new(RunLog::default());
    match run_sim_logged(&cli, Some(Arc::clone(&log))) {
        JobEnd::Reported(_, _, report) => (report, log.runs()),
        JobEnd::BadInput(e) => panic!("fttask {args:?}: bad input: {e}"),
        JobEnd::Failed(e) => panic!("fttask {args:?}: failed: {e}"),
        JobEnd::Quiet => panic!("fttask {args:?}: nobody reported"),
    }
}

/// The runs of `rank` in `log`.
fn runs_of(log: &[(u32, u32)], rank: u32) -> usize {
    log.iter().filter(|&&(r, _)| r == rank).count()
}

/// One failure scenario: the `--kill` flags, each first-flag rank with the `K` it
/// must die after, and the dead set the report must show.
type Scenario<'a> = (&'a [&'a str], &'a [(u32, usize)], &'a [u32]);

/// Runs `workload` failure-free and under each `(flags, first-flag ranks and K, dead)`;
/// asserts that the report's counts are the log's, exactly.
fn counts_are_exact(workload: &[&str], tasks: usize, kills: &[Scenario]) {
    let mut args = vec!["-n", "6"];
    args.extend_from_slice(workload);
    let (clean, log) = job(&args);
    assert_eq!(log.len(), tasks, "failure-free, every task runs once");
    assert_eq!((clean.executed, clean.reexecuted), (tasks as u64, 0));
    for &(flags, first, dead) in kills {
        let mut args = vec!["-n", "6"];
        args.extend_from_slice(flags);
        args.extend_from_slice(workload);
        let (report, log) = job(&args);
        let distinct: HashSet<u32> = log.iter().map(|&(_, t)| t).collect();
        assert_eq!(distinct.len(), tasks, "{flags:?}: every task ran");
        assert_eq!(report.executed, log.len() as u64, "{flags:?}: {report:?}");
        assert_eq!(
            report.reexecuted,
            (log.len() - tasks) as u64,
            "{flags:?}: {report:?}"
        );
        assert!(report.uncounted.is_empty(), "{flags:?}: {report:?}");
        assert_eq!(report.dead, dead, "{flags:?}");
        assert_eq!(report.checksum, clean.checksum, "{flags:?}");
        for &(rank, k) in first {
            assert_eq!(runs_of(&log, rank), k, "{flags:?}: rank {rank} runs");
        }
        eprintln!(
            "{flags:?}: {} runs, {} re-executed",
            report.executed, report.reexecuted
        );
    }
}

#[test]
fn cholesky_reexecutions_are_counted_exactly() {
    counts_are_exact(
        &[
            "cholesky",
            "--tiles",
            "8",
            "--tile-size",
            "32",
            "--seed",
            "3",
        ],
        120,
        &[
            (&["--kill", "2@5"], &[(2, 5)], &[2]),
            // A block of adjacent ranks, dying together after 4 runs each.
            (&["--kill", "2-3@4"], &[(2, 4), (3, 4)], &[2, 3]),
            (&["--kill", "1@3", "--kill", "4@9"], &[(1, 3)], &[1, 4]),
            // Rank 5 dies as soon as rank 0's death is agreed: during the recovery.
            (&["--kill", "0@6", "--kill", "5@0"], &[(0, 6)], &[0, 5]),
        ],
    );
}

#[test]
fn random_dag_reexecutions_are_counted_exactly() {
    counts_are_exact(
        &[
            "random",
            "--tasks",
            "200",
            "--max-bytes",
            "65536",
            "--seed",
            "5",
        ],
        200,
        &[
            (&["--kill", "3@4"], &[(3, 4)], &[3]),
            (&["--kill", "1,2@6"], &[(1, 6), (2, 6)], &[1, 2]),
            (&["--kill", "0@5", "--kill", "5@0"], &[(0, 5)], &[0, 5]),
        ],
    );
}
