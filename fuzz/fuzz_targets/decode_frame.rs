//! Arbitrary bytes through the frame codec: the header check, then a fuzzer-chosen
//! sequence of payload reads. Nothing may panic, and what decodes must re-encode to
//! something that decodes to the same value (rank sets, varints, byte strings).
#![no_main]

use arbitrary::Arbitrary;
use ft_core::wire::{Context, FrameKind, Header, Reader, HEADER_LEN};
use ft_core::{FrameError, RankSet};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Read {
    RankSet,
    Varint,
    VarintU32,
    Rank,
    Bytes,
    U8,
    U32,
    U64,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Use the full `u32` range for `n` (mostly huge communicators) instead of `0..1024`.
    wide: bool,
    n: u32,
    comm: u32,
    from: u32,
    reads: Vec<Read>,
    bytes: Vec<u8>,
}

/// A writer for payload fields (the header it starts with is cut off again).
fn writer() -> ft_core::wire::Writer {
    Header {
        kind: FrameKind::Heartbeat,
        comm: 0,
        epoch: 0,
        sender: 0,
    }
    .start()
}

fn payload(mut w: ft_core::wire::Writer) -> Vec<u8> {
    w.finish().split_off(HEADER_LEN)
}

fn check_rankset(set: &RankSet, n: u32) {
    assert_eq!(set.universe(), n);
    let members: Vec<u32> = set.iter().collect();
    assert_eq!(members.len(), set.len());
    assert!(members.windows(2).all(|w| w[0] < w[1]));
    assert!(members.iter().all(|&r| r < n));

    let bytes = payload({
        let mut w = writer();
        w.put_rankset(set);
        w
    });
    // The smaller form is chosen, so it never exceeds the dense one.
    assert!(bytes.len() <= 1 + (n as usize).div_ceil(8));
    let mut r = Reader::new(&bytes, n);
    assert_eq!(r.rankset().as_ref(), Ok(set));
    assert_eq!(r.finish(), Ok(()));
}

fn run_reads(mut r: Reader<'_>, reads: &[Read]) {
    let n = r.universe();
    for read in reads {
        let result: Result<(), FrameError> = match read {
            Read::RankSet => r.rankset().map(|set| check_rankset(&set, n)),
            Read::Varint => r.varint().map(|v| {
                let bytes = payload({
                    let mut w = writer();
                    w.put_varint(v);
                    w
                });
                assert_eq!(Reader::new(&bytes, n).varint(), Ok(v));
            }),
            Read::VarintU32 => r.varint_u32().map(drop),
            Read::Rank => r.rank().map(|rank| assert!(rank < n)),
            Read::Bytes => r.bytes().map(|b| {
                let bytes = payload({
                    let mut w = writer();
                    w.put_bytes(b);
                    w
                });
                assert_eq!(Reader::new(&bytes, n).bytes(), Ok(b));
            }),
            Read::U8 => r.u8().map(drop),
            Read::U32 => r.u32().map(drop),
            Read::U64 => r.u64().map(drop),
        };
        if let Err(e) = result {
            // Errors must render (Display is part of the contract).
            let _ = e.to_string();
            return;
        }
    }
    let _ = r.finish();
}

fuzz_target!(|input: Input| {
    let n = if input.wide { input.n } else { input.n % 1024 };
    let ctx = Context {
        comm: input.comm,
        n,
    };
    match Header::decode(&input.bytes, ctx, input.from) {
        Ok((header, reader)) => {
            assert_eq!(header.comm, input.comm);
            assert_eq!(header.sender, input.from);
            assert!(header.sender < n);
            run_reads(reader, &input.reads);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // The payload readers on their own, so coverage does not hinge on a valid header.
    run_reads(Reader::new(&input.bytes, n), &input.reads);
});
