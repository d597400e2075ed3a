//! The scenario file of `ftsim run` (DESIGN.md's contract): types, parsing, checks.
//!
//! Times are simulated milliseconds (floats). Every object refuses unknown fields. Checks
//! that a single value can fail (negative or non-finite time, rank `>= ranks`, a zero
//! period) are made while parsing, so the error carries the file position serde_json
//! reports (`line L column C`). Checks across fields follow the parse and name the
//! offending entry (`kill[2]`, `actions[0]`).
//!
//! Extensions beyond the contract (optional): `network.jitter_us`, the upper bound of
//! the uniform random extra delay per message (default: half of `latency_us`),
//! `detector.phases`, `"random"` (default) or `"staggered"` heartbeat phases, and
//! `ranks_per_node` (below).
//!
//! # Node failures
//!
//! Launchers place ranks on nodes in blocks, so a node failure kills a run of adjacent
//! ranks at once. A kill may name such a block, `{"ranks": [first, last], "at_ms": t}`,
//! beside the single-rank form `{"rank": r, ...}`. The block is `first..=last` on the
//! ring: when `first > last` it wraps, `first..n-1` then `0..=last` (`[n-4, 3]` is eight
//! ranks). A scenario may declare `"ranks_per_node": R`: every rank's detector then finds
//! a run of up to `R` adjacent deaths in one timeout (`DetectorConfig::span`; without it,
//! `ft_core::detector::DEFAULT_SPAN`). Blocks need not line up with `R`.
//!
//! Invariants of a checked scenario (parse and [`Scenario::check`]):
//! - every rank a kill names is `< ranks`, and no block covers every rank (at least one
//!   rank is left to observe it);
//! - no rank is named by two kills (a block counts for each of its ranks);
//! - a block dies at one moment, so it takes `at_ms` only: a step kill (`on`, `kind`,
//!   `nth`) counts one rank's own frames and names a single `rank`;
//! - `1 ≤ ranks_per_node ≤ ranks`.

use std::cell::Cell;
use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use ft_bcast::{OutputSpec, PlanSpec, Strategy, Topology};
use ft_core::detector::DEFAULT_SPAN;
use ft_core::wire::Family;
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
    /// Ranks per node (optional): the detector span of every rank (see the module docs).
    #[serde(default, deserialize_with = "optional_ranks_per_node")]
    pub ranks_per_node: Option<u32>,
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
    /// Descheduling: random pauses of every rank (optional).
    #[serde(default)]
    pub load: Option<Load>,
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

/// A load model: each rank is descheduled again and again, as on an oversubscribed
/// node. The gaps between a rank's pauses are uniform in `[0, 2 · mean_gap_ms)` and each
/// pause uniform in `[0, pause_max_ms]`, drawn from the scenario's seed (a stream of
/// their own: the network's jitter is the same with or without load).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Load {
    /// The longest pause, milliseconds.
    #[serde(deserialize_with = "non_negative")]
    pub pause_max_ms: f64,
    /// Mean time between the start of a rank's pauses, milliseconds.
    #[serde(deserialize_with = "positive")]
    pub mean_gap_ms: f64,
    /// No pause starts after this time, milliseconds (default: the end of the run).
    #[serde(default, deserialize_with = "optional_time_ms")]
    pub until_ms: Option<f64>,
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

/// One kill: of a rank or a block of adjacent ranks, at a time (`at_ms`) or, for a
/// single rank, at a protocol step (`on`, `kind`, `nth`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kill {
    /// The rank to kill.
    #[serde(default, deserialize_with = "optional_rank")]
    pub rank: Option<Rank>,
    /// The block to kill, `[first, last]` on the ring (wrapping when `first > last`).
    #[serde(default, deserialize_with = "optional_block")]
    pub ranks: Option<[Rank; 2]>,
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

/// Who a kill takes, once checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// One rank.
    Rank(Rank),
    /// The ranks `first..=last` on the ring of `n`: `first..n-1` then `0..=last` when
    /// `first > last`.
    Block {
        /// First rank of the block (in ring order).
        first: Rank,
        /// Last rank of the block (in ring order).
        last: Rank,
    },
}

impl Victims {
    /// How many ranks, in a communicator of `n`.
    pub fn len(&self, n: u32) -> u32 {
        match *self {
            Victims::Rank(_) => 1,
            Victims::Block { first, last } if first <= last => last - first + 1,
            Victims::Block { first, last } => n - first + last + 1,
        }
    }

    /// The ranks in ring order from the first, in a communicator of `n`.
    pub fn ranks(&self, n: u32) -> impl Iterator<Item = Rank> {
        let first = match *self {
            Victims::Rank(r) => r,
            Victims::Block { first, .. } => first,
        };
        (0..self.len(n)).map(move |i| ((u64::from(first) + u64::from(i)) % u64::from(n)) as Rank)
    }

