//! Groups of ranks on a tiny network of [`Groups`] machines.
use super::*;
use ft_core::detector::DetectorConfig;
use ft_core::wire::{FrameKind, Header};
use ft_core::{Duration, RankSet};

const TUNING: StackTuning = StackTuning {
    chunk_bytes: ft_core::wire::MAX_CHUNK,
    leaf_chunk_bytes: None,
    early_heads: false,
};

fn stack(n: u32, me: Rank) -> RankStack {
    let config = DetectorConfig {
        comm: 5,
        n,
        me,
        period: Duration::from_millis(10),
        timeout: Duration::from_millis(40),
        phase: Duration::from_millis(u64::from(me)),
        span: ft_core::detector::DEFAULT_SPAN,
    };
    RankStack::new(config, Instant::ZERO)
}

/// A heartbeat of communicator `comm` from `sender`.
fn heartbeat(comm: u32, sender: Rank) -> Vec<u8> {
    Header {
        kind: FrameKind::Heartbeat,
        comm,
        epoch: 0,
        sender,
    }
    .start()
    .finish()
}

/// Ranks of [`Groups`] on a network where every frame takes 1 ms; a dead rank
/// neither sends nor receives.
struct Net {
    now: Instant,
    ranks: Vec<Groups>,
    alive: Vec<bool>,
    in_flight: Vec<(Instant, Rank, Rank, Vec<u8>)>,
    events: Vec<Vec<GroupEvent>>,
}

impl Net {
    fn new(n: u32) -> Self {
        Net {
            now: Instant::ZERO,
            ranks: (0..n).map(|me| Groups::new(stack(n, me), TUNING)).collect(),
            alive: vec![true; n as usize],
            in_flight: Vec::new(),
            events: vec![Vec::new(); n as usize],
        }
    }

    /// Sends what every live rank has queued, then collects its events.
    fn flush(&mut self) {
        let mut buf = vec![0u8; ft_core::wire::frame_capacity(64)];
        for (me, groups) in self.ranks.iter_mut().enumerate() {
            while let Some(t) = groups.poll_transmit(self.now, &mut buf).unwrap() {
                if self.alive[me] {
                    let at = Instant::from_nanos(self.now.as_nanos() + 1_000_000);
                    let frame = buf[..t.len].to_vec();
                    self.in_flight.push((at, me as Rank, t.to, frame));
                }
            }
            while let Some(event) = groups.poll_event() {
                self.events[me].push(event);
            }
        }
    }

    /// Runs the network for `ms` milliseconds.
    fn run(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now = Instant::from_nanos(self.now.as_nanos() + 1_000_000);
            let now = self.now;
            let (due, later) = self.in_flight.drain(..).partition(|f| f.0 <= now);
            self.in_flight = later;
            for (_, from, to, frame) in due {
                if self.alive[to as usize] {
                    let _ = self.ranks[to as usize].handle_message(now, from, &frame);
                }
            }
            for (me, groups) in self.ranks.iter_mut().enumerate() {
                if self.alive[me] && groups.poll_timeout().is_some_and(|t| t <= now) {
                    groups.handle_timeout(now);
                }
            }
            self.flush();
        }
    }

    /// Starts a global validation of group `id` at each of `ranks`, and runs the
    /// network for 100 ms.
    fn validate(&mut self, id: GroupId, ranks: &[usize]) {
        for &me in ranks {
            let now = self.now;
            self.ranks[me]
                .stack_mut(id)
                .unwrap()
                .validate_global(now)
                .unwrap();
        }
        self.flush();
        self.run(100);
    }

    /// The communicator id of group `id` at rank `me`.
    fn comm(&self, me: usize, id: GroupId) -> u32 {
        self.ranks[me]
            .stack(id)
            .unwrap()
            .node()
            .detector()
            .config()
            .comm
    }

    /// `G` of group `id` at rank `me`, once a validation of that group finished.
    fn validated(&self, me: usize, id: GroupId) -> Option<RankSet> {
        self.events[me].iter().rev().find_map(|e| match e.event {
            StackEvent::Node(NodeEvent::GlobalValidated { .. }) if e.group == id => {
                Some(self.ranks[me].stack(id)?.node().view().global().clone())
            }
            _ => None,
        })
    }
}

