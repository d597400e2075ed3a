//! The activation protocol over an in-test network that delivers frames in random
//! order and notifies failures late, plus frame-level checks of peer input.

use super::codec::{put_entry, put_request, put_set, read_request, Want, DATA_FOLLOWS};
use super::*;
use crate::spec::{OutputSpec, PlanSpec};
use crate::topology::Topology;
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use core::num::NonZeroU32;
use ft_core::wire::{self, FrameKind, Header, Writer, MAX_CHUNK};
use ft_core::Promise;
use ft_core::SplitMix;
use ft_core::{FrameError, Protocol, TransmitParts};
use proptest::prelude::{
    any, prop, prop_assert, prop_assert_eq, proptest, ProptestConfig, TestCaseError,
};

/// Broadcast 5 of rank 0, the root of most tests.
const T5: TaskId = TaskId::new(0, 5);

/// Decodes a broadcast frame's header and its body's broadcast id: the header and the
/// reader after both.
fn decode_bcast<'a>(
    bytes: &'a [u8],
    ctx: wire::Context,
    from: Rank,
) -> (Header, ft_core::wire::Reader<'a>) {
    let (h, mut r) = Header::decode(bytes, ctx, from).expect("frames of the test decode");
    TaskId::read(&mut r).expect("the broadcast");
    (h, r)
}

/// Each output's payload ([`payload`]) for `plan`.
fn payloads_of(plan: &Plan) -> Vec<Vec<u8>> {
    let outputs = plan.spec().outputs.iter().enumerate();
    outputs.map(|(j, o)| payload(j, o.bytes)).collect()
}

fn payload(j: usize, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as usize * 31 + j * 7 + (i as usize >> 16)) as u8)
        .collect()
}

/// The longest chunk some of [`Net`]'s ranks send to a leaf.
const LEAF_CHUNK: usize = 3 * MAX_CHUNK;

/// An in-test network: frames are delivered in random order, failures are notified
/// to each survivor at a random later step. Ranks send chunks of different sizes (so
/// relays re-chunk nothing but receivers see every chunking), and each frame is taken at
/// random through `poll_transmit` (contiguous) or `poll_transmit_parts` (head plus
/// shared payload, joined here as a network would): both must give the same frames.
/// Some ranks send heads ahead of their payloads ([`Config::early_heads`], drained
/// through `poll_transmit_parts` only): the network keeps such a head and carries the
/// whole frame when its payload goes, as if it was sent then.
struct Net {
    n: u32,
    ranks: Vec<Option<Broadcaster>>,
    frames: Vec<(Rank, Rank, Vec<u8>)>,
    notices: Vec<(Rank, Rank)>,
    events: Vec<Vec<BcastEvent>>,
    rng: SplitMix,
    buf: Vec<u8>,
    delivered: usize,
    subtree_frames: usize,
    /// Payload bytes delivered to a live rank, by (rank, output).
    received: BTreeMap<(Rank, u32), u64>,
    /// Requests delivered.
    requests: usize,
    /// Heads sent ahead of their payload, by sender and promise.
    held_heads: BTreeMap<(Rank, u64), (Rank, Vec<u8>, usize)>,
}

impl Net {
    fn new(n: u32, seed: u64) -> Self {
        Self::with_push(n, seed, true)
    }

    /// Ranks with [`Config::eager_push`] as given.
    fn with_push(n: u32, seed: u64, eager_push: bool) -> Self {
        let mut chunks = SplitMix::new(seed ^ 0xc4);
        Net {
            n,
            ranks: (0..n)
                .map(|me| {
                    let mut cfg = Config::new(9, n, me);
                    cfg.chunk_bytes = [MAX_CHUNK, 1000, 4099][chunks.below(3) as usize];
                    cfg.leaf_chunk_bytes = [None, Some(LEAF_CHUNK)][chunks.below(2) as usize];
                    cfg.eager_push = eager_push;
                    cfg.early_heads = chunks.chance(1, 2);
                    Some(Broadcaster::new(cfg))
                })
                .collect(),
            frames: Vec::new(),
            notices: Vec::new(),
            events: (0..n).map(|_| Vec::new()).collect(),
            rng: SplitMix::new(seed),
            buf: vec![0; wire::frame_capacity_for(n, LEAF_CHUNK)],
            delivered: 0,
            subtree_frames: 0,
            received: BTreeMap::new(),
            requests: 0,
            held_heads: BTreeMap::new(),
        }
    }

    fn drain(&mut self, r: Rank) {
        let Some(m) = self.ranks[r as usize].as_mut() else {
            return;
        };
        let early = m.config().early_heads;
        loop {
            let t = if !early && self.rng.chance(1, 2) {
                m.poll_transmit(Instant::ZERO, &mut self.buf)
                    .expect("frame_capacity fits")
                    .map(TransmitParts::from)
            } else {
                m.poll_transmit_parts(Instant::ZERO, &mut self.buf)
                    .expect("frame_capacity fits")
            };
            let Some(t) = t else { break };
            let (to, mut frame) = match t.promise {
                None => (t.to, self.buf[..t.head].to_vec()),
                Some(Promise::Head { id, len }) => {
                    assert_eq!(self.buf[1], FrameKind::BcastData as u8, "a data head");
                    let head = self.buf[..t.head].to_vec();
                    assert!(t.payload.is_none(), "a head alone");
                    self.held_heads.insert((r, id), (t.to, head, len));
                    continue;
                }
                Some(Promise::Payload { id }) => {
                    let (to, head, len) =
                        self.held_heads.remove(&(r, id)).expect("a promised head");
                    assert_eq!(to, t.to, "a payload goes where its head went");
                    assert_eq!(t.payload.as_ref().map(Bytes::len), Some(len), "as promised");
                    (to, head)
                }
                Some(Promise::Withdrawn { id }) => {
                    self.held_heads.remove(&(r, id)).expect("a promised head");
                    continue;
                }
            };
            self.subtree_frames += usize::from(frame[1] == FrameKind::BcastSubtree as u8);
            frame.extend_from_slice(t.payload.as_deref().unwrap_or_default());
            self.frames.push((r, to, frame));
        }
        while let Some(e) = m.poll_event() {
            self.events[r as usize].push(e);
        }
    }

    fn kill(&mut self, r: Rank) {
        self.ranks[r as usize] = None;
        for s in 0..self.n {
            if self.ranks[s as usize].is_some() {
                self.notices.push((s, r));
            }
        }
    }

    /// Every rank sends chunks of at most `bytes`.
    fn set_chunks(&mut self, bytes: usize) {
        for m in self.ranks.iter_mut().flatten() {
            m.set_chunk_bytes(bytes);
        }
    }

    /// Delivers frame `k` of `frames`; a rejected frame fails the test.
    fn deliver(&mut self, k: usize) {
        let (from, to, bytes) = self.frames.swap_remove(k);
        self.delivered += 1;
        if let Some(m) = self.ranks[to as usize].as_mut() {
            let ctx = wire::Context { comm: 9, n: self.n };
            let (h, mut r) = decode_bcast(&bytes, ctx, from);
            if h.kind == FrameKind::BcastData {
                let output = r.varint_u32().expect("output");
                r.varint().and(r.varint()).expect("total, offset");
                let chunk = r.bytes().expect("chunk").len() as u64;
                *self.received.entry((to, output)).or_default() += chunk;
            }
            self.requests += usize::from(h.kind == FrameKind::BcastRequest);
            // Lent or handed over at random: the outcome must not differ.
            let handled = if self.rng.chance(1, 2) {
                m.handle_message(Instant::ZERO, from, &bytes)
            } else {
                m.handle_message_owned(Instant::ZERO, from, Bytes::from(bytes))
            };
            match handled {
                Ok(()) | Err(FrameError::FromFailedRank(_)) => {}
                Err(e) => panic!("rank {to} rejected a frame from {from}: {e}"),
            }
            self.drain(to);
        }
    }

    /// Delivers one frame or one failure notice; false when nothing is left.
    fn step(&mut self) -> bool {
        let total = self.frames.len() + self.notices.len();
        if total == 0 {
            return false;
        }
        let k = self.rng.below(total as u64) as usize;
        if k < self.frames.len() {
            self.deliver(k);
        } else {
            let (s, dead) = self.notices.swap_remove(k - self.frames.len());
            if let Some(m) = self.ranks[s as usize].as_mut() {
                m.on_rank_failed(Instant::ZERO, dead);
                self.drain(s);
            }
        }
        true
    }
}

/// Runs `spec` over the network, killing `kills` (rank, after how many deliveries),
/// and checks every surviving destination released exactly its outputs, once per
/// tree, byte-identical to the root's payloads.
fn run(spec: PlanSpec, kills: &[(Rank, usize)], seed: u64) -> Result<usize, String> {
    run_with(spec, kills, seed, true).map(|net| net.subtree_frames)
}

/// [`run`] with [`Config::eager_push`] as given at every rank; the network as it ended.
fn run_with(
    spec: PlanSpec,
    kills: &[(Rank, usize)],
    seed: u64,
    eager_push: bool,
) -> Result<Net, String> {
    run_from(spec, kills, seed, eager_push, false)
}

/// Starts broadcasts 1 and 2 from `plan` at the root `m` and forgets them, their
/// frames dropped: the second leaves the plan's template behind (module `template`).
fn warm_up(m: &mut Broadcaster, plan: &Plan, payloads: &[Vec<u8>]) {
    let mut buf = vec![0; wire::frame_capacity_for(m.cfg.n, LEAF_CHUNK)];
    for task in [1, 2] {
        m.start_broadcast(Instant::ZERO, task, plan, payloads.to_vec())
            .expect("a valid start");
        while m
            .poll_transmit_parts(Instant::ZERO, &mut buf)
            .unwrap()
            .is_some()
        {}
        while m.poll_event().is_some() {}
        m.forget(TaskId::new(m.cfg.me, task));
    }
}

