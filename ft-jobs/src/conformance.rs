//! The scenarios every real backend's tests run: a job, its size, and what its
//! survivors' lines must show. A backend's test starts the job its own way (`mpiexec`,
//! the `ftofi` launcher), reads the lines with [`crate::report::parse_lines`] and hands
//! them to [`Scenario::check`]; the same faults (a rank killed at a time or at a
//! protocol step, a coordinator killed inside `validate_global`, an inner broadcast
//! rank killed on activation, a "node" of 4 adjacent ranks out of 8 killed at once in
//! each of these ways) are thus checked the same way over every network.
//!
//! Dead ranks are compared as sets: the survivors are exactly the ranks not killed,
//! every agreed `G` is a subset of the killed set, and the last one (taken once every
//! survivor knows every death) is the killed set itself.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::report::{agreed, rank_set, ranks, served};

/// One job and the check of its output.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Ranks to start.
    pub ranks: u32,
    /// The job's command line (a `JobCommand` and its options).
    pub args: &'static [&'static str],
    /// Checks the survivors' lines (sorted by rank); says what is wrong.
    pub check: fn(&[Value]) -> Result<(), String>,
}

impl Scenario {
    /// Checks `lines`, naming the scenario's command line in the error.
    pub fn check(&self, lines: &[Value]) -> Result<(), String> {
        (self.check)(lines).map_err(|e| format!("{:?}: {e}", self.args))
    }
}

/// `Err(what())` unless `holds`.
fn expect(holds: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(what())
    }
}

/// The survivors are exactly `expected`.
fn survivors(lines: &[Value], expected: &[u64]) -> Result<(), String> {
    let got = ranks(lines);
    expect(got == expected, || {
        format!("survivors {got:?}, expected {expected:?}")
    })
}

/// The survivors are exactly the ranks of `0..n` outside `dead`.
fn survivors_of(lines: &[Value], n: u64, dead: &[u64]) -> Result<(), String> {
    let expected: Vec<u64> = (0..n).filter(|r| !dead.contains(r)).collect();
    survivors(lines, &expected)
}

/// `set` (a `G` or an `L`) is the set `dead` (`exactly`) or a subset of it.
fn set_of(set: &Value, dead: &[u64], exactly: bool) -> bool {
    let dead: BTreeSet<u64> = dead.iter().copied().collect();
    rank_set(set).is_some_and(|s| {
        if exactly {
            s == dead
        } else {
            s.is_subset(&dead)
        }
    })
}

/// Every line's `key` is the set `dead`.
fn all_sets(lines: &[Value], key: &str, dead: &[u64]) -> Result<(), String> {
    match lines.iter().find(|l| !set_of(&l[key], dead, true)) {
        Some(line) => Err(format!(
            "rank {}: {key} is {}, expected the set {dead:?}",
            line["rank"], line[key]
        )),
        None => Ok(()),
    }
}

/// Every line's `key` is `value`.
fn all(lines: &[Value], key: &str, value: &Value) -> Result<(), String> {
    match lines.iter().find(|l| &l[key] != value) {
        Some(line) => Err(format!(
            "rank {}: {key} is {}, expected {value}",
            line["rank"], line[key]
        )),
        None => Ok(()),
    }
}

/// Four ranks validate once, nothing fails: `G` and every `L` empty, frames flowed,
/// none rejected.
pub const VALIDATE_WITHOUT_FAILURES: Scenario = Scenario {
    ranks: 4,
    args: &["validate"],
    check: |lines| {
        survivors(lines, &[0, 1, 2, 3])?;
        let gs = agreed(lines)?;
        expect(gs == [json!([])], || format!("G {gs:?}"))?;
        all(lines, "L", &json!([]))?;
        for line in lines {
            let stats = &line["stats"];
            expect(stats["rejected"] == 0, || {
                format!("rejected frames: {line}")
            })?;
            expect(stats["frames_received"].as_u64() > Some(0), || {
                format!("no frame received: {line}")
            })?;
        }
        Ok(())
    },
};

/// Rank 2 of 5 is killed 3 ms after the start; everyone validates, then again once it
/// knows rank 2 dead: the second agreed set is `[2]` everywhere.
pub const VALIDATE_AFTER_A_KILL: Scenario = Scenario {
    ranks: 5,
    args: &["validate", "--kill", "2", "--kill-at-ms", "3"],
    check: validated_after_killing_2,
};

