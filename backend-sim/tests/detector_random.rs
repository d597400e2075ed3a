//! Randomized, seeded simulations of the failure detector: many group sizes, failure
//! schedules and network delays. Each schedule is reproducible from its seed, which the
//! failure message names.
//!
//! - Strong completeness: after the last failure plus
//!   `timeout + period + (⌈log2 n⌉ + 1) · max delay` (plus `2 · timeout` per further
//!   ring-adjacent rank dying in the same run, which the ring must detect one by one),
//!   every survivor's `validate_local` holds exactly the killed ranks.
//! - The same with ranks killed while a notice is spreading (a probe run finds when the
//!   first failure is declared; the replay kills more ranks within the next few delays).
//! - Accuracy: with every delay below `timeout - period`, no live rank is ever suspected.

use backend_sim::engine::{Departure, Sim, SplitMix};
use backend_sim::failure::make_node;
use backend_sim::scenario::{ActionKind, Scenario};
use ft_core::node::Node;
use ft_core::{Duration, Instant, Rank};

const PERIOD_MS: f64 = 10.0;
const TIMEOUT_MS: f64 = 40.0;

struct Schedule {
    n: u32,
    kills: Vec<(Rank, f64)>,
    latency_us: f64,
    jitter_us: f64,
}

fn random_kills(rng: &mut SplitMix, n: u32, max_kills: u32, window_ms: u64) -> Vec<(Rank, f64)> {
    let count = rng.below(u64::from(max_kills.min(n - 1)) + 1) as u32;
    let mut kills: Vec<(Rank, f64)> = Vec::new();
    while kills.len() < count as usize {
        let rank = rng.below(u64::from(n)) as Rank;
        if kills.iter().all(|(r, _)| *r != rank) {
            let at = rng.below(window_ms * 1000) as f64 / 1000.0;
            kills.push((rank, at));
        }
    }
    kills
}

impl Schedule {
    fn killed(&self) -> Vec<Rank> {
        self.kills.iter().map(|(r, _)| *r).collect()
    }

    /// When every survivor must know every kill: the last kill, plus one detection
    /// (`timeout + period`), plus `2·timeout` per further rank of the longest run of
    /// ring-adjacent kills (found one at a time), plus `⌈log2 n⌉ + 1` hops of the
    /// largest network delay.
    fn detection_bound(&self, sim: &Sim<Node>) -> Instant {
        let last_kill = self.kills.iter().map(|(_, t)| *t).fold(0.0, f64::max);
        let run = u64::from(longest_adjacent_run(self.n, &self.killed()).max(1));
        Instant::from_nanos((last_kill * 1e6) as u64)
            + Duration::from_millis((TIMEOUT_MS + PERIOD_MS) as u64)
            + Duration::from_millis(2 * TIMEOUT_MS as u64 * (run - 1))
            + sim
                .net()
                .max_delay(256)
                .saturating_mul(ceil_log2(self.n) + 1)
    }
}

