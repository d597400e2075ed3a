//! Unit tests of the detector: scripted inputs to one rank, and arbitrary frames.

use super::propagation::{DIRECT, MINUS, PLUS};
use super::*;
use crate::wire;
use proptest::prelude::*;

const MS: u64 = 1_000_000;

/// The ring alone (no long edge), as the propagation tests expect.
fn config(n: u32, me: Rank) -> DetectorConfig {
    spanned(n, me, 0)
}

fn spanned(n: u32, me: Rank, span: u32) -> DetectorConfig {
    DetectorConfig {
        comm: 9,
        n,
        me,
        period: Duration::from_millis(10),
        timeout: Duration::from_millis(40),
        phase: Duration::ZERO,
        span,
    }
}

fn frame(kind: FrameKind, sender: Rank) -> Header {
    Header {
        kind,
        comm: 9,
        epoch: 0,
        sender,
    }
}

fn heartbeat(sender: Rank) -> Vec<u8> {
    frame(FrameKind::Heartbeat, sender).start().finish()
}

/// The ranks `sent` frames of `kind` go to, with the observe relation (or 0).
fn sent_to(sent: &[(Rank, Vec<u8>)], kind: FrameKind) -> Vec<(Rank, u8)> {
    sent.iter()
        .filter(|(_, f)| f[1] == kind as u8)
        .map(|(to, f)| (*to, f.get(wire::HEADER_LEN).copied().unwrap_or(0)))
        .collect()
}

#[test]
fn the_long_edge_gets_heartbeats_and_is_watched() {
    let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
    assert_eq!((d.span(), d.long_observer()), (4, Some(12)));
    assert_eq!(d.long_watched().collect::<Vec<_>>(), [4]);
    d.handle_timeout(Instant::ZERO);
    let sent = drain(&mut d);
    assert_eq!(sent_to(&sent, FrameKind::Heartbeat), [(9, 0), (12, 0)]);
    // The span is capped at n / 2, and a span below 2 is no long edge.
    assert_eq!(Detector::new(spanned(6, 0, 64), Instant::ZERO).span(), 3);
    assert_eq!(Detector::new(spanned(3, 0, 64), Instant::ZERO).span(), 0);
}

#[test]
fn a_silent_long_predecessor_is_declared_two_periods_after_the_ring_timeout() {
    let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
    // 7 keeps beating; 4 beats once, at the start, and then falls silent.
    d.handle_message(Instant::ZERO, 4, &heartbeat(4)).unwrap();
    for t in (0..=50).step_by(10) {
        let now = Instant::from_nanos(t * MS);
        d.handle_message(now, 7, &heartbeat(7)).unwrap();
        d.handle_timeout(now);
        drain(&mut d);
    }
    // timeout 40 + one period: the ring would have declared by now, not the long edge.
    assert_eq!(d.poll_event(), None);
    let now = Instant::from_nanos(60 * MS);
    d.handle_message(now, 7, &heartbeat(7)).unwrap();
    d.handle_timeout(now);
    drain(&mut d);
    assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 4 }));
    // 4's death moves no edge: 3 is long-watched by 7, the first rank not known
    // dead at 4 or more ahead of it.
    assert_eq!(d.long_watched().count(), 0);
    assert_eq!(d.watched(), Some(7));
    assert_eq!(d.poll_timeout(), Some(Instant::from_nanos(70 * MS)));
}

#[test]
fn a_rank_not_heard_from_since_the_start_has_the_start_up_grace() {
    // timeout 40 ms: the grace is 3 timeouts, 120 ms, for the ring predecessor 7 and
    // (two periods more) for the long-watched 4.
    let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
    d.handle_timeout(Instant::from_nanos(119 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), None);
    // 7 is heard at last: from now on it has a timeout between heartbeats.
    let t = Instant::from_nanos(119 * MS);
    d.handle_message(t, 7, &heartbeat(7)).unwrap();
    d.handle_timeout(Instant::from_nanos(139 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), None);
    d.handle_timeout(Instant::from_nanos(140 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 4 }));
    d.handle_timeout(Instant::from_nanos(158 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), None);
    d.handle_timeout(Instant::from_nanos(159 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 7 }));
}

