//! What one [`Driver::pump`] costs when nothing arrives: the clock read, the machine's
//! timer check and an empty flush, over a transport that never has a frame (so the
//! figure is the driver's and the stack's share; a real transport adds its own poll:
//! one `MPI_Improbe`, one `fi_cq_read`). The stack is an idle 8-rank `RankStack` whose
//! next heartbeat is an hour away, so no timer fires during the measurement.
//!
//! `cargo bench -p ft-runtime --bench pump` prints the time of one clock read
//! (`std::time::Instant::now()`), of one idle pump, and of one idle round of
//! [`Driver::run_until`] in the spin window after a frame (pump, the caller's check, the
//! limit, the idle decision: a `spin_loop` pause, and a `sched_yield` every
//! `Transport::idle_yield_every`th round, 16 for `MemTransport`).

#![allow(missing_docs)] // criterion_group! and criterion_main! write undocumented items

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use criterion::{criterion_group, criterion_main, Criterion};
use ft_bcast::RankStack;
use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, Received, Transport};

/// A transport on which nothing ever arrives and every send completes at once.
struct Silent {
    n: u32,
}

impl Transport for Silent {
    type Error = Infallible;
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> u32 {
        self.n
    }
    fn send(&mut self, _to: Rank, frame: &[u8]) -> Result<(), Infallible> {
        black_box(frame);
        Ok(())
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, Infallible> {
        Ok(None)
    }
    fn progress(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
    fn pending_sends(&self) -> usize {
        0
    }
}

fn idle_driver(n: u32) -> Driver<RankStack, Silent> {
    let hour = Duration::from_millis(3_600_000);
    let config = DetectorConfig {
        comm: 1,
        n,
        me: 0,
        period: hour,
        timeout: hour.saturating_mul(4),
        phase: hour,
        span: DEFAULT_SPAN,
    };
    Driver::new(
        RankStack::new(config, Instant::ZERO),
        Silent { n },
        WallInstant::now(),
    )
}

fn pump(c: &mut Criterion) {
    let mut group = c.benchmark_group("idle");
    group.measurement_time(StdDuration::from_secs(3));
    group.bench_function("clock read", |b| b.iter(|| black_box(WallInstant::now())));
    let mut driver = idle_driver(8);
    group.bench_function("pump, 8 ranks", |b| {
        b.iter(|| black_box(driver.pump().unwrap()))
    });
    let mut driver = idle_driver(8);
    driver.set_idle(StdDuration::from_secs(3600), StdDuration::from_secs(3600));
    group.bench_function("run_until round, 8 ranks", |b| {
        b.iter_custom(|rounds| {
            let mut left = rounds;
            let start = WallInstant::now();
            driver
                .run_until("rounds", StdDuration::from_secs(3600), |_, _| {
                    left -= 1;
                    (left == 0).then_some(())
                })
                .unwrap();
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, pump);
criterion_main!(benches);
