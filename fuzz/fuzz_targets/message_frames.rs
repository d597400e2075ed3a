//! The messenger of a small group under arbitrary input: every rank runs a
//! `Messenger`; the input sends messages (of sizes and fragment lengths it picks),
//! delivers in-flight fragments in any order (lent, handed over, or with the payload
//! placed where the receiver asks, or a byte flipped), duplicates them, forges
//! `Message` frames with arbitrary fields, and kills ranks. Nothing may panic; refused
//! frames are typed errors; and whatever was delivered is, per sender, a prefix of
//! what that sender sent to this rank, in order and byte for byte, with nothing from a
//! rank after this rank learned it died.
#![no_main]

use arbitrary::Arbitrary;
use ft_core::messages::{Messenger, MessengerConfig};
use ft_core::wire::{frame_capacity_for, Context, FrameKind, Header};
use ft_core::{Bytes, Rank, RankSet};
use libfuzzer_sys::fuzz_target;

const COMM: u32 = 5;
const MAX_MESSAGE: u64 = 1 << 12;

#[derive(Arbitrary, Debug)]
enum Step {
    Send { from: u8, to: u8, tag: u8, len: u16 },
    Deliver { k: u16, how: u8 },
    Duplicate { k: u16 },
    Flip { k: u16, at: u16, bits: u8 },
    Forge { to: u8, from: u8, seq: u8, tag: u8, total: u16, offset: u16, piece: Vec<u8> },
    Kill { rank: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    /// Each rank's fragment length, from this (1 to 512 bytes).
    fragments: u64,
    steps: Vec<Step>,
}

struct Flight {
    from: Rank,
    to: Rank,
    frame: Vec<u8>,
    /// Where the fragment's bytes start (the head's end).
    head: usize,
}

fn body(from: Rank, k: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 3 + k * 11 + u64::from(from)) as u8).collect()
}

