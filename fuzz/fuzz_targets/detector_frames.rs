//! Arbitrary frame sequences, timer ticks and clock jumps delivered to one failure
//! detector (and to the node around it). Nothing may panic; every refused frame is a
//! typed error; the detector's invariants hold after every step:
//! - it never lists itself as dead, and every listed rank is `< n`;
//! - it never watches or heartbeats a rank it knows dead, nor itself, on the ring or
//!   the long edge (at most `span` long-watched ranks, `span <= n / 2`);
//! - once stopped it stays stopped, sends nothing and asks for no wake-up;
//! - every frame it sends decodes with the shared codec, from itself, to a rank `< n`
//!   other than itself.
//! - the node's view holds exactly the detector's dead set (validated or pending).
#![no_main]

use arbitrary::Arbitrary;
use ft_core::detector::{Detector, DetectorConfig};
use ft_core::node::Node;
use ft_core::wire::{frame_capacity, Context, Family, FrameKind, Header, HEADER_LEN, VERSION};
use ft_core::{Duration, Instant, Protocol, RankSet};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Step {
    /// Raw bytes as a frame from `from`.
    Raw { from: u32, bytes: Vec<u8> },
    /// A well-formed header of `kind` from `from` followed by arbitrary payload bytes.
    Framed {
        from: u32,
        kind: u8,
        epoch: u8,
        payload: Vec<u8>,
    },
    /// A well-formed notice from `from` with `hops` and the ranks `members % n`; in a
    /// tree (`tree % 3`: 0 none, 1 increasing, 2 decreasing offsets) of `origin % n`,
    /// declaration `seq`, covering offsets up to `end`.
    Notice {
        from: u32,
        hops: u8,
        members: Vec<u32>,
        tree: u8,
        origin: u32,
        seq: u8,
        end: u32,
    },
    /// Advance the clock by `micros` and fire due timers.
    Tick { micros: u32 },
    /// Validate locally (node only).
    Validate,
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    me: u8,
    period_ms: u8,
    timeout_ms: u8,
    steps: Vec<Step>,
}

fn check(d: &Detector, n: u32, me: u32) {
    let dead = d.known_dead();
    assert!(!dead.contains(me));
    assert!(dead.iter().all(|r| r < n));
    if let Some(w) = d.watched() {
        assert!(w != me && !dead.contains(w));
    }
    if let Some(o) = d.observer() {
        assert!(o != me && !dead.contains(o));
    }
    // The long edge: never to ourselves or a rank known dead, at most `span` watched.
    assert!(d.span() <= n / 2);
    if let Some(o) = d.long_observer() {
        assert!(o != me && !dead.contains(o));
    }
    assert!(d.long_watched().count() <= d.span() as usize);
    assert!(d.long_watched().all(|w| w != me && !dead.contains(w)));
    if d.is_stopped() {
        assert_eq!(d.poll_timeout(), None);
    }
}

/// Drains `p`; every frame must decode, from `me`, to another rank `< n`; a bare
/// detector sends only detector frames (a node also agreement and revoke ones).
fn drain<P: Protocol>(p: &mut P, now: Instant, n: u32, me: u32, buf: &mut [u8], bare: bool) {
    let ctx = Context { comm: 5, n };
    while let Some(t) = p.poll_transmit(now, buf).expect("frame_capacity fits") {
        assert!(t.to < n && t.to != me, "frame to {} from {me}", t.to);
        let (header, _) = Header::decode(&buf[..t.len], ctx, me).expect("own frames decode");
        if bare {
            assert_eq!(header.kind.family(), Family::Detector);
        }
    }
    while p.poll_event().is_some() {}
}

fn frame(kind: u8, epoch: u8, from: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_LEN + payload.len());
    f.push(VERSION);
    f.push(kind);
    f.extend_from_slice(&5u32.to_le_bytes());
    f.extend_from_slice(&u32::from(epoch % 2).to_le_bytes());
    f.extend_from_slice(&from.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 64) + 1;
    let me = u32::from(input.me) % n;
    let period = Duration::from_millis(u64::from(input.period_ms % 20) + 1);
    let config = DetectorConfig {
        comm: 5,
        n,
        me,
        period,
        timeout: period + Duration::from_millis(u64::from(input.timeout_ms % 50) + 1),
        phase: Duration::ZERO,
        span: u32::from(input.me % 8),
    };
    let mut detector = Detector::new(config, Instant::ZERO);
    let mut node = Node::new(config, Instant::ZERO);
    let mut buf = vec![0u8; frame_capacity(n)];
    let mut now = Instant::ZERO;
    let mut was_stopped = false;
    for step in input.steps {
        let bytes = match step {
            Step::Raw { from, bytes } => Some((from % n, bytes)),
            Step::Framed {
                from,
                kind,
                epoch,
                payload,
            } => {
                let from = from % n;
                let kind = FrameKind::ALL[usize::from(kind) % FrameKind::ALL.len()] as u8;
                Some((from, frame(kind, epoch, from, &payload)))
            }
            Step::Notice {
                from,
                hops,
                members,
                tree,
                origin,
                seq,
                end,
            } => {
                let from = from % n;
                let set = RankSet::from_ranks(n, members.iter().map(|m| m % n));
                let mut w = Header {
                    kind: FrameKind::FailureNotice,
                    comm: 5,
                    epoch: 0,
                    sender: from,
                }
                .start();
                w.put_varint(hops.into()).put_u8(tree % 3);
                if tree % 3 != 0 {
                    w.put_rank(origin % n)
                        .put_varint(seq.into())
                        .put_varint(u64::from(end % (n + 2)));
                }
                w.put_rankset(&set);
                Some((from, w.finish()))
            }
            Step::Tick { micros } => {
                now += Duration::from_micros(u64::from(micros));
                detector.handle_timeout(now);
                node.handle_timeout(now);
                None
            }
            Step::Validate => {
                let _ = node.validate_local(now);
                None
            }
        };
        if let Some((from, bytes)) = bytes {
            // Errors are typed values; both must agree on acceptance of detector frames
            // (the node also takes other families: agreement, revoke).
            let a = detector.handle_message(now, from, &bytes);
            let b = node.handle_message(now, from, &bytes);
            let detector_family = bytes
                .get(1)
                .and_then(|&code| FrameKind::from_code(code).ok())
                .is_some_and(|k| k.family() == Family::Detector);
            if detector_family && !node.is_stopped() && !detector.is_stopped() {
                assert_eq!(a.is_ok(), b.is_ok(), "{a:?} vs {b:?}");
            }
        }
        drain(&mut detector, now, n, me, &mut buf, true);
        drain(&mut node, now, n, me, &mut buf, false);
        check(&detector, n, me);
        check(node.detector(), n, me);
        assert!(!was_stopped || detector.is_stopped());
        was_stopped = detector.is_stopped();
        if !node.is_stopped() {
            assert_eq!(&node.view().known_failed(), node.detector().known_dead());
        }
    }
});
