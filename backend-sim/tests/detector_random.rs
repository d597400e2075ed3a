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

mod common;

use backend_sim::engine::{ceil_log2, Sim, SplitMix};
use backend_sim::scenario::Victims;
use common::{
    assert_every_survivor_lists_the_killed, assert_no_live_rank_was_declared_dead, Schedule,
};
use ft_core::node::Node;
use ft_core::{Duration, Instant, Rank};

const PERIOD_MS: f64 = 10.0;
const TIMEOUT_MS: f64 = 40.0;

/// A schedule of single deaths under the default detector settings.
fn schedule(n: u32, kills: Vec<(Victims, f64)>, latency_us: f64, jitter_us: f64) -> Schedule {
    Schedule {
        n,
        ranks_per_node: None,
        period_ms: PERIOD_MS,
        timeout_ms: TIMEOUT_MS,
        latency_us,
        jitter_us,
        kills,
    }
}

fn random_kills(rng: &mut SplitMix, n: u32, max_kills: u32, window_ms: u64) -> Vec<(Victims, f64)> {
    let count = rng.below(u64::from(max_kills.min(n - 1)) + 1) as u32;
    let mut kills: Vec<(Victims, f64)> = Vec::new();
    while kills.len() < count as usize {
        let rank = Victims::Rank(rng.below(u64::from(n)) as Rank);
        if kills.iter().all(|(r, _)| *r != rank) {
            let at = rng.below(window_ms * 1000) as f64 / 1000.0;
            kills.push((rank, at));
        }
    }
    kills
}

/// When every survivor must know every kill: the last kill (for a rank killed before
/// its first heartbeat was heard, its detection origin in the start-up grace), plus one detection
/// (`timeout + period`), plus `2·timeout` per further rank of the longest run of
/// ring-adjacent kills (the ring alone finds them one at a time; a bound the detector's
/// long edges only shorten), plus `⌈log2 n⌉ + 1` hops of the largest network delay.
fn detection_bound(s: &Schedule, sim: &Sim<Node>) -> Instant {
    let run = u64::from(s.longest_adjacent_run().max(1));
    s.last_detection_origin(sim)
        + Duration::from_millis((TIMEOUT_MS + PERIOD_MS) as u64)
        + Duration::from_millis(2 * TIMEOUT_MS as u64 * (run - 1))
        + sim
            .net()
            .max_delay(256)
            .saturating_mul(u64::from(ceil_log2(s.n)) + 1)
}

#[test]
fn strong_completeness_over_many_schedules() {
    let mut checked = 0;
    for seed in 0..400u64 {
        let mut rng = SplitMix::new(seed ^ 0xc0ffee);
        let n = 2 + rng.below(299) as u32;
        let latency_us = 1.0 + rng.below(50) as f64;
        let kills = random_kills(&mut rng, n, 6, 120);
        let jitter_us = rng.below(latency_us as u64 + 1) as f64;
        let schedule = schedule(n, kills, latency_us, jitter_us);
        let mut sim = schedule.build(seed);
        let bound = detection_bound(&schedule, &sim);
        sim.run_until(bound).expect("bounded run");
        assert_every_survivor_lists_the_killed(&mut sim, &schedule, seed);
        assert_no_live_rank_was_declared_dead(&sim, &schedule, seed);
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
        let kills = random_kills(&mut rng, n, 3, 300);
        let schedule = schedule(n, kills, latency_us, 29_900.0 - latency_us);
        let mut sim = schedule.build(seed);
        sim.run_until(Instant::from_nanos(800 * 1_000_000))
            .expect("bounded run");
        assert_no_live_rank_was_declared_dead(&sim, &schedule, seed);
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
        let victim = rng.below(u64::from(n)) as Rank;
        let first = vec![(Victims::Rank(victim), rng.below(50_000) as f64 / 1000.0)];
        let mut schedule = schedule(n, first, latency_us, latency_us / 2.0);
        // Probe: when is the first failure declared?
        let mut probe = schedule.build(seed);
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
        let window_ns = (latency_us * 1.5 * 1e3) as u64 * u64::from(ceil_log2(n));
        let extra = 1 + rng.below(3) as usize;
        while schedule.kills.len() < 1 + extra {
            let rank = Victims::Rank(rng.below(u64::from(n)) as Rank);
            if schedule.kills.iter().all(|(r, _)| *r != rank) {
                let at = declared_ms + rng.below(window_ns) as f64 / 1e6;
                schedule.kills.push((rank, at));
            }
        }
        let mut sim = schedule.build(seed);
        let bound = detection_bound(&schedule, &sim);
        sim.run_until(bound).expect("bounded run");
        assert_every_survivor_lists_the_killed(&mut sim, &schedule, seed);
    }
}