#[test]
fn a_first_heartbeat_ends_the_start_up_grace_at_once() {
    // Heard at 5 ms, the predecessor is declared a timeout later, not at 120 ms.
    let mut d = Detector::new(config(8, 3), Instant::ZERO);
    d.handle_message(Instant::from_nanos(5 * MS), 2, &heartbeat(2))
        .unwrap();
    d.handle_timeout(Instant::from_nanos(44 * MS));
    drain(&mut d);
    assert_eq!(d.poll_event(), None);
    d.handle_timeout(Instant::from_nanos(45 * MS));
    assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 2 }));
}

#[test]
fn a_probe_gets_one_heartbeat_and_no_subscription() {
    let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
    let probe = frame(FrameKind::Observe, 2).start().put_u8(2).finish();
    d.handle_message(Instant::ZERO, 2, &probe).unwrap();
    assert_eq!(sent_to(&drain(&mut d), FrameKind::Heartbeat), [(2, 0)]);
    d.handle_timeout(Instant::from_nanos(10 * MS));
    assert_eq!(
        sent_to(&drain(&mut d), FrameKind::Heartbeat),
        [(9, 0), (12, 0)]
    );
    // A long-edge observe from a rank that is not our long observer subscribes it;
    // long edges beat every other period.
    let long = frame(FrameKind::Observe, 13).start().put_u8(1).finish();
    d.handle_message(Instant::from_nanos(10 * MS), 13, &long)
        .unwrap();
    drain(&mut d);
    d.handle_timeout(Instant::from_nanos(20 * MS));
    assert_eq!(sent_to(&drain(&mut d), FrameKind::Heartbeat), [(9, 0)]);
    d.handle_timeout(Instant::from_nanos(30 * MS));
    assert_eq!(
        sent_to(&drain(&mut d), FrameKind::Heartbeat),
        [(9, 0), (12, 0), (13, 0)]
    );
    for bad in [alloc::vec![], alloc::vec![3], alloc::vec![0, 0]] {
        let mut f = frame(FrameKind::Observe, 2).start();
        for b in bad {
            f.put_u8(b);
        }
        assert!(d.handle_message(Instant::ZERO, 2, &f.finish()).is_err());
    }
}

#[test]
fn past_a_long_dead_run_a_window_is_probed_and_declared_at_once() {
    let mut d = Detector::new(spanned(64, 40, 4), Instant::ZERO);
    // Told that 32..=39 died (a run of 8 >= span 4): watch 31, probe 3 * 8 ranks.
    let dead: Vec<Rank> = (32..40).collect();
    d.handle_message(Instant::ZERO, 41, &notice(41, 1, &dead, 64))
        .unwrap();
    let sent = drain(&mut d);
    let observes = sent_to(&sent, FrameKind::Observe);
    assert!(observes.contains(&(31, Watch::Ring as u8)), "{observes:?}");
    let probed: Vec<Rank> = observes
        .iter()
        .filter(|o| o.1 == Watch::Probe as u8)
        .map(|o| o.0)
        .collect();
    assert_eq!(probed, (8..31).rev().collect::<Vec<_>>());
    // 20 answers (and 12, farther); 31..=21 stay silent.
    let t = Instant::from_nanos(5 * MS);
    d.handle_message(t, 12, &heartbeat(12)).unwrap();
    d.handle_message(t, 20, &heartbeat(20)).unwrap();
    while d.poll_event().is_some() {}
    // The grace is 2 * timeout - period = 70 ms.
    d.handle_timeout(Instant::from_nanos(69 * MS));
    assert_eq!(d.poll_event(), None);
    d.handle_timeout(Instant::from_nanos(70 * MS));
    let mut suspected = Vec::new();
    while let Some(e) = d.poll_event() {
        if let DetectorEvent::Suspected { rank } = e {
            suspected.push(rank);
        }
    }
    assert_eq!(suspected, (21..32).rev().collect::<Vec<_>>());
    assert_eq!(d.watched(), Some(20));
    // One declaration (two trees), and 20 answered: no second window.
    let sent = drain(&mut d);
    assert!(sent_to(&sent, FrameKind::Observe)
        .iter()
        .all(|o| o.1 != Watch::Probe as u8));
    assert_eq!(d.declarations, 1);
}