/// [`run_with`], the root first warmed up ([`warm_up`]) if `warm`, so broadcast 5
/// starts from the plan's template.
fn run_from(
    spec: PlanSpec,
    kills: &[(Rank, usize)],
    seed: u64,
    eager_push: bool,
    warm: bool,
) -> Result<Net, String> {
    let n = spec.ranks;
    let root = spec.root;
    let plan = Plan::build(spec).map_err(|e| format!("{e}"))?;
    let payloads = payloads_of(&plan);
    let mut net = Net::with_push(n, seed, eager_push);
    if warm {
        warm_up(net.ranks[root as usize].as_mut().unwrap(), &plan, &payloads);
    }
    net.ranks[root as usize]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, payloads.clone())
        .map_err(|e| format!("{e}"))?;
    net.drain(root);
    let mut kills = kills.to_vec();
    let mut steps = 0;
    loop {
        kills.retain(|&(r, at)| {
            if at <= net.delivered && net.ranks[r as usize].is_some() {
                net.kill(r);
                false
            } else {
                true
            }
        });
        if !net.step() {
            if kills.is_empty() {
                break;
            }
            let (r, _) = kills.remove(0);
            net.kill(r);
        }
        steps += 1;
        if steps > 1_000_000 {
            return Err(String::from("did not settle"));
        }
    }
    let mut needs: BTreeMap<Rank, BTreeSet<u32>> = BTreeMap::new();
    for (j, o) in plan.spec().outputs.iter().enumerate() {
        for &r in &o.dests {
            needs.entry(r).or_default().insert(j as u32);
        }
    }
    for r in 0..n {
        let Some(m) = net.ranks[r as usize].as_ref() else {
            continue;
        };
        if plan.spec().failed.contains(r) || r == root {
            continue;
        }
        let mut got: BTreeSet<u32> = BTreeSet::new();
        let mut trees: BTreeSet<u32> = BTreeSet::new();
        // Each tree's arrival, which comes first and names what the tree releases.
        let mut arrived: BTreeMap<u32, OutputSet> = BTreeMap::new();
        for e in &net.events[r as usize] {
            match e {
                BcastEvent::Arrived {
                    task,
                    tree,
                    outputs,
                    ..
                } => {
                    if *task != TaskId::new(root, 5) {
                        return Err(format!("rank {r}: arrival of task {task}"));
                    }
                    if arrived.insert(*tree, outputs.clone()).is_some() {
                        return Err(format!("rank {r}: arrived twice in tree {tree}"));
                    }
                }
                BcastEvent::Released {
                    task,
                    tree,
                    outputs,
                } => {
                    if *task != TaskId::new(root, 5) || !trees.insert(*tree) {
                        return Err(format!("rank {r}: released tree {tree} twice"));
                    }
                    if arrived.get(tree) != Some(outputs) {
                        return Err(format!(
                            "rank {r}: tree {tree} released {outputs:?} after arriving with {:?}",
                            arrived.get(tree)
                        ));
                    }
                    for j in outputs {
                        if !got.insert(j) {
                            return Err(format!("rank {r}: output {j} released twice"));
                        }
                    }
                }
                BcastEvent::Abandoned { .. } => return Err(format!("rank {r} abandoned")),
                BcastEvent::Failed { error, .. } => {
                    return Err(format!("rank {r} failed: {error}"))
                }
            }
        }
        let want = needs.get(&r).cloned().unwrap_or_default();
        if got != want {
            return Err(format!("rank {r}: released {got:?}, needs {want:?}"));
        }
        for &j in &want {
            if m.output(TaskId::new(root, 5), j) != Some(&payloads[j as usize][..]) {
                return Err(format!("rank {r}: output {j} differs from the root's"));
            }
        }
    }
    Ok(net)
}

fn topologies() -> [Topology; 4] {
    [
        Topology::Star,
        Topology::Chain,
        Topology::Binomial,
        Topology::Kary(NonZeroU32::new(2).unwrap()),
    ]
}

#[test]
fn issue_624_every_rank_gets_its_outputs_under_every_strategy() {
    for strategy in Strategy::ALL {
        for topology in topologies() {
            for seed in 0..20 {
                let spec = PlanSpec::new(3, 0)
                    .with_strategy(strategy)
                    .with_topology(topology)
                    .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
                    .with_output(OutputSpec::new("B", 4096, vec![2]));
                run(spec, &[], seed).unwrap_or_else(|e| panic!("{strategy} {topology}: {e}"));
            }
        }
    }
}

#[test]
fn chunked_outputs_survive_a_relay_dying_mid_transfer() {
    // Chain 0 -> 1 -> 2 -> 3; rank 1 dies after a few frames: 2 re-requests from 0
    // (or is adopted by it), 3 still gets everything from 2.
    for strategy in Strategy::ALL {
        for at in 0..12 {
            let spec = PlanSpec::new(4, 0)
                .with_strategy(strategy)
                .with_topology(Topology::Chain)
                .with_output(OutputSpec::new(
                    "big",
                    3 * MAX_CHUNK as u64 + 17,
                    vec![1, 2, 3],
                ))
                .with_output(OutputSpec::new("small", 10, vec![3]));
            run(spec, &[(1, at)], at as u64).unwrap_or_else(|e| panic!("{strategy} at {at}: {e}"));
        }
    }
}

#[test]
fn a_relay_forwards_each_chunk_as_soon_as_it_holds_it() {
    // Chain 0 -> 1 -> 2, one output of three chunks. Everything but data flows freely;
    // rank 0's chunks reach rank 1 one at a time, and after each, rank 1 must already
    // have sent that chunk on to rank 2 (it holds only part of the output).
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("big", 3 * MAX_CHUNK as u64 - 5, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    let data = payload(0, plan.spec().outputs[0].bytes);
    let mut net = Net::new(3, 1);
    net.set_chunks(MAX_CHUNK);
    net.ranks[0]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, vec![data.clone()])
        .unwrap();
    net.drain(0);
    let is_data = |f: &(Rank, Rank, Vec<u8>)| f.2[1] == FrameKind::BcastData as u8;
    let mut forwarded = 0;
    loop {
        // Deliver every control frame, and rank 1's data to rank 2.
        while let Some(k) = net.frames.iter().position(|f| !is_data(f) || f.0 == 1) {
            forwarded += usize::from(is_data(&net.frames[k]));
            net.deliver(k);
        }
        // The next chunk in order (the network may have reordered them).
        let offset = |f: &(Rank, Rank, Vec<u8>)| {
            let ctx = wire::Context { comm: 9, n: 3 };
            let (_, mut r) = decode_bcast(&f.2, ctx, f.0);
            r.varint().unwrap(); // output
            r.varint().unwrap(); // total
            r.varint().unwrap()
        };
        let Some(k) = (0..net.frames.len())
            .filter(|&k| net.frames[k].0 == 0 && net.frames[k].1 == 1)
            .min_by_key(|&k| offset(&net.frames[k]))
        else {
            break;
        };
        net.deliver(k);
        let relayed = net.frames.iter().filter(|f| is_data(f) && f.0 == 1).count();
        let output_at_1 = net.ranks[1].as_ref().unwrap().output(T5, 0);
        assert!(
            relayed == 1 || output_at_1.is_some(),
            "rank 1 holds a chunk it has not passed on (relayed {relayed})"
        );
    }
    assert_eq!(forwarded, 3, "three chunks relayed to rank 2");
    assert_eq!(
        net.ranks[2].as_ref().unwrap().output(T5, 0),
        Some(&data[..])
    );
}

#[test]
fn chunks_leave_and_are_forwarded_as_slices_of_the_payload_never_copies() {
    // Chain 0 -> 1 -> 2 -> 3, two outputs of several chunks, every frame taken through
    // `poll_transmit_parts`. The root's chunks point into the very buffer the
    // application handed over; relays send slices of what they received, shorter ones
    // where their own chunk size is smaller; no rank copies a payload byte on sending.
    let sizes = [3 * MAX_CHUNK as u64 + 11, 2 * MAX_CHUNK as u64];
    let spec = PlanSpec::new(4, 0)
        .with_topology(Topology::Chain)
        .with_strategy(Strategy::FetchForDescendants)
        .with_output(OutputSpec::new("A", sizes[0], vec![1, 2, 3]))
        .with_output(OutputSpec::new("B", sizes[1], vec![3]));
    let plan = Plan::build(spec).unwrap();
    let payloads: Vec<Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(j, &len)| Bytes::from(payload(j, len)))
        .collect();
    let mut ranks: Vec<Broadcaster> = (0..4)
        .map(|me| Broadcaster::new(Config::new(9, 4, me)))
        .collect();
    ranks[2].set_chunk_bytes(MAX_CHUNK / 3);
    ranks[0]
        .start_broadcast(Instant::ZERO, 5, &plan, payloads.clone())
        .unwrap();
    let inside = |p: &Bytes, whole: &Bytes| {
        let (start, end) = (
            whole.as_ptr() as usize,
            whole.as_ptr() as usize + whole.len(),
        );
        (start..=end).contains(&(p.as_ptr() as usize)) && p.as_ptr() as usize + p.len() <= end
    };
    let mut buf = vec![0; wire::frame_capacity(4)];
    let mut chunks_sent = [0usize; 4];
    let mut in_flight: VecDeque<(Rank, Rank, Vec<u8>)> = VecDeque::new();
    loop {
        for r in 0..4u32 {
            while let Some(t) = ranks[r as usize]
                .poll_transmit_parts(Instant::ZERO, &mut buf)
                .unwrap()
            {
                let mut frame = buf[..t.head].to_vec();
                if let Some(p) = &t.payload {
                    chunks_sent[r as usize] += 1;
                    let limit = if r == 2 { MAX_CHUNK / 3 } else { MAX_CHUNK };
                    assert!(p.len() <= limit, "rank {r} sent {} bytes", p.len());
                    if r == 0 {
                        assert!(
                            payloads.iter().any(|whole| inside(p, whole)),
                            "the root's chunk is a slice of the application's buffer"
                        );
                    }
                    frame.extend_from_slice(p);
                }
                in_flight.push_back((r, t.to, frame));
            }
        }
        let Some((from, to, frame)) = in_flight.pop_front() else {
            break;
        };
        ranks[to as usize]
            .handle_message(Instant::ZERO, from, &frame)
            .unwrap();
    }
    for (r, m) in ranks.iter().enumerate() {
        let stats = m.stats();
        assert_eq!(stats.payload_bytes_copied, 0, "rank {r}");
        if r < 3 {
            assert!(stats.payload_bytes_sent >= sizes[0], "rank {r}: {stats:?}");
        }
    }
    assert_eq!(chunks_sent[0], 4 + 2, "the root's chunks");
    // Rank 2 sends pieces of at most a third of the chunks it received.
    assert!(
        chunks_sent[2] >= 10 + 7,
        "rank 2 re-chunks: {chunks_sent:?}"
    );
    for j in 0..2u32 {
        assert_eq!(ranks[3].output(T5, j), Some(&payloads[j as usize][..]));
    }
    assert_eq!(ranks[1].output(T5, 0), Some(&payloads[0][..]));
}

