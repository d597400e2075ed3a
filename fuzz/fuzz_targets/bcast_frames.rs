//! Arbitrary frames, failures and timeouts delivered to the activation machines of a small
//! group: every rank runs a `Broadcaster`, the root has started a broadcast of a plan
//! built from the input (so real activations, requests and data are in flight), and the
//! input interleaves delivering in-flight frames (as sent, or with a byte flipped), forged
//! frames from arbitrary senders (raw bytes, a bcast header with arbitrary payload, or a
//! well-formed activation (with or without "data follows", or an unknown flag) /
//! request (with an offset per output, in place or not) / data frame with arbitrary
//! fields; data may come before its activation, as
//! machines push it right behind activations and delivery order is the input's), `on_rank_failed`
//! at any machine, and timeouts. Nothing may panic; refused frames are typed errors; every
//! frame a machine sends decodes with the shared codec, is from itself and goes to a rank
//! `< n` other than itself.
//!
//! Every frame names its broadcast (root, key) at the start of its body; forged frames
//! name the real broadcast's root or another rank (in range or not), and the real key or
//! another. The root starts with an activation header the input picks (empty, up to the
//! limit, or over it: refused), and forged activations carry headers up to and past the
//! limit.
//!
//! Machines send chunks of sizes the input picks (so receivers see many chunkings), and
//! each frame is taken, as the input says, contiguously (`poll_transmit`) or as a head
//! plus a shared payload (`poll_transmit_parts`, joined here): a split frame must be a
//! `BcastData` frame whose head ends with the chunk's length and whose payload is the
//! chunk, or a `BcastActivate` whose payload is the root's header, and only contiguous
//! chunks count as copied (`Broadcaster::stats`).
//!
//! Some machines (as the input picks) have an allocation hook, which lends vectors and
//! declines every third request: every buffer lent is given back exactly once, once the
//! machines and the frames in flight are dropped.
#![no_main]

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use ft_bcast::{Broadcaster, Config, OutputSpec, Plan, PlanSpec, Strategy, TaskId, Topology};
use ft_core::wire::{frame_capacity, Context, Family, FrameKind, Header, HEADER_LEN, VERSION};
use ft_core::{Duration, Instant, Protocol, Rank, TransmitParts};
use libfuzzer_sys::fuzz_target;

const COMM: u32 = 9;
/// Keeps what a forged size can make a machine allocate small.
const MAX_OUTPUT_BYTES: u64 = 1 << 12;
const MAX_OUTPUTS: u32 = 16;
/// Above the at most 6 outputs of under `MAX_OUTPUT_BYTES / 2` the specs here have, so
/// honest plans fit; mutated frames announcing more are refused.
const MAX_TASK_BYTES: u64 = 4 * MAX_OUTPUT_BYTES;
/// The machines' activation header limit (forged headers go past it).
const MAX_HEADER_BYTES: usize = 64;