/// [`VALIDATE_AFTER_A_KILL`] through `ft_runtime::Runtime`: the progress thread drives
/// the stack, the main thread blocks in `validate_global` and watches the published
/// view for the death.
pub const VALIDATE_THREADED_AFTER_A_KILL: Scenario = Scenario {
    ranks: 5,
    args: &["validate", "--threaded", "--kill", "2", "--kill-at-ms", "3"],
    check: |lines| {
        validated_after_killing_2(lines)?;
        all(lines, "threaded", &json!(true))
    },
};

fn validated_after_killing_2(lines: &[Value]) -> Result<(), String> {
    validated_after_kills(lines, 5, &[2])
}

/// The validation job of `n` ranks with the ranks `dead` killed at a time: the killed
/// ranks may die before, during or after the first validation, so its `G` is any
/// subset of them; the second one is called once every survivor knows them all dead,
/// so it is the killed set, and so is every `L`.
fn validated_after_kills(lines: &[Value], n: u64, dead: &[u64]) -> Result<(), String> {
    survivors_of(lines, n, dead)?;
    let gs = agreed(lines)?;
    expect(
        gs.len() == 2 && set_of(&gs[0], dead, false) && set_of(&gs[1], dead, true),
        || format!("G {gs:?}, expected a subset of {dead:?}, then {dead:?}"),
    )?;
    all_sets(lines, "L", dead)
}

/// The ranks of the "node" the node scenarios kill: 4 adjacent ranks of 8.
const NODE: [u64; 4] = [4, 5, 6, 7];

/// A "node" of 8 ranks (4, 5, 6, 7) is killed at once, 3 ms after the start: every
/// survivor learns all four deaths (adjacent deaths: the detector must see past the
/// whole block), and the second validation agrees on exactly `[4, 5, 6, 7]`.
pub const VALIDATE_AFTER_A_NODE_IS_KILLED: Scenario = Scenario {
    ranks: 8,
    args: &["validate", "--kill", "4,5,6,7", "--kill-at-ms", "3"],
    check: |lines| validated_after_kills(lines, 8, &NODE),
};

/// The node (4, 5, 6, 7 of 8) dies as the first validation starts, before sending
/// any of it: the survivors can only finish it once they know all four dead, so both
/// agreed sets are exactly the node.
pub const VALIDATE_WHEN_A_NODE_DIES_IN_THE_CALL: Scenario = Scenario {
    ranks: 8,
    args: &["validate", "--kill", "4,5,6,7", "--kill-on", "validate"],
    check: |lines| validated_when_killed_in_the_call(lines, 8, &NODE),
};

/// The validation job of `n` ranks with the ranks `dead` killed as the first
/// validation starts: both agreed sets, and every `L`, are the killed set.
fn validated_when_killed_in_the_call(lines: &[Value], n: u64, dead: &[u64]) -> Result<(), String> {
    survivors_of(lines, n, dead)?;
    let gs = agreed(lines)?;
    expect(
        gs.len() == 2 && gs.iter().all(|g| set_of(g, dead, true)),
        || format!("G {gs:?}, expected {dead:?} twice"),
    )?;
    all_sets(lines, "L", dead)
}

/// Rank 0 of 5 dies as the first validation starts, before sending any of it: the
/// survivors can only finish it by detecting that, so both agreed sets hold it.
pub const VALIDATE_WHEN_THE_COORDINATOR_DIES: Scenario = Scenario {
    ranks: 5,
    args: &["validate", "--kill", "0", "--kill-on", "validate"],
    check: |lines| validated_when_killed_in_the_call(lines, 5, &[0]),
};

/// PaRSEC #624 (A to ranks 1 and 2, B to rank 2), its mirror, and the merged-tree
/// strategy: every rank gets exactly its outputs.
pub const BROADCAST_ISSUE_624: [Scenario; 3] = [
    Scenario {
        ranks: 3,
        args: &["broadcast", "plans/issue624.json"],
        check: served_issue_624,
    },
    Scenario {
        ranks: 3,
        args: &["broadcast", "plans/issue624-mirror.json"],
        check: served_issue_624,
    },
    Scenario {
        ranks: 3,
        args: &["broadcast", "plans/issue624-merged.json"],
        check: served_issue_624,
    },
];

fn served_issue_624(lines: &[Value]) -> Result<(), String> {
    survivors(lines, &[0, 1, 2])?;
    served(lines)?;
    let needs: usize = lines
        .iter()
        .map(|l| l["needs"].as_array().map_or(0, Vec::len))
        .sum();
    expect(needs == 3, || {
        format!("{needs} needs, expected A to two ranks and B to one")
    })
}