#[test]
fn a_leaf_gets_its_output_in_one_chunk_and_a_relay_in_pipelined_ones() {
    // Binomial tree over 6 ranks: the root's children are relays and leaves. With
    // `leaf_chunk_bytes`, every output goes to a leaf child in one chunk (nothing to
    // join), to a relay in chunks of `chunk_bytes` (it forwards them as they come).
    let size = 3 * MAX_CHUNK as u64 + 5;
    let spec = PlanSpec::new(6, 0).with_output(OutputSpec::new("A", size, vec![1, 2, 3, 4, 5]));
    let plan = Plan::build(spec).unwrap();
    let relays: BTreeSet<Rank> = plan.edges().map(|e| e.parent).collect();
    let data = Bytes::from(payload(0, size));
    let mut ranks: Vec<Broadcaster> = (0..6)
        .map(|me| Broadcaster::new(Config::new(9, 6, me)))
        .collect();
    for m in &mut ranks {
        m.set_leaf_chunk_bytes(1 << 20);
    }
    ranks[0]
        .start_broadcast(Instant::ZERO, 5, &plan, [data.clone()])
        .unwrap();
    let mut buf = vec![0; wire::frame_capacity(6)];
    let mut in_flight: VecDeque<(Rank, Rank, Vec<u8>)> = VecDeque::new();
    let mut whole_to_leaves = 0;
    loop {
        for r in 0..6u32 {
            while let Some(t) = ranks[r as usize]
                .poll_transmit_parts(Instant::ZERO, &mut buf)
                .unwrap()
            {
                let mut frame = buf[..t.head].to_vec();
                if let Some(p) = &t.payload {
                    if relays.contains(&t.to) {
                        assert!(p.len() <= MAX_CHUNK, "{r} -> relay {}: {}", t.to, p.len());
                    } else if r == 0 {
                        assert_eq!(p.len() as u64, size, "the root sends a leaf one chunk");
                        whole_to_leaves += 1;
                    }
                    frame.extend_from_slice(p);
                }
                in_flight.push_back((r, t.to, frame));
            }
        }
        let Some((from, to, frame)) = in_flight.pop_front() else {
            break;
        };
        ranks[to as usize]
            .handle_message_owned(Instant::ZERO, from, Bytes::from(frame))
            .unwrap();
    }
    assert!(whole_to_leaves >= 1, "the root has a leaf child");
    for (r, m) in ranks.iter().enumerate().skip(1) {
        assert_eq!(m.output(T5, 0), Some(&data[..]), "rank {r}");
        assert_eq!(m.stats().received_bytes_copied, 0, "rank {r}");
    }
}

#[test]
fn chunks_of_any_size_from_two_sources_fill_an_output_once() {
    // The old parent sends chunks of 1000 bytes, ahead of order; a new parent (after a
    // repair) resends with chunks of 4099: overlaps are cut, nothing is held twice, and
    // the output completes exactly.
    let size = 10_000u64;
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    let data = payload(0, size);
    let frame = |from: Rank, offset: u64, len: u64| {
        let mut w = task5(FrameKind::BcastData, from);
        w.put_varint(0)
            .put_varint(size)
            .put_varint(offset)
            .put_bytes(&data[offset as usize..(offset + len) as usize]);
        w.finish()
    };
    for offset in [3000, 5000, 0] {
        m.handle_message(Instant::ZERO, 0, &frame(0, offset, 1000))
            .unwrap();
    }
    // Overlapping a chunk already ahead: only its first 500 bytes are new, and kept.
    m.handle_message(Instant::ZERO, 0, &frame(0, 2500, 1000))
        .unwrap();
    assert_eq!(held_bytes(&m), 3500);
    // Spanning two chunks ahead and the gaps around them: the gaps are kept.
    m.handle_message(Instant::ZERO, 0, &frame(0, 2000, 4000))
        .unwrap();
    assert_eq!(held_bytes(&m), 5000);
    let mut offset = 0;
    while offset < size {
        let len = 4099.min(size - offset);
        m.handle_message(Instant::ZERO, 0, &frame(0, offset, len))
            .unwrap();
        assert!(held_bytes(&m) as u64 <= size);
        offset += len;
    }
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    assert_eq!(held_bytes(&m) as u64, size);
    // 18000 bytes came for an output of 10000: the overlaps are counted.
    assert_eq!(m.stats().received_bytes_duplicate, 8000);

    // Chunks outside the output, or empty ones, are the peer's fault.
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    let wrong_length = Err(FrameError::Malformed("data chunk of the wrong length"));
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &frame(0, 9000, 0)),
        wrong_length
    );
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(0)
        .put_varint(size)
        .put_varint(9000)
        .put_bytes(&[1; 1001]);
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &w.finish()),
        wrong_length
    );
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(0)
        .put_varint(size)
        .put_varint(size)
        .put_bytes(&[1]);
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &w.finish()),
        Err(FrameError::Malformed("data offset out of place"))
    );
    assert_eq!(held_bytes(&m), 0);
}

#[test]
fn a_request_before_the_activation_is_queued_not_dropped() {
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 100, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    let mut net = Net::new(3, 1);
    // Rank 2 asks rank 1 before rank 1 knows anything about task 5.
    let m1 = net.ranks[1].as_mut().unwrap();
    m1.handle_message(Instant::ZERO, 2, &request_frame(2))
        .unwrap();
    assert!(
        m1.poll_transmit(Instant::ZERO, &mut net.buf)
            .expect("frame_capacity fits")
            .is_none(),
        "nothing to answer with yet"
    );
    net.ranks[0]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
        .unwrap();
    net.drain(0);
    // Rank 1 answers the queued request as soon as it holds the data. Rank 2 really
    // asks only once activated, so its data is delivered after everything else.
    let is_data_to_2 = |f: &(Rank, Rank, Vec<u8>)| f.1 == 2 && f.2[1] == FrameKind::BcastData as u8;
    while let Some(k) = net.frames.iter().position(|f| !is_data_to_2(f)) {
        net.deliver(k);
    }
    assert!(
        net.frames.iter().any(|f| f.0 == 1 && is_data_to_2(f)),
        "the queued request is answered"
    );
    while net.step() {}
    assert_eq!(
        net.ranks[2].as_ref().unwrap().output(T5, 0),
        Some(&payload(0, 100)[..])
    );
}

#[test]
fn a_frame_from_this_rank_itself_is_refused() {
    // Found by the bcast_frames fuzz target: the root answered a request that claimed
    // to come from itself, queueing data frames addressed to itself.
    let spec = PlanSpec::new(3, 1)
        .with_topology(Topology::Star)
        .with_output(OutputSpec::new("A", 100, vec![0, 2]));
    let plan = Plan::build(spec).unwrap();
    let mut net = Net::new(3, 1);
    let root = net.ranks[1].as_mut().unwrap();
    root.start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
        .unwrap();
    while root
        .poll_transmit(Instant::ZERO, &mut net.buf)
        .expect("frame_capacity fits")
        .is_some()
    {}
    assert_eq!(
        root.handle_message(Instant::ZERO, 1, &request_frame(1)),
        Err(FrameError::Malformed("frame from self"))
    );
    assert!(root
        .poll_transmit(Instant::ZERO, &mut net.buf)
        .expect("frame_capacity fits")
        .is_none());
}

/// The header of a frame of broadcast [`T5`] (communicator 9) from `sender`, and the
/// broadcast's id that starts its body.
fn task5(kind: FrameKind, sender: Rank) -> Writer {
    let mut w = Header {
        kind,
        comm: 9,
        epoch: 0,
        sender,
    }
    .start();
    T5.put(&mut w);
    w
}

/// A request of task 5 from `sender` for output 0 of tree 0, from offset 0.
fn request_frame(sender: Rank) -> Vec<u8> {
    request_frame_at(sender, &[(0, 0)])
}

/// A request of task 5 from `sender` in tree 0 for each `(output, offset)` (outputs
/// in increasing order).
fn request_frame_at(sender: Rank, wants: &[(u32, u64)]) -> Vec<u8> {
    let wants: Vec<Want> = wants
        .iter()
        .map(|&(output, offset)| Want { output, offset })
        .collect();
    let mut w = task5(FrameKind::BcastRequest, sender);
    put_request(&mut w, 0, &wants);
    w.finish()
}

/// An activation of `tree` of task 5 from `from` (whose only ancestor it is) that
/// fetches outputs `0..sizes.len()` of the given sizes, with an empty subtree.
fn activation_frame(from: Rank, tree: u32, sizes: &[u64]) -> Vec<u8> {
    activation_frame_flags(from, tree, sizes, 0)
}

/// [`activation_frame`] with the given flags word.
fn activation_frame_flags(from: Rank, tree: u32, sizes: &[u64], flags: u64) -> Vec<u8> {
    let fetch: OutputSet = (0..sizes.len() as u32).collect();
    let mut w = task5(FrameKind::BcastActivate, from);
    w.put_varint(tree.into())
        .put_varint(flags)
        .put_varint(1)
        .put_rank(from);
    put_set(&mut w, &fetch);
    put_set(&mut w, &fetch);
    for &size in sizes {
        w.put_varint(size);
    }
    // No subtree, no activation header.
    w.put_varint(0).put_varint(0).put_varint(0);
    w.finish()
}

/// A data frame of task 5 from `from`: output `output` of `total` bytes, the chunk
/// at `offset`.
fn data_frame(from: Rank, output: u32, total: u64, offset: u64) -> Vec<u8> {
    let len = (MAX_CHUNK as u64).min(total - offset) as usize;
    let mut w = task5(FrameKind::BcastData, from);
    w.put_varint(output.into())
        .put_varint(total)
        .put_varint(offset)
        .put_bytes(&vec![7; len]);
    w.finish()
}

/// Bytes of output data `m` holds for task 5 (each received chunk is its own buffer of
/// exactly its length, so this is the memory too).
fn held_bytes(m: &Broadcaster) -> usize {
    m.tasks
        .get(&T5)
        .map_or(0, |t| t.buffers.values().map(|b| b.bytes_kept()).sum())
}

/// An entry of a subtree: `child` under `parent`, needing and fetching `fetch`.
fn entry(child: Rank, parent: Rank, fetch: &[u32]) -> Entry {
    let fetch: OutputSet = fetch.iter().copied().collect();
    Entry {
        child,
        parent,
        needs: fetch.clone(),
        fetch,
    }
}

/// A `BcastSubtree` part of tree 0 of task 5 from `from`: `entries` from position
/// `first`.
fn subtree_frame(from: Rank, first: u64, entries: &[Entry]) -> Vec<u8> {
    let mut w = task5(FrameKind::BcastSubtree, from);
    w.put_varint(0)
        .put_varint(first)
        .put_varint(entries.len() as u64);
    for e in entries {
        put_entry(&mut w, e);
    }
    w.finish()
}

