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
//! After the criterion groups, a direct measurement prints the ratios `plan / scan`:
//! each repetition times the scans and the builds back to back, and the median of the
//! per-repetition ratios is reported (see `ratios`). A filter that matches no criterion
//! benchmark runs only this part: `cargo bench -p ft-bcast --bench plan -- paired`.

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

/// The `q`-quantile of `values` (sorted in place).
fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// Paired ratios: each repetition times `scan_sum`, `scan_bytes_per_rank` and every
/// strategy's build back to back (strategies in rotating order), and divides each time
/// by that repetition's `scan_sum`. The machine's load drifts slowly, so a ratio of
/// neighbouring runs is far steadier than a ratio of medians taken minutes apart; the
/// median over repetitions is the figure reported.
fn ratios() {
    let spec = spec(Strategy::PerClass);
    let runs = 41;
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let specs: Vec<PlanSpec> = Strategy::ALL
        .iter()
        .map(|&s| spec.clone().with_strategy(s))
        .collect();
    let mut sum_times = Vec::with_capacity(runs);
    let mut per_rank_ratios = Vec::with_capacity(runs);
    let mut build_ratios: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); specs.len()];
    for run in 0..runs {
        // Every timed step reads lists just written by a clone, as a build's input is.
        let input = spec.clone();
        let sum = time(&mut || {
            black_box(scan_sum(black_box(&input)));
        });
        drop(input);
        let input = spec.clone();
        let per_rank = time(&mut || {
            black_box(scan_bytes_per_rank(black_box(&input)));
        });
        drop(input);
        sum_times.push(sum);
        per_rank_ratios.push(per_rank / sum);
        for k in 0..specs.len() {
            let k = (k + run) % specs.len();
            let mut input = Some(specs[k].clone());
            let mut plan = None;
            let build = time(&mut || {
                let input = input.take().expect("one build per clone");
                plan = Some(Plan::build(black_box(input)).expect("valid spec"));
            });
            drop(black_box(plan));
            build_ratios[k].push(build / sum);
        }
    }
    let sum = quantile(&mut sum_times, 0.5);
    eprintln!("paired ratios to scan_sum over {runs} repetitions (median [p25, p75]):");
    eprintln!(
        "scan_sum                      {:>10.2?}",
        Duration::from_secs_f64(sum)
    );
    let report = |name: &str, ratios: &mut Vec<f64>| {
        let (p25, p75) = (quantile(ratios, 0.25), quantile(ratios, 0.75));
        let median = quantile(ratios, 0.5);
        eprintln!("{name:<29} {median:>6.2}x  [{p25:.2}, {p75:.2}]");
        median
    };
    report("scan_bytes_per_rank", &mut per_rank_ratios);
    let mut per_class = None;
    for (strategy, ratios) in Strategy::ALL.iter().zip(&mut build_ratios) {
        let median = report(&format!("build {strategy}"), ratios);
        if *strategy == Strategy::PerClass {
            per_class = Some(median);
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