/// Marks the pair's stream as holding forged frames: its content is not checked.
fn forged(sent: &mut [Vec<Vec<(u64, Vec<u8>)>>], from: Rank, to: Rank) {
    let pair = &mut sent[from as usize][to as usize];
    if pair.first().is_none_or(|(tag, _)| *tag != u64::MAX) {
        pair.insert(0, (u64::MAX, Vec::new()));
    }
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 5) + 2;
    let mut ranks: Vec<Messenger> = (0..n)
        .map(|me| {
            let mut cfg = MessengerConfig::new(COMM, n, me);
            cfg.fragment_bytes = 1 + (input.fragments >> (8 * (me % 8)) & 0x1ff) as usize;
            cfg.max_message_bytes = MAX_MESSAGE;
            cfg.max_pending_bytes = 8 * MAX_MESSAGE;
            Messenger::new(cfg)
        })
        .collect();
    let mut dead = RankSet::new(n);
    // What each (sender, destination) pair sent, and what each destination got.
    let mut sent: Vec<Vec<Vec<(u64, Vec<u8>)>>> = vec![vec![Vec::new(); n as usize]; n as usize];
    let mut got: Vec<Vec<Vec<(u64, Bytes)>>> = vec![vec![Vec::new(); n as usize]; n as usize];
    // Per destination, the ranks it knew dead when each message came: none may come after.
    let mut known_dead: Vec<RankSet> = vec![RankSet::new(n); n as usize];
    let mut flights: Vec<Flight> = Vec::new();
    let mut buf = vec![0u8; frame_capacity_for(n, 512)];
    let ctx = Context { comm: COMM, n };
    for step in input.steps.into_iter().take(200) {
        let mut deliveries: Vec<(Flight, u8)> = Vec::new();
        match step {
            Step::Send { from, to, tag, len } => {
                let (from, to) = (u32::from(from) % n, u32::from(to) % n);
                if dead.contains(from) {
                    continue;
                }
                let len = usize::from(len) % (MAX_MESSAGE as usize + 64);
                let k = sent[from as usize][to as usize].len() as u64;
                let bytes = body(from, k, len);
                match ranks[from as usize].send(to, u64::from(tag), bytes.clone().into()) {
                    Ok(()) => sent[from as usize][to as usize].push((u64::from(tag), bytes)),
                    Err(_) => assert!(
                        len as u64 > MAX_MESSAGE || known_dead[from as usize].contains(to),
                        "a send refused for no reason"
                    ),
                }
            }
            Step::Deliver { k, how } if !flights.is_empty() => {
                let f = flights.remove(usize::from(k) % flights.len());
                deliveries.push((f, how));
            }
            Step::Duplicate { k } if !flights.is_empty() => {
                let f = &flights[usize::from(k) % flights.len()];
                let copy = Flight { from: f.from, to: f.to, frame: f.frame.clone(), head: f.head };
                deliveries.push((copy, 0));
            }
            Step::Flip { k, at, bits } if !flights.is_empty() => {
                let f = &flights[usize::from(k) % flights.len()];
                let mut frame = f.frame.clone();
                let at = usize::from(at) % frame.len();
                frame[at] ^= bits;
                // A flipped payload byte is undetectable (transports are reliable, and
                // frames carry no checksum): the pair's content is not checked.
                forged(&mut sent, f.from, f.to);
                deliveries.push((Flight { from: f.from, to: f.to, frame, head: f.head }, 0));
            }
            Step::Deliver { .. } | Step::Duplicate { .. } | Step::Flip { .. } => {}
            Step::Forge { to, from, seq, tag, total, offset, piece } => {
                let (to, from) = (u32::from(to) % n, u32::from(from) % n);
                let mut w = Header { kind: FrameKind::Message, comm: COMM, epoch: 0, sender: from }
                    .start();
                w.put_varint(u64::from(seq % 8))
                    .put_varint(u64::from(tag))
                    .put_varint(u64::from(total))
                    .put_varint(u64::from(offset))
                    .put_bytes(&piece);
                let frame = w.finish();
                let head = frame.len() - piece.len();
                forged(&mut sent, from, to);
                deliveries.push((Flight { from, to, frame, head }, 0));
            }
            Step::Kill { rank } => {
                let rank = u32::from(rank) % n;
                dead.insert(rank);
                for (r, m) in ranks.iter_mut().enumerate() {
                    if r as u32 != rank {
                        m.on_rank_failed(rank);
                        known_dead[r].insert(rank);
                    }
                }
                flights.retain(|f| f.from != rank);
            }
        }
        for (f, how) in deliveries {
            if dead.contains(f.to) {
                continue;
            }
            let m = &mut ranks[f.to as usize];
            let Ok((h, r)) = Header::decode(&f.frame, ctx, f.from) else {
                continue;
            };
            let _ = match how % 3 {
                0 => m.handle_frame(&h, r, None),
                1 => {
                    let frame = Bytes::from(f.frame.clone());
                    let (h, r) = Header::decode(&frame, ctx, f.from).expect("decoded above");
                    m.handle_frame(&h, r, Some(&frame))
                }
                _ => {
                    let (head, payload) = f.frame.split_at(f.head);
                    let (hh, hr) = match Header::decode(head, ctx, f.from) {
                        Ok(x) => x,
                        Err(_) => continue,
                    };
                    match m.place_frame(&hh, hr, payload.len()) {
                        Some(slot) => {
                            let filled = slot.fill_from(payload).expect("same length");
                            let (hh, hr) = Header::decode(head, ctx, f.from).expect("again");
                            m.handle_frame_placed(&hh, hr, filled)
                        }
                        None => m.handle_frame(&h, r, None),
                    }
                }
            };
        }
        // Drain: what each rank sends, and what it delivered.
        for (me, m) in ranks.iter_mut().enumerate() {
            if dead.contains(me as u32) {
                while m.poll_transmit_parts(&mut buf, true).expect("fits").is_some() {}
                continue;
            }
            while let Some(t) = m.poll_transmit_parts(&mut buf, me % 2 == 0).expect("fits") {
                assert!(t.to < n && t.to != me as u32 && !known_dead[me].contains(t.to));
                let mut frame = buf[..t.head].to_vec();
                frame.extend_from_slice(t.payload.as_deref().unwrap_or_default());
                let head = if t.payload.is_some() { t.head } else { frame.len() };
                if flights.len() < 2048 {
                    flights.push(Flight { from: me as u32, to: t.to, frame, head });
                }
            }
            while let Some(msg) = m.poll_message() {
                assert!(!known_dead[me].contains(msg.from), "a message from a dead rank");
                got[me][msg.from as usize].push((msg.tag, msg.bytes));
            }
        }
    }
    // Every delivery is, per sender, a prefix of what it sent, in order and whole.
    for to in 0..n as usize {
        for from in 0..n as usize {
            let sent = &sent[from][to];
            if sent.first().is_some_and(|(tag, _)| *tag == u64::MAX) {
                continue; // forged frames in this pair's stream
            }
            let got = &got[to][from];
            assert!(got.len() <= sent.len(), "{from} -> {to}: more than was sent");
            for ((tag, bytes), (want_tag, want)) in got.iter().zip(sent) {
                assert_eq!((tag, &bytes[..]), (want_tag, &want[..]), "{from} -> {to}");
            }
        }
    }
});
