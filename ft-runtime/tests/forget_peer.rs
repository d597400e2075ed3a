//! A driver built with [`Driver::for_stack`] tells its transport of every death its
//! stack learns ([`Transport::forget_peer`]), once per dead rank, and never names a
//! live one: over [`MemNet`], rank 2 stops (its driver is no longer pumped), and every
//! survivor's transport hears of it, whether its own detector declared rank 2 or a
//! notice from another rank told it.

use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::RankStack;
use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, MemNet, MemTransport, Received, Transport};

const N: u32 = 5;
const DEAD: Rank = 2;

/// [`MemTransport`] that records the ranks it is told to forget.
struct Recording {
    inner: MemTransport,
    forgotten: Arc<Mutex<Vec<Rank>>>,
}

impl Transport for Recording {
    type Error = <MemTransport as Transport>::Error;
    fn rank(&self) -> Rank {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), Self::Error> {
        self.inner.send(to, frame)
    }
    fn forget_peer(&mut self, rank: Rank) {
        self.forgotten.lock().unwrap().push(rank);
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, Self::Error> {
        self.inner.try_recv()
    }
    fn progress(&mut self) -> Result<(), Self::Error> {
        self.inner.progress()
    }
    fn pending_sends(&self) -> usize {
        self.inner.pending_sends()
    }
}

#[test]
fn every_survivor_transport_hears_of_the_death_once() {
    let net = MemNet::new(N);
    let origin = WallInstant::now();
    let forgotten: Vec<Arc<Mutex<Vec<Rank>>>> = (0..N).map(|_| Arc::default()).collect();
    let mut drivers: Vec<Driver<RankStack, Recording>> = (0..N)
        .map(|me| {
            let config = DetectorConfig {
                comm: 0,
                n: N,
                me,
                period: Duration::from_millis(20),
                timeout: Duration::from_millis(400),
                phase: Duration::from_millis(u64::from(me)),
                span: DEFAULT_SPAN,
            };
            let transport = Recording {
                inner: net.endpoint(me),
                forgotten: Arc::clone(&forgotten[me as usize]),
            };
            Driver::for_stack(RankStack::new(config, Instant::ZERO), transport, origin)
        })
        .collect();
    let survivors: Vec<Rank> = (0..N).filter(|&r| r != DEAD).collect();
    let heard = |r: Rank| forgotten[r as usize].lock().unwrap().contains(&DEAD);
    // A few periods with everyone alive, then rank 2 stops.
    let stop_at = origin + StdDuration::from_millis(100);
    let deadline = origin + StdDuration::from_secs(10);
    while !survivors.iter().all(|&r| heard(r)) {
        assert!(
            WallInstant::now() < deadline,
            "not every survivor heard of rank {DEAD}: {forgotten:?}"
        );
        for (r, driver) in drivers.iter_mut().enumerate() {
            if r as Rank != DEAD || WallInstant::now() < stop_at {
                driver.pump().expect("MemNet does not fail");
            }
        }
        std::thread::yield_now();
    }
    // A little longer: notices still travelling must not name rank 2 a second time.
    let linger = WallInstant::now() + StdDuration::from_millis(100);
    while WallInstant::now() < linger {
        for &r in &survivors {
            drivers[r as usize].pump().expect("MemNet does not fail");
        }
    }
    for &r in &survivors {
        assert_eq!(*forgotten[r as usize].lock().unwrap(), [DEAD], "rank {r}");
    }
}