    /// Why a block of every rank of `n` is refused (`None` for any other kill).
    fn leaves_no_survivor(&self, n: u32) -> Option<String> {
        (matches!(self, Victims::Block { .. }) && self.len(n) >= n)
            .then(|| format!("{self} covers all {n} ranks (leave at least one survivor)"))
    }

    /// The ranks as one or two ascending, inclusive ranges (a wrapping block is two).
    fn ranges(&self, n: u32) -> impl Iterator<Item = (Rank, Rank)> {
        let (a, b) = match *self {
            Victims::Rank(r) => ((r, r), None),
            Victims::Block { first, last } if first <= last => ((first, last), None),
            Victims::Block { first, last } => ((first, n - 1), Some((0, last))),
        };
        std::iter::once(a).chain(b)
    }
}

impl fmt::Display for Victims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Victims::Rank(r) => write!(f, "rank {r}"),
            Victims::Block { first, last } => write!(f, "block [{first}, {last}]"),
        }
    }
}

/// When a kill happens, once checked.
#[derive(Clone, Debug, PartialEq)]
pub enum KillPoint {
    /// At this simulated time (milliseconds).
    At(f64),
    /// Just before the rank sends its `nth` frame of protocol `family`.
    BeforeSend {
        /// The protocol whose frames are counted.
        family: Family,
        /// From 1.
        nth: u64,
    },
}

impl Kill {
    /// Who dies, or why the entry is inconsistent.
    pub fn victims(&self) -> Result<Victims, String> {
        match (self.rank, self.ranks) {
            (Some(r), None) => Ok(Victims::Rank(r)),
            (None, Some([first, last])) => Ok(Victims::Block { first, last }),
            _ => Err("give either \"rank\" or \"ranks\": [first, last]".into()),
        }
    }

