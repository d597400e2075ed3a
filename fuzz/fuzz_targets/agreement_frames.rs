//! Arbitrary frame sequences (plus starts and failure reports) into one agreement
//! machine. Nothing may panic, and what the machine reports stays consistent: at most one
//! decision per epoch, epochs in order, the reported set is the one it keeps, nothing
//! after a self-exclusion, and every frame it emits is a well-formed agreement frame for
//! another rank of the communicator.
#![no_main]

use arbitrary::Arbitrary;
use ft_core::agreement::{Agreement, Config, Event};
use ft_core::wire::{frame_capacity, Context, Family, FrameKind, Header, Writer};
use ft_core::{BufferTooShort, Instant, Protocol, RankSet};
use libfuzzer_sys::fuzz_target;

/// A payload built field by field, so the fuzzer reaches past the decoder.
#[derive(Arbitrary, Debug)]
enum Field {
    Varint(u32),
    Rank(u8),
    Flags(u8),
    Set(u16),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Frame {
        from: u8,
        /// Agreement kinds are 16..=22 (21: sweep 1, round + exclusion + union; 22: one
        /// varint, sweep 2's round + 1 or 0 for the notice); 23 maps to a detector kind,
        /// to exercise the kind checks.
        kind: u8,
        epoch: u8,
        fields: Vec<Field>,
    },
    RawBytes {
        from: u8,
        bytes: Vec<u8>,
    },
    /// A well-formed sweep-1 frame of the view that excluded `excluded` at its call
    /// (often another view than this rank's: checked against that view's layout,
    /// then this rank leaves the fast path and tells its coordinator).
    Sweep {
        from: u8,
        epoch: u8,
        round: u8,
        excluded: u16,
        union: u16,
    },
    /// The fast path's notice "I left it: views differ" (sweep-2 kind, body 0).
    Notice {
        from: u8,
        epoch: u8,
    },
    Start {
        contribution: u16,
    },
    Failure {
        rank: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    me: u8,
    ops: Vec<Op>,
}

fn set_of(n: u32, bits: u16) -> RankSet {
    RankSet::from_ranks(n, (0..n.min(16)).filter(|r| bits >> r & 1 == 1))
}

/// A frame of `kind` from `from` in epoch `epoch % 4`, its body written by `body`.
fn frame_from(
    comm: u32,
    from: u32,
    epoch: u8,
    kind: FrameKind,
    body: impl FnOnce(&mut Writer),
) -> Vec<u8> {
    let mut w = Header {
        kind,
        comm,
        epoch: u32::from(epoch % 4),
        sender: from,
    }
    .start();
    body(&mut w);
    w.finish()
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 16) + 1;
    let me = u32::from(input.me) % n;
    let comm = 5;
    let mut machine = Agreement::new(Config::new(comm, n, me));
    let mut buf = vec![0u8; frame_capacity(n)];
    let mut decided: Vec<RankSet> = Vec::new();
    let mut excluded = false;
    for (step, op) in input.ops.into_iter().enumerate() {
        let now = Instant::from_nanos(step as u64);
        match op {
            Op::Frame {
                from,
                kind,
                epoch,
                fields,
            } => {
                let from = u32::from(from) % n;
                let kind = FrameKind::from_code(16 + kind % 8).unwrap_or(FrameKind::Heartbeat);
                let frame = frame_from(comm, from, epoch, kind, |w| {
                    for f in fields {
                        match f {
                            Field::Varint(v) => {
                                // Mostly small rounds, sometimes huge ones (overflow paths).
                                let v = if v >> 31 == 1 { v } else { v % 8 };
                                w.put_varint(u64::from(v))
                            }
                            Field::Rank(r) => w.put_rank(u32::from(r) % n),
                            Field::Flags(b) => w.put_u8(b % 8),
                            Field::Set(bits) => w.put_rankset(&set_of(n, bits)),
                            Field::Raw(bytes) => w.put_bytes(&bytes),
                        };
                    }
                });
                let _ = machine.handle_message(now, from, &frame);
            }
            Op::RawBytes { from, bytes } => {
                let _ = machine.handle_message(now, u32::from(from) % n, &bytes);
            }
            Op::Sweep {
                from,
                epoch,
                round,
                excluded,
                union,
            } => {
                let from = u32::from(from) % n;
                let frame = frame_from(comm, from, epoch, FrameKind::AgreeSweep, |w| {
                    w.put_varint(u64::from(round % 8));
                    w.put_rankset(&set_of(n, excluded));
                    w.put_rankset(&set_of(n, union));
                });
                let _ = machine.handle_message(now, from, &frame);
            }
            Op::Notice { from, epoch } => {
                let from = u32::from(from) % n;
                let frame = frame_from(comm, from, epoch, FrameKind::AgreeSweepDone, |w| {
                    w.put_varint(0);
                });
                let _ = machine.handle_message(now, from, &frame);
            }
            Op::Start { contribution } => {
                let _ = machine.start(now, &set_of(n, contribution));
            }
            Op::Failure { rank } => {
                let _ = machine.on_rank_failed(now, u32::from(rank) % n);
            }
        }
        // Every frame first meets an empty buffer and one a byte short of it: a typed
        // error that keeps it queued; the retry with exactly its size sends it.
        loop {
            let needed = match machine.poll_transmit(now, &mut []) {
                Ok(None) => break,
                Ok(Some(tx)) => panic!("a frame fit an empty buffer: {tx:?}"),
                Err(e) => e.needed,
            };
            assert!(needed <= buf.len(), "{needed} bytes exceed frame_capacity");
            assert_eq!(
                machine.poll_transmit(now, &mut buf[..needed - 1]),
                Err(BufferTooShort {
                    needed,
                    available: needed - 1
                })
            );
            let tx = machine
                .poll_transmit(now, &mut buf[..needed])
                .expect("fits")
                .expect("still queued");
            assert_eq!(tx.len, needed);
            assert!(tx.to < n && tx.to != me, "frame to {} from {me}", tx.to);
            let (header, _) =
                Header::decode(&buf[..tx.len], Context { comm, n }, me).expect("own frames decode");
            assert_eq!(header.kind.family(), Family::Agree);
        }
        while let Some(event) = machine.poll_event() {
            assert!(!excluded, "event after self-exclusion");
            match event {
                Event::Decided { epoch, agreed } => {
                    assert_eq!(epoch as usize, decided.len() + 1, "one decision per epoch");
                    assert!(!agreed.contains(me));
                    assert_eq!(machine.decided(epoch), Some(&agreed));
                    if let Some(prev) = decided.last() {
                        assert!(prev.is_subset(&agreed), "agreed sets only grow");
                    }
                    decided.push(agreed);
                }
                Event::SelfExcluded { epoch, agreed } => {
                    assert_eq!(epoch as usize, decided.len() + 1);
                    assert!(agreed.contains(me));
                    excluded = true;
                }
                _ => {}
            }
        }
        if let Some(last) = decided.last() {
            // The kept decision never changes.
            let epoch = decided.len() as u32;
            if let Some(kept) = machine.decided(epoch) {
                assert_eq!(kept, last);
            }
        }
    }
});
