//! The scenario file of `ftsim run` (DESIGN.md's contract): types, parsing, checks.
//!
//! Times are simulated milliseconds (floats). Every object refuses unknown fields. Checks
//! that a single value can fail (negative or non-finite time, rank `>= ranks`, a zero
//! period) are made while parsing, so the error carries the file position serde_json
//! reports (`line L column C`). Checks across fields follow the parse and name the
//! offending entry (`kill[2]`, `actions[0]`).
//!
//! Extensions beyond the contract (optional): `network.jitter_us`, the upper bound of
//! the uniform random extra delay per message (default: half of `latency_us`), and
//! `detector.phases`, `"random"` (default) or `"staggered"` heartbeat phases.

use std::cell::Cell;
use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use ft_bcast::{OutputSpec, PlanSpec, Strategy, Topology};
use ft_core::Rank;

thread_local! {
    /// `ranks` of the scenario being parsed, so rank fields are checked in place.
    static RANKS: Cell<Option<u32>> = const { Cell::new(None) };
}

/// A whole scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Communicator size.
    pub ranks: u32,
    /// Seed of every random choice of the run (jitter, heartbeat phases).
    #[serde(default)]
    pub seed: u64,
    /// Network model.
    #[serde(default)]
    pub network: Network,
    /// Detector settings.
    #[serde(default)]
    pub detector: DetectorSettings,
    /// Failure schedule.
    #[serde(default)]
    pub kill: Vec<Kill>,
    /// Application actions, run on every live rank.
    #[serde(default)]
    pub actions: Vec<Action>,
    /// End of the simulated run.
    #[serde(deserialize_with = "time_ms")]
    pub until_ms: f64,
}

/// The network model: each frame takes `latency + bytes / bandwidth + jitter`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// One-way latency, microseconds.
    #[serde(deserialize_with = "non_negative")]
    pub latency_us: f64,
    /// Bandwidth, gigabytes per second.
    #[serde(deserialize_with = "positive")]
    pub gbytes_per_s: f64,
    /// Upper bound of the uniform per-frame jitter, microseconds (default: half the
    /// latency).
    #[serde(default, deserialize_with = "optional_non_negative")]
    pub jitter_us: Option<f64>,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            latency_us: 1.5,
            gbytes_per_s: 10.0,
            jitter_us: None,
        }
    }
}

impl Network {
    /// The jitter bound in microseconds.
    pub fn jitter_us(&self) -> f64 {
        self.jitter_us.unwrap_or(self.latency_us / 2.0)
    }
}

/// Failure detector settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectorSettings {
    /// Heartbeat period, milliseconds.
    #[serde(deserialize_with = "positive")]
    pub period_ms: f64,
    /// Silence before suspicion, milliseconds.
    #[serde(deserialize_with = "positive")]
    pub timeout_ms: f64,
    /// How the ranks' heartbeat phases are spread over the period: `"random"` (from the
    /// seed, the default) or `"staggered"` (rank `r` at `r · period / n`).
    #[serde(default)]
    pub phases: Phases,
}

/// How heartbeat phases are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phases {
    /// Uniform in `[0, period)` from the scenario's seed.
    #[default]
    Random,
    /// Rank `r` at `r · period / n`: evenly spread, in rank order.
    Staggered,
}

impl Default for DetectorSettings {
    fn default() -> Self {
        DetectorSettings {
            period_ms: 10.0,
            timeout_ms: 40.0,
            phases: Phases::Random,
        }
    }
}

/// One kill: at a time (`at_ms`) or at a protocol step (`on`, `kind`, `nth`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kill {
    /// The rank to kill.
    #[serde(deserialize_with = "rank")]
    pub rank: Rank,
    /// Kill time, milliseconds.
    #[serde(default, deserialize_with = "optional_time_ms")]
    pub at_ms: Option<f64>,
    /// Step kind: only `"send"`.
    #[serde(default)]
    pub on: Option<String>,
    /// Protocol family of the frame: `detector`, `agree`, `bcast` or `revoke`.
    #[serde(default)]
    pub kind: Option<String>,
    /// The rank dies just before sending its `nth` frame of that family (from 1).
    #[serde(default)]
    pub nth: Option<u64>,
}

