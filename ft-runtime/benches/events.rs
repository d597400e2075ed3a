//! What the event path costs: a handle's `EventQueue` carrying a task runtime's events
//! (an `Arrived` with a header, then an `OutputReady`, per broadcast) from one
//! producing thread (the progress thread's side, in batches as it pushes them) to one
//! and to four taking threads, against the standard library's channel carrying the same
//! events in the same run (`std::sync::mpsc`, its receiver behind a mutex for four
//! takers: what an application would write without the queue).
//!
//! `cargo bench -p ft-runtime --bench events` prints, per case, the median time per
//! event of each over the rounds and their ratio (queue / channel). The queue does more
//! per event (the eventfd set and reset on each empty/non-empty edge, the bound, the
//! overflow count), so the ratio says what those cost.

#![allow(missing_docs)]

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ft_bcast::{Bytes, OutputSet, TaskId};
use ft_runtime::events::EventQueue;
use ft_runtime::Event;

/// Events per round, batch pushed at once, rounds per case.
const EVENTS: u64 = 200_000;
const BATCH: u64 = 16;
const ROUNDS: usize = 9;

/// The `k`-th event of a round: broadcasts' arrivals and their outputs, alternately.
fn event(k: u64, header: &Bytes) -> Event {
    let task = TaskId::new((k % 64) as u32, k / 2);
    if k % 2 == 0 {
        Event::Arrived {
            task,
            header: header.clone(),
            tree: 0,
            outputs: [0u32].into_iter().collect::<OutputSet>(),
        }
    } else {
        Event::OutputReady { task, output: 0 }
    }
}

/// One round through the queue with `takers` taking threads: the time from the first
/// push to the last take.
fn queue_round(takers: usize, header: &Bytes) -> Duration {
    // Room for the whole round: the queue drops events past its bound (and says so with
    // one `Overflowed`), which a round that takes every event must not meet.
    let queue = Arc::new(EventQueue::new(EVENTS as usize));
    let start = Instant::now();
    std::thread::scope(|s| {
        let per = EVENTS / takers as u64;
        for _ in 0..takers {
            let queue = Arc::clone(&queue);
            s.spawn(move || {
                for _ in 0..per {
                    let event = queue.next(None).expect("open").expect("no timeout");
                    std::hint::black_box(event);
                }
            });
        }
        let mut k = 0;
        while k < EVENTS {
            queue.push_all((k..(k + BATCH).min(EVENTS)).map(|k| event(k, header)));
            k += BATCH;
        }
    });
    start.elapsed()
}

/// The same round through `std::sync::mpsc`.
fn channel_round(takers: usize, header: &Bytes) -> Duration {
    let (tx, rx) = mpsc::channel::<Event>();
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now();
    std::thread::scope(|s| {
        let per = EVENTS / takers as u64;
        for _ in 0..takers {
            let rx = Arc::clone(&rx);
            s.spawn(move || {
                for _ in 0..per {
                    let event = rx.lock().unwrap().recv().expect("open");
                    std::hint::black_box(event);
                }
            });
        }
        for k in 0..EVENTS {
            tx.send(event(k, header)).expect("open");
        }
    });
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent: stay short then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick { 1 } else { ROUNDS };
    let header = Bytes::from_static(b"class=gemm m=3 n=5 k=1");
    println!("events: {EVENTS} per round, pushed in batches of {BATCH}, {rounds} rounds");
    for takers in [1usize, 4] {
        let (mut queue, mut channel) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            queue.push(queue_round(takers, &header));
            channel.push(channel_round(takers, &header));
        }
        let (q, c) = (median(queue), median(channel));
        let per = |d: Duration| d.as_nanos() as f64 / EVENTS as f64;
        println!(
            "{takers} taker(s): queue {:.0} ns/event, std mpsc {:.0} ns/event, ratio {:.2}",
            per(q),
            per(c),
            q.as_secs_f64() / c.as_secs_f64()
        );
    }
}