    /// The kill point, or why the entry is inconsistent.
    pub fn point(&self) -> Result<KillPoint, String> {
        match (self.at_ms, &self.on, &self.kind, self.nth) {
            (Some(at), None, None, None) => Ok(KillPoint::At(at)),
            (None, Some(on), Some(kind), Some(nth)) => {
                if self.ranks.is_some() {
                    return Err("a block dies at one moment: give it \"at_ms\" (a step \
                                kill counts one rank's frames and names a single \"rank\")"
                        .into());
                }
                if on != "send" {
                    return Err(format!("\"on\" must be \"send\", not {on:?}"));
                }
                let family = Family::from_name(kind).ok_or_else(|| {
                    let names = Family::ALL.map(Family::name);
                    format!("\"kind\" must be one of {names:?}, not {kind:?}")
                })?;
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
    /// The kind of validation it runs (`"local"`, `"global"`), as the report names it.
    pub fn validation_kind(&self) -> Option<&'static str> {
        match self {
            ActionKind::ValidateLocal => Some("local"),
            ActionKind::ValidateGlobal => Some("global"),
            ActionKind::Broadcast(_) => None,
        }
    }

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
        if let Some(per_node) = self.ranks_per_node {
            if per_node > self.ranks {
                return invalid(format!(
                    "\"ranks_per_node\" ({per_node}) exceeds \"ranks\" ({})",
                    self.ranks
                ));
            }
        }
        // Each kill's ranks as ascending ranges, tagged with the entry, to find overlaps.
        let mut ranges: Vec<(Rank, Rank, usize)> = Vec::new();
        for (i, kill) in self.kill.iter().enumerate() {
            let victims = kill
                .victims()
                .and_then(|v| kill.point().map(|_| v))
                .map_err(|e| ScenarioError::Invalid(format!("kill[{i}]: {e}")))?;
            // Parsing checked these in place when `ranks` was readable; this catches the rest.
            if let Some(r) = [
                kill.rank,
                kill.ranks.map(|b| b[0]),
                kill.ranks.map(|b| b[1]),
            ]
            .into_iter()
            .flatten()
            .find(|&r| r >= self.ranks)
            {
                return invalid(format!(
                    "kill[{i}]: rank {r} out of range (ranks = {})",
                    self.ranks
                ));
            }
            if let Some(e) = victims.leaves_no_survivor(self.ranks) {
                return invalid(format!("kill[{i}]: {e}"));
            }
            ranges.extend(victims.ranges(self.ranks).map(|(a, b)| (a, b, i)));
        }
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            let ((_, end, i), (start, _, j)) = (pair[0], pair[1]);
            if start <= end {
                let (i, j) = (i.min(j), i.max(j));
                return invalid(format!(
                    "kill[{j}] and kill[{i}] both kill rank {start} (a rank dies once)"
                ));
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

    /// The checked kills, in file order.
    pub fn kills(&self) -> Vec<(Victims, KillPoint)> {
        self.kill
            .iter()
            .filter_map(|k| Some((k.victims().ok()?, k.point().ok()?)))
            .collect()
    }

    /// The detector span of every rank: `ranks_per_node`, or
    /// [`DEFAULT_SPAN`] when the scenario does not say.
    pub fn detector_span(&self) -> u32 {
        self.ranks_per_node.unwrap_or(DEFAULT_SPAN)
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

fn optional_rank<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Rank>, D::Error> {
    Option::<u64>::deserialize(d)?.map(check_rank).transpose()
}

/// A block `[first, last]`: both ranks in range, and not every rank of the ring.
fn optional_block<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[Rank; 2]>, D::Error> {
    let Some([first, last]) = Option::<[u64; 2]>::deserialize(d)? else {
        return Ok(None);
    };
    let (first, last) = (
        check_rank::<D::Error>(first)?,
        check_rank::<D::Error>(last)?,
    );
    if let Some(e) = RANKS
        .with(|c| c.get())
        .and_then(|n| Victims::Block { first, last }.leaves_no_survivor(n))
    {
        return Err(de::Error::custom(e));
    }
    Ok(Some([first, last]))
}

fn optional_ranks_per_node<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<u32>::deserialize(d)? {
        Some(0) => Err(de::Error::custom("\"ranks_per_node\" must be at least 1")),
        other => Ok(other),
    }
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
                family: Family::Agree,
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

    fn error_of(kills: &str) -> String {
        Scenario::from_json(&format!(
            "{{\"ranks\": 16,\n \"kill\": [{kills}], \"until_ms\": 5}}"
        ))
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn a_kill_may_name_a_block_that_wraps_around_the_ring() {
        let s = Scenario::from_json(
            r#"{"ranks": 16, "ranks_per_node": 4, "until_ms": 5,
                "kill": [{"ranks": [4, 7], "at_ms": 1}, {"ranks": [14, 1], "at_ms": 2},
                         {"rank": 9, "at_ms": 3}, {"rank": 10, "on": "send", "kind": "agree", "nth": 1}]}"#,
        )
        .unwrap();
        let kills = s.kills();
        assert_eq!(
            kills[0],
            (Victims::Block { first: 4, last: 7 }, KillPoint::At(1.0))
        );
        assert_eq!(kills[1].0.ranks(16).collect::<Vec<_>>(), [14, 15, 0, 1]);
        assert_eq!(kills[2].0, Victims::Rank(9));
        assert_eq!(kills[1].0.to_string(), "block [14, 1]");
        assert_eq!(s.detector_span(), 4);
        let plain = Scenario::from_json(r#"{"ranks": 2, "until_ms": 5}"#).unwrap();
        assert_eq!(plain.detector_span(), DEFAULT_SPAN);
    }

    #[test]
    fn bad_blocks_and_overlaps_are_named() {
        let e = error_of(r#"{"ranks": [3, 16], "at_ms": 1}"#);
        assert!(
            e.contains("rank 16 out of range (ranks = 16)") && e.contains("line 2"),
            "{e}"
        );
        let e = error_of(r#"{"ranks": [5, 4], "at_ms": 1}"#);
        assert!(
            e.contains("block [5, 4] covers all 16 ranks") && e.contains("line 2"),
            "{e}"
        );
        let e = error_of(r#"{"ranks": [0, 15], "at_ms": 1}"#);
        assert!(e.contains("covers all 16 ranks"), "{e}");
        let e = error_of(
            r#"{"ranks": [2, 5], "at_ms": 1}, {"rank": 9, "at_ms": 1}, {"ranks": [14, 2], "at_ms": 2}"#,
        );
        assert_eq!(
            e,
            "bad scenario: kill[2] and kill[0] both kill rank 2 (a rank dies once)"
        );
        let e = error_of(
            r#"{"rank": 3, "at_ms": 1}, {"rank": 3, "on": "send", "kind": "agree", "nth": 1}"#,
        );
        assert!(e.contains("kill[1] and kill[0] both kill rank 3"), "{e}");
        let e = error_of(r#"{"ranks": [2, 5], "on": "send", "kind": "agree", "nth": 1}"#);
        assert!(e.contains("kill[0]: a block dies at one moment"), "{e}");
        let e = error_of(r#"{"rank": 2, "ranks": [2, 5], "at_ms": 1}"#);
        assert!(
            e.contains("kill[0]: give either \"rank\" or \"ranks\""),
            "{e}"
        );
        let e = error_of(r#"{"at_ms": 1}"#);
        assert!(e.contains("kill[0]: give either"), "{e}");
        let e = Scenario::from_json(r#"{"ranks": 16, "ranks_per_node": 0, "until_ms": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"ranks_per_node\" must be at least 1") && e.contains("column"),
            "{e}"
        );
        let e = Scenario::from_json(r#"{"ranks": 16, "ranks_per_node": 17, "until_ms": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"ranks_per_node\" (17) exceeds \"ranks\" (16)"),
            "{e}"
        );
    }
}
