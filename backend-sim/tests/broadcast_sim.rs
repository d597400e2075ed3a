//! Broadcasts under the simulator, with the whole stack on every rank (failure detector
//! and broadcaster): the PaRSEC #624 reproducer through a scenario file, and randomized
//! runs with kills at random times and at random broadcast send steps.
//!
//! What every run must show: every surviving destination releases exactly its outputs,
//! each once, byte-identical to the root's ([`payload`]); a surviving rank that is not
//! a destination releases nothing; no survivor ever sends a broadcast frame
//! (activation, request, data) to a rank it knows dead, so a dead rank is never used
//! as a parent again; and no rank copies a payload byte when it sends or forwards data
//! (the simulator takes chunks as shared slices); and in a failure-free run (per-class
//! or per-output), each destination gets each payload byte once. Ranks send chunks of
//! different sizes, so relays and repairs see every mix of chunkings, and half of them
//! send a head ahead of its payload when they can (`set_early_heads`).
//!
//! `FT_BCAST_SIM_CASES=N` sets the number of randomized runs (default 300);
//! `FT_BCAST_SIM_SEED=S` replays the one run of seed `S` (`FT_BCAST_SIM_DEBUG=1` dumps
//! its departures, detections, releases and every broadcaster).

use std::collections::{BTreeMap, BTreeSet};

use backend_sim::engine::{Departure, Observation, RankSetup, Sim, SimRank, SplitMix};
use backend_sim::failure::{run_scenario, RunOptions};
use backend_sim::scenario::{ActionKind, Scenario};
use backend_sim::stack::{payload, SimStack};
use ft_bcast::StackEvent;
use ft_core::view::FailureView;
use ft_core::wire::{Family, FrameKind, MAX_CHUNK};
use ft_core::{
    BufferTooShort, Filled, FrameError, Instant, Promise, Protocol, Rank, Slot, Transmit,
    TransmitParts,
};
use serde_json::json;

const TOPOLOGIES: [&str; 4] = ["star", "chain", "binomial", "kary:2"];
const STRATEGIES: [&str; 3] = ["per-class", "fetch-for-descendants", "per-output"];

