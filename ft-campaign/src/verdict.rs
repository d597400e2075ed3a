//! Judging one run from what it left: whether it ended in time, its exit status, the
//! survivors' JSON lines (read and checked with `ft_jobs::report`) and their standard
//! error; a task-graph run from `fttask`'s JSON line, against the checksum of the same
//! workload run failure-free in the simulator.

use std::collections::BTreeSet;
use std::fmt;

use ft_core::Rank;
use ft_jobs::report;
use serde_json::{json, Value};

use crate::generate::{Job, JobKind, Plan, TaskRun};

/// What a run came to, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// The job ran past its timeout (its process group was killed), or a rank gave up
    /// waiting for a step (`--limit-s`).
    Hang,
    /// The survivors' agreed sets `G` differ, or the last one is not the killed set (in
    /// a stall run: the stalled set after a long stall, none after a short one).
    Disagreement,
    /// A surviving destination did not get an output it needs, or got it corrupted, or
    /// gave the broadcast up.
    LostOutputs,
    /// Anything else: the launcher failed (named when it is PRRTE's abort on `SIGPIPE`),
    /// a survivor stopped with an error (a false suspicion, ...), a killed rank lived
    /// on, a line was unreadable.
    Other,
    /// A task-graph run in which a rank that was not killed died too, and `fttask`'s
    /// watchdog said why: its progress thread made no turn (a known libfabric progress
    /// stall). Reported on its own, and a failure.
    Stall,
    /// Every check passed.
    Ok,
}

impl Class {
    /// The name used in the summary and the logs.
    pub fn name(self) -> &'static str {
        match self {
            Class::Hang => "hang",
            Class::Disagreement => "disagreement",
            Class::LostOutputs => "lost-outputs",
            Class::Other => "other",
            Class::Stall => "progress-stall",
            Class::Ok => "ok",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A run's class and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What the run came to.
    pub class: Class,
    /// What was wrong (empty when ok).
    pub detail: String,
}

impl Verdict {
    /// A verdict of `class` because of `detail`.
    pub fn new(class: Class, detail: impl Into<String>) -> Self {
        Verdict {
            class,
            detail: detail.into(),
        }
    }
}

/// What a finished (or killed) job left behind.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Whether the campaign killed it at its timeout.
    pub timed_out: bool,
    /// Whether it exited with status 0.
    pub success: bool,
    /// How it ended, for the detail (`exit status: 1`, `signal 9`, ...).
    pub status: String,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// What PRRTE's launcher (`prterun`, under Open MPI 5's `mpiexec`) prints when it ends
/// the job at its eleventh `SIGPIPE`, killing the ranks still running
/// (`ft_jobs::mpiexec::BLOCK_SIGPIPE` says where they come from, and starts `mpiexec` so
/// that none is delivered).
pub const PRRTE_SIGPIPE_ABORT: &str = "SIGPIPE detected - aborting";

/// The launcher's own failure that `stderr` shows, by name, if any.
fn launcher_failure(stderr: &str) -> Option<&'static str> {
    stderr
        .contains(PRRTE_SIGPIPE_ABORT)
        .then_some("PRRTE aborted on SIGPIPE")
}

/// Why the launcher failed, for a verdict's detail: its own failure by name
/// ([`launcher_failure`]), else its exit status and the first error lines.
fn launcher_failed(outcome: &Outcome) -> String {
    match launcher_failure(&outcome.stderr) {
        Some(failure) => format!("the launcher failed: {failure} ({})", outcome.status),
        None => format!(
            "the launcher failed ({}): {}",
            outcome.status,
            errors(&outcome.stderr)
        ),
    }
}