/// When a kill happens, once checked.
#[derive(Clone, Debug, PartialEq)]
pub enum KillPoint {
    /// At this simulated time (milliseconds).
    At(f64),
    /// Just before the rank sends its `nth` frame of protocol `family`.
    BeforeSend {
        /// `detector`, `agree`, `bcast` or `revoke`.
        family: &'static str,
        /// From 1.
        nth: u64,
    },
}

/// Protocol families a step kill may name (see `ft_core::wire::FrameKind::family`).
pub const FAMILIES: [&str; 4] = ["detector", "agree", "bcast", "revoke"];

impl Kill {
    /// The kill point, or why the entry is inconsistent.
    pub fn point(&self) -> Result<KillPoint, String> {
        match (self.at_ms, &self.on, &self.kind, self.nth) {
            (Some(at), None, None, None) => Ok(KillPoint::At(at)),
            (None, Some(on), Some(kind), Some(nth)) => {
                if on != "send" {
                    return Err(format!("\"on\" must be \"send\", not {on:?}"));
                }
                let family = FAMILIES
                    .iter()
                    .find(|f| **f == kind.as_str())
                    .ok_or_else(|| format!("\"kind\" must be one of {FAMILIES:?}, not {kind:?}"))?;
                if nth == 0 {
                    return Err("\"nth\" counts from 1".into());
                }
                Ok(KillPoint::BeforeSend { family, nth })
            }
            _ => Err("give either \"at_ms\", or all of \"on\", \"kind\" and \"nth\"".into()),
        }
    }
}

/// An empty object (`{}`), refusing fields.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// One application action at a time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// When every live rank runs it, milliseconds.
    #[serde(deserialize_with = "time_ms")]
    pub at_ms: f64,
    /// `{}`: fold detector news into `L_i`.
    #[serde(default)]
    pub validate_local: Option<Empty>,
    /// `{}`: agree on `G`.
    #[serde(default)]
    pub validate_global: Option<Empty>,
    /// A broadcast of a task's outputs.
    #[serde(default)]
    pub broadcast: Option<Broadcast>,
}

/// What an action does, once checked.
#[derive(Clone, Debug)]
pub enum ActionKind {
    /// `validate_local`.
    ValidateLocal,
    /// `validate_global`.
    ValidateGlobal,
    /// `broadcast`.
    Broadcast(Broadcast),
}

impl ActionKind {
    /// The contract's name of the action.
    pub fn name(&self) -> &'static str {
        match self {
            ActionKind::ValidateLocal => "validate_local",
            ActionKind::ValidateGlobal => "validate_global",
            ActionKind::Broadcast(_) => "broadcast",
        }
    }
}

impl Action {
    /// The action, or why the entry is inconsistent.
    pub fn kind(&self) -> Result<ActionKind, String> {
        match (&self.validate_local, &self.validate_global, &self.broadcast) {
            (Some(_), None, None) => Ok(ActionKind::ValidateLocal),
            (None, Some(_), None) => Ok(ActionKind::ValidateGlobal),
            (None, None, Some(b)) => Ok(ActionKind::Broadcast(b.clone())),
            _ => Err(
                "give exactly one of \"validate_local\", \"validate_global\", \"broadcast\"".into(),
            ),
        }
    }
}

/// A broadcast action (the plan contract's fields minus `ranks` and `failed`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Broadcast {
    /// The task's rank.
    #[serde(deserialize_with = "rank")]
    pub root: Rank,
    /// `star`, `chain`, `binomial` or `kary:K`.
    pub topology: String,
    /// `per-class`, `fetch-for-descendants` or `per-output`.
    pub strategy: String,
    /// The outputs.
    pub outputs: Vec<Output>,
}