/// `plans/mpi-8.json` (per-class binomial trees: 0 -> 1, 3, 7 and 3 -> 5 for {A, C};
/// 0 -> 2, 4 and 4 -> 6 for {A, B}; A is 1 MiB, so data moves in many chunks). Rank 3
/// dies as soon as it is activated, before it forwards anything: rank 5 must be adopted
/// and served by the root, and the closing validation agrees on `[3]`.
pub const BROADCAST_REPAIR: Scenario = Scenario {
    ranks: 8,
    args: &[
        "broadcast",
        "plans/mpi-8.json",
        "--kill",
        "3",
        "--kill-on",
        "activation",
    ],
    check: served_without_3,
};

/// The broadcast through `ft_runtime::Runtime` (`start_broadcast` at the root,
/// `wait_outputs` elsewhere, then `validate_local` and `validate_global`), rank 3
/// killed at the start, before or just after its activation. Rank 5 could only be
/// served once the death was known, so its `validate_local` counts one failure.
pub const BROADCAST_THREADED_REPAIR: Scenario = Scenario {
    ranks: 8,
    args: &[
        "broadcast",
        "plans/mpi-8.json",
        "--threaded",
        "--kill",
        "3",
        "--kill-at-ms",
        "0",
    ],
    check: |lines| {
        served_without_3(lines)?;
        all(lines, "threaded", &json!(true))?;
        let failed = &lines[4]["validate_local"]["num_failed"];
        expect(failed == 1, || {
            format!("rank 5's validate_local counts {failed} failed")
        })
    },
};

/// `plans/mpi-8.json` with the node 4, 5, 6, 7 killed, each as a broadcast activates
/// it: 5 and 7 die at once, 4 dies before it forwards to its child 6, which is
/// re-attached to the root and dies when that activates it. The survivors 1, 2, 3 get
/// every output they need byte for byte, and the closing validation (after every
/// survivor knows the four deaths) agrees on exactly the node.
pub const BROADCAST_WHEN_A_NODE_DIES_ON_ACTIVATION: Scenario = Scenario {
    ranks: 8,
    args: &[
        "broadcast",
        "plans/mpi-8.json",
        "--kill",
        "4,5,6,7",
        "--kill-on",
        "activation",
    ],
    check: |lines| {
        survivors_of(lines, 8, &NODE)?;
        served(lines)?;
        let received: Vec<&Value> = lines.iter().map(|l| &l["received"]).collect();
        let expected = [
            json!([]),
            json!(["A", "C"]),
            json!(["A", "B"]),
            json!(["A", "C"]),
        ];
        expect(received == expected.iter().collect::<Vec<_>>(), || {
            format!("ranks 0..3 received {received:?}, expected {expected:?}")
        })?;
        all_sets(lines, "G", &NODE)
    },
};

fn served_without_3(lines: &[Value]) -> Result<(), String> {
    survivors(lines, &[0, 1, 2, 4, 5, 6, 7])?;
    served(lines)?;
    let five = &lines[4]["received"];
    expect(five == &json!(["A", "C"]), || {
        format!("rank 5 received {five}")
    })?;
    all_sets(lines, "G", &[3])
}

/// A smoke run of the bench-bcast job (`crate::bench_bcast`; under `ftmpi` its
/// baseline is `MPI_Bcast`): rank 0 prints one line per case, each with positive
/// medians for the stack and the baseline and their ratio; the other ranks say they
/// took part. Two chunks and a part-chunk (70 000 bytes), one and two outputs. Every
/// rank checked what it received byte for byte, or the job fails.
pub const BENCH_BCAST_SMOKE: Scenario = Scenario {
    ranks: 3,
    args: &[
        "bench-bcast",
        "--sizes",
        "1024,70000",
        "--outputs",
        "1,2",
        "--reps",
        "3",
    ],
    check: |lines| {
        let (cases, others): (Vec<&Value>, Vec<&Value>) =
            lines.iter().partition(|l| l.get("bytes").is_some());
        expect(cases.len() == 4, || format!("{} case lines", cases.len()))?;
        let ranks: Vec<&Value> = others.iter().map(|l| &l["rank"]).collect();
        expect(ranks == [1, 2], || {
            format!("other lines from ranks {ranks:?}")
        })?;
        for line in cases {
            // The stack's and the baseline's, and a backend may time more ways
            // (`ftmpi`'s activation floor).
            let medians = line["median_us"].as_object();
            expect(
                medians.is_some_and(|m| m.len() >= 2 && m.contains_key("stack")),
                || format!("the stack's median and a baseline's expected: {line}"),
            )?;
            let positive = |v: &Value| v.as_f64().is_some_and(|x| x > 0.0 && x.is_finite());
            let ratio = line
                .as_object()
                .and_then(|o| o.iter().find(|(k, _)| k.starts_with("ratio_to_")))
                .map(|(_, v)| v);
            expect(
                line["median_us"]
                    .as_object()
                    .is_some_and(|m| m.values().all(positive))
                    && ratio.is_some_and(positive),
                || format!("medians and ratio must be positive: {line}"),
            )?;
        }
        Ok(())
    },
};

