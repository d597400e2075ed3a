//! The run report of `ftsim run` (DESIGN.md's contract): built from a finished [`Sim`],
//! rendered as JSON (`--json`) or readable text.
//!
//! The JSON holds the contract's fields (`per_rank` is left out with `--summary`) and
//! the detector's figures a node failure is judged by: `ranks_per_node` and
//! `detector_span`, `heartbeats_per_rank_per_period` (steady state, before the first
//! death) and `heartbeats_per_rank_per_period_at_end` (the run's last stretch, after the
//! failures), and, per block kill, `blocks` (how long until every survivor knew all of it,
//! against [`crate::engine::detection_bound`]). Other figures (frames per kind, rejected frames, wall
//! time) are only in the text form and in [`Report::extra`].
//!
//! Heartbeat rate: the engine keeps the frames per kind sent before the first departure
//! (or the whole run, without one); `Heartbeat` frames over `ranks · window / period`.
//! Heartbeat phases are spread over the period (seeded or staggered), so a window
//! shorter than a period still gives the rate, not a start-up artefact.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use ft_core::wire::FrameKind;
use ft_core::{Instant, Rank};

use crate::engine::{Departure, ReceivedLog, Sim, SimRank};
use crate::scenario::{KillPoint, Victims};

/// The run report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Communicator size.
    pub ranks: u32,
    /// End of the run, simulated milliseconds.
    pub until_ms: f64,
    /// Events processed.
    pub events: u64,
    /// Frames sent.
    pub messages: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Every rank (absent in summary reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_rank: Option<Vec<RankReport>>,
    /// Every rank that failed (killed or declared dead).
    pub detections: Vec<Detection>,
    /// The scenario's `ranks_per_node` (null if it declared none).
    pub ranks_per_node: Option<u32>,
    /// The detector span every rank ran with.
    pub detector_span: u32,
    /// `Heartbeat` frames per rank per period before the first death (null if a rank
    /// died at time 0).
    pub heartbeats_per_rank_per_period: Option<f64>,
    /// The same per surviving rank over the run's last stretch (the last quarter, at
    /// most 10 periods): the steady state after the failures (null if the run did not
    /// get there).
    pub heartbeats_per_rank_per_period_at_end: Option<f64>,
    /// Per block kill (at a time), in file order.
    pub blocks: Vec<BlockDetection>,
    /// Figures beyond the contract.
    #[serde(skip)]
    pub extra: Extra,
}

/// One rank at the end of the run.
#[derive(Clone, Debug, Serialize)]
pub struct RankReport {
    /// The rank.
    pub rank: Rank,
    /// Neither killed nor stopped.
    pub alive: bool,
    /// `L_i` at the end (or when it died).
    pub local: Vec<Rank>,
    /// `G` at the end (or when it died).
    pub global: Vec<Rank>,
    /// Validations it finished.
    pub validations: Vec<ValidationReport>,
    /// Broadcasts it received.
    pub received: Vec<ReceivedReport>,
}

/// One finished validation.
#[derive(Clone, Debug, Serialize)]
pub struct ValidationReport {
    /// `"local"` or `"global"`.
    pub kind: &'static str,
    /// Start, simulated ms.
    pub started_ms: f64,
    /// End, simulated ms.
    pub finished_ms: f64,
    /// The set it returned.
    pub result: Vec<Rank>,
}

/// One received broadcast.
#[derive(Clone, Debug, Serialize)]
pub struct ReceivedReport {
    /// Broadcast number.
    pub broadcast: u32,
    /// Outputs received.
    pub outputs: Vec<String>,
    /// When, simulated ms.
    pub finished_ms: f64,
}

/// How one failure was detected and propagated.
#[derive(Clone, Debug, Serialize)]
pub struct Detection {
    /// The failed rank.
    pub rank: Rank,
    /// First suspicion by any rank (null if never suspected).
    pub first_suspected_ms: Option<f64>,
    /// When the last rank alive at the end learned it (null if some never did).
    pub all_survivors_ms: Option<f64>,
    /// Largest hop count of a notice about it.
    pub max_hops: u32,
}

/// How one killed block was detected, against the detector's bound.
#[derive(Clone, Debug, Serialize)]
pub struct BlockDetection {
    /// First rank (ring order).
    pub first: Rank,
    /// Last rank (ring order; below `first` when the block wraps).
    pub last: Rank,
    /// Ranks in the block.
    pub ranks: u32,
    /// When it was killed, ms.
    pub killed_ms: f64,
    /// When the last survivor learned the last of its ranks, ms (null if some never did).
    pub all_survivors_ms: Option<f64>,
    /// `all_survivors_ms - killed_ms`.
    pub detection_ms: Option<f64>,
    /// [`crate::engine::detection_bound`] for this block, ms after the kill; for a block
    /// killed in the start-up grace, counted from its
    /// [`crate::engine::detection_origin`].
    pub bound_ms: f64,
    /// `detection_ms <= bound_ms`.
    pub within_bound: bool,
}