#[derive(Arbitrary, Debug)]
struct Output {
    bytes: u16,
    dests: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// Deliver in-flight frame `k` (modulo the number in flight).
    Deliver { k: u16 },
    /// Deliver a copy of in-flight frame `k` with byte `at` xor-ed with `flip`, without
    /// removing the original.
    DeliverFlipped { k: u16, at: u16, flip: u8 },
    /// Deliver in-flight frame `k` twice.
    Duplicate { k: u16 },
    /// Deliver in-flight frame `k` as a transport that receives a head before its
    /// payload does: cut where a data frame's chunk starts (anywhere in the frame, `cut`
    /// from its end, if `odd_cut`), ask `place_payload`, and if the machine gives a
    /// slot, fill it and hand the frame back with `handle_message_placed` (or, if
    /// `lose`, give the slot back unfilled, as when the sender dies mid-transfer).
    Place {
        k: u16,
        odd_cut: bool,
        cut: u16,
        lose: bool,
    },
    /// Raw bytes to `to` from `from`.
    Raw { to: u8, from: u8, bytes: Vec<u8> },
    /// A well-formed header of bcast kind `kind` for `task`, then arbitrary payload.
    Framed {
        to: u8,
        from: u8,
        kind: u8,
        task: u8,
        payload: Vec<u8>,
    },
    /// A structurally valid activation with arbitrary contents; `flags % 4` as its
    /// flags word (bit 0, data follows, is the only one defined).
    Activate {
        to: u8,
        from: u8,
        task: u8,
        tree: u8,
        flags: u8,
        ancestors: Vec<u8>,
        needs: Vec<u8>,
        fetch: Vec<u8>,
        sizes: Vec<u16>,
        expected: u16,
        entries: Vec<(u8, u8, Vec<u8>, Vec<u8>)>,
        user_header: Vec<u8>,
    },
    /// A structurally valid subtree continuation with arbitrary contents.
    Subtree {
        to: u8,
        from: u8,
        task: u8,
        tree: u8,
        first: u16,
        entries: Vec<(u8, u8, Vec<u8>, Vec<u8>)>,
    },
    /// A structurally valid request: per output, its gap from the previous one and
    /// the offset to stream it from.
    Request {
        to: u8,
        from: u8,
        task: u8,
        tree: u8,
        outputs: Vec<(u8, u16)>,
    },
    /// A structurally valid data chunk.
    Data {
        to: u8,
        from: u8,
        task: u8,
        output: u8,
        total: u16,
        offset: u16,
        chunk: Vec<u8>,
    },
    /// Machine `at` learns that `rank` died.
    Fail { at: u8, rank: u8 },
    /// Every machine learns that `rank` died.
    FailEverywhere { rank: u8 },
    /// Time passes; every machine gets `handle_timeout`.
    Tick { micros: u32 },
    /// Machine `at` forgets `task`.
    Forget { at: u8, task: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    root: u8,
    task: u8,
    /// The root's activation header (refused past [`MAX_HEADER_BYTES`]).
    header: Vec<u8>,
    topology: u8,
    k: u8,
    strategy: u8,
    /// Chunk size of each machine, from this (1 to 1024 bytes).
    chunks: u64,
    /// Bit `k % 64`: the `k`-th frame polled goes through `poll_transmit_parts`.
    split: u64,
    /// Bit `me % 8`: machine `me` has an allocation hook, which declines every third
    /// request (the library's own memory then).
    hooks: u8,
    outputs: Vec<Output>,
    steps: Vec<Step>,
}

struct Flight {
    to: Rank,
    from: Rank,
    bytes: Vec<u8>,
}

/// Where the chunk of a `BcastData` frame starts (after its broadcast, output, total,
/// offset and length fields), as a transport that sends the chunk on its own cuts the
/// frame.
fn chunk_start(bytes: &[u8], n: u32) -> Option<usize> {
    let from = bytes.get(10..14).map(|b| u32::from_le_bytes(b.try_into().unwrap()))?;
    let (h, mut r) = Header::decode(bytes, Context { comm: COMM, n }, from).ok()?;
    if h.kind != FrameKind::BcastData {
        return None;
    }
    for _ in 0..6 {
        r.varint().ok()?;
    }
    Some(bytes.len() - r.remaining())
}

fn set_bytes(w: &mut ft_core::wire::Writer, items: &[u8]) {
    // Delta-coded set: count, then gaps (index = previous + 1 + gap).
    w.put_varint(items.len() as u64);
    for &g in items {
        w.put_varint(u64::from(g % 8));
    }
}

/// A forged frame's header and broadcast: `task`'s low bits pick the key, its high
/// bits the root (mostly the real one, `root`; sometimes another rank, or one out of
/// range).
fn header(kind: FrameKind, task: u8, root: Rank, n: u32, from: Rank) -> ft_core::wire::Writer {
    let mut w = Header {
        kind,
        comm: COMM,
        epoch: 0,
        sender: from,
    }
    .start();
    let forged_root = match task >> 5 {
        0..=5 => root,
        6 => (root + 1) % n,
        _ => n,
    };
    w.put_rank(forged_root).put_varint(u64::from(task % 4));
    w
}

fn entries_bytes(w: &mut ft_core::wire::Writer, n: u32, entries: &[(u8, u8, Vec<u8>, Vec<u8>)]) {
    w.put_varint(entries.len() as u64);
    for (child, parent, needs, fetch) in entries {
        w.put_rank(u32::from(*child) % n)
            .put_rank(u32::from(*parent) % n);
        set_bytes(w, needs);
        set_bytes(w, fetch);
    }
}

/// How frames are polled: the split bits and a count of polls; the payload bytes that
/// went out contiguously (copied by the machine), per machine.
struct Polling {
    split: u64,
    polls: u32,
    copied: Vec<u64>,
}

fn drain(
    machines: &mut [Broadcaster],
    n: u32,
    buf: &mut [u8],
    flights: &mut Vec<Flight>,
    polling: &mut Polling,
) {
    for (me, m) in machines.iter_mut().enumerate() {
        let me = me as Rank;
        loop {
            let split = polling.split >> (polling.polls % 64) & 1 == 1;
            polling.polls = polling.polls.wrapping_add(1);
            let t = if split {
                m.poll_transmit_parts(Instant::ZERO, buf)
            } else {
                m.poll_transmit(Instant::ZERO, buf)
                    .map(|t| t.map(TransmitParts::from))
            };
            let Some(t) = t.expect("frame_capacity fits") else {
                break;
            };
            assert!(t.to < n && t.to != me, "frame to {} from {me}", t.to);
            let mut bytes = buf[..t.head].to_vec();
            bytes.extend_from_slice(t.payload.as_deref().unwrap_or_default());
            let (h, mut r) =
                Header::decode(&bytes, Context { comm: COMM, n }, me).expect("own frames decode");
            assert_eq!(h.kind.family(), Family::Bcast);
            r.rank().and(r.varint()).expect("own broadcast");
            if h.kind == FrameKind::BcastData {
                // Output, total, offset, then the chunk (its length, its bytes): the last
                // field, so a split frame's payload is exactly the chunk.
                r.varint()
                    .and(r.varint())
                    .and(r.varint())
                    .expect("own fields");
                let chunk = r.bytes().expect("own chunk");
                r.finish().expect("the chunk ends the frame");
                match &t.payload {
                    Some(p) => assert_eq!(&p[..], chunk),
                    None if !split => polling.copied[me as usize] += chunk.len() as u64,
                    None => assert!(chunk.is_empty(), "a split chunk is a payload"),
                }
            } else if h.kind != FrameKind::BcastActivate {
                assert!(t.payload.is_none(), "only data and activation frames have a payload");
            }
            if flights.len() < 4096 {
                flights.push(Flight {
                    to: t.to,
                    from: me,
                    bytes,
                });
            }
        }
        assert_eq!(m.stats().payload_bytes_copied, polling.copied[me as usize]);
        while m.poll_event().is_some() {}
        assert_eq!(m.poll_timeout(), None);
    }
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 8) + 2;
    let root = u32::from(input.root) % n;
    let topology = match input.topology % 4 {
        0 => Topology::Star,
        1 => Topology::Chain,
        2 => Topology::Binomial,
        _ => Topology::Kary(NonZeroU32::new(u32::from(input.k % 4)).unwrap_or(NonZeroU32::MIN)),
    };
    let strategy = Strategy::ALL[usize::from(input.strategy) % 3];
    let mut spec = PlanSpec::new(n, root)
        .with_topology(topology)
        .with_strategy(strategy);
    for (j, o) in input.outputs.iter().take(6).enumerate() {
        let mut dests: Vec<Rank> = o
            .dests
            .iter()
            .map(|&d| u32::from(d) % n)
            .filter(|&d| d != root)
            .collect();
        dests.sort_unstable();
        dests.dedup();
        let bytes = u64::from(o.bytes) % (MAX_OUTPUT_BYTES / 2);
        spec.outputs
            .push(OutputSpec::new(format!("o{j}"), bytes, dests));
    }
    let plan = Plan::build(spec).expect("specs built here are valid");
    // Buffers the hooks lent and not given back yet.
    let lent = Arc::new(AtomicI64::new(0));
    let mut machines: Vec<Broadcaster> = (0..n)
        .map(|me| {
            let mut cfg = Config::new(COMM, n, me);
            cfg.max_output_bytes = MAX_OUTPUT_BYTES;
            cfg.max_task_bytes = MAX_TASK_BYTES;
            cfg.max_outputs = MAX_OUTPUTS;
            cfg.max_header_bytes = MAX_HEADER_BYTES;
            cfg.chunk_bytes = 1 + (input.chunks >> (8 * (me % 8)) & 0x3ff) as usize;
            let mut machine = Broadcaster::new(cfg);
            if input.hooks >> (me % 8) & 1 == 1 {
                machine.set_allocator(Box::new(hook(Arc::clone(&lent))));
            }
            machine
        })
        .collect();
    let payloads: Vec<Vec<u8>> = plan
        .spec()
        .outputs
        .iter()
        .enumerate()
        .map(|(j, o)| vec![j as u8; o.bytes as usize])
        .collect();
    let task = u64::from(input.task % 4);
    let root_header = input.header;
    let started = machines[root as usize].start_with_header(
        Instant::ZERO,
        task,
        &plan,
        root_header.clone(),
        payloads.clone(),
    );
    if root_header.len() > MAX_HEADER_BYTES {
        assert!(started.is_err(), "a header past the limit is refused");
        machines[root as usize]
            .start_broadcast(Instant::ZERO, task, &plan, payloads)
            .expect("the root starts its own plan");
    } else {
        started.expect("the root starts its own plan");
    }
    // A second start of the same task is misuse, reported as such.
    assert!(machines[root as usize]
        .start_broadcast(Instant::ZERO, task, &plan, Vec::<Vec<u8>>::new())
        .is_err());