#[test]
fn a_bad_subtree_part_is_refused_whole_and_a_good_one_then_completes_the_subtree() {
    // Rank 1 is activated by 0 with a subtree of 3 entries of which the activation
    // carries one (2 under 1); the rest comes in parts.
    let mut m = Broadcaster::new(Config::new(9, 8, 1));
    let mut w = task5(FrameKind::BcastActivate, 0);
    w.put_varint(0).put_varint(0).put_varint(1).put_rank(0);
    put_set(&mut w, &OutputSet::single(0));
    put_set(&mut w, &OutputSet::single(0));
    w.put_varint(100).put_varint(3).put_varint(1);
    put_entry(&mut w, &entry(2, 1, &[0]));
    w.put_varint(0);
    m.handle_message(Instant::ZERO, 0, &w.finish()).unwrap();
    assert!(matches!(
        m.poll_event(),
        Some(BcastEvent::Arrived {
            task: T5,
            tree: 0,
            ..
        })
    ));
    // A part whose second entry fetches an output its parent lacks: refused, and its
    // first entry (3 under 2, fine by itself) is not kept either.
    let bad = subtree_frame(0, 1, &[entry(3, 2, &[0]), entry(4, 3, &[1])]);
    assert!(m.handle_message(Instant::ZERO, 0, &bad).is_err());
    assert!(m.poll_event().is_none());
    let tree = &m.tasks[&T5].trees.get(&0).unwrap();
    assert_eq!((tree.entries.len(), tree.index.len()), (1, 1));
    // The same positions, right this time: the subtree completes and rank 2 is
    // activated with its own subtree (3 under 2, 4 under 3).
    let good = subtree_frame(0, 1, &[entry(3, 2, &[0]), entry(4, 3, &[0])]);
    m.handle_message(Instant::ZERO, 0, &good).unwrap();
    let tree = &m.tasks[&T5].trees.get(&0).unwrap();
    assert_eq!((tree.entries.len(), tree.index.len()), (3, 3));
    assert_eq!(tree.index.get(&4), Some(&2));
    // (It requested its data from 0 on the activation, which did not push.)
    let mut buf = vec![0; wire::frame_capacity(8)];
    let mut activated = Vec::new();
    while let Some(t) = m.poll_transmit(Instant::ZERO, &mut buf).unwrap() {
        if buf[1] == FrameKind::BcastActivate as u8 {
            activated.push(t.to);
        }
    }
    assert_eq!(activated, [2]);
}

#[test]
fn a_chunk_of_a_frame_handed_over_is_kept_in_the_frame_not_copied() {
    let size = 3000u64;
    let data = payload(0, size);
    let frame = |offset: usize| {
        let mut w = task5(FrameKind::BcastData, 0);
        w.put_varint(0)
            .put_varint(size)
            .put_varint(offset as u64)
            .put_bytes(&data[offset..offset + 1000]);
        w.finish()
    };
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    // The last chunk overtakes the activation (kept early, in its frame), the first
    // comes lent (copied), the middle one handed over.
    m.handle_message_owned(Instant::ZERO, 0, Bytes::from(frame(2000)))
        .unwrap();
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    m.handle_message(Instant::ZERO, 0, &frame(0)).unwrap();
    m.handle_message_owned(Instant::ZERO, 0, Bytes::from(frame(1000)))
        .unwrap();
    // A duplicate counts nowhere.
    m.handle_message_owned(Instant::ZERO, 0, Bytes::from(frame(1000)))
        .unwrap();
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    let stats = m.stats();
    assert_eq!(
        (stats.received_bytes_in_place, stats.received_bytes_copied),
        (2000, 1000)
    );

    // An output of one chunk is that very slice of the frame: the bytes the transport
    // received into are the bytes the application reads (and a relay forwards).
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[1000]))
        .unwrap();
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(0)
        .put_varint(1000)
        .put_varint(0)
        .put_bytes(&data[..1000]);
    let frame = Bytes::from(w.finish());
    let range = frame.as_ptr_range();
    m.handle_message_owned(Instant::ZERO, 0, frame.clone())
        .unwrap();
    let kept = m.output_bytes(T5, 0).expect("complete");
    assert_eq!(&kept[..], &data[..1000]);
    assert!(range.contains(&kept.as_ptr()) && kept.as_ptr_range().end == range.end);
    assert_eq!(m.stats().received_bytes_in_place, 1000);
}

#[test]
fn a_huge_announcement_costs_no_memory_until_data_arrives() {
    let gib = 1u64 << 30;
    let mut cfg = Config::new(9, 3, 1);
    cfg.max_task_bytes = 8 * gib;
    let mut m = Broadcaster::new(cfg);
    // Four outputs of 1 GiB each, 4 GiB in all: accepted, and nothing reserved.
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 4]))
        .unwrap();
    assert_eq!(held_bytes(&m), 0);
    let mut buf = vec![0; wire::frame_capacity(3)];
    let request = m.poll_transmit(Instant::ZERO, &mut buf).unwrap().unwrap();
    assert_eq!((request.to, buf[1]), (0, FrameKind::BcastRequest as u8));
    // Data grows the buffer by what arrives: the first chunk, then one far ahead.
    m.handle_message(Instant::ZERO, 0, &data_frame(0, 0, gib, 0))
        .unwrap();
    assert!(held_bytes(&m) <= 2 * MAX_CHUNK, "{}", held_bytes(&m));
    m.handle_message(
        Instant::ZERO,
        0,
        &data_frame(0, 3, gib, 1000 * MAX_CHUNK as u64),
    )
    .unwrap();
    assert!(held_bytes(&m) <= 3 * MAX_CHUNK, "{}", held_bytes(&m));
    assert_eq!(m.output(T5, 0), None, "incomplete outputs are not readable");
}

#[test]
fn out_of_order_chunks_complete_an_output_within_its_size() {
    let size = 3 * MAX_CHUNK as u64 + 5;
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    for offset in [3, 1, 1, 0, 2, 0].map(|k| k * MAX_CHUNK as u64) {
        m.handle_message(Instant::ZERO, 0, &data_frame(0, 0, size, offset))
            .unwrap();
    }
    assert_eq!(m.output(T5, 0).map(<[u8]>::len), Some(size as usize));
    assert!(held_bytes(&m) <= size as usize, "{}", held_bytes(&m));
    assert!(m.tasks[&T5].buffers.get(&0).unwrap().ahead.is_empty());
}

#[test]
fn announced_totals_over_the_limit_are_refused() {
    let gib = 1u64 << 30;
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    let too_big = Err(FrameError::Malformed(
        "outputs larger in total than the configured limit",
    ));
    // Eight outputs of 1 GiB: each within its limit, 8 GiB in all over 4 GiB.
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 8])),
        too_big
    );
    assert!(m.tasks.is_empty(), "a refused activation changes nothing");
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib + 1])),
        Err(FrameError::Malformed(
            "output larger than the configured limit"
        ))
    );
    // The total counts every tree of the task: 3 GiB, then 2 GiB more is refused.
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 3]))
        .unwrap();
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 1, &[gib; 5])),
        too_big
    );
    assert_eq!(m.tasks[&T5].trees.len(), 1);
    assert!(m
        .poll_transmit(Instant::ZERO, &mut vec![0; wire::frame_capacity(3)])
        .expect("frame_capacity fits")
        .is_some());
    assert_eq!(held_bytes(&m), 0);

    // The root refuses to start what its receivers would refuse.
    let mut cfg = Config::new(9, 3, 0);
    (cfg.max_output_bytes, cfg.max_task_bytes) = (100, 150);
    let mut root = Broadcaster::new(cfg);
    let plan = |sizes: &[u64]| {
        let mut spec = PlanSpec::new(3, 0);
        for (j, &b) in sizes.iter().enumerate() {
            spec.outputs
                .push(OutputSpec::new(format!("o{j}"), b, vec![1, 2]));
        }
        Plan::build(spec).unwrap()
    };
    assert_eq!(
        root.start_broadcast(Instant::ZERO, 1, &plan(&[101]), vec![payload(0, 101)]),
        Err(BcastError::TooLarge {
            bytes: 101,
            limit: 100
        })
    );
    assert_eq!(
        root.start_broadcast(
            Instant::ZERO,
            1,
            &plan(&[100, 100]),
            vec![payload(0, 100), payload(1, 100)]
        ),
        Err(BcastError::TooLarge {
            bytes: 200,
            limit: 150
        })
    );
}

#[test]
fn root_death_abandons_and_bad_starts_are_rejected() {
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 100, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    assert_eq!(
        m.start_broadcast(Instant::ZERO, 1, &plan, vec![payload(0, 100)]),
        Err(BcastError::NotRoot { root: 0 })
    );
    let mut root = Broadcaster::new(Config::new(9, 3, 0));
    assert_eq!(
        root.start_broadcast(Instant::ZERO, 1, &plan, vec![payload(0, 99)]),
        Err(BcastError::PayloadSize {
            output: 0,
            expected: 100,
            got: 99
        })
    );
    let mut net = Net::new(3, 3);
    net.ranks[0]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
        .unwrap();
    net.drain(0);
    net.step(); // rank 1 gets its activation
    net.kill(0);
    while net.step() {}
    assert!(net.events[1].contains(&BcastEvent::Abandoned { task: T5 }));
}

#[test]
fn big_subtrees_are_split_over_several_frames() {
    // 1024 ranks, binomial, 150 outputs to everyone: an entry takes about 300 bytes,
    // so the root's first child's 511-entry subtree needs 3 frames; frames arrive in
    // random order and a relay dies midway.
    let n = 1024;
    let mut spec = PlanSpec::new(n, 0).with_topology(Topology::Binomial);
    for j in 0..150 {
        spec.outputs.push(OutputSpec::new(
            format!("o{j}"),
            1,
            (1..n).collect::<Vec<_>>(),
        ));
    }
    let continuation_frames = run(spec, &[(2, 300)], 7).unwrap();
    assert!(continuation_frames >= 2, "{continuation_frames}");
}

fn random_spec(n: u32, m: usize, seed: u64) -> PlanSpec {
    let mut rng = SplitMix::new(seed);
    let root = rng.below(n.into()) as Rank;
    let mut spec = PlanSpec::new(n, root);
    for j in 0..m {
        let p = [10, 40, 80][rng.below(3) as usize];
        let dests: Vec<Rank> = (0..n)
            .filter(|&r| r != root && rng.chance(p, 100))
            .collect();
        let bytes = [0, 1, 1000, MAX_CHUNK as u64 + 5][rng.below(4) as usize];
        spec.outputs
            .push(OutputSpec::new(format!("o{j}"), bytes, dests));
    }
    let failed: Vec<Rank> = (0..n)
        .filter(|&r| r != root && rng.chance(5, 100))
        .collect();
    spec.with_failed(&failed).unwrap()
}