/// Figures beyond the contract.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    /// Ranks killed by the scenario, with the time (ms).
    pub killed: Vec<(Rank, f64)>,
    /// Ranks that learned they were declared dead and stopped, with the time (ms).
    pub stopped: Vec<(Rank, f64)>,
    /// Frames per kind name.
    pub by_kind: BTreeMap<String, u64>,
    /// Frames refused by a machine (typed errors).
    pub rejected: u64,
    /// Actions refused by live ranks.
    pub refused_actions: u64,
    /// The first refused action: the rank and why.
    pub first_refusal: Option<(Rank, String)>,
    /// Largest network delay drawn, ms.
    pub max_delay_ms: f64,
    /// Ranks alive at the end.
    pub survivors: u32,
    /// Survivors whose knowledge of failures at the end (`L_i` and the detector's news
    /// not validated yet) lacks a failed rank, or holds a live one.
    pub survivors_wrong: u32,
    /// The `k`-th global validation of every rank, summed over ranks.
    pub global_validations: Vec<GlobalSummary>,
}

/// The `k`-th global validation, over all ranks (survivors and ranks that died after
/// returning).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GlobalSummary {
    /// Ranks that returned from it.
    pub returned: u32,
    /// Survivors that did not return from it (by the end of the run).
    pub survivors_pending: u32,
    /// Distinct `G` returned (1 means uniform agreement held).
    pub distinct_results: u32,
    /// `|G|` of the first result.
    pub failed: usize,
    /// Earliest and latest return, ms.
    pub finished_ms: (f64, f64),
    /// Earliest call, ms.
    pub started_ms: f64,
    /// Longest call at one rank (return - call), ms.
    pub longest_call_ms: f64,
    /// The longest call in mean link delays (`latency + jitter / 2`; frame sizes add
    /// picoseconds per byte, left out).
    pub longest_call_delays: f64,
    /// Message delays of the agreement's failure-free shape for this validation's
    /// participants `m = n - |G of the previous one|`: `2·⌈log2 m⌉` on the fast path's
    /// sweeps, `4·h(m)` on the tree (above [`ft_core::agreement::DEFAULT_SWEEP_LIMIT`]).
    pub failure_free_delays: u32,
}

/// Message delays of a failure-free `validate_global` over `m` participants (see
/// [`GlobalSummary::failure_free_delays`]).
pub fn failure_free_delays(m: u32) -> u32 {
    if m <= ft_core::agreement::DEFAULT_SWEEP_LIMIT {
        2 * crate::engine::ceil_log2(m)
    } else {
        // The binomial tree's depth: the largest popcount below m.
        let top = m - 1;
        4 * top.count_ones().max(top.checked_ilog2().unwrap_or(0))
    }
}

fn millis(t: Instant) -> f64 {
    t.as_millis_f64()
}

/// One entry per broadcast, in order of first release: a rank released in several
/// trees (per-output strategy) gets the union of the outputs and the latest time.
fn merge_received(logs: &[ReceivedLog]) -> Vec<ReceivedReport> {
    let mut merged: Vec<ReceivedReport> = Vec::new();
    for r in logs {
        match merged.iter_mut().find(|m| m.broadcast == r.broadcast) {
            Some(m) => {
                for name in &r.outputs {
                    if !m.outputs.contains(name) {
                        m.outputs.push(name.clone());
                    }
                }
                m.finished_ms = m.finished_ms.max(millis(r.finished));
            }
            None => merged.push(ReceivedReport {
                broadcast: r.broadcast,
                outputs: r.outputs.clone(),
                finished_ms: millis(r.finished),
            }),
        }
    }
    merged
}