/// A scenario with one broadcast at `at_ms`.
fn scenario(
    ranks: u32,
    seed: u64,
    kill: serde_json::Value,
    broadcast: serde_json::Value,
    at_ms: f64,
    until_ms: f64,
) -> Scenario {
    let text = json!({
        "ranks": ranks, "seed": seed,
        "network": { "latency_us": 1.5, "gbytes_per_s": 10.0 },
        "detector": { "period_ms": 10, "timeout_ms": 40 },
        "kill": kill,
        "actions": [ { "at_ms": at_ms, "broadcast": broadcast } ],
        "until_ms": until_ms,
    })
    .to_string();
    Scenario::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Rank -> the output names it needs, from a broadcast action.
fn needs_of(broadcast: &serde_json::Value) -> BTreeMap<Rank, BTreeSet<String>> {
    let mut needs: BTreeMap<Rank, BTreeSet<String>> = BTreeMap::new();
    for o in broadcast["outputs"].as_array().unwrap() {
        for d in o["dests"].as_array().unwrap() {
            needs
                .entry(d.as_u64().unwrap() as Rank)
                .or_default()
                .insert(o["name"].as_str().unwrap().to_string());
        }
    }
    needs
}

#[test]
fn issue_624_reproducer_and_mirror_under_every_strategy_and_topology() {
    // #624: A to ranks 1 and 2, B to rank 2 only; the mirror: B to rank 1 only.
    let shapes = [
        json!([{"name": "A", "bytes": 1024, "dests": [1, 2]},
               {"name": "B", "bytes": 4096, "dests": [2]}]),
        json!([{"name": "A", "bytes": 1024, "dests": [1, 2]},
               {"name": "B", "bytes": 4096, "dests": [1]}]),
    ];
    for outputs in &shapes {
        for strategy in STRATEGIES {
            for topology in TOPOLOGIES {
                let b = json!({"root": 0, "topology": topology, "strategy": strategy,
                               "outputs": outputs});
                let s = scenario(3, 1, json!([]), b.clone(), 20.0, 40.0);
                let options = RunOptions {
                    per_rank: true,
                    ..RunOptions::default()
                };
                let (report, _) = run_scenario(&s, options).expect("run");
                let needs = needs_of(&b);
                for r in report.per_rank.as_ref().unwrap() {
                    let what = format!("{strategy} {topology} rank {}", r.rank);
                    assert!(r.alive, "{what}");
                    let want = needs.get(&r.rank).cloned().unwrap_or_default();
                    if want.is_empty() {
                        assert!(r.received.is_empty(), "{what}: {:?}", r.received);
                        continue;
                    }
                    // One entry per broadcast, per-output releases merged.
                    assert_eq!(r.received.len(), 1, "{what}: {:?}", r.received);
                    let got: BTreeSet<String> = r.received[0].outputs.iter().cloned().collect();
                    assert_eq!(got.len(), r.received[0].outputs.len(), "{what}");
                    assert_eq!(got, want, "{what}");
                    assert!(r.received[0].finished_ms >= 20.0, "{what}");
                }
                assert_eq!(report.extra.rejected, 0, "{strategy} {topology}");
            }
        }
    }
}

#[test]
fn bad_broadcast_actions_are_refused_when_the_scenario_loads() {
    let base = |b: serde_json::Value| {
        json!({"ranks": 4, "until_ms": 10, "actions": [{"at_ms": 1, "broadcast": b}]}).to_string()
    };
    let cases = [
        (
            json!({"root": 0, "topology": "ring", "strategy": "per-class", "outputs": []}),
            "topology must be one of",
        ),
        (
            json!({"root": 0, "topology": "star", "strategy": "merged", "outputs": []}),
            "strategy must be one of",
        ),
        (
            json!({"root": 0, "topology": "star", "strategy": "per-class",
                   "outputs": [{"name": "A", "bytes": 1, "dests": [0, 1]}]}),
            "actions[0]: broadcast:",
        ),
        (
            json!({"root": 0, "topology": "star", "strategy": "per-class",
                   "outputs": [{"name": "A", "bytes": 1, "dests": [1]},
                               {"name": "A", "bytes": 1, "dests": [2]}]}),
            "actions[0]: broadcast:",
        ),
    ];
    for (b, expected) in cases {
        let e = Scenario::from_json(&base(b.clone()))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{b}: {e}");
    }
}

#[test]
fn the_shipped_scenarios_deliver_to_every_surviving_destination() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    for file in ["broadcast.json", "demo.json"] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let s = Scenario::from_json(&text).unwrap();
        let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
        let options = RunOptions {
            per_rank: true,
            ..RunOptions::default()
        };
        let (report, _) = run_scenario(&s, options).expect("run");
        let per_rank = report.per_rank.as_ref().unwrap();
        let mut index = 0;
        for action in raw["actions"].as_array().unwrap() {
            let Some(b) = action.get("broadcast") else {
                continue;
            };
            let needs = needs_of(b);
            for r in per_rank.iter().filter(|r| r.alive) {
                let got: BTreeSet<String> = r
                    .received
                    .iter()
                    .filter(|x| x.broadcast == index)
                    .flat_map(|x| x.outputs.iter().cloned())
                    .collect();
                let want = needs.get(&r.rank).cloned().unwrap_or_default();
                assert_eq!(got, want, "{file}: broadcast {index} at rank {}", r.rank);
            }
            index += 1;
        }
        assert!(index > 0, "{file} has no broadcast");
    }
}

// ----- randomized runs -----

/// The stack, watched: records every broadcast frame a rank sends to a rank it already
/// knows dead (there must be none).
#[derive(Debug)]
struct Watched {
    inner: SimStack,
    to_known_dead: Vec<(Rank, u8)>,
}

impl Watched {
    /// Records a broadcast frame of kind `code` to `to` if `to` is known dead.
    fn watch(&mut self, to: Rank, code: u8) {
        let kind = FrameKind::from_code(code).expect("own frames are valid");
        if kind.family() == Family::Bcast && self.inner.view().is_known_failed(to) {
            self.to_known_dead.push((to, code));
        }
    }
}

impl Protocol for Watched {
    type Event = StackEvent;
    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        self.inner.handle_message(now, from, bytes)
    }
    fn place_payload(&mut self, now: Instant, from: Rank, head: &[u8], len: usize) -> Option<Slot> {
        self.inner.place_payload(now, from, head, len)
    }
    fn handle_message_placed(
        &mut self,
        now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        self.inner.handle_message_placed(now, from, head, payload)
    }
    fn placement_lost(&mut self, now: Instant, slot: Slot) {
        self.inner.placement_lost(now, slot);
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now);
    }
    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        let Some(t) = self.inner.poll_transmit(now, buf)? else {
            return Ok(None);
        };
        self.watch(t.to, buf[1]);
        Ok(Some(t))
    }
    fn poll_transmit_parts(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        let Some(t) = self.inner.poll_transmit_parts(now, buf)? else {
            return Ok(None);
        };
        match t.promise {
            None | Some(Promise::Head { .. }) => self.watch(t.to, buf[1]),
            // A payload whose head went ahead goes to that head's peer, so to `t.to`.
            Some(Promise::Payload { .. }) => self.watch(t.to, FrameKind::BcastData as u8),
            Some(Promise::Withdrawn { .. }) => {}
        }
        Ok(Some(t))
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.inner.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<StackEvent> {
        self.inner.poll_event()
    }
}