/// The first lines of `stderr` that say something went wrong (each once: every rank
/// may print the same).
fn errors(stderr: &str) -> String {
    let mut lines: Vec<&str> = Vec::new();
    let wrong = stderr.lines().filter(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("error")
            || l.contains("prterun:")
            || l.contains("ftofi:")
            || l.contains("ftmpi:")
            || l.contains("fttask:")
            || l.contains("ftrun:")
    });
    for line in wrong {
        if lines.len() == 4 {
            break;
        }
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    if lines.is_empty() {
        stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
    } else {
        lines.join(" | ")
    }
}

/// The ranks the survivors of `job` must end up agreeing are dead, which print no
/// line, and how to name that set in a verdict: the killed ranks; after a long stall
/// the stalled ones, after a short stall none.
fn declared(job: &Job) -> (Vec<Rank>, String) {
    match job.stall() {
        None => (
            job.killed().to_vec(),
            format!("the killed set {:?}", job.killed()),
        ),
        Some(stall) if stall.long => (
            job.victims.clone(),
            format!(
                "the stalled set {:?} (stalled {} ms, past the timeout)",
                job.victims, stall.ms
            ),
        ),
        Some(stall) => (
            Vec::new(),
            format!(
                "[] ({:?} stalled {} ms, within the timeout)",
                job.victims, stall.ms
            ),
        ),
    }
}

/// Classifies a run of `job`.
pub fn judge(job: &Job, outcome: &Outcome) -> Verdict {
    if outcome.timed_out {
        return Verdict::new(Class::Hang, "ran past the job timeout and was killed");
    }
    // The driver's "timed out after ... waiting for ...", the threaded jobs' "timed out
    // waiting to learn ...", the ftofi launcher's "ran past".
    if outcome.stderr.contains("timed out") || outcome.stderr.contains("ran past") {
        return Verdict::new(
            Class::Hang,
            format!("a rank gave up waiting: {}", errors(&outcome.stderr)),
        );
    }
    let lines = match report::parse_lines(&outcome.stdout) {
        Ok(lines) => lines,
        Err(e) => return Verdict::new(Class::Other, format!("unreadable output: {e}")),
    };
    let (gone, what) = declared(job);
    let expected: Vec<u64> = (0..job.ranks)
        .filter(|r| !gone.contains(r))
        .map(u64::from)
        .collect();
    let got = report::ranks(&lines);
    if let Some(r) = got.iter().find(|&&r| gone.contains(&(r as Rank))) {
        return match job.stall() {
            Some(stall) => Verdict::new(
                Class::Disagreement,
                format!(
                    "rank {r} was stalled {} ms, past the timeout, but printed a line: \
                     it was not declared",
                    stall.ms
                ),
            ),
            None => Verdict::new(
                Class::Other,
                format!("rank {r} was to die but printed a line"),
            ),
        };
    }
    let checked = match &job.kind {
        JobKind::Validate => check_validate(&lines, &gone, &what),
        JobKind::Broadcast(plan) => check_broadcast(plan, &lines, job.killed()),
        JobKind::Taskgraph(_) => Err(Verdict::new(
            Class::Other,
            "a task-graph run is judged against its failure-free checksum (judge_taskgraph)",
        )),
    };
    if let Err(mut verdict) = checked {
        // A survivor missing is often the cause (it stopped, the others declared it).
        if got != expected {
            verdict.detail += &format!(
                "; survivors {got:?}, expected {expected:?} ({}; {})",
                outcome.status,
                errors(&outcome.stderr)
            );
        }
        return verdict;
    }
    if got != expected {
        // The launcher's own failure killed the survivors still running: name it.
        if launcher_failure(&outcome.stderr).is_some() {
            return Verdict::new(
                Class::Other,
                format!(
                    "{}; {} of {} survivors printed their line",
                    launcher_failed(outcome),
                    got.len(),
                    expected.len()
                ),
            );
        }
        return Verdict::new(
            Class::Other,
            format!(
                "survivors {got:?}, expected {expected:?} ({}; {})",
                outcome.status,
                errors(&outcome.stderr)
            ),
        );
    }
    if !outcome.success {
        return Verdict::new(Class::Other, launcher_failed(outcome));
    }
    Verdict::new(Class::Ok, "")
}