/// Validates locally everywhere and checks that every survivor's `L_i` is exactly the
/// killed set.
fn assert_every_survivor_lists_the_killed(sim: &mut Sim<Node>, s: &Schedule, seed: u64) {
    sim.act(&ActionKind::ValidateLocal, 0)
        .expect("validate_local");
    let mut expected = s.killed();
    expected.sort_unstable();
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

/// Every rank that left the run was killed by the schedule: none stopped because it was
/// (falsely) declared dead.
fn assert_no_live_rank_was_declared_dead(sim: &Sim<Node>, seed: u64) {
    for (&rank, how) in &sim.log().departures {
        assert!(
            matches!(how, Departure::Killed(_)),
            "seed {seed}: live rank {rank} was declared dead ({how:?})"
        );
    }
}

fn build(s: &Schedule, seed: u64) -> Sim<Node> {
    let kills: Vec<String> = s
        .kills
        .iter()
        .map(|(r, t)| format!(r#"{{"rank": {r}, "at_ms": {t}}}"#))
        .collect();
    let scenario = Scenario::from_json(&format!(
        r#"{{ "ranks": {}, "seed": {seed},
              "network": {{ "latency_us": {}, "jitter_us": {}, "gbytes_per_s": 10.0 }},
              "detector": {{ "period_ms": {PERIOD_MS}, "timeout_ms": {TIMEOUT_MS} }},
              "kill": [{}], "until_ms": 10000 }}"#,
        s.n,
        s.latency_us,
        s.jitter_us,
        kills.join(", ")
    ))
    .expect("scenario");
    Sim::new(&scenario, make_node).expect("sim")
}

/// Longest run of ring-consecutive killed ranks.
fn longest_adjacent_run(n: u32, killed: &[Rank]) -> u32 {
    let dead = |r: u32| killed.contains(&(r % n));
    if killed.len() as u32 == n {
        return n;
    }
    let mut best = 0;
    for &k in killed {
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

fn ceil_log2(n: u32) -> u64 {
    u64::from(32 - (n.max(2) - 1).leading_zeros())
}

#[test]
fn strong_completeness_over_many_schedules() {
    let mut checked = 0;
    for seed in 0..400u64 {
        let mut rng = SplitMix::new(seed ^ 0xc0ffee);
        let n = 2 + rng.below(299) as u32;
        let latency_us = 1.0 + rng.below(50) as f64;
        let schedule = Schedule {
            n,
            kills: random_kills(&mut rng, n, 6, 120),
            latency_us,
            jitter_us: rng.below(latency_us as u64 + 1) as f64,
        };
        let mut sim = build(&schedule, seed);
        let bound = schedule.detection_bound(&sim);
        sim.run_until(bound).expect("bounded run");
        assert_every_survivor_lists_the_killed(&mut sim, &schedule, seed);
        assert_no_live_rank_was_declared_dead(&sim, seed);
        checked += 1;
    }
    assert_eq!(checked, 400);
}

#[test]
fn accuracy_when_delays_stay_below_timeout_minus_period() {
    for seed in 0..150u64 {
        let mut rng = SplitMix::new(seed ^ 0xacc);
        let n = 2 + rng.below(199) as u32;
        // Up to 29.9 ms of delay, against timeout - period = 30 ms.
        let latency_us = 5_000.0 + rng.below(15_000) as f64;
        let schedule = Schedule {
            n,
            kills: random_kills(&mut rng, n, 3, 300),
            latency_us,
            jitter_us: 29_900.0 - latency_us,
        };
        let mut sim = build(&schedule, seed);
        sim.run_until(Instant::from_nanos(800 * 1_000_000))
            .expect("bounded run");
        let killed = schedule.killed();
        assert_no_live_rank_was_declared_dead(&sim, seed);
        for &suspected in sim.log().detections.keys() {
            assert!(
                killed.contains(&suspected),
                "seed {seed}: n {n}, live rank {suspected} suspected; kills {:?}",
                schedule.kills
            );
        }
        // And the dead were all found.
        assert_every_survivor_lists_the_killed(&mut sim, &schedule, seed);
    }
}

#[test]
fn completeness_when_ranks_die_while_a_notice_spreads() {
    for seed in 0..150u64 {
        let mut rng = SplitMix::new(seed ^ 0x5eed);
        let n = 16 + rng.below(300) as u32;
        let latency_us = 1.0 + rng.below(20) as f64;
        let first = vec![(
            rng.below(u64::from(n)) as Rank,
            rng.below(50_000) as f64 / 1000.0,
        )];
        let mut schedule = Schedule {
            n,
            kills: first.clone(),
            latency_us,
            jitter_us: latency_us / 2.0,
        };
        // Probe: when is the first failure declared?
        let mut probe = build(&schedule, seed);
        let (victim, _) = first[0];
        probe
            .drive_until(Instant::from_nanos(200 * 1_000_000), |s| {
                s.log()
                    .detections
                    .get(&victim)
                    .is_some_and(|d| d.first_suspected.is_some())
            })
            .expect("the first failure is declared");
        let declared_ms = probe.now().as_nanos() as f64 / 1e6;
        // Replay, killing 1 to 3 more ranks while the notice is on its way.
        let window_ns = (latency_us * 1.5 * 1e3) as u64 * ceil_log2(n);
        let extra = 1 + rng.below(3) as usize;
        while schedule.kills.len() < 1 + extra {
            let rank = rng.below(u64::from(n)) as Rank;
            if schedule.kills.iter().all(|(r, _)| *r != rank) {
                let at = declared_ms + rng.below(window_ns) as f64 / 1e6;
                schedule.kills.push((rank, at));
            }
        }
        let mut sim = build(&schedule, seed);
        let bound = schedule.detection_bound(&sim);
        sim.run_until(bound).expect("bounded run");
        assert_every_survivor_lists_the_killed(&mut sim, &schedule, seed);
    }
}