impl Broadcast {
    /// The broadcast as a plan spec for a communicator of `ranks` (no failed rank: the
    /// root adds the ones it knows), checked: a bad topology or strategy name, or a spec
    /// that cannot be planned (duplicate or empty names, duplicate destinations, the
    /// root among the destinations), is an error naming the cause.
    pub fn plan_spec(&self, ranks: u32) -> Result<PlanSpec, String> {
        let topology: Topology = self
            .topology
            .parse()
            .map_err(|e| format!("{e}, not {:?}", self.topology))?;
        let strategy: Strategy = self
            .strategy
            .parse()
            .map_err(|e| format!("{e}, not {:?}", self.strategy))?;
        let mut spec = PlanSpec::new(ranks, self.root)
            .with_topology(topology)
            .with_strategy(strategy);
        spec.outputs = self
            .outputs
            .iter()
            .map(|o| OutputSpec::new(o.name.clone(), o.bytes, o.dests.clone()))
            .collect();
        spec.validate().map_err(|e| e.to_string())?;
        Ok(spec)
    }
}

/// One output of a broadcast.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// Output name.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Destination ranks.
    #[serde(deserialize_with = "ranks")]
    pub dests: Vec<Rank>,
}

/// A scenario that could not be used.
#[derive(Debug)]
pub enum ScenarioError {
    /// The file could not be read.
    Io(String, std::io::Error),
    /// Not JSON, or not the contract (unknown field, wrong type, bad value): with the
    /// position serde_json gives.
    Parse(serde_json::Error),
    /// The fields are each fine but do not fit together.
    Invalid(String),
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScenarioError::Io(path, e) => write!(f, "cannot read {path}: {e}"),
            ScenarioError::Parse(e) => write!(f, "bad scenario: {e}"),
            ScenarioError::Invalid(what) => write!(f, "bad scenario: {what}"),
        }
    }
}

impl std::error::Error for ScenarioError {}

impl Scenario {
    /// Parses and checks a scenario from JSON text.
    pub fn from_json(text: &str) -> Result<Scenario, ScenarioError> {
        #[derive(Deserialize)]
        struct RanksOnly {
            ranks: Option<u32>,
        }
        // A first pass reads `ranks` (wherever it sits in the object) so that the second
        // can check every rank in place and report its position.
        let ranks = serde_json::from_str::<RanksOnly>(text)
            .ok()
            .and_then(|r| r.ranks);
        RANKS.with(|c| c.set(ranks));
        let parsed = serde_json::from_str::<Scenario>(text);
        RANKS.with(|c| c.set(None));
        let scenario = parsed.map_err(ScenarioError::Parse)?;
        scenario.check()?;
        Ok(scenario)
    }