/// [`random_spec`] with strategy and topology number `strategy` and `topology`.
fn random_shaped_spec(n: u32, m: usize, strategy: usize, topology: usize, seed: u64) -> PlanSpec {
    random_spec(n, m, seed)
        .with_strategy(Strategy::ALL[strategy])
        .with_topology(topologies()[topology])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 48 } else { 2000 }, ..ProptestConfig::default() })]
    /// Random plans, random delivery order, up to 3 ranks killed at random steps:
    /// every surviving destination releases exactly its outputs, byte-identical.
    #[test]
    fn random_kills_leave_every_survivor_with_exactly_its_outputs(
        n in 2u32..24,
        m in 1usize..5,
        strategy in 0usize..3,
        topology in 0usize..4,
        kills in prop::collection::vec((0u32..24, 0usize..100), 0..4),
        seed in any::<u64>(),
        warm in any::<bool>(),
    ) {
        let spec = random_shaped_spec(n, m, strategy, topology, seed);
        let root = spec.root;
        let kills: Vec<(Rank, usize)> = kills.into_iter().map(|(r, at)| (r % n, at)).filter(|&(r, _)| r != root).collect();
        if let Err(e) = run_from(spec, &kills, seed, true, warm) {
            return Err(TestCaseError::fail(e));
        }
    }

    /// A root that started twice from a plan starts again from its template: it
    /// sends byte for byte what a root starting from scratch sends, with any chunk
    /// settings and push, and after a rank's death (which drops the template) too.
    #[test]
    fn a_root_starting_again_from_a_plan_sends_what_a_fresh_root_sends(
        n in 2u32..24,
        m in 1usize..5,
        strategy in 0usize..3,
        topology in 0usize..4,
        seed in any::<u64>(),
        push in any::<bool>(),
        dead in prop::option::of(0u32..24),
    ) {
        let spec = random_shaped_spec(n, m, strategy, topology, seed);
        let root = spec.root;
        let plan = Plan::build(spec).unwrap();
        let payloads = payloads_of(&plan);
        let mut cfg = Config::new(9, n, root);
        let mut chunks = SplitMix::new(seed ^ 0x7e);
        cfg.chunk_bytes = [MAX_CHUNK, 1000, 4099][chunks.below(3) as usize];
        cfg.leaf_chunk_bytes = [None, Some(LEAF_CHUNK)][chunks.below(2) as usize];
        cfg.eager_push = push;
        let mut warm = Broadcaster::new(cfg);
        let mut fresh = Broadcaster::new(cfg);
        warm_up(&mut warm, &plan, &payloads);
        prop_assert!(warm.root_template.is_some());
        if let Some(d) = dead.map(|d| d % n).filter(|&d| d != root) {
            warm.on_rank_failed(Instant::ZERO, d);
            fresh.on_rank_failed(Instant::ZERO, d);
            prop_assert!(warm.root_template.is_none());
        }
        // Task 5: from the template (or, after a death, from scratch again, which
        // leaves a new template); task 6: from the template.
        for task in [5, 6] {
            let sent = |m: &mut Broadcaster| {
                m.start_broadcast(Instant::ZERO, task, &plan, payloads.clone()).unwrap();
                let mut buf = vec![0; wire::frame_capacity_for(n, LEAF_CHUNK)];
                let mut frames = Vec::new();
                while let Some(t) = m.poll_transmit_parts(Instant::ZERO, &mut buf).unwrap() {
                    frames.push((t.to, buf[..t.head].to_vec(), t.payload));
                }
                frames
            };
            prop_assert_eq!(sent(&mut warm), sent(&mut fresh));
        }
    }

    /// Arbitrary bytes, alone or behind a valid header of every broadcast kind, never
    /// panic the machine.
    #[test]
    fn arbitrary_frames_never_panic(kind in 0usize..4, body in prop::collection::vec(any::<u8>(), 0..200), raw in any::<bool>()) {
        let mut m = Broadcaster::new(Config::new(9, 50, 3));
        let kinds = [FrameKind::BcastActivate, FrameKind::BcastSubtree, FrameKind::BcastRequest, FrameKind::BcastData];
        let mut frame = if raw { Vec::new() } else {
            Header { kind: kinds[kind], comm: 9, epoch: 0, sender: 7 }.start().finish()
        };
        frame.extend_from_slice(&body);
        let _ = m.handle_message(Instant::ZERO, 7, &frame);
        let mut buf = vec![0; wire::frame_capacity(50)];
        while m.poll_transmit(Instant::ZERO, &mut buf).expect("frame_capacity fits").is_some() {}
        while m.poll_event().is_some() {}
    }
}

/// The bytes of every output each rank fetches in `plan` (the union of its incoming
/// edges), by (rank, output).
fn fetched_bytes(plan: &Plan) -> BTreeMap<(Rank, u32), u64> {
    let mut want = BTreeMap::new();
    for k in 0..plan.trees().len() {
        for e in plan.tree_edges(k) {
            for j in e.outputs.iter() {
                want.insert((e.child, j), plan.spec().outputs[j as usize].bytes);
            }
        }
    }
    want
}

#[test]
fn failure_free_every_destination_receives_each_payload_byte_once() {
    // Eager push, random delivery order (so data often overtakes its activation):
    // with nothing failing, each rank receives exactly the bytes of the outputs it
    // fetches, each once, and nobody sends a request. Pull only gives the same bytes
    // through one request per activated rank and tree.
    for strategy in Strategy::ALL {
        for topology in topologies() {
            for seed in 0..6 {
                let spec = PlanSpec::new(9, 2)
                    .with_strategy(strategy)
                    .with_topology(topology)
                    .with_output(OutputSpec::new(
                        "A",
                        3 * MAX_CHUNK as u64 + 17,
                        vec![0, 1, 4, 5, 8],
                    ))
                    .with_output(OutputSpec::new("B", 5000, vec![1, 3, 5, 7]))
                    .with_output(OutputSpec::new("C", 0, vec![6]))
                    .with_output(OutputSpec::new("D", 1, vec![0, 3, 6, 8]));
                let plan = Plan::build(spec.clone()).unwrap();
                let want = fetched_bytes(&plan);
                let empty: Vec<(Rank, u32)> = want
                    .iter()
                    .filter(|(_, &b)| b == 0)
                    .map(|(&k, _)| k)
                    .collect();
                for push in [true, false] {
                    let net = run_with(spec.clone(), &[], seed, push)
                        .unwrap_or_else(|e| panic!("{strategy} {topology} push {push}: {e}"));
                    let mut got = net.received.clone();
                    // An empty output's one chunk carries no byte: count it as present.
                    for k in &empty {
                        assert_eq!(got.get(k), Some(&0), "{k:?}: its empty chunk");
                    }
                    got.retain(|_, b| *b > 0);
                    let mut nonempty = want.clone();
                    nonempty.retain(|_, b| *b > 0);
                    assert_eq!(
                        got, nonempty,
                        "{strategy} {topology} seed {seed} push {push}"
                    );
                    let activated: usize = (0..plan.trees().len())
                        .map(|k| plan.tree_edges(k).count())
                        .sum();
                    let requests = if push { 0 } else { activated };
                    assert_eq!(net.requests, requests, "{strategy} {topology} push {push}");
                }
            }
        }
    }
}

/// Delivers the network round by round (every frame in flight at the start of a round
/// is delivered in it, in random order): the rounds until nothing is left, i.e. the
/// message delays on the longest causal chain.
fn rounds(spec: PlanSpec, eager_push: bool) -> usize {
    let plan = Plan::build(spec).unwrap();
    let payloads: Vec<Vec<u8>> = (plan.spec().outputs.iter().enumerate())
        .map(|(j, o)| payload(j, o.bytes))
        .collect();
    let mut net = Net::with_push(plan.spec().ranks, 3, eager_push);
    let root = plan.spec().root;
    net.ranks[root as usize]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, payloads.clone())
        .unwrap();
    net.drain(root);
    let mut rounds = 0;
    while !net.frames.is_empty() {
        rounds += 1;
        let mut this_round = core::mem::take(&mut net.frames);
        while !this_round.is_empty() {
            let k = net.rng.below(this_round.len() as u64) as usize;
            // Delivered from the end of `frames`, behind which `deliver` queues what
            // the receiver sends: the next round's frames.
            let at = net.frames.len();
            net.frames.push(this_round.swap_remove(k));
            net.deliver(at);
        }
    }
    for (j, o) in plan.spec().outputs.iter().enumerate() {
        for &d in &o.dests {
            let m = net.ranks[d as usize].as_ref().unwrap();
            assert_eq!(m.output(T5, j as u32), Some(&payloads[j][..]), "rank {d}");
        }
    }
    rounds
}

#[test]
fn eager_push_costs_one_message_delay_per_tree_level() {
    // A chain of 5 (depth 4), one output of three chunks: each level is one delay
    // with push (activation and data together). Pull pays two more in all: a relay
    // activates its children at once, so the activations run one level a delay ahead
    // and each child's request and the data behind it add two delays at the last level
    // (the data itself moves one level a delay, pipelined).
    let chain = || {
        PlanSpec::new(5, 0)
            .with_topology(Topology::Chain)
            .with_output(OutputSpec::new("A", 3 * MAX_CHUNK as u64, vec![1, 2, 3, 4]))
    };
    assert_eq!(rounds(chain(), true), 4);
    assert_eq!(rounds(chain(), false), 6);
    // Binomial over 8 ranks (depth 3).
    let binomial = PlanSpec::new(8, 0)
        .with_topology(Topology::Binomial)
        .with_output(OutputSpec::new("A", 70_000, (1..8).collect::<Vec<Rank>>()));
    assert_eq!(rounds(binomial.clone(), true), 3);
    assert_eq!(rounds(binomial, false), 5);
}

#[test]
fn pull_only_ranks_repair_and_deliver_as_before() {
    // The pull-only mode stays correct under kills (the random proptest runs the
    // default, eager push).
    for strategy in Strategy::ALL {
        for at in 0..12 {
            let spec = PlanSpec::new(5, 0)
                .with_strategy(strategy)
                .with_topology(Topology::Chain)
                .with_output(OutputSpec::new(
                    "big",
                    3 * MAX_CHUNK as u64 + 17,
                    vec![1, 2, 3, 4],
                ))
                .with_output(OutputSpec::new("small", 10, vec![3]));
            run_with(spec, &[(1, at), (3, 2 * at)], at as u64, false)
                .unwrap_or_else(|e| panic!("{strategy} at {at}: {e}"));
        }
    }
}

#[test]
fn data_that_overtakes_its_activation_is_kept_then_used_without_a_request() {
    let size = 3 * MAX_CHUNK as u64 + 5;
    let data = payload(0, size);
    let chunk = |offset: u64| {
        let end = (offset + MAX_CHUNK as u64).min(size);
        let mut w = task5(FrameKind::BcastData, 0);
        w.put_varint(0)
            .put_varint(size)
            .put_varint(offset)
            .put_bytes(&data[offset as usize..end as usize]);
        w.finish()
    };
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    for k in [2, 0] {
        m.handle_message(Instant::ZERO, 0, &chunk(k * MAX_CHUNK as u64))
            .unwrap();
    }
    assert_eq!(
        m.held_bytes(),
        2 * MAX_CHUNK,
        "kept, counted, not yet an output"
    );
    assert_eq!(m.output(T5, 0), None);
    m.handle_message(
        Instant::ZERO,
        0,
        &activation_frame_flags(0, 0, &[size], DATA_FOLLOWS),
    )
    .unwrap();
    let mut buf = vec![0; wire::frame_capacity(3)];
    assert!(
        m.poll_transmit(Instant::ZERO, &mut buf).unwrap().is_none(),
        "data follows: no request"
    );
    assert_eq!(m.tasks[&T5].early_bytes, 0);
    for k in [1, 3] {
        m.handle_message(Instant::ZERO, 0, &chunk(k * MAX_CHUNK as u64))
            .unwrap();
    }
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    assert_eq!(m.held_bytes(), size as usize);
    assert_eq!(
        m.poll_event(),
        Some(BcastEvent::Arrived {
            task: T5,
            tree: 0,
            outputs: OutputSet::single(0),
            header: Bytes::new(),
        })
    );
    assert_eq!(
        m.poll_event(),
        Some(BcastEvent::Released {
            task: T5,
            tree: 0,
            outputs: OutputSet::single(0)
        })
    );
    // Once forgotten, a late chunk (the rest of a repair stream) is dropped, not kept.
    m.forget(T5);
    m.handle_message(Instant::ZERO, 0, &chunk(0)).unwrap();
    assert_eq!(m.held_bytes(), 0);
    assert!(m.tasks.is_empty());
}