/// A smoke run of the latency job (`crate::latency`): every rank reports positive
/// medians, and rank 0 (which also does the round trips) the ratios. The figures
/// themselves come from longer runs.
pub const LATENCY_SMOKE: Scenario = Scenario {
    ranks: 3,
    args: &["latency", "--reps", "5"],
    check: |lines| {
        survivors(lines, &[0, 1, 2])?;
        for line in lines {
            let ops: &[&str] = if line["rank"] == 0 {
                &["raw_barrier", "raw_round_trip", "validate_global"]
            } else {
                &["raw_barrier", "validate_global"]
            };
            for op in ops {
                let median = line["median_us"][op].as_f64().unwrap_or(f64::NAN);
                expect(median > 0.0 && median.is_finite(), || {
                    format!("{op} median {median}: {line}")
                })?;
            }
        }
        for ratio in ["raw_barriers", "raw_round_trips"] {
            let r = lines[0]["validate_global_in"][ratio]
                .as_f64()
                .unwrap_or(f64::NAN);
            expect(r > 0.0 && r.is_finite(), || {
                format!("{ratio}: {}", lines[0])
            })?;
        }
        Ok(())
    },
};

/// A command line a new user might try that cannot run: every backend must refuse it
/// before any rank waits for another, print `message` once, exit non-zero, and end
/// within a few seconds.
#[derive(Clone, Copy, Debug)]
pub struct BadInput {
    /// Ranks to start.
    pub ranks: u32,
    /// The job's command line.
    pub args: &'static [&'static str],
    /// What the error must say.
    pub message: &'static str,
}

/// A [`BadInput`], in one line of the table.
const fn bad(ranks: u32, args: &'static [&'static str], message: &'static str) -> BadInput {
    BadInput {
        ranks,
        args,
        message,
    }
}

/// The longest a refused or failing job may take: generous, since the point is that
/// it ends (it used to wait for a step's 60 s limit, or forever under ULFM).
pub const PROMPTLY: Duration = Duration::from_secs(20);

/// Checks how a job that must fail ended: not successfully, within [`PROMPTLY`],
/// saying `message` exactly once on its standard error, and no Rust `Debug` text of
/// an exit status.
pub fn refused(succeeded: bool, stderr: &str, took: Duration, message: &str) -> Result<(), String> {
    expect(!succeeded, || format!("it succeeded:\n{stderr}"))?;
    let said = stderr.matches(message).count();
    expect(said == 1, || {
        format!("it says {message:?} {said} times, not once:\n{stderr}")
    })?;
    expect(!stderr.contains("ExitStatus"), || {
        format!("Debug text:\n{stderr}")
    })?;
    expect(took < PROMPTLY, || format!("it took {took:?}:\n{stderr}"))
}