#[test]
fn shrunk_communicator_ids_are_alike_at_every_survivor_and_differ_per_shrink() {
    assert_eq!(shrunk_comm(5, 1, 0), shrunk_comm(5, 1, 0));
    let ids = [
        shrunk_comm(5, 1, 0),
        shrunk_comm(5, 2, 0),
        shrunk_comm(5, 1, 1),
        shrunk_comm(6, 1, 0),
    ];
    for (i, a) in ids.iter().enumerate() {
        assert!(ids[i + 1..].iter().all(|b| a != b), "{ids:?}");
    }
}

#[test]
fn survivors_shrink_over_the_same_network_and_agree_in_the_new_group() {
    let mut net = Net::new(4);
    net.run(30);
    net.alive[2] = false;
    net.run(200);
    net.validate(0, &[0, 1, 3]);
    for me in [0, 1, 3] {
        assert_eq!(net.validated(me, 0), Some(RankSet::from_ranks(4, [2])));
    }
    // Rank 0 shrinks first and starts validating at once: its frames of the new
    // group reach ranks 1 and 3 before they shrink, and are kept for it.
    let now = net.now;
    let id = net.ranks[0].shrink(0, now).unwrap();
    assert_eq!(id, 1);
    net.ranks[0]
        .stack_mut(id)
        .unwrap()
        .validate_global(now)
        .unwrap();
    net.flush();
    net.run(20);
    assert!(
        net.ranks[1].early_frames() > 0,
        "kept for the group to come"
    );
    for me in [1, 3] {
        let now = net.now;
        assert_eq!(net.ranks[me].shrink(0, now), Ok(1));
        assert_eq!(net.ranks[me].early_frames(), 0, "handed over");
        net.ranks[me]
            .stack_mut(1)
            .unwrap()
            .validate_global(now)
            .unwrap();
    }
    net.flush();
    net.run(100);
    for (me, new) in [(0, 0), (1, 1), (3, 2)] {
        let stack = net.ranks[me].stack(1).unwrap();
        assert_eq!(stack.node().view().rank(), new);
        assert_eq!(stack.node().view().size(), 3);
        assert_eq!(
            net.validated(me, 1),
            Some(RankSet::new(3)),
            "nobody failed since"
        );
        assert_eq!(net.ranks[me].transport_rank(1, 2), Some(3));
    }
    // Transport rank 2 is not in the new group: its frames are refused.
    let heartbeat = heartbeat(net.comm(0, 1), 2);
    assert!(matches!(
        net.ranks[0].handle_message(net.now, 2, &heartbeat),
        Err(FrameError::RankOutOfRange { rank: 2, n: 3 })
    ));
    // A closed group's frames are refused, not kept.
    net.ranks[0].remove(1);
    assert!(net.ranks[0].stack(1).is_none());
    assert!(matches!(
        net.ranks[0].handle_message(net.now, 1, &heartbeat),
        Err(FrameError::WrongCommunicator { .. })
    ));
    assert_eq!(net.ranks[0].early_frames(), 0);
}

#[test]
fn a_peer_that_closed_one_group_is_not_dead_for_the_transport() {
    let mut net = Net::new(3);
    net.run(30);
    for me in 0..3 {
        let now = net.now;
        assert_eq!(net.ranks[me].shrink(0, now), Ok(1));
    }
    net.run(30);
    // Rank 2 closes the shrunk group: its detector there falls silent.
    net.ranks[2].remove(1);
    net.run(300);
    let declared: Vec<&GroupEvent> = net.events[0]
        .iter()
        .filter(|e| matches!(e.event, StackEvent::Node(NodeEvent::Suspected { rank: 2 })))
        .collect();
    assert_eq!(declared.len(), 1, "declared in the group it closed");
    assert_eq!(
        (declared[0].group, declared[0].dead),
        (1, None),
        "alive in group 0"
    );
    // It dies for real: group 0 declares it too, and now the transport forgets it.
    net.alive[2] = false;
    net.run(300);
    let dead: Vec<Option<Rank>> = net.events[0]
        .iter()
        .filter(|e| {
            e.group == 0 && matches!(e.event, StackEvent::Node(NodeEvent::Suspected { .. }))
        })
        .map(|e| e.dead)
        .collect();
    assert_eq!(dead, [Some(2)]);
}