    let mut buf = vec![0u8; frame_capacity(n)];
    let mut flights: Vec<Flight> = Vec::new();
    let mut polling = Polling {
        split: input.split,
        polls: 0,
        copied: vec![0; n as usize],
    };
    let mut now = Instant::ZERO;
    drain(&mut machines, n, &mut buf, &mut flights, &mut polling);
    for step in input.steps.into_iter().take(256) {
        let deliveries: Vec<Flight> = match step {
            Step::Deliver { k } if !flights.is_empty() => {
                vec![flights.remove(usize::from(k) % flights.len())]
            }
            Step::DeliverFlipped { k, at, flip } if !flights.is_empty() => {
                let f = &flights[usize::from(k) % flights.len()];
                let mut bytes = f.bytes.clone();
                let at = usize::from(at) % bytes.len().max(1);
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= flip;
                }
                vec![Flight {
                    to: f.to,
                    from: f.from,
                    bytes,
                }]
            }
            Step::Duplicate { k } if !flights.is_empty() => {
                let f = flights.remove(usize::from(k) % flights.len());
                let copy = Flight {
                    to: f.to,
                    from: f.from,
                    bytes: f.bytes.clone(),
                };
                vec![f, copy]
            }
            Step::Place {
                k,
                odd_cut,
                cut,
                lose,
            } if !flights.is_empty() => {
                let f = flights.remove(usize::from(k) % flights.len());
                let at = if odd_cut {
                    f.bytes.len() - usize::from(cut) % (f.bytes.len() + 1)
                } else {
                    chunk_start(&f.bytes, n).unwrap_or(f.bytes.len())
                };
                let (head, payload) = f.bytes.split_at(at);
                let m = &mut machines[f.to as usize];
                match m.place_payload(now, f.from, head, payload.len()) {
                    Some(slot) => {
                        assert_eq!(slot.len(), payload.len(), "a slot of the payload's length");
                        if lose {
                            m.placement_lost(now, slot);
                        } else {
                            let filled = slot.fill_from(payload).expect("same length");
                            let _ = m.handle_message_placed(now, f.from, head, filled);
                        }
                    }
                    None => {
                        let _ = m.handle_message(now, f.from, &f.bytes);
                    }
                }
                Vec::new()
            }
            Step::Deliver { .. }
            | Step::DeliverFlipped { .. }
            | Step::Duplicate { .. }
            | Step::Place { .. } => Vec::new(),
            Step::Raw { to, from, bytes } => vec![Flight {
                to: u32::from(to) % n,
                from: u32::from(from) % n,
                bytes,
            }],
            Step::Framed {
                to,
                from,
                kind,
                task,
                payload,
            } => {
                let from = u32::from(from) % n;
                let kinds = [
                    FrameKind::BcastActivate,
                    FrameKind::BcastSubtree,
                    FrameKind::BcastRequest,
                    FrameKind::BcastData,
                ];
                let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
                bytes.push(VERSION);
                bytes.push(kinds[usize::from(kind) % kinds.len()] as u8);
                bytes.extend_from_slice(&COMM.to_le_bytes());
                bytes.extend_from_slice(&u32::from(task % 4).to_le_bytes());
                bytes.extend_from_slice(&from.to_le_bytes());
                bytes.extend_from_slice(&payload);
                vec![Flight {
                    to: u32::from(to) % n,
                    from,
                    bytes,
                }]
            }
            Step::Activate {
                to,
                from,
                task,
                tree,
                flags,
                ancestors,
                needs,
                fetch,
                sizes,
                expected,
                entries,
                user_header,
            } => {
                let from = u32::from(from) % n;
                let mut w = header(FrameKind::BcastActivate, task, root, n, from);
                w.put_varint(u64::from(tree % 8))
                    .put_varint(u64::from(flags % 4));
                w.put_varint(ancestors.len() as u64);
                for a in &ancestors {
                    w.put_rank(u32::from(*a) % n);
                }
                set_bytes(&mut w, &needs);
                set_bytes(&mut w, &fetch);
                for s in &sizes {
                    w.put_varint(u64::from(*s));
                }
                w.put_varint(u64::from(expected % 16));
                entries_bytes(&mut w, n, &entries);
                w.put_bytes(&user_header);
                vec![Flight {
                    to: u32::from(to) % n,
                    from,
                    bytes: w.finish(),
                }]
            }
            Step::Subtree {
                to,
                from,
                task,
                tree,
                first,
                entries,
            } => {
                let from = u32::from(from) % n;
                let mut w = header(FrameKind::BcastSubtree, task, root, n, from);
                w.put_varint(u64::from(tree % 8))
                    .put_varint(u64::from(first % 16));
                entries_bytes(&mut w, n, &entries);
                vec![Flight {
                    to: u32::from(to) % n,
                    from,
                    bytes: w.finish(),
                }]
            }
            Step::Request {
                to,
                from,
                task,
                tree,
                outputs,
            } => {
                let from = u32::from(from) % n;
                let mut w = header(FrameKind::BcastRequest, task, root, n, from);
                w.put_varint(u64::from(tree % 8));
                let gaps: Vec<u8> = outputs.iter().map(|&(gap, _)| gap).collect();
                set_bytes(&mut w, &gaps);
                for &(_, offset) in &outputs {
                    w.put_varint(u64::from(offset));
                }
                vec![Flight {
                    to: u32::from(to) % n,
                    from,
                    bytes: w.finish(),
                }]
            }
            Step::Data {
                to,
                from,
                task,
                output,
                total,
                offset,
                chunk,
            } => {
                let from = u32::from(from) % n;
                let mut w = header(FrameKind::BcastData, task, root, n, from);
                w.put_varint(u64::from(output % 8))
                    .put_varint(u64::from(total))
                    .put_varint(u64::from(offset))
                    .put_bytes(&chunk);
                vec![Flight {
                    to: u32::from(to) % n,
                    from,
                    bytes: w.finish(),
                }]
            }
            Step::Fail { at, rank } => {
                let at = usize::from(at) % n as usize;
                machines[at].on_rank_failed(now, u32::from(rank) % (n + 1));
                Vec::new()
            }
            Step::FailEverywhere { rank } => {
                for m in machines.iter_mut() {
                    m.on_rank_failed(now, u32::from(rank) % (n + 1));
                }
                Vec::new()
            }
            Step::Tick { micros } => {
                now += Duration::from_micros(u64::from(micros));
                for m in machines.iter_mut() {
                    m.handle_timeout(now);
                }
                Vec::new()
            }
            Step::Forget { at, task } => {
                machines[usize::from(at) % n as usize].forget(TaskId::new(root, u64::from(task % 4)));
                Vec::new()
            }
        };
        for f in deliveries {
            // Refusals are typed errors; what matters is that nothing panics.
            let _ = machines[f.to as usize].handle_message(now, f.from, &f.bytes);
        }
        drain(&mut machines, n, &mut buf, &mut flights, &mut polling);
    }
    // Every buffer a hook lent comes back exactly once, once nothing holds it.
    drop((machines, flights));
    assert_eq!(lent.load(Ordering::SeqCst), 0, "a lent buffer was not given back");
});

/// An allocation hook that lends vectors, counting them out in `lent` and back in when
/// given back (a length other than the one asked would be refused by the machine), and
/// declines every third request.
fn hook(lent: Arc<AtomicI64>) -> impl ft_bcast::Allocate + 'static {
    let mut asked = 0u64;
    move |_task: TaskId, _output: u32, len: usize| {
        asked += 1;
        if asked % 3 == 0 {
            return None;
        }
        lent.fetch_add(1, Ordering::SeqCst);
        let back = Arc::clone(&lent);
        Some(ft_core::Landing::lent_vec(vec![0u8; len], move |v| {
            assert_eq!(v.len(), len, "given back whole");
            back.fetch_sub(1, Ordering::SeqCst);
        }))
    }
}
