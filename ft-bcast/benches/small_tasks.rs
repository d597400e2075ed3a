//! Per-task cost of small broadcasts, the common case in a task runtime: 8, 16 and 64
//! destinations needing 1, 4 or 8 outputs, on a communicator of 1024 ranks.
//!
//! - `plan/DxM`: what a runtime does per task before any frame: write the spec (output
//!   names, sizes, destination lists) and build the plan (partition refinement, one
//!   binomial tree per class). Target: at most 1 µs for 16 × 4.
//! - `activate/DxM`: the same plus the root's activation: `start_broadcast` on a
//!   long-lived broadcaster (tiny payloads) and every activation frame encoded into the
//!   caller's buffer (`poll_transmit`), then `forget`.
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
use ft_bcast::{Broadcaster, Config, Plan};
use ft_core::{wire, Instant, Protocol};

mod shape;

const N: u32 = 1024;

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
        g.bench_function(BenchmarkId::new("activate", &id), |b| {
            b.iter(|| {
                let plan = Plan::build(shape::spec(N, black_box(&lists), 64)).unwrap();
                root.start_broadcast(Instant::ZERO, 1, &plan, payloads.clone())
                    .unwrap();
                let mut bytes = 0;
                while let Some(t) = root
                    .poll_transmit(Instant::ZERO, &mut buf)
                    .expect("frame_capacity fits")
                {
                    bytes += t.len;
                }
                root.forget(1);
                bytes
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