    /// Reads, parses and checks a scenario file.
    pub fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Io(path.display().to_string(), e))?;
        Scenario::from_json(&text)
    }

    /// Cross-field checks.
    pub fn check(&self) -> Result<(), ScenarioError> {
        let invalid = |s: String| Err(ScenarioError::Invalid(s));
        if self.ranks == 0 {
            return invalid("\"ranks\" must be at least 1".into());
        }
        if self.detector.timeout_ms <= self.detector.period_ms {
            return invalid(format!(
                "detector.timeout_ms ({}) must exceed detector.period_ms ({})",
                self.detector.timeout_ms, self.detector.period_ms
            ));
        }
        for (i, kill) in self.kill.iter().enumerate() {
            if kill.rank >= self.ranks {
                return invalid(format!(
                    "kill[{i}]: rank {} out of range (ranks = {})",
                    kill.rank, self.ranks
                ));
            }
            if let Err(e) = kill.point() {
                return invalid(format!("kill[{i}]: {e}"));
            }
        }
        for (i, action) in self.actions.iter().enumerate() {
            match action.kind() {
                Err(e) => return invalid(format!("actions[{i}]: {e}")),
                Ok(ActionKind::Broadcast(b)) => {
                    let bad = b
                        .outputs
                        .iter()
                        .flat_map(|o| o.dests.iter())
                        .chain(Some(&b.root))
                        .find(|r| **r >= self.ranks);
                    if let Some(r) = bad {
                        return invalid(format!(
                            "actions[{i}]: rank {r} out of range (ranks = {})",
                            self.ranks
                        ));
                    }
                    if let Err(e) = b.plan_spec(self.ranks) {
                        return invalid(format!("actions[{i}]: broadcast: {e}"));
                    }
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// The checked actions with their times, in file order.
    pub fn action_kinds(&self) -> Vec<(f64, ActionKind)> {
        self.actions
            .iter()
            .filter_map(|a| a.kind().ok().map(|k| (a.at_ms, k)))
            .collect()
    }
}

fn check_rank<E: de::Error>(r: u64) -> Result<Rank, E> {
    let ranks = RANKS.with(|c| c.get());
    match ranks {
        Some(n) if r >= u64::from(n) => {
            Err(E::custom(format!("rank {r} out of range (ranks = {n})")))
        }
        _ => Rank::try_from(r).map_err(|_| E::custom(format!("rank {r} out of range"))),
    }
}

fn rank<'de, D: Deserializer<'de>>(d: D) -> Result<Rank, D::Error> {
    check_rank(u64::deserialize(d)?)
}

fn ranks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Rank>, D::Error> {
    Vec::<u64>::deserialize(d)?
        .into_iter()
        .map(check_rank)
        .collect()
}

fn check_time<E: de::Error>(v: f64) -> Result<f64, E> {
    if !v.is_finite() {
        Err(E::custom(format!("time {v} ms is not a finite number")))
    } else if v < 0.0 {
        Err(E::custom(format!("negative time {v} ms")))
    } else {
        Ok(v)
    }
}

fn time_ms<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    check_time(f64::deserialize(d)?)
}

fn optional_time_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)?.map(check_time).transpose()
}

fn non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(de::Error::custom(format!(
            "{v} must be a finite number ≥ 0"
        )))
    }
}

fn optional_non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)?
        .map(|v| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(de::Error::custom(format!(
                    "{v} must be a finite number ≥ 0"
                )))
            }
        })
        .transpose()
}

fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(de::Error::custom(format!(
            "{v} must be a finite number > 0"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_design_example_parses() {
        let s = Scenario::from_json(
            r#"{ "ranks": 1024, "seed": 7,
  "network":  { "latency_us": 1.5, "gbytes_per_s": 10.0 },
  "detector": { "period_ms": 10, "timeout_ms": 40 },
  "kill": [ {"rank": 17, "at_ms": 5.0}, {"rank": 3, "on": "send", "kind": "agree", "nth": 2} ],
  "actions": [
    { "at_ms": 100, "validate_local": {} },
    { "at_ms": 150, "validate_global": {} },
    { "at_ms": 300, "broadcast": { "root": 0, "topology": "binomial",
                                   "strategy": "per-class",
                                   "outputs": [ {"name": "A", "bytes": 65536, "dests": [1, 2, 3]} ] } } ],
  "until_ms": 1000 }"#,
        )
        .unwrap();
        assert_eq!(
            s.kill[1].point().unwrap(),
            KillPoint::BeforeSend {
                family: "agree",
                nth: 2
            }
        );
        assert_eq!(s.action_kinds().len(), 3);
    }

    #[test]
    fn errors_name_the_position() {
        let e = Scenario::from_json(
            "{\"ranks\": 4,\n \"kill\": [{\"rank\": 9, \"at_ms\": 1}], \"until_ms\": 5}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 9 out of range (ranks = 4)") && e.contains("line 2"),
            "{e}"
        );
        let e = Scenario::from_json("{\"ranks\": 4, \"until_ms\": -5}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("negative time") && e.contains("column"), "{e}");
        let e = Scenario::from_json("{\"ranks\": 4, \"until_ms\": 5, \"colour\": 1}")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field `colour`") && e.contains("line 1"),
            "{e}"
        );
    }
}