#[test]
fn early_data_is_bounded_and_checked_against_its_later_activation() {
    let mut cfg = Config::new(9, 3, 1);
    cfg.max_task_bytes = 2 * MAX_CHUNK as u64;
    cfg.max_output_bytes = 4 * MAX_CHUNK as u64;
    let mut m = Broadcaster::new(cfg);
    let total = 4 * MAX_CHUNK as u64;
    for k in 0..2 {
        m.handle_message(
            Instant::ZERO,
            0,
            &data_frame(0, 0, total, k * MAX_CHUNK as u64),
        )
        .unwrap();
    }
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &data_frame(0, 1, total, 0)),
        Err(FrameError::Malformed(
            "more data before its activation than the configured limit"
        ))
    );
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &data_frame(0, 1, total + 1, 0)),
        Err(FrameError::Malformed(
            "output larger than the configured limit"
        ))
    );
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &data_frame(0, 4096, 10, 0)),
        Err(FrameError::Malformed("output index over the limit"))
    );
    assert_eq!(m.held_bytes(), 2 * MAX_CHUNK);
    // The activation announces another size: the kept chunks do not match it and are
    // dropped, the activation itself stands (and, not pushed, asks for the data).
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[1000]))
        .unwrap();
    assert_eq!(m.held_bytes(), 0);
    let mut buf = vec![0; wire::frame_capacity(3)];
    let request = m.poll_transmit(Instant::ZERO, &mut buf).unwrap().unwrap();
    assert_eq!((request.to, buf[1]), (0, FrameKind::BcastRequest as u8));
}

#[test]
fn unknown_activation_flags_are_refused() {
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    assert_eq!(
        m.handle_message(Instant::ZERO, 0, &activation_frame_flags(0, 0, &[10], 2)),
        Err(FrameError::Malformed("unknown activation flags"))
    );
    assert!(m.tasks.is_empty());
}

#[test]
fn a_request_for_an_output_being_pushed_starts_no_second_stream() {
    // Star 0 -> {1, 2}: the root pushes A to both; a request from 1 for A (before or
    // after its push started) is merged into the push: 1 gets A's bytes once.
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Star)
        .with_output(OutputSpec::new("A", 2 * MAX_CHUNK as u64, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    for when in [0, 1, 2, 5] {
        let mut root = Broadcaster::new(Config::new(9, 3, 0));
        let mut buf = vec![0; wire::frame_capacity(3)];
        root.start_broadcast(
            Instant::ZERO,
            5,
            &plan,
            vec![payload(0, 2 * MAX_CHUNK as u64)],
        )
        .unwrap();
        let mut to_1 = 0u64;
        let mut polls = 0;
        loop {
            if polls == when {
                root.handle_message(Instant::ZERO, 1, &request_frame(1))
                    .unwrap();
            }
            let Some(t) = root.poll_transmit_parts(Instant::ZERO, &mut buf).unwrap() else {
                break;
            };
            polls += 1;
            if t.to == 1 {
                to_1 += t.payload.map_or(0, |p| p.len() as u64);
            }
        }
        assert!(polls > when, "the request came in mid-push");
        assert_eq!(to_1, 2 * MAX_CHUNK as u64, "request after {when} frames");
    }
}

/// Chain 0 -> 1 -> 2, one output of five chunks, every rank sending chunks of
/// [`MAX_CHUNK`] (a multiple of the chunk, so the chunks are exactly that long). Rank 1 gets the whole output and forwards it, but rank 2
/// receives only its chunks with the indices in `held` before rank 1 dies (what else
/// rank 1 sent is lost with it). The survivors learn of the death in `order` (rank 2
/// first: it repairs by requesting from rank 0; rank 0 first: it adopts rank 2, which
/// requests once activated). Returns the network as it ended and the payload bytes
/// rank 2 received after the death.
fn repair_with_a_prefix(held: &[u64], order: [Rank; 2], eager_push: bool) -> (Net, u64) {
    let size = 5 * MAX_CHUNK as u64;
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", size, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    let mut net = Net::with_push(3, 11, eager_push);
    net.set_chunks(MAX_CHUNK);
    for m in net.ranks.iter_mut().flatten() {
        m.set_leaf_chunk_bytes(MAX_CHUNK);
    }
    net.ranks[0]
        .as_mut()
        .unwrap()
        .start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, size)])
        .unwrap();
    net.drain(0);
    let ctx = wire::Context { comm: 9, n: 3 };
    let withheld = |f: &(Rank, Rank, Vec<u8>)| {
        let (h, mut r) = decode_bcast(&f.2, ctx, f.0);
        if (f.0, f.1, h.kind) != (1, 2, FrameKind::BcastData) {
            return false;
        }
        r.varint().and(r.varint()).unwrap(); // output, total
        !held.contains(&(r.varint().unwrap() / MAX_CHUNK as u64))
    };
    while let Some(k) = net.frames.iter().position(|f| !withheld(f)) {
        net.deliver(k);
    }
    let received = |net: &Net| net.received.get(&(2, 0)).copied().unwrap_or(0);
    let before = received(&net);
    net.ranks[1] = None;
    net.frames.retain(|f| f.0 != 1);
    for s in order {
        net.ranks[s as usize]
            .as_mut()
            .unwrap()
            .on_rank_failed(Instant::ZERO, 1);
        net.drain(s);
        while net.step() {}
    }
    let m = net.ranks[2].as_ref().unwrap();
    assert_eq!(m.output(T5, 0), Some(&payload(0, size)[..]));
    let after = received(&net) - before;
    (net, after)
}

#[test]
fn a_repaired_child_receives_only_the_bytes_past_the_prefix_it_holds() {
    let size = 5 * MAX_CHUNK as u64;
    let chunk = MAX_CHUNK as u64;
    // (chunks held when the parent dies, bytes the new source sends, bytes received
    // twice): only the contiguous prefix counts, so chunks held past a gap come again.
    let cases: [(&[u64], u64, u64); 5] = [
        (&[0, 1], size - 2 * chunk, 0),
        (&[0, 1, 2, 3], chunk, 0),
        (&[], size, 0),
        (&[0, 1, 3], size - 2 * chunk, chunk),
        (&[1, 2], size, 2 * chunk),
    ];
    for (held, resent, twice) in cases {
        for order in [[2, 0], [0, 2]] {
            for push in [true, false] {
                let what = format!("held {held:?}, told {order:?} first, push {push}");
                let (net, after) = repair_with_a_prefix(held, order, push);
                assert_eq!(after, resent, "{what}");
                let stats = net.ranks[2].as_ref().unwrap().stats();
                assert_eq!(stats.received_bytes_duplicate, twice, "{what}");
                // Rank 2 asked rank 0 once (without push, ranks 1 and 2 asked their
                // parents before).
                assert_eq!(net.requests, 1 + 2 * usize::from(!push), "{what}");
            }
        }
    }
}

#[test]
fn requests_carry_an_offset_per_output_and_round_trip() {
    let wants = [
        Want {
            output: 0,
            offset: 0,
        },
        Want {
            output: 3,
            offset: 12_345,
        },
        Want {
            output: 4095,
            offset: 1 << 30,
        },
    ];
    let mut w = task5(FrameKind::BcastRequest, 2);
    put_request(&mut w, 7, &wants);
    let frame = w.finish();
    let ctx = wire::Context { comm: 9, n: 3 };
    let read = |max_offset: u64| {
        let (_, r) = decode_bcast(&frame, ctx, 2);
        read_request(r, 4096, max_offset)
    };
    assert_eq!(read(1 << 30), Ok((7, wants.to_vec())));
    assert_eq!(
        read((1 << 30) - 1),
        Err(FrameError::Malformed(
            "request offset over the output size limit"
        ))
    );
    // An output named without its offset (the frame ends early), or bytes after the
    // last offset, are refused.
    let (_, r) = decode_bcast(&frame[..frame.len() - 1], ctx, 2);
    assert_eq!(read_request(r, 4096, 1 << 30), Err(FrameError::Truncated));
    let mut longer = frame.clone();
    longer.push(0);
    let (_, r) = decode_bcast(&longer, ctx, 2);
    assert_eq!(
        read_request(r, 4096, 1 << 30),
        Err(FrameError::TrailingBytes)
    );
}

#[test]
fn a_request_offset_past_its_output_is_refused_and_changes_nothing() {
    let mut buf = vec![0; wire::frame_capacity(3)];
    let drained = |m: &mut Broadcaster, buf: &mut [u8]| {
        let mut frames = Vec::new();
        while let Some(t) = m.poll_transmit(Instant::ZERO, buf).unwrap() {
            frames.push((t.to, buf[1]));
        }
        frames
    };
    // Rank 0 sends rank 1 both outputs: 1000 bytes in one chunk, and the empty one.
    let feed = |m: &mut Broadcaster| {
        for (output, size) in [(0, 1000), (1, 0)] {
            m.handle_message(Instant::ZERO, 0, &data_frame(0, output, size, 0))
                .unwrap();
        }
    };
    // Rank 1 knows output 0 has 1000 bytes, output 1 none.
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[1000, 0]))
        .unwrap();
    drained(&mut m, &mut buf); // its own request to rank 0
    let out_of_place = Err(FrameError::Malformed("request offset out of place"));
    for bad in [
        &[(0, 1000)][..],
        &[(0, 5000)],
        &[(1, 1)],
        &[(0, 10), (1, 1)],
    ] {
        assert_eq!(
            m.handle_message(Instant::ZERO, 2, &request_frame_at(2, bad)),
            out_of_place,
            "{bad:?}"
        );
    }
    assert_eq!(
        m.handle_message(Instant::ZERO, 2, &request_frame_at(2, &[(0, 1 << 31)])),
        Err(FrameError::Malformed(
            "request offset over the output size limit"
        ))
    );
    assert!(m.tasks[&T5].waiting.is_empty() && m.tasks[&T5].served.is_empty());
    // In place: the last byte of output 0, and the empty output 1 at 0. Rank 1 holds
    // nothing yet, so its streams wait for the data.
    m.handle_message(Instant::ZERO, 2, &request_frame_at(2, &[(0, 999), (1, 0)]))
        .unwrap();
    feed(&mut m);
    let mut sent = Vec::new();
    while let Some(t) = m.poll_transmit(Instant::ZERO, &mut buf).unwrap() {
        let ctx = wire::Context { comm: 9, n: 3 };
        let (_, mut r) = decode_bcast(&buf[..t.len], ctx, 1);
        let at = (
            r.varint().unwrap(),
            r.varint().unwrap(),
            r.varint().unwrap(),
        );
        sent.push((t.to, at, r.bytes().unwrap().len()));
    }
    sent.sort_unstable();
    assert_eq!(sent, vec![(2, (0, 1000, 999), 1), (2, (1, 0, 0), 0)]);

    // Queued before the size is announced, an offset past the output is dropped then:
    // no stream, and the rest of the request is served.
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(Instant::ZERO, 2, &request_frame_at(2, &[(0, 5000), (1, 0)]))
        .unwrap();
    m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[1000, 0]))
        .unwrap();
    feed(&mut m);
    let frames = drained(&mut m, &mut buf);
    let data = FrameKind::BcastData as u8;
    assert_eq!(frames.iter().filter(|f| **f == (2, data)).count(), 1);
    assert!(m.tasks[&T5].waiting.is_empty());
    assert_eq!(m.tasks[&T5].served[&2], OutputSet::single(1));
}

