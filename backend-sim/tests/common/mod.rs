//! What the simulator's tests share: a failure schedule (single ranks and blocks, at
//! times) turned into a scenario and a simulated group of failure layers, the checks
//! every schedule must pass, and temporary input files.
// Each test file uses its own part of this module.
#![allow(dead_code)]

use backend_sim::engine::{Departure, Sim};
use backend_sim::failure::make_node;
use backend_sim::scenario::{ActionKind, Scenario, Victims};
use ft_core::node::Node;
use ft_core::{Instant, Rank};

/// Writes `text` to `{name}.json` in a fresh temporary folder of the test `test` and
/// returns its path.
pub fn temp_file(test: &str, name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A group, its network and detector settings, and who dies when.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub n: u32,
    /// `ranks_per_node` (`None`: the detector's default span).
    pub ranks_per_node: Option<u32>,
    pub period_ms: f64,
    pub timeout_ms: f64,
    pub latency_us: f64,
    pub jitter_us: f64,
    pub kills: Vec<(Victims, f64)>,
}

impl Schedule {
    /// Every killed rank, ascending.
    pub fn killed(&self) -> Vec<Rank> {
        let mut killed: Vec<Rank> = self
            .kills
            .iter()
            .flat_map(|(v, _)| v.ranks(self.n))
            .collect();
        killed.sort_unstable();
        killed
    }

    /// The time of the last kill, ms.
    pub fn last_kill_ms(&self) -> f64 {
        self.kills.iter().map(|(_, t)| *t).fold(0.0, f64::max)
    }

    /// The latest detection origin of the kills in `sim` (the last kill, or the
    /// start-up grace's origin for a kill in it: `backend_sim::engine::detection_origin`).
    pub fn last_detection_origin(&self, sim: &Sim<Node>) -> Instant {
        self.kills
            .iter()
            .map(|&(_, t)| sim.detection_origin(Instant::from_nanos((t * 1e6).round() as u64)))
            .max()
            .unwrap_or(Instant::ZERO)
    }

    /// Longest run of ring-consecutive killed ranks.
    pub fn longest_adjacent_run(&self) -> u32 {
        let killed = self.killed();
        let n = self.n;
        if killed.len() as u32 == n {
            return n;
        }
        let dead = |r: u32| killed.binary_search(&(r % n)).is_ok();
        let mut best = 0;
        for &k in &killed {
            if dead(k + n - 1) {
                continue; // not the start of a run
            }
            let mut len = 0;
            while dead(k + len) {
                len += 1;
            }
            best = best.max(len);
        }
        best
    }

    /// The scenario file's text, with `seed` (`until_ms` is far: tests run to their own
    /// bounds).
    pub fn scenario_json(&self, seed: u64) -> String {
        let kills: Vec<String> = self
            .kills
            .iter()
            .map(|(v, t)| match v {
                Victims::Rank(r) => format!(r#"{{"rank": {r}, "at_ms": {t}}}"#),
                Victims::Block { first, last } => {
                    format!(r#"{{"ranks": [{first}, {last}], "at_ms": {t}}}"#)
                }
            })
            .collect();
        let per_node = self
            .ranks_per_node
            .map_or(String::new(), |r| format!(r#""ranks_per_node": {r},"#));
        format!(
            r#"{{ "ranks": {}, "seed": {seed}, {per_node}
                  "network": {{ "latency_us": {}, "jitter_us": {}, "gbytes_per_s": 10.0 }},
                  "detector": {{ "period_ms": {}, "timeout_ms": {} }},
                  "kill": [{}], "until_ms": 100000 }}"#,
            self.n,
            self.latency_us,
            self.jitter_us,
            self.period_ms,
            self.timeout_ms,
            kills.join(", ")
        )
    }

    /// The group of failure layers this schedule runs on.
    pub fn build(&self, seed: u64) -> Sim<Node> {
        let scenario = Scenario::from_json(&self.scenario_json(seed))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", self.scenario_json(seed)));
        Sim::new(&scenario, make_node).expect("sim")
    }
}

/// The first live rank the run declared dead (it stopped, or some rank suspected it),
/// if any: the detector's accuracy, `G ⊆ F` in practice.
pub fn first_false_declaration(sim: &Sim<Node>, killed: &[Rank]) -> Option<Rank> {
    let stopped = sim
        .log()
        .departures
        .iter()
        .find(|(_, how)| !matches!(how, Departure::Killed(_)))
        .map(|(&r, _)| r);
    stopped.or_else(|| {
        sim.log()
            .detections
            .keys()
            .copied()
            .find(|r| killed.binary_search(r).is_err())
    })
}

/// The first survivor whose known-failed set (its `L_i` and the detector's news not
/// validated yet) is not exactly `killed`, with that set.
pub fn first_survivor_not_knowing(sim: &Sim<Node>, killed: &[Rank]) -> Option<(Rank, Vec<Rank>)> {
    sim.survivors().find_map(|r| {
        let known: Vec<Rank> = sim.machine(r).view().known_failed().iter().collect();
        (known != killed).then_some((r, known))
    })
}

/// Every rank that left the run was killed by the schedule: none stopped because it was
/// (falsely) declared dead.
pub fn assert_no_live_rank_was_declared_dead(sim: &Sim<Node>, s: &Schedule, seed: u64) {
    if let Some(r) = first_false_declaration(sim, &s.killed()) {
        panic!(
            "seed {seed}: live rank {r} was declared dead; n {}, kills {:?}",
            s.n, s.kills
        );
    }
}

/// Validates locally everywhere and checks that every survivor's `L_i` is exactly the
/// killed set.
pub fn assert_every_survivor_lists_the_killed(sim: &mut Sim<Node>, s: &Schedule, seed: u64) {
    sim.act(&ActionKind::ValidateLocal, 0)
        .expect("validate_local");
    let expected = s.killed();
    for r in sim.survivors() {
        let local: Vec<Rank> = sim.machine(r).view().local().iter().collect();
        assert_eq!(
            local,
            expected,
            "seed {seed}: n {}, kills {:?}, rank {r} at {}",
            s.n,
            s.kills,
            sim.now()
        );
    }
}