/// The last line of `stdout` that is a JSON value `wanted` accepts (`fttask` prints its
/// report last, after the workload's own lines).
pub(crate) fn last_json(stdout: &str, wanted: impl Fn(&Value) -> bool) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(wanted)
}

/// The line `fttask`'s watchdog prints when a rank's progress thread stalled.
pub const WATCHDOG: &str = "made no turn";

/// Classifies a task-graph run of `job` (`task` is its `fttask` job), whose workload
/// gives the checksum `reference` when run failure-free: the last JSON line of
/// `"app":"taskgraph"` must hold that checksum, `dead` exactly the killed set and
/// `ok: true`, and the launcher must exit 0.
pub fn judge_taskgraph(job: &Job, task: &TaskRun, reference: &str, outcome: &Outcome) -> Verdict {
    if outcome.timed_out {
        return Verdict::new(Class::Hang, "ran past the job timeout and was killed");
    }
    if outcome.stderr.contains("ran past") {
        return Verdict::new(
            Class::Hang,
            format!(
                "the launcher's job limit fired: {}",
                errors(&outcome.stderr)
            ),
        );
    }
    let failed = || format!("{}; {}", outcome.status, errors(&outcome.stderr));
    let Some(line) = last_json(&outcome.stdout, |v| v["app"] == "taskgraph") else {
        if launcher_failure(&outcome.stderr).is_some() {
            return Verdict::new(
                Class::Other,
                format!("{}; no fttask report line", launcher_failed(outcome)),
            );
        }
        return Verdict::new(
            Class::Other,
            format!("no fttask report line ({})", failed()),
        );
    };
    if line["checksum"] != reference {
        return Verdict::new(
            Class::LostOutputs,
            format!(
                "checksum {} but {reference} failure-free ({})",
                line["checksum"],
                task.workload.key()
            ),
        );
    }
    let dead = rank_set(job.killed());
    let Some(agreed) = report::rank_set(&line["dead"]) else {
        return Verdict::new(Class::Other, format!("unreadable dead {}", line["dead"]));
    };
    if agreed != dead {
        if agreed.is_superset(&dead) && outcome.stderr.contains(WATCHDOG) {
            let watchdog: Vec<&str> = outcome
                .stderr
                .lines()
                .filter(|l| l.contains(WATCHDOG))
                .take(2)
                .collect();
            return Verdict::new(
                Class::Stall,
                format!(
                    "dead {} but killed {:?}: {}",
                    line["dead"],
                    job.killed(),
                    watchdog.join(" | ")
                ),
            );
        }
        return Verdict::new(
            Class::Disagreement,
            format!(
                "dead {} but killed {:?} ({})",
                line["dead"],
                job.killed(),
                failed()
            ),
        );
    }
    if line["ok"] != true {
        return Verdict::new(Class::Other, format!("not ok: {line}"));
    }
    if !outcome.success {
        return Verdict::new(Class::Other, launcher_failed(outcome));
    }
    Verdict::new(Class::Ok, "")
}

/// Ranks as a set, to compare with `report::rank_set` of a `G` or an `L` (compared as
/// sets: the jobs do not promise an order).
fn rank_set(ranks: &[Rank]) -> BTreeSet<u64> {
    ranks.iter().map(|&r| u64::from(r)).collect()
}

/// Whether the JSON array `set` is a set of ranks within `of`.
fn within(set: &Value, of: &BTreeSet<u64>) -> bool {
    report::rank_set(set).is_some_and(|s| s.is_subset(of))
}

/// Whether the JSON array `set` is exactly the set `of`.
fn same(set: &Value, of: &BTreeSet<u64>) -> bool {
    report::rank_set(set).as_ref() == Some(of)
}