#[test]
fn a_request_with_an_offset_streams_the_rest_and_merges_into_a_stream_under_way() {
    // Star 0 -> {1, 2} without push: rank 1 asks for A from its second chunk, so the
    // root sends it the rest only; a second request (from 0, overtaken by the first)
    // merges into that stream. With push, a request from any offset merges into the
    // push, which sends the whole output once.
    let size = 3 * MAX_CHUNK as u64;
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Star)
        .with_output(OutputSpec::new("A", size, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    for push in [false, true] {
        let mut cfg = Config::new(9, 3, 0);
        cfg.eager_push = push;
        let mut root = Broadcaster::new(cfg);
        root.start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, size)])
            .unwrap();
        let chunk = MAX_CHUNK as u64;
        for offset in [chunk, 0] {
            root.handle_message(Instant::ZERO, 1, &request_frame_at(1, &[(0, offset)]))
                .unwrap();
        }
        let mut buf = vec![0; wire::frame_capacity(3)];
        let (mut to_1, mut first) = (0, None);
        while let Some(t) = root.poll_transmit_parts(Instant::ZERO, &mut buf).unwrap() {
            if let (1, Some(p)) = (t.to, t.payload) {
                to_1 += p.len() as u64;
                let ctx = wire::Context { comm: 9, n: 3 };
                let (_, mut r) = decode_bcast(&buf[..t.head], ctx, 0);
                r.varint().and(r.varint()).unwrap();
                first = first.or(Some(r.varint().unwrap()));
            }
        }
        let (want, from) = if push {
            (size, 0)
        } else {
            (size - chunk, chunk)
        };
        assert_eq!((to_1, first), (want, Some(from)), "push {push}");
    }
}

/// The head of a data frame of task 5 from `from` (everything before the chunk's
/// bytes: output, total, offset and the chunk's length), as a transport that receives
/// the payload on its own sees it.
fn data_head(from: Rank, output: u32, total: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut w = task5(FrameKind::BcastData, from);
    w.put_varint(output.into())
        .put_varint(total)
        .put_varint(offset)
        .put_varint(len as u64);
    w.finish()
}

