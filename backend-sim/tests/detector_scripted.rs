//! Scripted failure-detector scenarios: build a small simulated group, inject failures
//! at named points, drive until settled (bounded), and check what every survivor saw.

use backend_sim::engine::{Departure, Sim};
use backend_sim::failure::make_node;
use backend_sim::scenario::{ActionKind, Scenario};
use ft_core::node::Node;
use ft_core::{Duration, Instant, Rank};

fn at_ms(ms: f64) -> Instant {
    Instant::from_nanos((ms * 1e6) as u64)
}

/// A group of `n` ranks (period 10 ms, timeout 40 ms, 1.5 µs latency) with `kills`.
fn group(n: u32, kills: &str) -> Sim<Node> {
    let scenario = Scenario::from_json(&format!(
        r#"{{ "ranks": {n}, "seed": 3,
              "network": {{ "latency_us": 1.5, "gbytes_per_s": 10.0 }},
              "detector": {{ "period_ms": 10, "timeout_ms": 40 }},
              "kill": [{kills}], "until_ms": 1000 }}"#
    ))
    .expect("scenario");
    Sim::new(&scenario, make_node).expect("sim")
}

/// The completeness deadline after a failure at `t`: timeout + period + (⌈log2 n⌉+1)
/// network delays.
fn deadline(sim: &Sim<Node>, t: Instant) -> Instant {
    let hops = u64::from(32 - (sim.size() - 1).leading_zeros()) + 1;
    t + Duration::from_millis(50) + sim.net().max_delay(64).saturating_mul(hops)
}

fn everyone_knows(sim: &Sim<Node>, dead: &[Rank]) -> bool {
    sim.survivors().all(|r| {
        dead.iter()
            .all(|&d| sim.machine(r).view().is_known_failed(d))
    })
}

/// Runs `validate_local` everywhere and returns every survivor's `L_i`.
fn validated(sim: &mut Sim<Node>) -> Vec<(Rank, Vec<Rank>)> {
    sim.act(&ActionKind::ValidateLocal, 0)
        .expect("validate_local");
    sim.survivors()
        .map(|r| (r, sim.machine(r).view().local().iter().collect()))
        .collect()
}

