//! `RankSet` union and ordered iteration at n = 10^6, each beside a plain baseline on
//! the same input, in the same criterion group so the ratio reads off directly:
//!
//! - sparse (10 members): a sorted `Vec<u32>` merged / iterated;
//! - dense (10^5 members): a `Vec<u64>` bitset OR-ed / iterated bit by bit.
//!
//! Both sides of a union work on a fresh clone of the left operand (cloning is not
//! timed), and both produce the result in place or in a new vector as the real code does.
//! The heap bytes of each set are printed before the groups run.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use ft_core::RankSet;
use std::time::Duration;

const N: u32 = 1_000_000;

/// `count` distinct ranks of `0..N`, spread by a fixed-seed generator (xorshift).
fn ranks(count: usize, seed: u64) -> Vec<u32> {
    let mut state = seed | 1;
    let mut out = std::collections::BTreeSet::new();
    while out.len() < count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.insert((state % u64::from(N)) as u32);
    }
    out.into_iter().collect()
}

fn merge(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        out.push(x.min(y));
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

fn bitset(members: &[u32]) -> Vec<u64> {
    let mut words = vec![0u64; (N as usize).div_ceil(64)];
    for &r in members {
        words[(r / 64) as usize] |= 1 << (r % 64);
    }
    words
}

fn sum_bits(words: &[u64]) -> u64 {
    let mut sum = 0u64;
    for (i, &word) in words.iter().enumerate() {
        let mut w = word;
        while w != 0 {
            sum += (i as u64) * 64 + u64::from(w.trailing_zeros());
            w &= w - 1;
        }
    }
    sum
}

fn bench_size(c: &mut Criterion, label: &str, members: usize) {
    let (a, b) = (ranks(members, 0x9e37_79b9), ranks(members, 0x85eb_ca6b));
    let (set_a, set_b) = (
        RankSet::from_ranks(N, a.iter().copied()),
        RankSet::from_ranks(N, b.iter().copied()),
    );
    let mut union = set_a.clone();
    union.union_with(&set_b);
    println!(
        "rankset memory, n = {N}, {label}: {} members -> {} heap bytes ({}), union of two: {} members -> {} heap bytes; sorted Vec<u32> {} bytes, Vec<u64> bitset {} bytes",
        set_a.len(),
        set_a.heap_bytes(),
        if set_a.is_dense() { "dense" } else { "sparse" },
        union.len(),
        union.heap_bytes(),
        a.len() * 4,
        (N as usize).div_ceil(64) * 8,
    );

    let mut group = c.benchmark_group(format!("union/{label}"));
    group.bench_function("RankSet", |bench| {
        bench.iter_batched_ref(
            || set_a.clone(),
            |s| s.union_with(black_box(&set_b)),
            BatchSize::SmallInput,
        )
    });
    if set_a.is_dense() {
        let (bits_a, bits_b) = (bitset(&a), bitset(&b));
        group.bench_function("Vec<u64> OR", |bench| {
            bench.iter_batched_ref(
                || bits_a.clone(),
                |w| {
                    for (x, y) in w.iter_mut().zip(black_box(&bits_b)) {
                        *x |= *y;
                    }
                },
                BatchSize::SmallInput,
            )
        });
    } else {
        group.bench_function("Vec<u32> merge", |bench| {
            bench.iter(|| merge(black_box(&a), black_box(&b)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group(format!("iter/{label}"));
    group.bench_function("RankSet", |bench| {
        bench.iter(|| black_box(&set_a).iter().map(u64::from).sum::<u64>())
    });
    if set_a.is_dense() {
        let bits_a = bitset(&a);
        group.bench_function("Vec<u64> bits", |bench| {
            bench.iter(|| sum_bits(black_box(&bits_a)))
        });
    } else {
        group.bench_function("Vec<u32>", |bench| {
            bench.iter(|| black_box(&a).iter().map(|&r| u64::from(r)).sum::<u64>())
        });
    }
    group.finish();
}

fn rankset(c: &mut Criterion) {
    bench_size(c, "sparse-10", 10);
    bench_size(c, "dense-100000", 100_000);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = rankset
}
criterion_main!(benches);