#[test]
fn chunks_received_in_place_land_in_the_outputs_one_buffer_and_join_free() {
    let size = 3000u64;
    let data = payload(0, size);
    let now = Instant::ZERO;
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    let head = |offset: u64, len: usize| data_head(0, 0, size, offset, len);
    // Nothing is placed before the activation announces the output, nor for a frame
    // that is not data, nor from this rank itself.
    assert!(m.place_payload(now, 0, &head(0, 1000), 1000).is_none());
    m.handle_message(now, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    assert!(m.place_payload(now, 0, &request_frame(0), 1000).is_none());
    assert!(m
        .place_payload(now, 1, &data_head(1, 0, size, 0, 1000), 1000)
        .is_none());
    // The announced length must be the head's, the size the announced one, and the
    // chunk within it.
    assert!(m.place_payload(now, 0, &head(0, 1000), 999).is_none());
    assert!(m
        .place_payload(now, 0, &data_head(0, 0, size + 1, 0, 1000), 1000)
        .is_none());
    assert!(m.place_payload(now, 0, &head(2500, 1000), 1000).is_none());
    // A one-chunk output stays in the transport's buffer (kept as its frame, no copy).
    assert!(m.place_payload(now, 0, &head(0, 3000), 3000).is_none());

    // Three chunks placed, out of order; a second placement over placed bytes is
    // refused (the transport then keeps that payload itself, and it is trimmed).
    let last = m
        .place_payload(now, 0, &head(2000, 1000), 1000)
        .expect("placed");
    let first = m
        .place_payload(now, 0, &head(0, 1000), 1000)
        .expect("placed");
    assert!(m.place_payload(now, 0, &head(500, 1000), 1000).is_none());
    // The middle one's sender dies mid-transfer: its slot comes back, and the range can
    // be placed again (from the new source).
    let lost = m
        .place_payload(now, 0, &head(1000, 1000), 1000)
        .expect("placed");
    assert!(m.place_payload(now, 0, &head(1000, 1000), 1000).is_none());
    m.slot_lost(lost);
    let middle = m
        .place_payload(now, 0, &head(1000, 1000), 1000)
        .expect("again");

    let fill = |slot: ft_core::Slot, at: usize| slot.fill_from(&data[at..at + 1000]).unwrap();
    m.handle_message_placed(now, 0, &head(2000, 1000), fill(last, 2000))
        .unwrap();
    m.handle_message_placed(now, 0, &head(0, 1000), fill(first, 0))
        .unwrap();
    assert_eq!(m.output(T5, 0), None);
    // A placed payload of another length than its head's is refused.
    let short = Broadcaster::new(Config::new(9, 3, 1))
        .handle_message_placed(now, 0, &head(1000, 999), fill(middle, 1000))
        .unwrap_err();
    assert_eq!(
        short,
        FrameError::Malformed("placed payload differs from its announced length")
    );
    let middle = m.place_payload(now, 0, &head(1000, 1000), 1000);
    assert!(
        middle.is_none(),
        "still claimed: the refused fill was of another machine"
    );
}

#[test]
fn landed_chunks_join_without_a_copy_and_mixed_ones_with_one() {
    let size = 3000u64;
    let data = payload(0, size);
    let now = Instant::ZERO;
    let head = |offset: u64| data_head(0, 0, size, offset, 1000);
    // Every chunk landed: the output is the landing buffer itself.
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(now, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    let slots: Vec<_> = [2000u64, 0, 1000]
        .iter()
        .map(|&at| (at, m.place_payload(now, 0, &head(at), 1000).unwrap()))
        .collect();
    let mut first = None;
    for (at, slot) in slots {
        let filled = slot
            .fill_from(&data[at as usize..at as usize + 1000])
            .unwrap();
        m.handle_message_placed(now, 0, &head(at), filled).unwrap();
        if at == 0 {
            first = m.tasks[&T5].buffers.get(&0).unwrap().piece(0, 1000);
        }
    }
    let whole = m.output_bytes(T5, 0).expect("complete");
    assert_eq!(&whole[..], &data[..]);
    assert_eq!(
        whole.as_ptr(),
        first.unwrap().as_ptr(),
        "the landing buffer itself"
    );
    let stats = m.stats();
    assert_eq!((stats.received_bytes_landed, stats.joined_bytes), (3000, 0));

    // One chunk came in a frame (a repair from a transport that does not place): the
    // output is joined by a copy, counted, and still byte-exact.
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.handle_message(now, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    for at in [0u64, 2000] {
        let slot = m.place_payload(now, 0, &head(at), 1000).unwrap();
        let filled = slot
            .fill_from(&data[at as usize..at as usize + 1000])
            .unwrap();
        m.handle_message_placed(now, 0, &head(at), filled).unwrap();
    }
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(0)
        .put_varint(size)
        .put_varint(1000)
        .put_bytes(&data[1000..2000]);
    m.handle_message(now, 0, &w.finish()).unwrap();
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    let stats = m.stats();
    assert_eq!(
        (
            stats.received_bytes_landed,
            stats.received_bytes_copied,
            stats.joined_bytes
        ),
        (2000, 1000, 3000)
    );
}

#[test]
fn a_chain_deeper_than_the_ancestors_carried_keeps_the_root_and_the_nearest() {
    // Chain 0 -> 1 -> ... -> 79: rank 79 has 79 ancestors, more than an activation
    // carries; it keeps the root and the MAX_ANCESTORS - 1 nearest, its parent last.
    let n = 80;
    let spec = PlanSpec::new(n, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 100, (1..n).collect::<Vec<Rank>>()));
    let net = run_with(spec, &[], 1, true).expect("every rank gets its output");
    let last = net.ranks[79].as_ref().unwrap();
    let tree = last.tasks[&T5]
        .trees
        .values()
        .next()
        .expect("rank 79 is in the tree");
    let ancestors = &tree.ancestors;
    assert_eq!(ancestors.len(), super::codec::MAX_ANCESTORS);
    assert_eq!(ancestors[0], 0, "the root first");
    let nearest: Vec<Rank> = (79 - (super::codec::MAX_ANCESTORS as Rank - 1)..79).collect();
    assert_eq!(
        &ancestors[1..],
        &nearest[..],
        "then the nearest, its parent last"
    );
}

/// A frame as `poll_transmit_parts` gives it: to, head, payload, promise.
type Parts = (Rank, Vec<u8>, Option<Bytes>, Option<Promise>);

/// Every frame `m` has queued, through `poll_transmit_parts`.
fn parts_of(m: &mut Broadcaster) -> Vec<Parts> {
    let mut buf = vec![0; wire::frame_capacity(8)];
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit_parts(Instant::ZERO, &mut buf).unwrap() {
        out.push((t.to, buf[..t.head].to_vec(), t.payload, t.promise));
    }
    out
}

#[test]
fn a_relay_sends_its_childs_head_ahead_and_the_payload_whole_when_it_holds_it() {
    // Chain 0 -> 1 -> 2, one output in one chunk. Rank 1, with early heads, sends rank 2
    // its activation and then, holding nothing yet, the data's head; once the data is
    // in, the payload alone, under the head's promise. Head and payload make the very
    // frame a relay without early heads sends.
    let size = 3000;
    let spec = PlanSpec::new(3, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", size, vec![1, 2]));
    let plan = Plan::build(spec).unwrap();
    let data = Bytes::from(payload(0, size));
    let mut root = Broadcaster::new(Config::new(9, 3, 0));
    root.start_broadcast(Instant::ZERO, 5, &plan, [data.clone()])
        .unwrap();
    let from_root = parts_of(&mut root);
    let (activation, data_frame): (Vec<_>, Vec<_>) =
        from_root.into_iter().partition(|f| f.2.is_none());
    let whole = |f: &Parts| {
        let mut frame = f.1.clone();
        frame.extend_from_slice(f.2.as_deref().unwrap_or_default());
        frame
    };
    let relay = |early: bool| {
        let mut cfg = Config::new(9, 3, 1);
        cfg.early_heads = early;
        let mut m = Broadcaster::new(cfg);
        m.handle_message(Instant::ZERO, 0, &whole(&activation[0]))
            .unwrap();
        let sent = parts_of(&mut m);
        (m, sent)
    };
    let (mut early, ahead) = relay(true);
    assert_eq!(ahead.len(), 2, "the activation, then the data's head");
    assert_eq!(ahead[0].3, None);
    let Some(Promise::Head { id, len }) = ahead[1].3 else {
        panic!("a head sent ahead: {:?}", ahead[1].3);
    };
    assert_eq!((ahead[1].0, len), (2, size as usize));
    assert!(ahead[1].2.is_none(), "the head goes alone");
    assert_eq!(early.stats().heads_sent_early, 1);
    early
        .handle_message(Instant::ZERO, 0, &whole(&data_frame[0]))
        .unwrap();
    let after = parts_of(&mut early);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].3, Some(Promise::Payload { id }));
    assert_eq!((after[0].0, after[0].1.len()), (2, 0), "the payload alone");
    let payload = after[0].2.clone().expect("the payload");
    assert_eq!(payload, data, "the output, whole");
    // The relay without early heads: the activation alone, then the whole frame.
    let (mut plain, plain_before) = relay(false);
    assert_eq!(plain_before.len(), 1, "its activation alone");
    assert_eq!(ahead[0].1, plain_before[0].1, "the same activation");
    plain
        .handle_message(Instant::ZERO, 0, &whole(&data_frame[0]))
        .unwrap();
    let plain_after = parts_of(&mut plain);
    let mut promised = ahead[1].1.clone();
    promised.extend_from_slice(&payload);
    assert_eq!(promised, whole(&plain_after[0]), "the same frame");
    let (relay_stats, plain_stats) = (early.stats(), plain.stats());
    assert_eq!(
        relay_stats.payload_bytes_sent,
        plain_stats.payload_bytes_sent
    );
    assert_eq!(relay_stats.payload_bytes_copied, 0);
}

#[test]
fn a_forgotten_task_withdraws_its_promised_payloads_and_a_dead_child_gets_none() {
    // Binomial over 4: rank 2 relays to 3. Rank 2 promises rank 3 its data, then the
    // task is forgotten: the promise is withdrawn. Again, and rank 3 dies instead:
    // nothing more goes to it, not even a withdrawal.
    let spec = PlanSpec::new(4, 0).with_output(OutputSpec::new("A", 100, vec![1, 2, 3]));
    let plan = Plan::build(spec).unwrap();
    assert!(plan.edges().any(|e| e.parent == 2 && e.child == 3));
    for dies in [false, true] {
        let mut root = Broadcaster::new(Config::new(9, 4, 0));
        root.start_broadcast(Instant::ZERO, 5, &plan, [Bytes::from(payload(0, 100))])
            .unwrap();
        let to_2 = parts_of(&mut root)
            .into_iter()
            .find(|f| f.0 == 2 && f.2.is_none())
            .expect("rank 2's activation");
        let mut cfg = Config::new(9, 4, 2);
        cfg.early_heads = true;
        let mut relay = Broadcaster::new(cfg);
        relay.handle_message(Instant::ZERO, 0, &to_2.1).unwrap();
        let sent = parts_of(&mut relay);
        let Some(&Some(Promise::Head { id, .. })) = sent.last().map(|f| &f.3) else {
            panic!("a promised head to rank 3: {sent:?}");
        };
        if dies {
            relay.on_rank_failed(Instant::ZERO, 3);
        }
        relay.forget(T5);
        let after = parts_of(&mut relay);
        if dies {
            assert!(after.is_empty(), "{after:?}");
        } else {
            assert_eq!(after.len(), 1, "{after:?}");
            assert_eq!(
                (after[0].0, after[0].3),
                (3, Some(Promise::Withdrawn { id }))
            );
        }
    }
}

#[test]
fn a_multi_chunk_output_goes_in_chunks_of_equal_length() {
    use super::serve::even_chunk;
    let c = MAX_CHUNK;
    assert_eq!(even_chunk(100, c), c, "one chunk: the limit itself");
    assert_eq!(even_chunk(c as u64, c), c);
    assert_eq!(even_chunk(5 * c as u64, c), c, "a multiple: full chunks");
    // 300 KiB in 256 KiB chunks: two of 150 KiB, not 256 + 44.
    assert_eq!(even_chunk(300 << 10, 256 << 10), 150 << 10);
    for total in [c as u64 + 1, 3 * c as u64 - 5, 7 * c as u64 + 3] {
        let piece = even_chunk(total, c) as u64;
        let k = total.div_ceil(c as u64);
        assert!(
            piece <= c as u64 && piece * 2 >= c as u64,
            "{total}: {piece}"
        );
        assert_eq!(
            total.div_ceil(piece),
            k,
            "{total}: as many chunks as before"
        );
    }
}

/// A buffer an allocation hook lent: (broadcast, output, length, address).
type Lent = (TaskId, u32, usize, usize);

/// An allocation hook for tests: each buffer a vector lent and given back when the
/// broadcaster releases it (counted); records (task, output, length, address) per call.
#[derive(Clone, Default)]
struct TestArena {
    given: std::sync::Arc<std::sync::Mutex<Vec<Lent>>>,
    released: std::sync::Arc<core::sync::atomic::AtomicUsize>,
}

impl TestArena {
    fn hook(&self) -> impl Allocate + 'static {
        let arena = self.clone();
        move |task: TaskId, output: u32, len: usize| {
            let memory = vec![0u8; len];
            let addr = memory.as_ptr() as usize;
            arena.given.lock().unwrap().push((task, output, len, addr));
            let released = std::sync::Arc::clone(&arena.released);
            Some(ft_core::Landing::lent_vec(memory, move |back| {
                assert_eq!((back.as_ptr() as usize, back.len()), (addr, len));
                released.fetch_add(1, core::sync::atomic::Ordering::SeqCst);
            }))
        }
    }

    fn given(&self) -> Vec<Lent> {
        self.given.lock().unwrap().clone()
    }

    fn released(&self) -> usize {
        self.released.load(core::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn an_allocation_hook_lands_every_output_in_the_runtimes_memory() {
    let now = Instant::ZERO;
    let (size, chunk) = (3000u64, 1000usize);
    let data = payload(0, size);
    let place =
        |m: &mut Broadcaster, output: u32, total: u64, at: u64, len: usize, bytes: &[u8]| {
            let head = data_head(0, output, total, at, len);
            let slot = m.place_payload(now, 0, &head, len).expect("placed");
            let filled = slot.fill_from(bytes).unwrap();
            m.handle_message_placed(now, 0, &head, filled).unwrap();
        };

    // Chunks placed: output 0 lands in the hook's memory, joined free; an output of
    // one chunk (output 1) is placed too; an empty one (output 2) asks for nothing.
    let arena = TestArena::default();
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.set_allocator(Box::new(arena.hook()));
    m.handle_message(now, 0, &activation_frame(0, 0, &[size, 500, 0]))
        .unwrap();
    for at in [1000u64, 0, 2000] {
        let bytes = &data[at as usize..at as usize + chunk];
        place(&mut m, 0, size, at, chunk, bytes);
    }
    place(&mut m, 1, 500, 0, 500, &data[..500]);
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(2).put_varint(0).put_varint(0).put_bytes(&[]);
    m.handle_message(now, 0, &w.finish()).unwrap();
    let given = arena.given();
    assert_eq!(
        given.iter().map(|g| (g.1, g.2)).collect::<Vec<_>>(),
        [(0, 3000), (1, 500)]
    );
    assert_eq!(m.output_bytes(T5, 0).unwrap().as_ptr() as usize, given[0].3);
    assert_eq!(m.output_bytes(T5, 1).unwrap().as_ptr() as usize, given[1].3);
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    assert_eq!(m.output(T5, 2), Some(&[][..]));
    assert_eq!(m.stats().joined_bytes, 0);
    let kept = m.output_bytes(T5, 0).unwrap().clone();
    m.forget(T5);
    assert_eq!(
        arena.released(),
        1,
        "output 1 released; output 0 still held here"
    );
    drop(kept);
    assert_eq!(arena.released(), 2);

    // Chunks in frames: the complete output is copied into the hook's memory once.
    let arena = TestArena::default();
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.set_allocator(Box::new(arena.hook()));
    m.handle_message(now, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    for at in [0u64, 1000, 2000] {
        let mut w = task5(FrameKind::BcastData, 0);
        w.put_varint(0)
            .put_varint(size)
            .put_varint(at)
            .put_bytes(&data[at as usize..at as usize + chunk]);
        m.handle_message(now, 0, &w.finish()).unwrap();
    }
    assert_eq!(
        m.output_bytes(T5, 0).unwrap().as_ptr() as usize,
        arena.given()[0].3
    );
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    assert_eq!(m.stats().joined_bytes, size);

    // Two chunks placed, the third in a frame (a repair stream from a transport that
    // does not place): the first memory cannot take the frame's chunk (its range may
    // still be written by the dead source's receive), so the output is copied into a
    // second buffer; the first is released once nothing holds it.
    let arena = TestArena::default();
    let mut m = Broadcaster::new(Config::new(9, 3, 1));
    m.set_allocator(Box::new(arena.hook()));
    m.handle_message(now, 0, &activation_frame(0, 0, &[size]))
        .unwrap();
    for at in [0u64, 2000] {
        let bytes = &data[at as usize..at as usize + chunk];
        place(&mut m, 0, size, at, chunk, bytes);
    }
    let mut w = task5(FrameKind::BcastData, 0);
    w.put_varint(0)
        .put_varint(size)
        .put_varint(1000)
        .put_bytes(&data[1000..2000]);
    m.handle_message(now, 0, &w.finish()).unwrap();
    let given = arena.given();
    assert_eq!(given.len(), 2);
    assert_eq!(m.output_bytes(T5, 0).unwrap().as_ptr() as usize, given[1].3);
    assert_eq!(m.output(T5, 0), Some(&data[..]));
    assert_eq!(arena.released(), 1, "the first buffer, held by nothing");
    drop(m);
    assert_eq!(arena.released(), 2, "every buffer released once");
}
