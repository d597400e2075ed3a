//! `ft-campaign`: fault campaigns. `ftcampaign` runs many randomized real jobs on one
//! backend (`ftofi` over libfabric's `tcp;ofi_rxm` or `sockets`, or `ftmpi` under Open
//! MPI 5's `mpiexec --with-ft ulfm`), each with real `SIGKILL`s, and reports how many
//! came out right.
//!
//! ```sh
//! ftcampaign --backend ofi-tcp --runs 50 --seed 1
//! ftcampaign --backend mpi --runs 50 --seed 1 --json
//! ftcampaign --backend ofi-tcp --seed 1 --only 17     # replays run 17 alone
//! ftcampaign --app taskgraph --backend mpi --runs 20 --fttask target/mpi/fttask
//! ```
//!
//! Run `i` of seed `S` is drawn from a generator seeded by `(S, i)` alone
//! ([`mod@generate`]): a `validate` or `broadcast` job (a random plan file: strategy,
//! topology, 1–4 outputs of 1 B to 4 MiB, destination sets), `--ranks A..B` ranks,
//! and a kill list (1–3 random ranks or a block of adjacent ones) that dies at a time,
//! at the first global validation or at the ranks' activation. One validate job in four
//! is a stall run instead: one rank or a block of adjacent ones stops its process
//! (`--stall`) after the first validation, for well below `timeout − 2 · period`
//! (short: nobody may be declared) or well past the detector's start-up grace of
//! `3 · timeout + 2 · period` (long: every stalled rank must be, and leaves as a
//! killed rank does).
//!
//! What each run is checked for ([`verdict`]), reading the survivors' JSON lines with
//! `ft_jobs::report`:
//! - **hang**: the job must end within `--job-timeout-s` (else its whole process group
//!   is killed), and no rank may give up waiting for a step;
//! - **disagreement**: every survivor returns the same `G` from every validation, `G`
//!   never holds a rank that was not killed (`G ⊆ F`), and the set the survivors agree
//!   on once they know every death (the validate job's last validation, the broadcast
//!   job's closing one) is exactly the killed set; in a stall run every `G` lies within,
//!   and the last is exactly, the stalled set (long) or empty (short), and no rank a
//!   long stall should have cost printed a line;
//! - **lost outputs**: every surviving destination received exactly the outputs the
//!   plan gives it, byte for byte, and gave nothing up (`report::served`);
//! - **other**: the launcher or `mpiexec` failed (a stall run too must exit 0), a
//!   survivor stopped with an error (a false suspicion, say), a survivor printed no
//!   line (every rank not declared prints one), or a rank that was to die lived.
//!
//! With `--app taskgraph` a run is an `fttask` job instead (the task-graph runtime of
//! `apps/taskgraph`, under `ftrun` or `mpiexec --with-ft ulfm`): a small random Cholesky
//! or DAG with 1–2 `--kill RANKS@K` flags drawn on its failure-free mapping
//! ([`generate_taskgraph`]), judged by [`judge_taskgraph`]: its checksum must be the
//! simulator's failure-free one, `dead` the killed set, `ok` true, the exit status 0,
//! and it must end in time; a rank lost to a progress-thread stall (`fttask`'s
//! watchdog) is counted on its own, as a failure.
//!
//! It prints a summary (runs, how many were short and long stall runs, ok, hangs,
//! disagreements, lost outputs, other failures, wall time; one JSON object with
//! `--json`) and keeps each failing run's command line,
//! standard output and error, plan file and replay command under `--logs`; it exits
//! non-zero if any run failed.

pub mod backend;
pub mod campaign;
pub mod generate;
pub mod verdict;

pub use backend::{App, Backend, Tools};
pub use campaign::{Campaign, Checksums, Summary};
pub use generate::{
    generate, generate_taskgraph, parse_ranks, Fault, GenConfig, GenError, Job, JobKind, KillFlag,
    Moment, Plan, RanksError, Stall, TaskRun, Timing, Workload,
};
pub use verdict::{judge, judge_taskgraph, Class, Outcome, Verdict};