#[test]
fn frames_of_unknown_communicators_are_kept_up_to_the_limit() {
    let mut groups = Groups::new(stack(2, 0), TUNING);
    let frame = Header {
        kind: FrameKind::Heartbeat,
        comm: 99,
        epoch: 0,
        sender: 1,
    }
    .start()
    .finish();
    for _ in 0..EARLY_FRAMES {
        assert_eq!(groups.handle_message(Instant::ZERO, 1, &frame), Ok(()));
    }
    assert!(matches!(
        groups.handle_message(Instant::ZERO, 1, &frame),
        Err(FrameError::WrongCommunicator {
            expected: 5,
            got: 99
        })
    ));
    assert_eq!(groups.early_frames(), EARLY_FRAMES);
    assert_eq!(
        groups.handle_message(Instant::ZERO, 1, &[1, 1]),
        Err(FrameError::Truncated)
    );
}

#[test]
fn promise_ids_carry_their_group() {
    let tagged = tag_promise(Promise::Head { id: 5, len: 9 }, 3);
    assert_eq!(
        tagged,
        Promise::Head {
            id: 3 << 56 | 5,
            len: 9
        }
    );
    assert_eq!(
        tag_promise(Promise::Withdrawn { id: 5 }, 0),
        Promise::Withdrawn { id: 5 }
    );
}

#[test]
fn frames_of_a_replaced_incarnation_are_refused() {
    // Ranks 0-3 work, rank 4 is the spare; rank 2 dies and the spare takes its number.
    let mut net = Net::new(5);
    for me in 0..5 {
        let now = net.now;
        let team = net.ranks[me].split_spares(0, 1, now).unwrap();
        assert_eq!(team, (me < 4).then_some(1));
    }
    net.run(30);
    net.alive[2] = false;
    net.run(200);
    net.validate(1, &[0, 1, 3]);
    let mut admission = None;
    for me in [0, 1, 3] {
        assert_eq!(net.validated(me, 1), Some(RankSet::from_ranks(4, [2])));
        let now = net.now;
        let rebuilt = net.ranks[me].rebuild(1, now).unwrap();
        assert_eq!(rebuilt.replaced, [(2, 1)]);
        assert_eq!(rebuilt.admission.ranks, [0, 1, 4, 3]);
        admission = Some(rebuilt.admission);
    }
    let admission = admission.unwrap();
    let now = net.now;
    assert_eq!(net.ranks[4].join(0, &admission, now), Ok(Some(1)));
    net.run(100);
    // The new incarnation is heard in the rebuilt group: nobody suspects rank 2 there.
    for (me, id) in [(0, 2), (1, 2), (3, 2), (4, 1)] {
        let view = net.ranks[me].stack(id).unwrap().node().view();
        assert_eq!(view.generation(2), 1, "rank {me}");
        assert!(view.local().is_empty(), "rank {me}: {:?}", view.local());
    }
    // The replaced incarnation (transport rank 2, say a process that was stopped and
    // runs again) is refused in the rebuilt group, whose rank 2 is transport rank 4,
    // and in the group it was declared dead in.
    let now = net.now;
    assert_eq!(
        net.ranks[0].handle_message(now, 2, &heartbeat(admission.comm, 2)),
        Err(FrameError::RankOutOfRange { rank: 2, n: 4 })
    );
    let team = net.comm(0, 1);
    assert_eq!(
        net.ranks[0].handle_message(now, 2, &heartbeat(team, 2)),
        Err(FrameError::FromFailedRank(2))
    );
    // The new incarnation's frames, from transport rank 4, reach rank 2 of the group.
    assert_eq!(
        net.ranks[0].handle_message(now, 4, &heartbeat(admission.comm, 2)),
        Ok(())
    );
}