#[test]
fn an_answer_from_the_watched_rank_closes_the_window() {
    let mut d = Detector::new(spanned(64, 40, 4), Instant::ZERO);
    let dead: Vec<Rank> = (34..40).collect();
    d.handle_message(Instant::ZERO, 41, &notice(41, 1, &dead, 64))
        .unwrap();
    drain(&mut d);
    assert!(d.window.is_some());
    for t in (1..75).step_by(10) {
        let now = Instant::from_nanos(t * MS);
        d.handle_message(now, 33, &heartbeat(33)).unwrap();
        d.handle_timeout(now);
    }
    assert!(d.window.is_none());
    d.handle_timeout(Instant::from_nanos(75 * MS));
    while let Some(e) = d.poll_event() {
        assert!(!matches!(e, DetectorEvent::Suspected { .. }), "{e:?}");
    }
}

fn drain(d: &mut Detector) -> Vec<(Rank, Vec<u8>)> {
    let mut buf = alloc::vec![0u8; wire::frame_capacity(d.config.n)];
    let mut out = Vec::new();
    while let Some(t) = d
        .poll_transmit(d.now, &mut buf)
        .expect("frame_capacity fits")
    {
        out.push((t.to, buf[..t.len].to_vec()));
    }
    out
}

/// A point-to-point notice.
fn notice(sender: Rank, hops: u32, ranks: &[Rank], n: u32) -> Vec<u8> {
    Header {
        kind: FrameKind::FailureNotice,
        comm: 9,
        epoch: 0,
        sender,
    }
    .start()
    .put_varint(hops.into())
    .put_u8(DIRECT)
    .put_rankset(&RankSet::from_ranks(n, ranks.iter().copied()))
    .finish()
}

/// The notices in `sent`: (to, tree code, end of range, set).
fn notices(d: &Detector, sent: &[(Rank, Vec<u8>)]) -> Vec<(Rank, u8, u32, Vec<Rank>)> {
    sent.iter()
        .filter(|(_, f)| f[1] == FrameKind::FailureNotice as u8)
        .map(|(to, f)| {
            let (_, mut r) = Header::decode(f, d.context(), d.config.me).unwrap();
            r.varint().unwrap();
            let code = r.u8().unwrap();
            let end = if code == DIRECT {
                0
            } else {
                r.rank().unwrap();
                r.varint().unwrap();
                r.varint_u32().unwrap()
            };
            (*to, code, end, r.rankset().unwrap().iter().collect())
        })
        .collect()
}

#[test]
fn heartbeats_go_to_the_successor_every_period() {
    let mut d = Detector::new(config(8, 3), Instant::ZERO);
    d.handle_timeout(Instant::ZERO);
    let sent = drain(&mut d);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, 4);
    assert_eq!(sent[0].1[1], FrameKind::Heartbeat as u8);
    assert_eq!(d.poll_timeout(), Some(Instant::from_nanos(10 * MS)));
}

#[test]
fn silence_declares_the_predecessor_and_starts_two_trees() {
    let mut d = Detector::new(config(8, 3), Instant::ZERO);
    // 2 is heard once (ending the start-up grace), then falls silent for a timeout.
    d.handle_message(Instant::ZERO, 2, &heartbeat(2)).unwrap();
    d.handle_timeout(Instant::from_nanos(40 * MS));
    assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 2 }));
    assert_eq!(d.watched(), Some(1));
    let sent = drain(&mut d);
    let observe: Vec<Rank> = sent
        .iter()
        .filter(|(_, f)| f[1] == FrameKind::Observe as u8)
        .map(|(to, _)| *to)
        .collect();
    assert_eq!(observe, [1]);
    let got = notices(&d, &sent);
    // The suspect itself first.
    assert_eq!(got[0], (2, DIRECT, 0, alloc::vec![2]));
    // Increasing tree from 3: offsets 1, 2, 4 are ranks 4, 5, 7 with ranges ending
    // at 2, 4, 8. Decreasing tree: offset 1 is rank 2 (dead, its range [1, 2) is
    // empty), offset 2 is rank 1 (range [2, 4)), offset 4 is rank 7 (range [4, 8)).
    // The ring predecessor, 1, is a tree child: no separate ring-edge notice.
    let tree: Vec<(Rank, u8, u32)> = got[1..].iter().map(|(to, c, e, _)| (*to, *c, *e)).collect();
    assert_eq!(
        tree,
        [
            (4, PLUS, 2),
            (5, PLUS, 4),
            (7, PLUS, 8),
            (1, MINUS, 4),
            (7, MINUS, 8)
        ]
    );
}