impl SimRank for Watched {
    fn view(&self) -> &FailureView {
        self.inner.view()
    }
    fn is_stopped(&self) -> bool {
        self.inner.is_stopped()
    }
    fn supports(action: &ActionKind) -> Result<(), String> {
        SimStack::supports(action)
    }
    fn apply(&mut self, now: Instant, action: &ActionKind, index: u32) -> Result<(), String> {
        self.inner.apply(now, action, index)
    }
    fn observe(&self, now: Instant, event: &StackEvent) -> Option<Observation> {
        self.inner.observe(now, event)
    }
}

/// One random case: the broadcast action, the kills, and what it exercises.
struct Case {
    n: u32,
    broadcast: serde_json::Value,
    kill: serde_json::Value,
    /// Output sizes, by index.
    sizes: Vec<u64>,
}

const BROADCAST_AT_MS: f64 = 30.0;

fn random_case(seed: u64) -> Case {
    let mut rng = SplitMix::new(seed);
    let n = 3 + rng.below(198) as u32;
    let root = rng.below(n.into()) as Rank;
    let m = 1 + rng.below(8) as usize;
    let mut outputs = Vec::new();
    let mut sizes = Vec::new();
    for j in 0..m {
        let percent = [5, 30, 90][rng.below(3) as usize];
        let mut dests: Vec<Rank> = (0..n)
            .filter(|&r| r != root && rng.below(100) < percent)
            .collect();
        if dests.is_empty() {
            dests.push((root + 1 + rng.below(u64::from(n) - 1) as Rank) % n);
        }
        let bytes = [0, 1, 100, 3000, 2 * MAX_CHUNK as u64 + 7][rng.below(5) as usize];
        sizes.push(bytes);
        outputs.push(json!({"name": format!("o{j}"), "bytes": bytes, "dests": dests}));
    }
    let broadcast = json!({
        "root": root,
        "topology": TOPOLOGIES[rng.below(4) as usize],
        "strategy": STRATEGIES[rng.below(3) as usize],
        "outputs": outputs,
    });
    // Up to 4 victims (never the root: without it nobody holds the outputs), each
    // killed before the broadcast (so the plan holds a rank nobody knows dead yet),
    // during it, somewhat after, or just before its k-th broadcast frame.
    let victims = rng.below(5.min(u64::from(n) - 1));
    let mut kill = Vec::new();
    let mut chosen = BTreeSet::new();
    for _ in 0..victims {
        let rank = (root + 1 + rng.below(u64::from(n) - 1) as Rank) % n;
        if !chosen.insert(rank) {
            continue;
        }
        let at = match rng.below(4) {
            0 => BROADCAST_AT_MS - 15.0 * rng.below(1000) as f64 / 1000.0,
            1 => BROADCAST_AT_MS + 0.05 * rng.below(1000) as f64 / 1000.0,
            2 => BROADCAST_AT_MS + 60.0 * rng.below(1000) as f64 / 1000.0,
            _ => {
                let nth = 1 + rng.below(6);
                kill.push(json!({"rank": rank, "on": "send", "kind": "bcast", "nth": nth}));
                continue;
            }
        };
        kill.push(json!({"rank": rank, "at_ms": at}));
    }
    Case {
        n,
        broadcast,
        kill: serde_json::Value::Array(kill),
        sizes,
    }
}

/// Kills that struck a rank while a broadcast was under way (within 1 ms of its start),
/// and all kills, over a run.
#[derive(Default)]
struct Struck {
    mid_broadcast: usize,
    total: usize,
    /// Payload bytes the ranks sent (as shared slices), over the run.
    payload_sent: u64,
    /// Payload bytes the ranks received that they held already (repairs), over the run.
    duplicate_received: u64,
    /// Failure-free runs whose bytes were counted (each payload byte once per
    /// destination).
    failure_free_checked: usize,
    /// Payload bytes received straight into their output's buffer, over the run.
    landed: u64,
    /// Payload bytes copied to join multi-chunk outputs, over the run.
    joined: u64,
    /// Of those, in failure-free runs (where every multi-chunk output lands: 0).
    joined_failure_free: u64,
    /// Data frames whose head went ahead of their payload, over the run.
    heads_early: u64,
}