#[test]
fn a_single_failure_is_seen_by_its_observer_and_then_by_everyone() {
    let mut sim = group(16, r#"{"rank": 5, "at_ms": 12}"#);
    let done = sim
        .drive_until(deadline(&sim, at_ms(12.0)), |s| everyone_knows(s, &[5]))
        .expect("every survivor learns 5");
    assert!(done <= at_ms(12.0) + Duration::from_millis(50) + Duration::from_micros(20));

    let detection = &sim.log().detections[&5];
    assert_eq!(
        detection.learned[6],
        detection.first_suspected.unwrap(),
        "6 observed 5"
    );
    assert!(detection.max_hops <= 5, "hops {}", detection.max_hops);
    assert_eq!(sim.machine(6).detector().watched(), Some(4));
    assert_eq!(sim.machine(4).detector().observer(), Some(6));

    for (rank, local) in validated(&mut sim) {
        assert_eq!(local, [5], "rank {rank}");
    }
}

#[test]
fn two_adjacent_failures_are_found_together_by_the_ring_and_the_long_edge() {
    let mut sim = group(16, r#"{"rank": 5, "at_ms": 12}, {"rank": 6, "at_ms": 12}"#);
    // 7 watches 6 on the ring. 5's ring observer died with it, but its long observer
    // (the span is min(64, 16 / 2) = 8 ranks) is 13, which declares it two periods
    // after the ring timeout (long edges beat every other period): no re-target wait
    // of 2 × timeout after 6.
    let bound = deadline(&sim, at_ms(12.0)) + Duration::from_millis(10);
    sim.drive_until(bound, |s| everyone_knows(s, &[5, 6]))
        .expect("every survivor learns 5 and 6");

    let log = sim.log();
    let six = log.detections[&6].first_suspected.unwrap();
    let five = log.detections[&5].first_suspected.unwrap();
    assert_eq!(log.detections[&6].learned[7], six, "7 suspected 6");
    assert_eq!(log.detections[&5].learned[13], five, "13 suspected 5");
    // Two periods of extra silence, plus up to one period between 5's and 6's phases.
    assert!(
        five <= six + Duration::from_millis(30),
        "5 at {five:?}, 6 at {six:?}"
    );
    assert_eq!(sim.machine(7).detector().watched(), Some(4));
    assert_eq!(sim.machine(4).detector().observer(), Some(7));

    for (rank, local) in validated(&mut sim) {
        assert_eq!(local, [5, 6], "rank {rank}");
    }
}

#[test]
fn a_failure_during_propagation_still_reaches_every_survivor() {
    // First run: find the step at which 6, the observer of 5, starts sending notices.
    let mut probe = group(64, r#"{"rank": 5, "at_ms": 12}"#);
    let frames_before_notices = loop {
        let before = probe.frames_sent_by(6);
        probe.step().expect("events left");
        if probe
            .log()
            .detections
            .get(&5)
            .is_some_and(|d| d.first_suspected.is_some())
        {
            break before;
        }
    };
    // Replay, with 6 dying in the middle of it: its batch is the notice to the suspect,
    // the `Observe` to 4, then the tree notices; it dies before its 6th frame, so only
    // three tree children heard of 5 from it.
    let nth = frames_before_notices + 6;
    let mut sim = group(
        64,
        &format!(
            r#"{{"rank": 5, "at_ms": 12}},
               {{"rank": 6, "on": "send", "kind": "detector", "nth": {nth}}}"#
        ),
    );
    let died = sim
        .drive_until(at_ms(200.0), |s| !s.is_alive(6))
        .expect("6 dies mid-propagation");
    assert_eq!(sim.log().departures[&6], Departure::Killed(died));
    let learned_5 = sim.log().detections[&5]
        .learned
        .iter()
        .filter(|t| **t != Instant::MAX)
        .count();
    assert!(learned_5 >= 1, "a notice went out before 6 died");

    sim.drive_until(deadline(&sim, died), |s| everyone_knows(s, &[5, 6]))
        .expect("every survivor learns 5 and 6");
    for (rank, local) in validated(&mut sim) {
        assert_eq!(local, [5, 6], "rank {rank}");
    }
}

#[test]
fn the_detecting_rank_and_a_relay_dying_with_the_notice_in_flight_lose_nothing() {
    let mut probe = group(32, r#"{"rank": 20, "at_ms": 3}"#);
    probe
        .drive_until(at_ms(200.0), |s| {
            s.log()
                .detections
                .get(&20)
                .is_some_and(|d| d.first_suspected.is_some())
        })
        .expect("21 suspects 20");
    let t = probe.now();
    // 21 (the detector) and 22 (its +1 relay) die while the first notices are in flight.
    let kill_ms = t.as_nanos() as f64 / 1e6 + 0.000_5;
    let mut sim = group(
        32,
        &format!(
            r#"{{"rank": 20, "at_ms": 3}}, {{"rank": 21, "at_ms": {kill_ms}}},
               {{"rank": 22, "at_ms": {kill_ms}}}"#
        ),
    );
    // 21 and 22 are adjacent: the ring detects them one after the other.
    let bound = deadline(&sim, at_ms(kill_ms)) + Duration::from_millis(80);
    sim.drive_until(bound, |s| everyone_knows(s, &[20, 21, 22]))
        .expect("every survivor learns 20, 21, 22");
    for (rank, local) in validated(&mut sim) {
        assert_eq!(local, [20, 21, 22], "rank {rank}");
    }
}

#[test]
fn a_falsely_suspected_rank_stops_itself_and_everyone_lists_it() {
    let mut sim = group(16, "");
    sim.run_until(at_ms(20.0)).unwrap();
    // 9's frames now take longer than the timeout: 10 suspects it although it runs.
    sim.delay_sends_of(9, Duration::from_millis(60));
    sim.drive_until(at_ms(20.0 + 50.0 + 10.0), |s| !s.is_alive(9))
        .expect("9 learns it was declared dead");
    assert!(matches!(sim.log().departures[&9], Departure::Stopped(_)));
    assert!(sim.machine(9).is_stopped());

    sim.drive_until(at_ms(200.0), |s| everyone_knows(s, &[9]))
        .expect("every survivor lists 9");
    // Its late heartbeats arrive and are refused: fail-stop is enforced.
    sim.run_until(at_ms(200.0)).unwrap();
    assert!(sim.log().rejected > 0);
    for (rank, local) in validated(&mut sim) {
        assert_eq!(local, [9], "rank {rank}");
    }
    assert_eq!(sim.survivors().count(), 15);
}