/// The bad inputs both backends refuse the same way (paths are relative to the
/// workspace root).
pub const BAD_INPUTS: &[BadInput] = &[
    bad(
        4,
        &["broadcast", "ft-jobs/testdata/duplicate-output.json"],
        "invalid plan: two outputs are named \"A\"",
    ),
    bad(
        4,
        &["broadcast", "plans/mpi-8.json"],
        "the plan is for 8 ranks, the job has 4",
    ),
    bad(
        4,
        &["broadcast", "plans/no-such-plan.json"],
        "cannot read plans/no-such-plan.json",
    ),
    bad(
        8,
        &[
            "broadcast",
            "plans/mpi-8.json",
            "--kill",
            "0",
            "--kill-on",
            "activation",
        ],
        "the plan never activates rank 0",
    ),
    bad(
        8,
        &[
            "broadcast",
            "plans/mpi-8.json",
            "--kill",
            "3",
            "--kill-on",
            "validate",
        ],
        "--kill-on validate applies to the validate job",
    ),
    bad(
        8,
        &[
            "broadcast",
            "plans/mpi-8.json",
            "--threaded",
            "--kill",
            "3",
            "--kill-on",
            "activation",
        ],
        "cannot be used with",
    ),
    bad(
        4,
        &["validate", "--kill", "2,2"],
        "--kill names rank 2 twice",
    ),
    bad(
        4,
        &["validate", "--kill", "1,9"],
        "--kill 9: the job's ranks are 0..4",
    ),
    bad(
        4,
        &["validate", "--kill-on", "validate"],
        "the following required arguments were not provided",
    ),
    bad(
        4,
        &[
            "validate",
            "--kill",
            "1",
            "--kill-at-ms",
            "5",
            "--kill-on",
            "validate",
        ],
        "cannot be used with",
    ),
    bad(
        4,
        &["validate", "--kill", "1", "--kill-on", "activation"],
        "--kill-on activation needs a broadcast",
    ),
    bad(4, &["latency", "--reps", "0"], "0 is not in 1.."),
    bad(
        4,
        &["bench-bcast", "--kill", "1"],
        "bench-bcast runs failure-free",
    ),
    bad(4, &["bench-bcast", "--sizes", "0"], "--sizes 0"),
    bad(4, &["bench-bcast", "--outputs", "65"], "--outputs 65"),
    bad(
        4,
        &["latency", "--kill", "1"],
        "the latency job runs failure-free",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn validation(rank: u64, gs: &[Value], l: Value) -> Value {
        let validations: Vec<Value> = gs
            .iter()
            .enumerate()
            .map(|(e, g)| json!({"epoch": e + 1, "G": g}))
            .collect();
        json!({"rank": rank, "validations": validations, "L": l,
               "stats": {"rejected": 0, "frames_received": 9}})
    }

    #[test]
    fn checks_accept_the_right_lines_and_name_what_is_wrong() {
        let good: Vec<Value> = [0, 1, 3, 4]
            .map(|r| validation(r, &[json!([]), json!([2])], json!([2])))
            .into();
        assert!(VALIDATE_AFTER_A_KILL.check(&good).is_ok());
        let mut wrong_l = good.clone();
        wrong_l[1]["L"] = json!([]);
        let e = VALIDATE_AFTER_A_KILL.check(&wrong_l).unwrap_err();
        assert!(e.contains("rank 1: L is []"), "{e}");
        let e = VALIDATE_AFTER_A_KILL.check(&good[..3]).unwrap_err();
        assert!(e.contains("survivors [0, 1, 3]"), "{e}");

        let clean: Vec<Value> = (0..4)
            .map(|r| validation(r, &[json!([])], json!([])))
            .collect();
        assert!(VALIDATE_WITHOUT_FAILURES.check(&clean).is_ok());
        assert!(
            VALIDATE_THREADED_AFTER_A_KILL.check(&good).is_err(),
            "not threaded"
        );
    }

    #[test]
    fn node_checks_take_the_dead_as_a_set() {
        let node = |gs: &[Value]| -> Vec<Value> {
            (0..4)
                .map(|r| validation(r, gs, json!([4, 5, 6, 7])))
                .collect()
        };
        // The first G may hold any part of the node; the last must be all of it.
        let good = node(&[json!([5, 7]), json!([4, 5, 6, 7])]);
        assert!(VALIDATE_AFTER_A_NODE_IS_KILLED.check(&good).is_ok());
        let e = VALIDATE_AFTER_A_NODE_IS_KILLED
            .check(&node(&[json!([]), json!([4, 5, 6])]))
            .unwrap_err();
        assert!(e.contains("then [4, 5, 6, 7]"), "{e}");
        assert!(VALIDATE_AFTER_A_NODE_IS_KILLED
            .check(&node(&[json!([3]), json!([4, 5, 6, 7])]))
            .is_err());
        let e = VALIDATE_WHEN_A_NODE_DIES_IN_THE_CALL
            .check(&good)
            .unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = VALIDATE_WHEN_A_NODE_DIES_IN_THE_CALL
            .check(&good[..3])
            .unwrap_err();
        assert!(e.contains("survivors [0, 1, 2]"), "{e}");
    }
}