fn at_ms(ms: f64) -> Instant {
    Instant::from_nanos((ms * 1e6) as u64)
}

/// Whether every survivor knows every rank that left the run.
fn all_departures_known(sim: &Sim<Watched>) -> bool {
    let log = sim.log();
    sim.survivors().all(|r| {
        log.departures
            .keys()
            .all(|&d| sim.machine(r).view().is_known_failed(d))
    })
}

/// Runs past the broadcast until every survivor knows every departed rank (the
/// heartbeat ring finds a run of adjacent dead ranks one after the other, so this can
/// take several timeouts), then 20 ms more for the repair; again if that repair made
/// another rank reach its kill step.
fn settle(sim: &mut Sim<Watched>) -> Result<(), String> {
    sim.run_until(at_ms(BROADCAST_AT_MS + 100.0))
        .map_err(|e| e.to_string())?;
    loop {
        let deadline = sim.now() + ft_core::Duration::from_millis(2000);
        sim.drive_until(deadline, all_departures_known)
            .map_err(|e| format!("failures not learned: {e}"))?;
        let departed = sim.log().departures.len();
        let now = sim.now();
        sim.run_until(now + ft_core::Duration::from_millis(20))
            .map_err(|e| e.to_string())?;
        if sim.log().departures.len() == departed {
            return Ok(());
        }
    }
}

/// Runs one case and checks it; returns a description of the failure, if any.
fn run_case(seed: u64, struck: &mut Struck) -> Result<(), String> {
    let case = random_case(seed);
    let s = scenario(
        case.n,
        seed,
        case.kill.clone(),
        case.broadcast.clone(),
        BROADCAST_AT_MS,
        10_000.0,
    );
    let mut make = SimStack::factory(&s);
    let mut sim: Sim<Watched> = Sim::new(&s, |setup: &RankSetup| {
        let mut inner = make(setup);
        let pick = SplitMix::new(seed ^ u64::from(setup.rank) << 32).below(6);
        let stack = inner.stack_mut();
        stack.set_chunk_bytes([MAX_CHUNK, 20_000, 48_000][pick as usize % 3]);
        // Half the ranks send heads ahead of their payloads, as over MPI.
        stack.set_early_heads(pick >= 3);
        Watched {
            inner,
            to_known_dead: Vec::new(),
        }
    })
    .map_err(|e| e.to_string())?;
    sim.set_event_budget(50_000_000);
    settle(&mut sim)?;

    for how in sim.log().departures.values() {
        if let Departure::Killed(at) = how {
            struck.total += 1;
            let at = at.as_millis_f64();
            struck.mid_broadcast +=
                usize::from((BROADCAST_AT_MS..BROADCAST_AT_MS + 1.0).contains(&at));
        }
    }
    let context = || {
        format!(
            "seed {seed}: n = {}, kills {}, broadcast {}",
            case.n, case.kill, case.broadcast
        )
    };
    let needs = needs_of(&case.broadcast);
    let log = sim.log();
    if std::env::var("FT_BCAST_SIM_DEBUG").is_ok() {
        eprintln!("departures {:?}", log.departures);
        for (d, e) in &log.detections {
            eprintln!("detect {d}: {:?}", e.learned);
        }
        for r in 0..case.n {
            eprintln!("rank {r} received {:?}", log.received.get(&r));
            eprintln!(
                "rank {r} stack {:#?}",
                sim.machine(r).inner.stack().broadcaster()
            );
        }
    }
    for r in 0..case.n {
        let m = sim.machine(r);
        if let Some(&(to, kind)) = m.to_known_dead.first() {
            return Err(format!(
                "rank {r} sent a frame of kind {kind} to {to}, known dead: {}",
                context()
            ));
        }
        let stats = m.inner.stack().bcast_stats();
        struck.payload_sent += stats.payload_bytes_sent;
        struck.duplicate_received += stats.received_bytes_duplicate;
        struck.landed += stats.received_bytes_landed;
        struck.joined += stats.joined_bytes;
        struck.heads_early += stats.heads_sent_early;
        if log.departures.is_empty() {
            struck.joined_failure_free += stats.joined_bytes;
        }
        let copied = stats.payload_bytes_copied;
        if copied > 0 {
            return Err(format!(
                "rank {r} copied {copied} payload bytes: {}",
                context()
            ));
        }
        if !sim.is_alive(r) {
            continue;
        }
        let mut released: BTreeMap<&str, usize> = BTreeMap::new();
        for entry in log.received.get(&r).into_iter().flatten() {
            if entry.broadcast != 0 {
                return Err(format!("rank {r}: unknown broadcast: {}", context()));
            }
            for name in &entry.outputs {
                *released.entry(name.as_str()).or_default() += 1;
            }
        }
        let want = needs.get(&r).cloned().unwrap_or_default();
        let got: BTreeSet<String> = released.keys().map(|s| s.to_string()).collect();
        if got != want || released.values().any(|&c| c != 1) {
            return Err(format!(
                "rank {r} released {released:?}, needs {want:?}: {}",
                context()
            ));
        }
        for name in &want {
            let j: u32 = name[1..].parse().unwrap();
            let expected = payload(0, j, case.sizes[j as usize]);
            let root = case.broadcast["root"].as_u64().expect("a root") as Rank;
            let task = ft_bcast::TaskId::new(root, 0);
            let held = m
                .inner
                .stack()
                .broadcaster()
                .and_then(|b| b.output(task, j));
            if held != Some(&expected[..]) {
                return Err(format!(
                    "rank {r}: output {name} differs from the source: {}",
                    context()
                ));
            }
        }
    }
    // Failure-free, with a strategy whose destinations fetch exactly what they need:
    // the payload bytes sent (as root or relay, all ranks together) are each output's
    // size once per destination. Every destination holds its outputs (checked above),
    // so none received a byte twice: eager push and a request never both ran.
    let fetch_is_need = case.broadcast["strategy"] != "fetch-for-descendants";
    if log.departures.is_empty() && fetch_is_need {
        let sent: u64 = (0..case.n)
            .map(|r| {
                sim.machine(r)
                    .inner
                    .stack()
                    .bcast_stats()
                    .payload_bytes_sent
            })
            .sum();
        let once: u64 = needs
            .values()
            .flatten()
            .map(|name| {
                let j: usize = name[1..].parse().unwrap();
                case.sizes[j]
            })
            .sum();
        if sent != once {
            return Err(format!(
                "{sent} payload bytes sent, {once} needed once each: {}",
                context()
            ));
        }
        struck.failure_free_checked += 1;
    }
    Ok(())
}

