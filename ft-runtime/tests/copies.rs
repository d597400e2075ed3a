//! Copies of broadcast payload bytes on the sending and forwarding side, counted by the
//! driver ([`DriverStats::payload_bytes_copied`]): over [`MemTransport`], which sends a
//! chunk as a head plus the shared payload, a multi-chunk broadcast down a tree with
//! relays copies none; over a transport that keeps the copying default of
//! `send_parts`, the same broadcast counts every byte sent.

use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::{Bytes, OutputSpec, PlanSpec, RankStack, Topology};
use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
use ft_core::wire::MAX_CHUNK;
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, DriverStats, MemNet, MemTransport, Received, Transport};

const N: u32 = 6;

fn config(me: Rank) -> DetectorConfig {
    DetectorConfig {
        comm: 0,
        n: N,
        me,
        period: Duration::from_millis(20),
        timeout: Duration::from_millis(5000),
        phase: Duration::from_millis(u64::from(me)),
        span: DEFAULT_SPAN,
    }
}

/// [`MemTransport`] with the default, copying `send_parts`.
struct Copying(MemTransport);

impl Transport for Copying {
    type Error = <MemTransport as Transport>::Error;
    fn rank(&self) -> Rank {
        self.0.rank()
    }
    fn size(&self) -> u32 {
        self.0.size()
    }
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), Self::Error> {
        self.0.send(to, frame)
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, Self::Error> {
        self.0.try_recv()
    }
    fn progress(&mut self) -> Result<(), Self::Error> {
        self.0.progress()
    }
    fn pending_sends(&self) -> usize {
        self.0.pending_sends()
    }
}

/// A binary tree over `N` ranks (0 -> 1, 2; 1 -> 3, 4; 2 -> 5): ranks 1 and 2 relay.
/// Output A (four and a bit chunks) goes to everyone, B (two chunks) to 3, 4 and 5,
/// fetched for descendants so the relays forward both. Returns each rank's stats and
/// checks every rank received its outputs byte for byte.
fn broadcast<T: Transport>(wrap: impl Fn(MemTransport) -> T) -> Vec<DriverStats>
where
    T::Error: std::fmt::Debug,
{
    let net = MemNet::new(N);
    let origin = WallInstant::now();
    let mut drivers: Vec<Driver<RankStack, T>> = (0..N)
        .map(|r| {
            let stack = RankStack::new(config(r), Instant::ZERO);
            Driver::for_stack(stack, wrap(net.endpoint(r)), origin)
        })
        .collect();
    let sizes = [4 * MAX_CHUNK + 123, 2 * MAX_CHUNK];
    let payloads: Vec<Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(j, &len)| {
            (0..len)
                .map(|i| (i * 7 + j) as u8)
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    let spec = PlanSpec::new(N, 0)
        .with_topology(Topology::Kary(2.try_into().unwrap()))
        .with_strategy(ft_bcast::Strategy::FetchForDescendants)
        .with_output(OutputSpec::new(
            "A",
            sizes[0] as u64,
            (1..N).collect::<Vec<_>>(),
        ))
        .with_output(OutputSpec::new("B", sizes[1] as u64, vec![3, 4, 5]));
    drivers[0]
        .command(|stack, now| {
            stack.start_broadcast(now, 1, ft_bcast::Bytes::new(), spec, payloads.clone())
        })
        .unwrap()
        .expect("the root starts the broadcast");
    let wants: Vec<Vec<u32>> = (0..N)
        .map(|r| match r {
            0 => vec![],
            1 | 2 => vec![0],
            _ => vec![0, 1],
        })
        .collect();
    let held = |d: &Driver<RankStack, T>, r: usize| {
        wants[r].iter().all(|&j| {
            d.machine()
                .broadcaster()
                .and_then(|b| b.output(ft_bcast::TaskId::new(0, 1), j))
                == Some(&payloads[j as usize][..])
        })
    };
    let deadline = WallInstant::now() + StdDuration::from_secs(60);
    while !drivers.iter().enumerate().all(|(r, d)| held(d, r)) {
        assert!(
            WallInstant::now() < deadline,
            "the broadcast did not finish"
        );
        for d in &mut drivers {
            d.pump().unwrap();
        }
    }
    drivers.iter().map(Driver::stats).collect()
}

#[test]
fn sending_and_forwarding_copy_no_payload_byte_over_mem_transport() {
    let stats = broadcast(|t| t);
    for (r, s) in stats.iter().enumerate() {
        assert_eq!(s.payload_bytes_copied, 0, "rank {r}: {s:?}");
    }
    let a = 4 * MAX_CHUNK as u64 + 123;
    let b = 2 * MAX_CHUNK as u64;
    // The root sends A and B to 1 and A and B to 2; each relay forwards to its children.
    assert_eq!(stats[0].payload_bytes_sent, 2 * (a + b), "{:?}", stats[0]);
    assert_eq!(stats[1].payload_bytes_sent, 2 * (a + b), "{:?}", stats[1]);
    assert_eq!(stats[2].payload_bytes_sent, a + b, "{:?}", stats[2]);
    for leaf in &stats[3..] {
        assert_eq!(leaf.payload_bytes_sent, 0);
    }
    println!(
        "payload bytes sent / copied by rank: {:?}",
        stats
            .iter()
            .map(|s| (s.payload_bytes_sent, s.payload_bytes_copied))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_copying_transport_is_counted_byte_for_byte() {
    let stats = broadcast(Copying);
    for (r, s) in stats.iter().enumerate() {
        assert_eq!(
            s.payload_bytes_copied, s.payload_bytes_sent,
            "rank {r}: {s:?}"
        );
    }
    assert!(stats[0].payload_bytes_copied > 0);
}