#[test]
fn frames_from_dead_ranks_are_rejected_and_self_notice_stops() {
    let mut d = Detector::new(config(8, 3), Instant::ZERO);
    let n = notice(6, 1, &[5], 8);
    d.handle_message(Instant::ZERO, 6, &n).unwrap();
    assert_eq!(
        d.poll_event(),
        Some(DetectorEvent::Learned { rank: 5, hops: 1 })
    );
    let hb = Header {
        kind: FrameKind::Heartbeat,
        comm: 9,
        epoch: 0,
        sender: 5,
    }
    .start()
    .finish();
    assert_eq!(
        d.handle_message(Instant::ZERO, 5, &hb),
        Err(FrameError::FromFailedRank(5))
    );
    d.handle_message(Instant::ZERO, 6, &notice(6, 2, &[3], 8))
        .unwrap();
    assert_eq!(d.poll_event(), Some(DetectorEvent::DeclaredDead { by: 6 }));
    assert!(d.is_stopped());
    assert_eq!(d.poll_timeout(), None);
    assert!(drain(&mut d).is_empty());
}

#[test]
fn a_dead_child_s_range_goes_to_the_next_live_rank_with_everything_known() {
    let mut d = Detector::new(config(16, 0), Instant::ZERO);
    d.handle_message(Instant::ZERO, 15, &heartbeat(15)).unwrap();
    d.handle_timeout(Instant::from_nanos(40 * MS)); // declares 15
    drain(&mut d);
    // 4, child for offsets [4, 8) of the increasing tree, dies: 5 takes its range.
    d.handle_message(Instant::ZERO, 8, &notice(8, 1, &[4], 16))
        .unwrap();
    let sent = drain(&mut d);
    let got = notices(&d, &sent);
    assert!(got.contains(&(5, PLUS, 8, alloc::vec![4, 15])), "{got:?}");
}

#[test]
fn a_tree_range_that_misses_the_receiver_is_malformed() {
    let mut d = Detector::new(config(16, 5), Instant::ZERO);
    let frame = |end: u32| {
        Header {
            kind: FrameKind::FailureNotice,
            comm: 9,
            epoch: 0,
            sender: 1,
        }
        .start()
        .put_varint(1)
        .put_u8(PLUS)
        .put_rank(1)
        .put_varint(1)
        .put_varint(end.into())
        .put_rankset(&RankSet::from_ranks(16, [0]))
        .finish()
    };
    // 5 is at offset 4 from origin 1: a range ending at 4 does not hold it.
    assert!(matches!(
        d.handle_message(Instant::ZERO, 1, &frame(4)),
        Err(FrameError::Malformed(_))
    ));
    assert!(d.known_dead().is_empty());
    d.handle_message(Instant::ZERO, 1, &frame(8)).unwrap();
    // 5 covers [4, 8): offsets 5 and 6 (ranks 6, 7), with ranges ending at 6 and 8.
    let sent = drain(&mut d);
    let got = notices(&d, &sent);
    let tree: Vec<(Rank, u8, u32)> = got
        .iter()
        .filter(|n| n.1 != DIRECT)
        .map(|(to, c, e, _)| (*to, *c, *e))
        .collect();
    assert_eq!(tree, [(6, PLUS, 6), (7, PLUS, 8)]);
}

proptest! {
    #[test]
    fn arbitrary_frames_never_panic(frames in prop::collection::vec((0u32..8, prop::collection::vec(any::<u8>(), 0..40)), 0..20)) {
        let mut d = Detector::new(config(8, 3), Instant::ZERO);
        for (i, (from, mut bytes)) in frames.into_iter().enumerate() {
            if bytes.len() >= wire::HEADER_LEN && i % 2 == 0 {
                bytes[0] = wire::VERSION;
                bytes[1] = (bytes[1] % 4) + 1;
                bytes[2..6].copy_from_slice(&9u32.to_le_bytes());
                bytes[6..10].copy_from_slice(&0u32.to_le_bytes());
                bytes[10..14].copy_from_slice(&from.to_le_bytes());
            }
            let _ = d.handle_message(Instant::from_nanos(i as u64 * MS), from, &bytes);
            d.handle_timeout(Instant::from_nanos(i as u64 * 7 * MS));
            drain(&mut d);
            while d.poll_event().is_some() {}
        }
    }
}