/// The seeds to run: `FT_BCAST_SIM_SEED=s` for one (to replay a failure), else
/// `0..FT_BCAST_SIM_CASES` (default 300).
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match var("FT_BCAST_SIM_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..var("FT_BCAST_SIM_CASES").unwrap_or(300),
    }
}

#[test]
fn random_broadcasts_with_random_kills_deliver_exactly_and_byte_identically() {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let count = seeds.end - seeds.start;
    let mut struck = Struck::default();
    let failures: Vec<String> = seeds
        .filter_map(|seed| run_case(seed, &mut struck).err())
        .collect();
    eprintln!(
        "{count} randomized broadcast simulations in {:.1} s: {} kills, {} of them mid-broadcast; {} failure-free runs with each payload byte sent once per destination; {} payload bytes sent, {} received twice; {} received in place into their output's buffer, {} copied to join outputs ({} in failure-free runs); {} heads sent ahead of their payload",
        started.elapsed().as_secs_f64(),
        struck.total,
        struck.mid_broadcast,
        struck.failure_free_checked,
        struck.payload_sent,
        struck.duplicate_received,
        struck.landed,
        struck.joined,
        struck.joined_failure_free,
        struck.heads_early
    );
    assert!(struck.landed > 0, "no chunk was received in place");
    assert!(
        count < 100 || struck.heads_early > 0,
        "no head was sent ahead of its payload"
    );
    assert_eq!(
        struck.joined_failure_free, 0,
        "failure-free, every multi-chunk output lands in its one buffer"
    );
    assert!(
        struck.mid_broadcast * 10 >= count as usize,
        "too few kills mid-broadcast"
    );
    assert!(struck.payload_sent > 0, "no payload was sent at all");
    assert!(
        struck.failure_free_checked * 20 >= count as usize,
        "too few failure-free runs had their bytes counted ({})",
        struck.failure_free_checked
    );
    assert!(
        failures.is_empty(),
        "{} of {count} runs failed; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
