//! Plan construction at scale against a plain scan of the same destination lists.
//!
//! Input: n = 10^6 ranks, root 0, 8 outputs, each output going to every rank with
//! probability 1/2 (sorted lists), so about 4·10^6 destination entries.
//!
//! Baselines, on the same lists in the same run:
//! - `scan_sum`: sums every destination entry (a sequential read of the lists, the least
//!   any planner must do);
//! - `scan_bytes_per_rank`: adds each output's bytes into a per-rank counter (the same
//!   reads plus one scattered read-modify-write per entry, like any per-rank tally).
//!
//! After the criterion groups, a short direct measurement prints the ratios
//! `plan / scan` (median of repeated runs).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use ft_bcast::{OutputSpec, Plan, PlanSpec, Strategy, Topology};

const N: u32 = 1_000_000;
const OUTPUTS: usize = 8;

fn spec(strategy: Strategy) -> PlanSpec {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut coin = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state & 1 == 1
    };
    let mut spec = PlanSpec::new(N, 0)
        .with_strategy(strategy)
        .with_topology(Topology::Binomial);
    for j in 0..OUTPUTS {
        let dests: Vec<u32> = (1..N).filter(|_| coin()).collect();
        spec.outputs
            .push(OutputSpec::new(format!("o{j}"), 4096 << j, dests));
    }
    spec
}

fn scan_sum(spec: &PlanSpec) -> u64 {
    spec.outputs
        .iter()
        .map(|o| o.dests.iter().map(|&r| u64::from(r)).sum::<u64>())
        .sum()
}

fn scan_bytes_per_rank(spec: &PlanSpec) -> Vec<u64> {
    let mut bytes = vec![0u64; spec.ranks as usize];
    for o in &spec.outputs {
        for &r in &o.dests {
            bytes[r as usize] += o.bytes;
        }
    }
    bytes
}

fn benches(c: &mut Criterion) {
    let per_class = spec(Strategy::PerClass);
    let entries: usize = per_class.outputs.iter().map(|o| o.dests.len()).sum();
    eprintln!("input: n = {N}, {OUTPUTS} outputs, {entries} destination entries");
    let mut g = c.benchmark_group("plan_1e6");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    g.bench_function("scan_sum", |b| b.iter(|| scan_sum(black_box(&per_class))));
    g.bench_function("scan_bytes_per_rank", |b| {
        b.iter(|| scan_bytes_per_rank(black_box(&per_class)))
    });
    for strategy in Strategy::ALL {
        let s = per_class.clone().with_strategy(strategy);
        g.bench_function(format!("build_{strategy}"), |b| {
            b.iter_batched(|| s.clone(), Plan::build, BatchSize::LargeInput)
        });
    }
    g.finish();
}

fn median(mut f: impl FnMut() -> Duration, runs: usize) -> Duration {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    times[runs / 2]
}

fn ratios() {
    let spec = spec(Strategy::PerClass);
    let runs = 11;
    let sum = median(
        || {
            let t = Instant::now();
            black_box(scan_sum(black_box(&spec)));
            t.elapsed()
        },
        runs,
    );
    let per_rank = median(
        || {
            let t = Instant::now();
            black_box(scan_bytes_per_rank(black_box(&spec)));
            t.elapsed()
        },
        runs,
    );
    eprintln!("scan_sum            {sum:>10.2?}");
    eprintln!("scan_bytes_per_rank {per_rank:>10.2?}");
    let mut per_class = None;
    for strategy in Strategy::ALL {
        let s = spec.clone().with_strategy(strategy);
        let build = median(
            || {
                let input = s.clone();
                let t = Instant::now();
                let plan = Plan::build(black_box(input)).expect("valid spec");
                let elapsed = t.elapsed();
                drop(black_box(plan));
                elapsed
            },
            runs,
        );
        eprintln!(
            "build {strategy:<22} {build:>10.2?}  = {:.2}x scan_sum, {:.2}x scan_bytes_per_rank",
            build.as_secs_f64() / sum.as_secs_f64(),
            build.as_secs_f64() / per_rank.as_secs_f64()
        );
        if strategy == Strategy::PerClass {
            per_class = Some(build.as_secs_f64() / sum.as_secs_f64());
        }
    }
    if let Some(ratio) = per_class {
        eprintln!("per-class build / scan_sum = {ratio:.2} (acceptance: at most 3)");
    }
    let plan = Plan::build(spec).expect("valid spec");
    plan.check().expect("the benchmarked plan is correct");
    let s = plan.stats();
    eprintln!(
        "per-class plan: {} classes, {} activations, {} bytes, max depth {}",
        s.trees, s.activations, s.bytes, s.max_depth
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    ratios();
    c.final_summary();
}
