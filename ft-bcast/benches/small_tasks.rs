//! Per-task cost of small broadcasts, the common case in a task runtime: 8, 16 and 64
//! destinations needing 1, 4 or 8 outputs, on a communicator of 1024 ranks.
//!
//! - `plan/DxM`: what a runtime does per task before any frame: write the spec (output
//!   names, sizes, destination lists) and build the plan (partition refinement, one
//!   binomial tree per class). Target: at most 1 µs for 16 × 4.
//! - `activate/DxM`: the same plus the root's activation: `start_with_header` (a
//!   64-byte activation header, as a task runtime's task class and parameters) on a
//!   long-lived broadcaster (tiny payloads) and every activation frame encoded into the
//!   caller's buffer (`poll_transmit`), then `forget`.
//!
//! - `start/DxM` and `restart/DxM`: the root's part alone, from plans built once: a
//!   runtime that keeps a plan per task class. `start` alternates two plans of the same
//!   spec, so every start derives its trees and frames from the plan; `restart` starts
//!   from one plan again and again, so every start clones the plan's template (see
//!   `Broadcaster::start_broadcast`). Each: `start_with_header`, every frame encoded,
//!   `forget`.
//! - `relay/DxM`: the same task at the root's child with the largest subtree: every
//!   frame the root sent it (activation with its header, subtree parts, the pushed
//!   data) handed over (`handle_message_owned`), its arrival event taken, and every
//!   frame it then sends its own children encoded (`poll_transmit`), then `forget`:
//!   what one hop costs a relay.
//!
//! Destination `i` (spread over the communicator) needs output `j` when
//! `(7i + 3j) mod 4 ≠ 0`, so the outputs' destination sets differ and form several
//! classes, as tasks whose consumers read different outputs do (`shape/mod.rs`, shared
//! with `tests/memory.rs`, which counts the allocations of the same plans).
//!
//! `cargo bench -p ft-bcast --bench small_tasks` (criterion keeps the last run and prints
//! the change against it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use ft_bcast::{Broadcaster, Bytes, Config, Plan};
use ft_core::{wire, Instant, Protocol};

mod shape;

const N: u32 = 1024;

/// The first key of the relay bench: every key from here to `2^63` takes 9 bytes as a
/// varint, so a recorded frame is made another task's by rewriting them ([`set_key`]).
const WIDE_KEY: u64 = 1 << 56;

/// Writes `key` (at least [`WIDE_KEY`], below `2^63`) into a frame of root 0, whose
/// body starts with the root (one byte) and the key (nine).
fn set_key(frame: &mut [u8], mut key: u64) {
    let at = wire::HEADER_LEN + 1;
    for byte in &mut frame[at..at + 9] {
        *byte = (key & 0x7f) as u8 | 0x80;
        key >>= 7;
    }
    frame[at + 8] &= 0x7f;
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("small_task");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let shapes = [(8, 1), (8, 4), (16, 1), (16, 4), (16, 8), (64, 4), (64, 8)];
    for (d, m) in shapes {
        let lists = shape::lists(N, d, m);
        let id = format!("{d}x{m}");
        g.bench_function(BenchmarkId::new("plan", &id), |b| {
            b.iter(|| Plan::build(shape::spec(N, black_box(&lists), 64)).unwrap())
        });
        let mut root = Broadcaster::new(Config::new(0, N, 0));
        let mut buf = vec![0u8; wire::frame_capacity(N)];
        let payloads: Vec<Vec<u8>> = (0..m).map(|j| vec![j as u8; 64]).collect();
        let header = Bytes::from(vec![0x5a; 64]);
        g.bench_function(BenchmarkId::new("activate", &id), |b| {
            b.iter(|| {
                let plan = Plan::build(shape::spec(N, black_box(&lists), 64)).unwrap();
                root.start_with_header(Instant::ZERO, 1, &plan, header.clone(), payloads.clone())
                    .unwrap();
                let bytes = encode_all(&mut root, &mut buf);
                root.forget(ft_bcast::TaskId::new(0, 1));
                bytes
            })
        });
        // The root alone, plans built once: derived each time, or from the template.
        let plans = [0, 1].map(|_| Plan::build(shape::spec(N, &lists, 64)).unwrap());
        for (name, alternate) in [("start", true), ("restart", false)] {
            let mut root = Broadcaster::new(Config::new(0, N, 0));
            let mut key = 0u64;
            g.bench_function(BenchmarkId::new(name, &id), |b| {
                b.iter(|| {
                    key = key.wrapping_add(1);
                    let plan = &plans[usize::from(alternate) * (key as usize % 2)];
                    root.start_with_header(
                        Instant::ZERO,
                        key,
                        plan,
                        header.clone(),
                        payloads.clone(),
                    )
                    .unwrap();
                    let bytes = encode_all(&mut root, &mut buf);
                    root.forget(ft_bcast::TaskId::new(0, key));
                    bytes
                })
            });
        }
        // The frames the root sends its busiest child, recorded once.
        let plan = Plan::build(shape::spec(N, &lists, 64)).unwrap();
        let mut root = Broadcaster::new(Config::new(0, N, 0));
        root.start_with_header(
            Instant::ZERO,
            WIDE_KEY,
            &plan,
            header.clone(),
            payloads.clone(),
        )
        .unwrap();
        let mut sent: Vec<(u32, Vec<u8>)> = Vec::new();
        while let Some(t) = root.poll_transmit(Instant::ZERO, &mut buf).unwrap() {
            sent.push((t.to, buf[..t.len].to_vec()));
        }
        let busiest = sent
            .iter()
            .map(|(to, _)| *to)
            .max_by_key(|&to| {
                sent.iter()
                    .filter(|(t, _)| *t == to)
                    .map(|(_, f)| f.len())
                    .sum::<usize>()
            })
            .unwrap();
        let mut frames: Vec<Vec<u8>> = sent
            .into_iter()
            .filter(|(to, _)| *to == busiest)
            .map(|(_, f)| f)
            .collect();
        let mut relay = Broadcaster::new(Config::new(0, N, busiest));
        let mut key = WIDE_KEY;
        g.bench_function(BenchmarkId::new("relay", &id), |b| {
            b.iter(|| {
                // A new task each time (a forgotten one's late frames are dropped).
                key += 1;
                for f in &mut frames {
                    set_key(f, key);
                    let frame = Bytes::copy_from_slice(f);
                    relay.handle_message_owned(Instant::ZERO, 0, frame).unwrap();
                }
                let arrived = relay.poll_event();
                let bytes = encode_all(&mut relay, &mut buf);
                relay.forget(ft_bcast::TaskId::new(0, key));
                (bytes, arrived)
            })
        });
    }
    g.finish();
}

/// Encodes every frame `m` has queued into `buf` (`poll_transmit`); returns their bytes.
fn encode_all(m: &mut Broadcaster, buf: &mut [u8]) -> usize {
    let mut bytes = 0;
    while let Some(t) = m
        .poll_transmit(Instant::ZERO, buf)
        .expect("frame_capacity fits")
    {
        bytes += t.len;
    }
    bytes
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