/// A validate job: every validation agreed identically everywhere
/// (`report::agreed`), every `G` within `dead` (the set [`declared`] gives, named
/// `what`), the last exactly it, and each survivor's `L` equal to it.
fn check_validate(lines: &[Value], dead: &[Rank], what: &str) -> Result<(), Verdict> {
    if lines.is_empty() {
        return Ok(());
    }
    let dead = rank_set(dead);
    let gs = report::agreed(lines).map_err(|e| Verdict::new(Class::Disagreement, e))?;
    if let Some(g) = gs.iter().find(|g| !within(g, &dead)) {
        return Err(Verdict::new(
            Class::Disagreement,
            format!("G {g} holds a rank outside {what}"),
        ));
    }
    if !gs.last().is_some_and(|g| same(g, &dead)) {
        return Err(Verdict::new(
            Class::Disagreement,
            format!(
                "the last G is {}, not {what}",
                gs.last().map_or_else(|| "missing".into(), Value::to_string)
            ),
        ));
    }
    if let Some(line) = lines.iter().find(|l| !same(&l["L"], &dead)) {
        return Err(Verdict::new(
            Class::Other,
            format!(
                "rank {}'s L is {} after agreeing on {what} (a late suspicion)",
                line["rank"], line["L"]
            ),
        ));
    }
    Ok(())
}

