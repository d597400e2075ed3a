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
//! classes, as tasks whose consumers read different outputs do.
//!
//! `cargo bench -p ft-bcast --bench small_tasks` (criterion keeps the last run and prints
//! the change against it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use ft_bcast::{Broadcaster, Config, OutputSpec, Plan, PlanSpec};
use ft_core::{wire, Instant, Protocol, Rank};

const N: u32 = 1024;
const NAMES: [&str; 8] = ["A", "B", "C", "D", "E", "F", "G", "H"];

/// Each output's destinations, for `d` destinations and `m` outputs.
fn lists(d: u32, m: u32) -> Vec<Vec<Rank>> {
    let dest = |i: u32| 1 + i * (N - 1) / d;
    (0..m)
        .map(|j| {
            (0..d)
                .filter(|&i| m == 1 || (7 * i + 3 * j) % 4 != 0)
                .map(dest)
                .collect()
        })
        .collect()
}

/// The spec a runtime writes for the task.
fn spec(lists: &[Vec<Rank>]) -> PlanSpec {
    lists
        .iter()
        .zip(NAMES)
        .fold(PlanSpec::new(N, 0), |spec, (dests, name)| {
            spec.with_output(OutputSpec::new(name, 64, dests.clone()))
        })
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("small_task");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let shapes = [(8, 1), (8, 4), (16, 1), (16, 4), (16, 8), (64, 4), (64, 8)];
    for (d, m) in shapes {
        let lists = lists(d, m);
        let id = format!("{d}x{m}");
        g.bench_function(BenchmarkId::new("plan", &id), |b| {
            b.iter(|| Plan::build(spec(black_box(&lists))).unwrap())
        });
        let mut root = Broadcaster::new(Config::new(0, N, 0));
        let mut buf = vec![0u8; wire::frame_capacity(N)];
        let payloads: Vec<Vec<u8>> = (0..m).map(|j| vec![j as u8; 64]).collect();
        g.bench_function(BenchmarkId::new("activate", &id), |b| {
            b.iter(|| {
                let plan = Plan::build(spec(black_box(&lists))).unwrap();
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