/// Sums the ranks' `k`-th global validations, for every `k` any rank reached.
fn summarize_globals<P: SimRank>(sim: &Sim<P>, survivors: &[Rank]) -> Vec<GlobalSummary> {
    let mut out: Vec<GlobalSummary> = Vec::new();
    let mut results: Vec<Vec<&Vec<Rank>>> = Vec::new();
    for logs in sim.log().validations.values() {
        for (k, v) in logs.iter().filter(|v| v.kind == "global").enumerate() {
            if out.len() <= k {
                out.push(GlobalSummary {
                    finished_ms: (f64::MAX, 0.0),
                    started_ms: f64::MAX,
                    ..GlobalSummary::default()
                });
                results.push(Vec::new());
            }
            let g = &mut out[k];
            g.returned += 1;
            g.finished_ms.0 = g.finished_ms.0.min(millis(v.finished));
            g.finished_ms.1 = g.finished_ms.1.max(millis(v.finished));
            g.started_ms = g.started_ms.min(millis(v.started));
            g.longest_call_ms = g
                .longest_call_ms
                .max(millis(v.finished) - millis(v.started));
            if !results[k].contains(&&v.result) {
                results[k].push(&v.result);
            }
        }
    }
    let net = sim.net();
    let mean_delay_ms = (net.latency.as_nanos() as f64 + net.jitter.as_nanos() as f64 / 2.0) / 1e6;
    let mut previous_failed = 0;
    for (k, g) in out.iter_mut().enumerate() {
        g.distinct_results = results[k].len() as u32;
        g.failed = results[k].first().map_or(0, |r| r.len());
        g.longest_call_delays = g.longest_call_ms / mean_delay_ms.max(f64::MIN_POSITIVE);
        g.failure_free_delays = failure_free_delays(sim.size() - previous_failed as u32);
        previous_failed = g.failed;
        g.survivors_pending = survivors
            .iter()
            .filter(|r| {
                let done = sim
                    .log()
                    .validations
                    .get(r)
                    .map_or(0, |v| v.iter().filter(|v| v.kind == "global").count());
                done <= k
            })
            .count() as u32;
    }
    out
}

/// `Heartbeat` frames per rank per period before the first departure (see the module
/// docs).
fn heartbeat_rate<P: SimRank>(sim: &Sim<P>) -> Option<f64> {
    let log = sim.log();
    let (end, by_kind) = match &log.before_first_departure {
        Some((at, by_kind)) => (*at, by_kind),
        None => (sim.now(), &log.by_kind),
    };
    let periods = end.as_nanos() as f64 / sim.settings().period.as_nanos() as f64;
    let heartbeats = by_kind[FrameKind::Heartbeat as usize] as f64;
    (periods > 0.0).then(|| heartbeats / (f64::from(sim.size()) * periods))
}

/// `Heartbeat` frames per surviving rank per period over the run's last stretch.
fn heartbeat_rate_at_end<P: SimRank>(sim: &Sim<P>, survivors: usize) -> Option<f64> {
    let before = sim.log().before_tail.as_ref()?;
    let from = sim.settings().tail_from;
    let periods = (sim.now() - from).as_nanos() as f64 / sim.settings().period.as_nanos() as f64;
    let code = FrameKind::Heartbeat as usize;
    let heartbeats = (sim.log().by_kind[code] - before[code]) as f64;
    (periods > 0.0 && survivors > 0).then(|| heartbeats / (survivors as f64 * periods))
}

/// One entry per block killed at a time.
fn block_detections<P: SimRank>(sim: &Sim<P>, detections: &[Detection]) -> Vec<BlockDetection> {
    let n = sim.size();
    let known_by_all = |rank: Rank| {
        detections
            .iter()
            .find(|d| d.rank == rank)
            .and_then(|d| d.all_survivors_ms)
    };
    sim.settings()
        .kills
        .iter()
        .filter_map(|(victims, point)| match (victims, point) {
            (&Victims::Block { first, last }, &KillPoint::At(killed_ms)) => {
                Some((first, last, victims, killed_ms))
            }
            _ => None,
        })
        .map(|(first, last, victims, killed_ms)| {
            let all_survivors_ms = victims
                .ranks(n)
                .map(known_by_all)
                .try_fold(0.0f64, |latest, t| Some(latest.max(t?)));
            let detection_ms = all_survivors_ms.map(|t| t - killed_ms);
            // Counted from the death, or from the start-up grace for a block killed
            // before its watchers heard it (`engine::detection_origin`).
            let origin = sim.detection_origin(Instant::from_nanos((killed_ms * 1e6) as u64));
            let bound_ms =
                (origin + sim.detection_bound(victims.len(n))).as_millis_f64() - killed_ms;
            BlockDetection {
                first,
                last,
                ranks: victims.len(n),
                killed_ms,
                all_survivors_ms,
                detection_ms,
                bound_ms,
                within_bound: detection_ms.is_some_and(|d| d <= bound_ms),
            }
        })
        .collect()
}

