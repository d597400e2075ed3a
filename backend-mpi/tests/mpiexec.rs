//! Real multi-process runs: `mpiexec` starts `ftmpi` on several ranks of this machine,
//! and the fault tests kill one of them, or a "node" of four, with `SIGKILL`. Every
//! survivor prints one JSON line; the tests read them all and check them as
//! `ft_jobs::conformance` says (the scenarios every backend runs), plus a smoke run of
//! the MPI-only benchmark. Bad input (`conformance::BAD_INPUTS` and the benchmark's
//! own) must end the job within seconds, with one clear message and a non-zero
//! status; a rank that fails after the job started says why once and ends as a crashed
//! rank, and the others finish without it.
//!
//! The MPI is the one the crate was built against: `mpiexec` is taken from `FT_MPIEXEC`,
//! else from beside `MPICC`, else from `PATH`. Fault tests need Open MPI 5 with ULFM
//! (`--with-ft ulfm`); `scripts/test-all` installs it. Built against MPICH
//! (`cfg(mpi_family = "mpich")`, from `build.rs`), the failure-free tests run and the
//! tests that kill a rank are ignored. The runs are serialized: ranks
//! oversubscribe the cores already, and a second job beside them could starve a
//! heartbeat long enough for a false suspicion.

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ft_jobs::conformance::{self, Scenario};
use serde_json::Value;

/// One `mpiexec` job at a time.
static JOBS: Mutex<()> = Mutex::new(());

/// The longest a job may take before it is killed and the test fails.
const JOB_LIMIT: Duration = Duration::from_secs(120);

/// The longest a job refusing its input may take: every rank refuses within a second
/// or two, and each bounds its `MPI_Finalize`.
const REFUSAL_LIMIT: Duration = Duration::from_secs(30);

/// A job killed past its limit: what it printed, and the processes it left running
/// (`pid command`) when it was killed.
struct Hung {
    output: Output,
    running: Vec<String>,
}

impl Hung {
    /// Whether a rank (an `ftmpi` process) was still running: if none was, only the
    /// launcher hung, after every rank had ended.
    fn ranks_running(&self) -> bool {
        self.running.iter().any(|p| p.contains(FTMPI))
    }

    fn describe(&self, args: &[&OsStr], limit: Duration) -> String {
        format!(
            "mpiexec {args:?} ran past {limit:?}\nstill running: {:#?}\nstdout:\n{}\nstderr:\n{}",
            self.running,
            String::from_utf8_lossy(&self.output.stdout),
            String::from_utf8_lossy(&self.output.stderr)
        )
    }
}

/// Runs `mpiexec --with-ft ulfm ARGS` (ARGS: `-n N ftmpi ...`, or several such
/// contexts) from the workspace root; kills it and fails the test past [`JOB_LIMIT`].
/// Returns its output and how long it took.
fn mpiexec_run(args: &[&OsStr]) -> (Output, Duration) {
    mpiexec_within(args, JOB_LIMIT)
        .unwrap_or_else(|hung| panic!("{}", hung.describe(args, JOB_LIMIT)))
}

/// What PRRTE prints when its launcher could not start (no rank started, nothing on
/// stdout): the job never ran, so it is run again.
const LAUNCHER_DID_NOT_START: &str = "PMIx server's listener thread failed to start";

/// [`mpiexec_run`] with its own limit; a job past it is killed and returned as
/// [`Hung`]. A job whose launcher failed to start (no rank ran) is started again, up
/// to twice, and says so on stderr.
fn mpiexec_within(args: &[&OsStr], limit: Duration) -> Result<(Output, Duration), Hung> {
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 1.. {
        let (out, took) = launch(args, limit)?;
        let launcher_failed = out.stdout.is_empty()
            && String::from_utf8_lossy(&out.stderr).contains(LAUNCHER_DID_NOT_START);
        if !launcher_failed || attempt == 3 {
            return Ok((out, took));
        }
        eprintln!("mpiexec {args:?}: the launcher did not start (attempt {attempt}); again");
    }
    unreachable!("the loop returns by its third attempt")
}

