//! A peer that sends malformed or stale control messages: each is refused with its
//! typed error and counted, an offer the reader cannot serve is a lost (or
//! oversized) frame, and the transport goes on delivering frames, RMA ones too.
//! Two transports on `tcp;ofi_rxm` over loopback, one per thread.

use std::fs;
use std::time::{Duration, Instant};

use ft_core::Rank;
use ft_runtime::{Bytes, Received};

use super::send::{Carries, Frame};
use super::{OfiConfig, OfiTransport};
use crate::rma::{self, ControlError, Offer};

/// How long either side waits for the other before the test fails.
const LIMIT: Duration = Duration::from_secs(10);

/// Rank 0 and rank 1 of a fresh job, each running `body` on its own thread.
fn pair<R: Send>(test: &str, body: impl Fn(OfiTransport) -> R + Sync) -> Vec<R> {
    let dir = std::env::temp_dir().join(format!("ofi-unit-{test}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let mut config = OfiConfig::new(2, rank, &dir);
                config.address = Some("127.0.0.1".into());
                let body = &body;
                scope.spawn(move || body(OfiTransport::open(config).expect("open")))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    let _ = fs::remove_dir_all(&dir);
    results
}

/// Progresses `t` until `done` holds, keeping every frame received in `frames` (an
/// oversized one as its length's bytes).
fn drive_until(
    t: &mut OfiTransport,
    what: &str,
    frames: &mut Vec<Vec<u8>>,
    mut done: impl FnMut(&OfiTransport, &[Vec<u8>]) -> bool,
) {
    let start = Instant::now();
    while !done(t, frames) {
        assert!(
            start.elapsed() < LIMIT,
            "rank {}: no {what}; {:?}, last control error {:?}",
            t.rank(),
            t.stats(),
            t.last_control_error()
        );
        t.progress().expect("progress");
        while let Some(got) = t.try_recv().expect("try_recv") {
            frames.push(match got {
                Received::Frame { bytes, .. } => bytes.to_vec(),
                Received::Owned { frame, .. } => frame.to_vec(),
                Received::Oversized { len, .. } => len.to_le_bytes().to_vec(),
            });
        }
    }
}

/// Sends `bytes` as a control message, as a misbehaving peer would.
fn send_raw_control(t: &mut OfiTransport, to: Rank, bytes: &[u8]) {
    let frame = Frame {
        head: bytes.into(),
        payload: None,
        carries: Carries::Done,
    };
    t.start(to, frame).expect("send");
}

#[test]
fn bad_control_messages_are_typed_errors_and_the_transport_goes_on() {
    let payload = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let mut done_with_extra = rma::encode_done(1).into_vec();
    done_with_extra.push(0);
    let bogus_key = rma::encode_offer(&Offer {
        id: 999,
        addr: 0x1000,
        len: 100_000,
        key: 0xdead_beef,
        head: b"h",
    });
    let too_long = rma::encode_offer(&Offer {
        id: 998,
        addr: 0,
        len: 1 << 40,
        key: 1,
        head: b"h",
    });
    // What rank 0 sends, and the error rank 1 must report for each.
    let malformed: Vec<(Vec<u8>, ControlError)> = vec![
        (vec![], ControlError::Empty),
        (vec![7, 0, 0], ControlError::UnknownKind { kind: 7 }),
        (
            vec![1, 0, 0, 0, 0],
            ControlError::Truncated { len: 5, need: 33 },
        ),
        (
            rma::encode_done(42).into_vec(),
            ControlError::UnknownTransfer { id: 42 },
        ),
        (done_with_extra, ControlError::TrailingBytes { len: 10 }),
    ];
    let finished = std::sync::atomic::AtomicBool::new(false);
    pair("badctl", |mut t| {
        let me = t.rank();
        let mut frames: Vec<Vec<u8>> = Vec::new();
        if me == 0 {
            assert!(t.uses_rma(), "tcp;ofi_rxm offers FI_RMA");
            for (step, (bytes, _)) in malformed.iter().enumerate() {
                send_raw_control(&mut t, 1, bytes);
                drive_until(&mut t, "go-ahead", &mut frames, |_, frames| {
                    frames.len() > step
                });
            }
            send_raw_control(&mut t, 1, &too_long);
            // Rank 1 answers with a done message for an id never offered.
            drive_until(&mut t, "a stale done", &mut frames, |t, _| {
                t.stats().bad_control == 1
            });
            assert_eq!(
                t.last_control_error(),
                Some(&ControlError::UnknownTransfer { id: 998 })
            );
            // A real RMA frame still goes through, and its done message comes back.
            t.send_parts(1, b"head", &payload).expect("send_parts");
            assert_eq!(t.rma_transfers_open(), 1);
            drive_until(&mut t, "the done message", &mut frames, |t, _| {
                t.rma_transfers_open() == 0 && t.pending_sends() == 0
            });
            assert_eq!(t.stats().rma_offered, 1);
            // Last, an offer with a key this rank never registered: `tcp;ofi_rxm`
            // (1.17) answers the read with an error and breaks the connection.
            send_raw_control(&mut t, 1, &bogus_key);
            drive_until(&mut t, "the end", &mut frames, |_, _| {
                finished.load(std::sync::atomic::Ordering::SeqCst)
            });
        } else {
            for (step, (_, error)) in malformed.iter().enumerate() {
                drive_until(&mut t, "a bad control message", &mut frames, |t, _| {
                    t.stats().bad_control > step as u64
                });
                assert_eq!(t.last_control_error(), Some(error), "step {step}");
                t.send(0, b"next").expect("send");
            }
            // The oversized offer is reported as a two-sided frame this long would
            // have been.
            drive_until(&mut t, "the oversized offer", &mut frames, |_, frames| {
                !frames.is_empty()
            });
            assert_eq!(frames, vec![((1usize << 40) + 1).to_le_bytes().to_vec()]);
            assert_eq!(t.stats().oversized, 1);
            frames.clear();
            drive_until(&mut t, "the RMA frame", &mut frames, |_, frames| {
                !frames.is_empty()
            });
            assert_eq!(&frames[0][..4], b"head");
            assert_eq!(&frames[0][4..], &payload[..]);
            let stats = t.stats();
            assert_eq!((stats.rma_reads, stats.rma_bytes_read), (1, 200_000));
            assert_eq!(stats.bad_control, malformed.len() as u64);
            // The read behind the bogus key fails: a lost frame, not an error.
            drive_until(&mut t, "the failed read", &mut frames, |t, _| {
                t.stats().rma_lost_reads == 1
            });
            assert_eq!(frames.len(), 1, "the failed read delivered nothing");
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
}