/// A broadcast job: the closing validation's `G` identical at every survivor and
/// exactly the killed set (every survivor waits to know each killed rank dead before
/// it); every survivor needs what the plan says and got it intact (`report::served`).
fn check_broadcast(plan: &Plan, lines: &[Value], killed: &[Rank]) -> Result<(), Verdict> {
    let dead = rank_set(killed);
    if let Some(first) = lines.first() {
        let g = &first["G"];
        if let Some(other) = lines
            .iter()
            .find(|l| report::rank_set(&l["G"]) != report::rank_set(g))
        {
            return Err(Verdict::new(
                Class::Disagreement,
                format!(
                    "rank {} agreed on G {} but rank {} on {}",
                    first["rank"], g, other["rank"], other["G"]
                ),
            ));
        }
        if !same(g, &dead) {
            return Err(Verdict::new(
                Class::Disagreement,
                format!("the survivors agreed on G {g}, the killed set is {killed:?}"),
            ));
        }
    }
    for line in lines {
        let rank = line["rank"].as_u64().unwrap_or(u64::MAX) as Rank;
        if line["needs"] != json!(plan.needs(rank)) {
            return Err(Verdict::new(
                Class::Other,
                format!(
                    "rank {rank} needs {} but the plan says {:?}",
                    line["needs"],
                    plan.needs(rank)
                ),
            ));
        }
    }
    report::served(lines).map_err(|e| Verdict::new(Class::LostOutputs, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Fault, KillFlag, Moment, Output, Stall, Workload};

    fn validate_job(kills: Vec<Rank>) -> Job {
        Job {
            run: 0,
            ranks: 4,
            kind: JobKind::Validate,
            threaded: false,
            victims: kills,
            block: false,
            fault: Fault::Kill(Moment::AtMs(3)),
        }
    }

    fn outcome(stdout: &str) -> Outcome {
        Outcome {
            timed_out: false,
            success: true,
            status: "exit status: 0".into(),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    fn validation_line(rank: u32, gs: &[Value]) -> String {
        let v: Vec<Value> = gs
            .iter()
            .enumerate()
            .map(|(e, g)| json!({"epoch": e + 1, "G": g}))
            .collect();
        json!({"rank": rank, "validations": v, "L": gs.last()}).to_string()
    }

    #[test]
    fn validate_runs_are_judged() {
        let job = validate_job(vec![1, 2]);
        let good = [0, 3]
            .map(|r| validation_line(r, &[json!([]), json!([1, 2])]))
            .join("\n");
        assert_eq!(judge(&job, &outcome(&good)).class, Class::Ok);

        let split = [
            validation_line(0, &[json!([]), json!([1, 2])]),
            validation_line(3, &[json!([1]), json!([1, 2])]),
        ]
        .join("\n");
        assert_eq!(judge(&job, &outcome(&split)).class, Class::Disagreement);

        let unordered = [0, 3]
            .map(|r| validation_line(r, &[json!([]), json!([2, 1])]))
            .join("\n");
        assert_eq!(judge(&job, &outcome(&unordered)).class, Class::Ok);

        let short = [0, 3]
            .map(|r| validation_line(r, &[json!([]), json!([1])]))
            .join("\n");
        assert_eq!(judge(&job, &outcome(&short)).class, Class::Disagreement);

        let missing = validation_line(0, &[json!([]), json!([1, 2])]);
        assert_eq!(judge(&job, &outcome(&missing)).class, Class::Other);

        let mut hung = outcome(&good);
        hung.timed_out = true;
        assert_eq!(judge(&job, &hung).class, Class::Hang);
        let mut gave_up = outcome(&good);
        gave_up.stderr = "ftofi: rank 0: timed out after 60s waiting for x".into();
        assert_eq!(judge(&job, &gave_up).class, Class::Hang);
    }

    fn stall_job(stalled: Vec<Rank>, ms: u64, long: bool) -> Job {
        Job {
            ranks: 5,
            fault: Fault::Stall(Stall { ms, long }),
            block: stalled.len() > 1,
            ..validate_job(stalled)
        }
    }

    #[test]
    fn long_stall_runs_are_judged() {
        // Ranks 2 and 3 stalled past the timeout: the others declared them, they left
        // without a line, and the survivors' last G is exactly them.
        let job = stall_job(vec![2, 3], 4000, true);
        let line = |r, last: Value| validation_line(r, &[json!([]), last]);
        let lines = |ranks: &[u32], last: Value| {
            let lines: Vec<String> = ranks.iter().map(|&r| line(r, last.clone())).collect();
            lines.join("\n")
        };
        let good = lines(&[0, 1, 4], json!([3, 2]));
        assert_eq!(judge(&job, &outcome(&good)), Verdict::new(Class::Ok, ""));

        // Rank 3 was not declared: it printed its line, and G lacks it.
        let verdict = judge(&job, &outcome(&lines(&[0, 1, 3, 4], json!([2]))));
        assert_eq!(verdict.class, Class::Disagreement);
        assert_eq!(
            verdict.detail,
            "rank 3 was stalled 4000 ms, past the timeout, but printed a line: it was \
             not declared"
        );
        // Rank 3 printed nothing, yet nobody declared it.
        let verdict = judge(&job, &outcome(&lines(&[0, 1, 4], json!([2]))));
        assert_eq!(verdict.class, Class::Disagreement);
        assert!(
            verdict.detail.starts_with(
                "the last G is [2], not the stalled set [2, 3] (stalled 4000 ms, past the \
                 timeout)"
            ),
            "{}",
            verdict.detail
        );
        // A live rank was declared too.
        let extra = lines(&[0, 4], json!([1, 2, 3]));
        assert_eq!(judge(&job, &outcome(&extra)).class, Class::Disagreement);
        // The survivors disagree.
        let split = [
            line(0, json!([2, 3])),
            line(1, json!([2])),
            line(4, json!([2, 3])),
        ]
        .join("\n");
        assert_eq!(judge(&job, &outcome(&split)).class, Class::Disagreement);

        // A survivor printed no line; the launcher failed; the job ran past its time.
        let missing = lines(&[0, 4], json!([2, 3]));
        assert_eq!(judge(&job, &outcome(&missing)).class, Class::Other);
        let failed = Outcome {
            success: false,
            status: "exit status 1".into(),
            ..outcome(&good)
        };
        assert_eq!(judge(&job, &failed).class, Class::Other);
        let hung = Outcome {
            timed_out: true,
            ..outcome(&good)
        };
        assert_eq!(judge(&job, &hung).class, Class::Hang);
    }

    #[test]
    fn short_stall_runs_are_judged() {
        // Rank 1 stalled well within the timeout: nobody may be declared, every rank
        // prints its line, every G is empty.
        let job = stall_job(vec![1], 300, false);
        let lines = |ranks: &[u32], last: Value| {
            let lines: Vec<String> = ranks
                .iter()
                .map(|&r| validation_line(r, &[json!([]), last.clone()]))
                .collect();
            lines.join("\n")
        };
        let good = lines(&[0, 1, 2, 3, 4], json!([]));
        assert_eq!(judge(&job, &outcome(&good)), Verdict::new(Class::Ok, ""));

        // Rank 1 was declared all the same (and left, as a declared rank does).
        let verdict = judge(&job, &outcome(&lines(&[0, 2, 3, 4], json!([1]))));
        assert_eq!(verdict.class, Class::Disagreement);
        assert!(
            verdict
                .detail
                .starts_with("G [1] holds a rank outside [] ([1] stalled 300 ms, within"),
            "{}",
            verdict.detail
        );
        // Rank 1 printed no line though nobody declared it.
        let missing = lines(&[0, 2, 3, 4], json!([]));
        assert_eq!(judge(&job, &outcome(&missing)).class, Class::Other);
        // A rank suspects rank 1 after the last validation.
        let late = [0, 1, 2, 3, 4]
            .map(|r| {
                let mut line: Value =
                    serde_json::from_str(&validation_line(r, &[json!([]), json!([])])).unwrap();
                if r == 3 {
                    line["L"] = json!([1]);
                }
                line.to_string()
            })
            .join("\n");
        assert_eq!(judge(&job, &outcome(&late)).class, Class::Other);
    }

    #[test]
    fn prrte_sigpipe_abort_is_a_named_launcher_failure() {
        let job = validate_job(vec![1]);
        let line = |r| validation_line(r, &[json!([]), json!([1])]);
        let aborted = |stdout: &str, stderr: &str| Outcome {
            success: false,
            status: "exit status 1".into(),
            stderr: stderr.into(),
            ..outcome(stdout)
        };
        let prrte = "[vm:03200] pmix_ptl_base: send_msg: write failed: Broken pipe (32) \
                     [sd = 98]\n[vm:03200] prterun: SIGPIPE detected - aborting\n";

        // PRRTE killed survivors 2 and 3 before their lines were out.
        let verdict = judge(&job, &aborted(&line(0), prrte));
        assert_eq!(verdict.class, Class::Other);
        assert_eq!(
            verdict.detail,
            "the launcher failed: PRRTE aborted on SIGPIPE (exit status 1); \
             1 of 3 survivors printed their line"
        );
        // Every line was out before the abort: still PRRTE's abort, by name.
        let all = [0, 2, 3].map(line).join("\n");
        let verdict = judge(&job, &aborted(&all, prrte));
        assert_eq!(
            verdict.detail,
            "the launcher failed: PRRTE aborted on SIGPIPE (exit status 1)"
        );
        // Any other launcher failure stays unnamed.
        let verdict = judge(&job, &aborted(&all, "prterun: an error occurred\n"));
        assert_eq!(verdict.class, Class::Other);
        assert_eq!(
            verdict.detail,
            "the launcher failed (exit status 1): prterun: an error occurred"
        );
        // A disagreement among the lines that were out is still a disagreement.
        let split = [
            validation_line(0, &[json!([]), json!([1])]),
            validation_line(2, &[json!([1]), json!([1])]),
        ]
        .join("\n");
        assert_eq!(
            judge(&job, &aborted(&split, prrte)).class,
            Class::Disagreement
        );
    }

    #[test]
    fn broadcast_runs_are_judged() {
        let plan = Plan {
            ranks: 3,
            root: 0,
            topology: "binomial".into(),
            strategy: "per-class".into(),
            outputs: vec![Output {
                name: "A".into(),
                bytes: 10,
                dests: vec![1, 2],
            }],
        };
        let job = Job {
            kind: JobKind::Broadcast(plan),
            ranks: 3,
            victims: vec![2],
            fault: Fault::Kill(Moment::OnActivation),
            ..validate_job(vec![])
        };
        let line = |rank: u32, needs: Value, received: Value, g: Value| {
            json!({"rank": rank, "needs": needs, "received": received, "verified": true,
                   "abandoned": false, "G": g})
            .to_string()
        };
        let good = [
            line(0, json!([]), json!([]), json!([2])),
            line(1, json!(["A"]), json!(["A"]), json!([2])),
        ]
        .join("\n");
        assert_eq!(judge(&job, &outcome(&good)).class, Class::Ok);
        let lost = [
            line(0, json!([]), json!([]), json!([2])),
            line(1, json!(["A"]), json!([]), json!([2])),
        ]
        .join("\n");
        assert_eq!(judge(&job, &outcome(&lost)).class, Class::LostOutputs);
        let no_g = [
            line(0, json!([]), json!([]), json!([])),
            line(1, json!(["A"]), json!(["A"]), json!([])),
        ]
        .join("\n");
        assert_eq!(judge(&job, &outcome(&no_g)).class, Class::Disagreement);
    }

    #[test]
    fn taskgraph_runs_are_judged() {
        let task = TaskRun {
            workload: Workload::Random {
                tasks: 30,
                max_bytes: 1024,
                seed: 3,
            },
            strategy: "per-class".into(),
            topology: None,
            flags: vec![KillFlag {
                ranks: vec![1],
                after: 2,
            }],
            owned: vec![8, 7, 8, 7],
        };
        let job = Job {
            kind: JobKind::Taskgraph(task.clone()),
            victims: vec![1],
            fault: Fault::Kill(Moment::AfterTasks),
            ..validate_job(vec![])
        };
        let line = |dead: Value, checksum: &str, ok: bool| {
            format!(
                "some workload line\n{}",
                json!({"app": "taskgraph", "ok": ok, "dead": dead, "checksum": checksum})
            )
        };
        let judged = |o: &Outcome| judge_taskgraph(&job, &task, "abc", o).class;
        assert_eq!(judged(&outcome(&line(json!([1]), "abc", true))), Class::Ok);
        assert_eq!(
            judged(&outcome(&line(json!([1]), "abd", true))),
            Class::LostOutputs
        );
        assert_eq!(
            judged(&outcome(&line(json!([]), "abc", true))),
            Class::Disagreement
        );
        assert_eq!(
            judged(&outcome(&line(json!([1]), "abc", false))),
            Class::Other
        );
        assert_eq!(judged(&outcome("")), Class::Other);
        let mut extra = outcome(&line(json!([1, 3]), "abc", true));
        assert_eq!(judged(&extra), Class::Disagreement);
        extra.stderr = "[rank 3] fttask: rank 3: the progress thread made no turn for 3s".into();
        assert_eq!(judged(&extra), Class::Stall);
        let mut failed = outcome(&line(json!([1]), "abc", true));
        failed.success = false;
        assert_eq!(judged(&failed), Class::Other);
        let mut hung = outcome("");
        hung.timed_out = true;
        assert_eq!(judged(&hung), Class::Hang);
        let mut aborted = outcome("");
        aborted.success = false;
        aborted.stderr = "[vm:1] prterun: SIGPIPE detected - aborting".into();
        let verdict = judge_taskgraph(&job, &task, "abc", &aborted);
        assert_eq!(verdict.class, Class::Other);
        assert!(
            verdict
                .detail
                .starts_with("the launcher failed: PRRTE aborted on SIGPIPE"),
            "{}",
            verdict.detail
        );
    }
}