impl Report {
    /// The report of `sim` as it stands; `per_rank` only when asked for.
    pub fn build<P: SimRank>(sim: &Sim<P>, per_rank: bool) -> Report {
        let n = sim.size();
        let log = sim.log();
        let mut extra = Extra {
            rejected: log.rejected,
            refused_actions: log.refused_actions,
            first_refusal: log.first_refusal.clone(),
            max_delay_ms: log.max_delay.as_millis_f64(),
            ..Extra::default()
        };
        for (code, &count) in log.by_kind.iter().enumerate() {
            if count > 0 {
                let name = match FrameKind::from_code(code as u8) {
                    Ok(k) => format!("{k:?}"),
                    Err(_) => format!("kind{code}"),
                };
                extra.by_kind.insert(name, count);
            }
        }
        let mut departures: Vec<_> = log.departures.iter().collect();
        departures.sort_by_key(|(r, _)| **r);
        for (&rank, how) in departures {
            match how {
                Departure::Killed(at) => extra.killed.push((rank, millis(*at))),
                Departure::Stopped(at) => extra.stopped.push((rank, millis(*at))),
            }
        }
        let failed: Vec<Rank> = {
            let mut f: Vec<Rank> = log
                .departures
                .keys()
                .chain(log.detections.keys())
                .copied()
                .collect();
            f.sort_unstable();
            f.dedup();
            f
        };
        let survivors: Vec<Rank> = sim.survivors().collect();
        extra.survivors = survivors.len() as u32;
        let dead: std::collections::HashSet<Rank> = failed
            .iter()
            .copied()
            .filter(|&r| !sim.is_alive(r))
            .collect();
        for &r in &survivors {
            let known = sim.machine(r).view().known_failed();
            let complete = dead.iter().all(|&d| known.contains(d));
            let accurate = known.iter().all(|x| dead.contains(&x));
            if !(complete && accurate) {
                extra.survivors_wrong += 1;
            }
        }
        extra.global_validations = summarize_globals(sim, &survivors);
        let detections: Vec<Detection> = failed
            .iter()
            .map(|&rank| {
                let entry = log.detections.get(&rank);
                let all = entry.and_then(|e| {
                    let mut last = Instant::ZERO;
                    for &s in &survivors {
                        if s == rank {
                            continue;
                        }
                        let t = e.learned[s as usize];
                        if t == Instant::MAX {
                            return None;
                        }
                        last = last.max(t);
                    }
                    Some(millis(last))
                });
                Detection {
                    rank,
                    first_suspected_ms: entry.and_then(|e| e.first_suspected).map(millis),
                    all_survivors_ms: all,
                    max_hops: entry.map_or(0, |e| e.max_hops),
                }
            })
            .collect();
        let blocks = block_detections(sim, &detections);
        let per_rank = per_rank.then(|| {
            (0..n)
                .map(|rank| {
                    let view = sim.machine(rank).view();
                    RankReport {
                        rank,
                        alive: sim.is_alive(rank),
                        local: view.local().iter().collect(),
                        global: view.global().iter().collect(),
                        validations: log
                            .validations
                            .get(&rank)
                            .map(|v| {
                                v.iter()
                                    .map(|v| ValidationReport {
                                        kind: v.kind,
                                        started_ms: millis(v.started),
                                        finished_ms: millis(v.finished),
                                        result: v.result.clone(),
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                        received: log
                            .received
                            .get(&rank)
                            .map(|v| merge_received(v))
                            .unwrap_or_default(),
                    }
                })
                .collect()
        });
        Report {
            ranks: n,
            until_ms: millis(sim.until()),
            events: log.events,
            messages: log.messages,
            bytes: log.bytes,
            per_rank,
            detections,
            ranks_per_node: sim.settings().ranks_per_node,
            detector_span: sim.settings().span,
            heartbeats_per_rank_per_period: heartbeat_rate(sim),
            heartbeats_per_rank_per_period_at_end: heartbeat_rate_at_end(sim, survivors.len()),
            blocks,
            extra,
        }
    }

    /// The JSON contract.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The readable form. Per-rank lines are printed for up to 64 ranks.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let x = &self.extra;
        let _ = writeln!(
            s,
            "ftsim: {} ranks, simulated {:.3} ms: {} events, {} frames, {} bytes",
            self.ranks, self.until_ms, self.events, self.messages, self.bytes
        );
        // Runs of consecutive ranks that left at the same time read as one block.
        let list = |v: &[(Rank, f64)]| {
            let mut runs: Vec<(Rank, Rank, f64)> = Vec::new();
            for &(r, t) in v {
                match runs.last_mut() {
                    Some((_, last, at)) if *last + 1 == r && *at == t => *last = r,
                    _ => runs.push((r, r, t)),
                }
            }
            runs.iter()
                .map(|&(first, last, t)| match first == last {
                    true => format!("{first} @ {t:.3} ms"),
                    false => format!("{first}..={last} @ {t:.3} ms"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "killed:  {}",
            if x.killed.is_empty() {
                "none".into()
            } else {
                list(&x.killed)
            }
        );
        if !x.stopped.is_empty() {
            let _ = writeln!(s, "stopped (declared dead): {}", list(&x.stopped));
        }
        let _ = writeln!(
            s,
            "survivors: {} ({} whose known-failed set misses a dead rank or holds a live one)",
            x.survivors, x.survivors_wrong
        );
        let _ = writeln!(s, "frames by kind: {:?}", x.by_kind);
        let _ = writeln!(
            s,
            "detector span: {} ({}); heartbeats per rank per period: {} before the first death, {} at the end",
            self.detector_span,
            self.ranks_per_node
                .map_or("default".to_string(), |r| format!("ranks_per_node = {r}")),
            self.heartbeats_per_rank_per_period
                .map_or("n/a".to_string(), |h| format!("{h:.3}")),
            self.heartbeats_per_rank_per_period_at_end
                .map_or("n/a".to_string(), |h| format!("{h:.3}"))
        );
        for b in &self.blocks {
            let _ = writeln!(
                s,
                "block [{}, {}] ({} ranks) killed @ {:.3} ms: every survivor knew all of it {}; bound {:.4} ms: {}",
                b.first,
                b.last,
                b.ranks,
                b.killed_ms,
                b.detection_ms.map_or("never".to_string(), |d| format!(
                    "after {d:.4} ms = {:.3} × bound",
                    d / b.bound_ms
                )),
                b.bound_ms,
                if b.within_bound { "pass" } else { "FAIL" }
            );
        }
        if x.rejected > 0 {
            let _ = writeln!(s, "frames refused by the machines: {}", x.rejected);
        }
        if let Some((rank, why)) = &x.first_refusal {
            let _ = writeln!(
                s,
                "actions refused by live ranks: {} (first: rank {rank}: {why})",
                x.refused_actions
            );
        }
        let _ = writeln!(s, "largest network delay: {:.6} ms", x.max_delay_ms);
        for (k, g) in x.global_validations.iter().enumerate() {
            let _ = writeln!(
                s,
                "global validation #{}: returned at {} ranks ({} survivors pending), {} distinct G, |G| = {}, called {:.4} ms, finished {:.4}..{:.4} ms",
                k + 1,
                g.returned,
                g.survivors_pending,
                g.distinct_results,
                g.failed,
                g.started_ms,
                g.finished_ms.0,
                g.finished_ms.1
            );
            let _ = writeln!(
                s,
                "  longest call {:.4} ms = {:.1} mean link delays (failure-free shape: {} delays)",
                g.longest_call_ms, g.longest_call_delays, g.failure_free_delays
            );
        }
        let _ = writeln!(s, "\ndetections:");
        let _ = writeln!(
            s,
            "  {:>8}  {:>14}  {:>14}  {:>8}",
            "rank", "suspected ms", "all know ms", "max hops"
        );
        for d in &self.detections {
            let opt = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.4}"));
            let _ = writeln!(
                s,
                "  {:>8}  {:>14}  {:>14}  {:>8}",
                d.rank,
                opt(d.first_suspected_ms),
                opt(d.all_survivors_ms),
                d.max_hops
            );
        }
        if let Some(per_rank) = &self.per_rank {
            if per_rank.len() <= 64 {
                let _ = writeln!(s, "\nper rank:");
                for r in per_rank {
                    let _ = write!(
                        s,
                        "  {:>4} {:<5} L={:?} G={:?}",
                        r.rank,
                        if r.alive { "alive" } else { "dead" },
                        r.local,
                        r.global
                    );
                    for v in &r.validations {
                        let _ = write!(s, "  {}@{:.3}ms->{:?}", v.kind, v.finished_ms, v.result);
                    }
                    for b in &r.received {
                        let _ = write!(
                            s,
                            "  bcast{}@{:.3}ms:{:?}",
                            b.broadcast, b.finished_ms, b.outputs
                        );
                    }
                    let _ = writeln!(s);
                }
            } else {
                let _ = writeln!(
                    s,
                    "\n(per-rank lines omitted for {} ranks; use --json)",
                    per_rank.len()
                );
            }
        }
        s
    }
}