/// The launcher flags of the MPI this crate was built against. Open MPI's PRRTE runs
/// more ranks than cores only when told to, and keeps the survivors of a killed rank
/// only with ULFM on. MPICH's Hydra oversubscribes by default and keeps no survivors
/// (with a rank killed, Hydra ends the whole job, and `MPIR_CVAR_ENABLE_FT=1` aborts
/// in `MPI_Init`; the guide's MPI chapter has the measurements), so the tests that kill
/// a rank are ignored on it.
#[cfg(not(mpi_family = "mpich"))]
const LAUNCHER_FLAGS: &[&str] = &["--oversubscribe", "--bind-to", "none", "--with-ft", "ulfm"];
#[cfg(mpi_family = "mpich")]
const LAUNCHER_FLAGS: &[&str] = &[];

/// One `mpiexec` job, killed past `limit` (the caller holds [`JOBS`]).
fn launch(args: &[&OsStr], limit: Duration) -> Result<(Output, Duration), Hung> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut child = ft_jobs::mpiexec::command()
        .args(LAUNCHER_FLAGS)
        .args(args)
        .current_dir(root)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({e}): set FT_MPIEXEC or MPICC, or run scripts/test-all, \
                 which installs Open MPI",
                ft_jobs::mpiexec::mpiexec_path().display()
            )
        });
    let started = Instant::now();
    while child.try_wait().expect("waiting for mpiexec").is_none() {
        if started.elapsed() > limit {
            let running = descendants(child.id());
            let _ = child.kill();
            // The ranks may outlive the launcher: end them too, or the next job
            // shares the cores with them.
            for process in &running {
                if let Some(pid) = process.split(' ').next() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            let output = child.wait_with_output().expect("reading mpiexec's output");
            return Err(Hung { output, running });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("reading mpiexec's output");
    Ok((out, started.elapsed()))
}

/// The processes below `root` (`pid command`), read from `/proc`.
fn descendants(root: u32) -> Vec<String> {
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut below = vec![root];
    let mut found = Vec::new();
    while let Some(parent) = below.pop() {
        for &pid in &pids {
            if parent_of(pid) == Some(parent) {
                below.push(pid);
                let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                    .unwrap_or_default();
                found.push(format!("{pid} {}", command.trim_end()));
            }
        }
    }
    found
}

/// `-n RANKS ftmpi ARGS`, as [`mpiexec_run`] takes it.
fn context<'a>(ranks: &'a str, args: &[&'a str]) -> Vec<&'a OsStr> {
    let mut all: Vec<&OsStr> = vec!["-n".as_ref(), ranks.as_ref(), FTMPI.as_ref()];
    all.extend(args.iter().map(|a| OsStr::new(*a)));
    all
}

const FTMPI: &str = env!("CARGO_BIN_EXE_ftmpi");

/// Runs `ftmpi ARGS` on `ranks` ranks; returns the survivors' JSON lines by rank.
fn run(ranks: u32, args: &[&str]) -> Vec<Value> {
    let n = ranks.to_string();
    let (out, _) = mpiexec_run(&context(&n, args));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpiexec {args:?} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    ft_jobs::report::parse_lines(&stdout).unwrap_or_else(|e| panic!("{e}\nstdout:\n{stdout}"))
}

/// Runs `scenario` on `mpiexec` and checks its survivors' lines.
fn check(scenario: &Scenario) {
    let lines = run(scenario.ranks, scenario.args);
    check_lines(scenario, &lines);
}

/// Checks the lines `scenario` printed.
fn check_lines(scenario: &Scenario, lines: &[Value]) {
    scenario
        .check(lines)
        .unwrap_or_else(|e| panic!("{e}\nlines: {lines:#?}"));
}

#[test]
fn validate_global_without_failures() {
    check(&conformance::VALIDATE_WITHOUT_FAILURES);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn validate_global_after_a_rank_is_killed() {
    check(&conformance::VALIDATE_AFTER_A_KILL);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn validate_global_on_a_progress_thread_after_a_rank_is_killed() {
    check(&conformance::VALIDATE_THREADED_AFTER_A_KILL);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn validate_global_when_the_coordinator_dies_in_the_call() {
    check(&conformance::VALIDATE_WHEN_THE_COORDINATOR_DIES);
}

#[test]
fn broadcast_issue_624_shapes_under_every_strategy() {
    for scenario in &conformance::BROADCAST_ISSUE_624 {
        check(scenario);
    }
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn broadcast_repairs_the_subtree_of_a_killed_inner_rank() {
    check(&conformance::BROADCAST_REPAIR);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn broadcast_through_the_progress_thread_survives_a_killed_rank() {
    check(&conformance::BROADCAST_THREADED_REPAIR);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn validate_global_after_a_node_is_killed() {
    check(&conformance::VALIDATE_AFTER_A_NODE_IS_KILLED);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn validate_global_when_a_node_dies_in_the_call() {
    check(&conformance::VALIDATE_WHEN_A_NODE_DIES_IN_THE_CALL);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn broadcast_serves_every_survivor_when_a_node_dies_on_activation() {
    check(&conformance::BROADCAST_WHEN_A_NODE_DIES_ON_ACTIVATION);
}

#[test]
fn send_buffers_are_reused_from_the_pool() {
    // A rank has few sends in flight at once, so it allocates about that many buffers,
    // however many frames it sends.
    let lines = run(4, &["validate"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 2, 3]);
    for line in &lines {
        let stat = |name: &str| line["stats"][name].as_u64().unwrap();
        let (sent, buffers) = (stat("frames_sent"), stat("send_buffers"));
        assert!(buffers >= 1 && buffers * 4 <= sent, "{line}");
    }
}

#[test]
fn send_parts_sends_every_payload_in_place() {
    // Rank 0 sends 8 frames of a 64 KiB payload slice to each of 3 ranks with
    // `send_parts`, then the same frames copied; every receiver checks every byte and
    // the order. Every `send_parts` payload byte went from the shared buffer itself.
    let lines = run(4, &["send-parts", "--frames", "8"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 2, 3]);
    for line in &lines {
        let stat = |name: &str| line["stats"][name].as_u64().unwrap();
        assert_eq!(line["copies_payload"], false, "{line}");
        assert_eq!(stat("payload_bytes_copied"), 0, "{line}");
        if line["rank"] == 0 {
            assert_eq!(stat("payload_bytes_in_place"), 3 * 8 * 65536, "{line}");
            assert_eq!(stat("frames_sent"), 2 * 3 * 8, "{line}");
            assert_eq!(stat("frames_received"), 3, "{line}");
        } else {
            assert_eq!(line["checked"], 16, "{line}");
            assert_eq!(stat("frames_received"), 16, "{line}");
        }
    }
}

#[test]
fn a_message_longer_than_any_frame_is_discarded_and_the_ring_goes_on() {
    // Rank 0 first sends each rank a message one byte past `frame_capacity`: the
    // posted receive truncates it (MPI_ERR_TRUNCATE), the transport reports it as
    // oversized and re-posts the slot, and the frames behind it arrive intact.
    let lines = run(3, &["send-parts", "--frames", "20", "--oversized"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 2]);
    for line in &lines[1..] {
        assert_eq!(line["oversized_discarded"], 1, "{line}");
        assert_eq!(line["checked"], 40, "{line}");
        assert_eq!(line["stats"]["frames_received"], 40, "{line}");
    }
}

#[test]
fn send_parts_copies_only_payloads_shorter_than_a_datatype_is_worth() {
    let lines = run(
        2,
        &["send-parts", "--frames", "4", "--payload-bytes", "100"],
    );
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1]);
    let stat = |name: &str| lines[0]["stats"][name].as_u64().unwrap();
    assert_eq!(stat("payload_bytes_copied"), 4 * 100, "{}", lines[0]);
    assert_eq!(stat("payload_bytes_in_place"), 0, "{}", lines[0]);
    assert_eq!(lines[1]["checked"], 8, "{}", lines[1]);
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn sends_to_a_killed_rank_are_dropped_and_the_sender_goes_on() {
    // Rank 2 dies at the start; rank 0 sends it 16 frames of 64 KiB (rendezvous
    // sends, which Open MPI cannot complete: its error handler frees them unreported,
    // see `MpiTransport::progress`). They are dropped and counted, rank 0 completes
    // every send and hears from rank 1, and rank 1 checks all its frames. Rank 2 may
    // take in a few before it dies, at most its RECV_SLOTS posted receives.
    let lines = run(3, &["send-parts", "--frames", "8", "--kill", "2"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1]);
    let stat = |name: &str| lines[0]["stats"][name].as_u64().unwrap();
    let at_least = 16 - backend_mpi::transport::RECV_SLOTS as u64;
    assert!(
        (at_least..=16).contains(&stat("dropped_to_failed")),
        "{}",
        lines[0]
    );
    assert_eq!(stat("frames_received"), 1, "{}", lines[0]);
    assert_eq!(lines[1]["checked"], 16, "{}", lines[1]);
}

#[test]
fn a_multi_chunk_broadcast_sends_and_receives_its_payload_bytes_in_place() {
    // plans/mpi-8.json: A 1 MiB to 7 ranks, B 200,000 bytes to 3, C 65,537 to 4, in
    // chunks of DEFAULT_CHUNK_BYTES to relays and whole to leaves (the transport's
    // `chunk_bytes` and `leaf_chunk_bytes`). Failure-free, every delivered payload byte is sent once by
    // some rank's `send_parts`: in place, except chunks shorter than COPY_BELOW (at
    // most the short tails of the outputs chunked for relays).
    let lines = run(8, &["broadcast", "plans/mpi-8.json"]);
    assert_eq!(ft_jobs::report::ranks(&lines).len(), 8);
    let chunk = backend_mpi::transport::DEFAULT_CHUNK_BYTES as u64;
    let small = backend_mpi::transport::COPY_BELOW as u64;
    let outputs: [(u64, u64); 3] = [(1_048_576, 7), (200_000, 3), (65_537, 4)];
    let total: u64 = outputs.iter().map(|(bytes, dests)| bytes * dests).sum();
    let copied: u64 = outputs
        .iter()
        .map(|(bytes, dests)| match bytes % chunk {
            tail if tail > 0 && tail < small => tail * dests,
            _ => 0,
        })
        .sum();
    let sum = |name: &str| -> u64 {
        lines
            .iter()
            .map(|l| l["stats"][name].as_u64().unwrap())
            .sum()
    };
    let (in_place, short) = (sum("payload_bytes_in_place"), sum("payload_bytes_copied"));
    assert!(short <= copied, "{lines:#?}");
    assert_eq!(in_place + short, total, "{lines:#?}");
    // Receiving: every chunk of an output that comes in several chunks (A and B to the
    // relays) is received straight into the output's one buffer, so no output is
    // joined by a copy, and the transport and the broadcaster agree on the bytes.
    assert_eq!(sum("bcast_bytes_joined"), 0, "{lines:#?}");
    let landed = sum("bcast_bytes_landed");
    assert!(
        landed >= 1_048_576,
        "A reached at least one relay in chunks: {lines:#?}"
    );
    assert_eq!(landed, sum("payload_bytes_placed"), "{lines:#?}");
    assert_eq!(sum("placed_mismatched"), 0, "{lines:#?}");
    // The root's activation of each of its children (three in the tree of class
    // {1, 3, 5, 7}, two in that of {2, 4, 6}) rode in front of the first data pushed
    // to it, one message instead of two (a relay activates its children before
    // its data arrives, so its activations go alone), and every such message was
    // taken apart into its two frames.
    let root = lines
        .iter()
        .find(|l| l["rank"] == 0)
        .expect("rank 0's line");
    assert_eq!(root["stats"]["frames_joined"], 5, "{root:#?}");
    assert_eq!(sum("frames_joined"), sum("joined_received"), "{lines:#?}");
    // A relay holds none of B or C (one chunk each) when it activates its children:
    // it sends each child's head right behind its activation, and the payload, under
    // the head's own tag, when it holds it. Every such head arrived before its payload
    // (the receive was posted early), none was withdrawn, and the root, which holds
    // its data, promised nothing.
    assert_eq!(root["stats"]["heads_sent_early"], 0, "{root:#?}");
    let early = sum("heads_sent_early");
    assert!(early > 0, "no relay sent a head ahead: {lines:#?}");
    assert_eq!(early, sum("heads_received_early"), "{lines:#?}");
    assert_eq!(sum("withdrawn"), 0, "{lines:#?}");
}

#[test]
fn latency_job_reports_its_ratios() {
    check(&conformance::LATENCY_SMOKE);
}

#[test]
fn bench_bcast_times_the_stack_beside_mpi_bcast_and_the_activation_floor() {
    // A smoke run (the figures come from longer runs, see the README).
    let lines = run(3, conformance::BENCH_BCAST_SMOKE.args);
    check_lines(&conformance::BENCH_BCAST_SMOKE, &lines);
    for line in lines.iter().filter(|l| l.get("bytes").is_some()) {
        assert!(line["ratio_to_mpi_bcast"].as_f64().unwrap() > 0.0, "{line}");
        // The activation floor is timed beside them, its bytes checked as theirs.
        assert!(
            line["median_us"]["activation_floor"].as_f64().unwrap() > 0.0,
            "{line}"
        );
        assert!(
            line["activation_floor_ratio_to_mpi_bcast"]
                .as_f64()
                .unwrap()
                > 0.0,
            "{line}"
        );
    }
}

#[test]
fn bench_bcast_writes_every_ranks_timeline() {
    // `--timeline DIR`: each rank writes when each step of each repetition happened.
    // A 64 KiB payload goes as its own message, so at every destination the stack's
    // repetitions show the activation handed to the machine and handled, then the
    // payload's receive posted and seen landed; the floor marks the same steps.
    let dir = std::env::temp_dir().join(format!("ftmpi-timeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let reps = 3;
    let args = [
        "bench-bcast",
        "--sizes",
        "65536",
        "--outputs",
        "1",
        "--reps",
        "3",
        "--timeline",
        dir.to_str().unwrap(),
    ];
    let lines = run(4, &args);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 2, 3]);
    for rank in 0..4 {
        let path = dir.join(format!("rank-{rank}.tsv"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert_eq!(text.lines().last(), Some("# dropped 0"), "{path:?}");
        let marks: Vec<(&str, &str)> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let fields: Vec<&str> = l.split('\t').collect();
                assert!(fields[0].parse::<u64>().is_ok(), "{path:?}: {l}");
                (fields[1], fields[2])
            })
            .collect();
        for phase in ["stack", "mpi_bcast", "activation_floor"] {
            for mark in ["rep_start", "rep_done"] {
                let count = marks.iter().filter(|&&m| m == (mark, phase)).count();
                assert_eq!(count, reps, "rank {rank}: {mark} {phase}");
            }
        }
        if rank == 0 {
            continue;
        }
        for phase in ["stack", "activation_floor"] {
            let mut inside = None;
            for &(mark, arg) in &marks {
                match (mark, &mut inside) {
                    ("rep_start", _) => inside = (arg == phase).then(Vec::new),
                    ("rep_done", Some(steps)) => {
                        let order = [
                            "frame_received",
                            "frame_handled",
                            "payload_posted",
                            "payload_landed",
                        ];
                        let mut at = steps.iter();
                        for step in order {
                            assert!(
                                at.any(|&s| s == step),
                                "rank {rank}, {phase}: no {step} in order in {steps:?}"
                            );
                        }
                        inside = None;
                    }
                    (_, Some(steps)) => steps.push(mark),
                    _ => {}
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_times_validate_global_beside_ulfm_agree() {
    // A smoke run of the benchmark (the figures come from longer runs, see the README).
    let lines = run(3, &["bench", "--reps", "5"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 2]);
    for line in &lines {
        for op in ["barrier", "validate_global"] {
            let median = line["median_us"][op].as_f64().unwrap();
            assert!(median > 0.0 && median.is_finite(), "{op}: {line}");
        }
        assert!(
            line["ratio_to_barrier"]["validate_global"]
                .as_f64()
                .unwrap()
                > 0.0
        );
        if backend_mpi::ulfm::AGREE_WORKS {
            let median = line["median_us"]["ulfm_agree"].as_f64().unwrap();
            assert!(median > 0.0 && median.is_finite(), "ulfm_agree: {line}");
            let ratio = &line["ratio_to_ulfm_agree"]["validate_global"];
            assert!(ratio.as_f64().unwrap() > 0.0, "{line}");
        } else {
            assert!(line["median_us"]["ulfm_agree"].is_null(), "{line}");
        }
    }
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn bench_times_the_shrink_beside_ulfm_shrink_after_a_kill() {
    // Rank 2 dies at the start; once both ULFM and the stack know it, MPIX_Comm_shrink
    // and validate_global + Survivors are timed side by side (a smoke run).
    let lines = run(4, &["bench", "--reps", "5", "--kill", "2"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 3]);
    for line in &lines {
        assert_eq!(line["survivors"], 3, "{line}");
        assert_eq!(line["live_size"], 3, "{line}");
        for op in ["ulfm_shrink", "validate_global_and_renumber"] {
            let median = line["median_us"][op].as_f64().unwrap();
            assert!(median > 0.0 && median.is_finite(), "{op}: {line}");
        }
    }
}

/// Runs a job that must refuse its input. `mpiexec` itself can run on after every rank
/// has refused: a job whose ranks have all ended but whose launcher hangs is run once
/// more, and said so on stderr; a rank still running fails the test.
fn refusing_run(args: &[&OsStr]) -> (Output, Duration) {
    match mpiexec_within(args, REFUSAL_LIMIT) {
        Ok(run) => run,
        Err(hung) if !hung.ranks_running() => {
            eprintln!(
                "the launcher hung after every rank had ended; running once more:\n{}",
                hung.describe(args, REFUSAL_LIMIT)
            );
            mpiexec_within(args, REFUSAL_LIMIT)
                .unwrap_or_else(|hung| panic!("{}", hung.describe(args, REFUSAL_LIMIT)))
        }
        Err(hung) => panic!("{}", hung.describe(args, REFUSAL_LIMIT)),
    }
}

/// The job failed promptly with `message` said once (`conformance::refused`).
fn refused(args: &[&str], (out, took): &(Output, Duration), message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    conformance::refused(out.status.success(), &stderr, *took, message)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

#[test]
fn bad_input_ends_the_job_before_any_rank_connects() {
    let bench: &[(u32, &[&str], &str)] = &[
        (
            4,
            &["bench", "--kill", "2", "--kill-on", "activation"],
            "bench: --kill-on does not apply",
        ),
        (
            4,
            &["bench", "--kill", "1,2"],
            "bench: --kill takes one rank",
        ),
        (4, &["bench", "--reps", "0"], "0 is not in 1.."),
        (
            3,
            &["send-parts", "--kill", "0"],
            "send-parts: --kill 0: not rank 0",
        ),
    ];
    let common = conformance::BAD_INPUTS
        .iter()
        .map(|bad| (bad.ranks, bad.args, bad.message));
    for (ranks, args, message) in common.chain(bench.iter().copied()) {
        let n = ranks.to_string();
        let run = refusing_run(&context(&n, args));
        refused(args, &run, message);
        assert_eq!(
            run.0.status.code(),
            Some(2),
            "{args:?}: bad input exits with 2"
        );
    }
}

#[test]
#[cfg_attr(mpi_family = "mpich", ignore = "on MPICH a killed rank ends the job")]
fn a_rank_that_fails_after_the_start_ends_the_job() {
    // Rank 3 alone gives up (its step limit, 1 s, is shorter than the 3 s the detector
    // takes to see rank 1's death). It says why, once, and leaves as a crashed rank
    // would (SIGKILL); the others see it fail and finish without it. mpiexec's status
    // is not the signal here (0 after any failure ULFM survives): the survivors are.
    // Both survivors must print even when one finishes long before the other: a
    // non-zero exit in its place would let PRRTE kill the slower survivor.
    let kill = ["validate", "--kill", "1", "--timeout-ms", "3000"];
    let mut args = context("3", &kill);
    let impatient: Vec<&str> = kill.iter().copied().chain(["--limit-s", "1"]).collect();
    args.push(":".as_ref());
    args.extend(context("1", &impatient));
    let (out, took) = mpiexec_run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("ftmpi: rank 3: timed out").count(),
        1,
        "{stderr}"
    );
    assert!(took < conformance::PROMPTLY, "took {took:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = ft_jobs::report::parse_lines(&stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 2], "{stdout}");
    for line in &lines {
        let last = &line["validations"].as_array().unwrap().last().unwrap()["G"];
        assert_eq!(last, &serde_json::json!([1, 3]), "{line}");
    }
}

#[test]
#[cfg_attr(
    mpi_family = "mpich",
    ignore = "on MPICH a rank that leaves ends the job"
)]
fn a_rank_stalled_past_the_timeout_leaves_and_the_survivors_agree_on_it() {
    // Rank 2 stops its own process for 3 s (the timeout is 1 s): it is declared, leaves
    // by SIGKILL once it runs again, and the job goes on without it.
    let lines = run(4, &["validate", "--stall", "2", "--stall-ms", "3000"]);
    assert_eq!(ft_jobs::report::ranks(&lines), [0, 1, 3], "{lines:#?}");
    for line in &lines {
        let last = line["validations"]
            .as_array()
            .and_then(|v| v.last())
            .cloned();
        assert_eq!(
            last.map(|v| v["G"].clone()),
            Some(serde_json::json!([2])),
            "{line}"
        );
    }
}
