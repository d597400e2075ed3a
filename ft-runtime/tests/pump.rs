//! What one round of the driver does, over [`MemNet`] with a probe machine: a round
//! stops receiving once a frame gave the caller news (an event), unless a timer is due
//! (then every frame that arrived is read before it fires), `run_until` returns
//! without pumping when its condition already holds, and a control frame followed by a
//! frame with a payload to the same peer goes out in one call
//! ([`Transport::send_then_parts`]), the two arriving as two frames in order; a head
//! sent ahead of its payload ([`Promise`]) goes in two steps over a transport that
//! sends heads early, and as one whole frame at the payload's turn over any other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_core::{
    BufferTooShort, FrameError, Instant, Promise, Protocol, Rank, Transmit, TransmitParts,
};
use ft_runtime::{Bytes, Driver, MemNet, MemTransport, Received, Transport};

/// A frame the probe sends: destination, head, payload, promise.
type Out = (Rank, Vec<u8>, Option<Bytes>, Option<Promise>);

/// Records the frames it gets; a frame starting with 1 is news (an event); sends what
/// it is given; its one timer, if set, records how many frames it had got when it fired.
#[derive(Default)]
struct Probe {
    got: Vec<Vec<u8>>,
    events: VecDeque<u8>,
    out: VecDeque<Out>,
    timer: Option<Instant>,
    got_when_timer_fired: Option<usize>,
}

impl Protocol for Probe {
    type Event = u8;
    fn handle_message(
        &mut self,
        _now: Instant,
        _from: Rank,
        bytes: &[u8],
    ) -> Result<(), FrameError> {
        self.got.push(bytes.to_vec());
        if bytes.first() == Some(&1) {
            self.events.push_back(1);
        }
        Ok(())
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            self.got_when_timer_fired = Some(self.got.len());
        }
    }
    fn poll_transmit(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        let Some((to, mut frame, payload, _)) = self.out.pop_front() else {
            return Ok(None);
        };
        frame.extend_from_slice(payload.as_deref().unwrap_or_default());
        buf[..frame.len()].copy_from_slice(&frame);
        Ok(Some(Transmit {
            to,
            len: frame.len(),
        }))
    }
    fn poll_transmit_parts(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        let Some((to, head, payload, promise)) = self.out.pop_front() else {
            return Ok(None);
        };
        buf[..head.len()].copy_from_slice(&head);
        Ok(Some(TransmitParts {
            to,
            head: head.len(),
            payload,
            promise,
        }))
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.timer
    }
    fn poll_event(&mut self) -> Option<u8> {
        self.events.pop_front()
    }
}

/// A send call: its name, destination and bytes.
type Call = (&'static str, Rank, Vec<u8>);

/// [`MemTransport`] that records each send call; with `early`, it says it sends
/// heads ahead of their payloads and records those calls too (sending nothing).
struct Recording {
    inner: MemTransport,
    calls: Arc<Mutex<Vec<Call>>>,
    early: bool,
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
        self.calls
            .lock()
            .unwrap()
            .push(("send", to, frame.to_vec()));
        self.inner.send(to, frame)
    }
    fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), Self::Error> {
        let bytes = [head, payload].concat();
        self.calls.lock().unwrap().push(("send_parts", to, bytes));
        self.inner.send_parts(to, head, payload)
    }
    fn send_then_parts(
        &mut self,
        to: Rank,
        frame: &[u8],
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), Self::Error> {
        let bytes = [frame, head, payload].concat();
        self.calls
            .lock()
            .unwrap()
            .push(("send_then_parts", to, bytes));
        self.inner.send(to, frame)?;
        self.inner.send_parts(to, head, payload)
    }
    fn sends_heads_early(&self) -> bool {
        self.early
    }
    fn send_head(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        len: usize,
        promise: u64,
    ) -> Result<(), Self::Error> {
        let bytes = [first.unwrap_or_default(), head, &[len as u8, promise as u8]].concat();
        self.calls.lock().unwrap().push(("send_head", to, bytes));
        Ok(())
    }
    fn send_promised(&mut self, promise: u64, payload: &Bytes) -> Result<(), Self::Error> {
        let bytes = [&[promise as u8], &payload[..]].concat();
        self.calls.lock().unwrap().push(("send_promised", 0, bytes));
        Ok(())
    }
    fn withdraw(&mut self, promise: u64) -> Result<(), Self::Error> {
        let bytes = vec![promise as u8];
        self.calls.lock().unwrap().push(("withdraw", 0, bytes));
        Ok(())
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

fn received(transport: &mut MemTransport) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while let Some(Received::Frame { bytes, .. }) = transport.try_recv().unwrap() {
        frames.push(bytes.to_vec());
    }
    frames
}

#[test]
fn a_round_stops_receiving_once_a_frame_gave_news() {
    let net = MemNet::new(2);
    let mut peer = net.endpoint(1);
    for frame in [[0, 9], [1, 9], [0, 7]] {
        peer.send(0, &frame).unwrap();
    }
    let mut driver = Driver::new(Probe::default(), net.endpoint(0), WallInstant::now());
    assert!(driver.pump().unwrap());
    assert_eq!(
        driver.machine().got,
        [[0, 9], [1, 9]],
        "the third frame waits"
    );
    assert_eq!(driver.poll_event().map(|(_, e)| e), Some(1));
    assert!(driver.pump().unwrap());
    assert_eq!(driver.machine().got.len(), 3);
}

#[test]
fn a_due_timer_fires_only_once_every_frame_that_arrived_was_read() {
    // A detector's timeout judged with a heartbeat still unread behind a frame with
    // news would declare a live rank.
    let net = MemNet::new(2);
    let mut peer = net.endpoint(1);
    for frame in [[1, 9], [0, 7], [1, 8], [0, 6]] {
        peer.send(0, &frame).unwrap();
    }
    let probe = Probe {
        timer: Some(Instant::ZERO),
        ..Probe::default()
    };
    let mut driver = Driver::new(probe, net.endpoint(0), WallInstant::now());
    assert!(driver.pump().unwrap());
    assert_eq!(driver.machine().got_when_timer_fired, Some(4));
    assert_eq!(driver.poll_event().map(|(_, e)| e), Some(1));
    assert_eq!(driver.poll_event().map(|(_, e)| e), Some(1));
}

#[test]
fn run_until_returns_at_once_when_its_condition_already_holds() {
    let net = MemNet::new(2);
    net.endpoint(1).send(0, &[0, 1]).unwrap();
    let mut driver = Driver::new(Probe::default(), net.endpoint(0), WallInstant::now());
    driver
        .run_until("nothing", StdDuration::from_secs(1), |_, _| Some(()))
        .unwrap();
    assert!(driver.machine().got.is_empty(), "no round ran");
    let got = driver
        .run_until("a frame", StdDuration::from_secs(5), |probe, _| {
            (!probe.got.is_empty()).then_some(probe.got.len())
        })
        .unwrap();
    assert_eq!(got, 1);
}

#[test]
fn a_control_frame_and_the_payload_frame_behind_it_to_the_same_peer_go_out_together() {
    let net = MemNet::new(3);
    let calls = Arc::default();
    let transport = Recording {
        inner: net.endpoint(0),
        calls: Arc::clone(&calls),
        early: false,
    };
    let data = |b: &'static [u8]| Some(Bytes::from_static(b));
    let mut probe = Probe::default();
    probe.out.extend([
        (1, vec![10, 1], None, None),
        (1, vec![20, 1], data(b"abc"), None), // joins the frame before it
        (1, vec![11, 1], None, None),
        (2, vec![12, 2], None, None), // alone: the next frame goes to another peer
        (1, vec![21, 1], data(b"de"), None),
        (2, vec![13, 2], None, None), // alone: nothing follows
    ]);
    let mut driver = Driver::new(probe, transport, WallInstant::now());
    driver.command(|_, _| ()).unwrap();
    let calls: Vec<Call> = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            ("send_then_parts", 1, b"\x0a\x01\x14\x01abc".to_vec()),
            ("send", 1, vec![11, 1]),
            ("send", 2, vec![12, 2]),
            ("send_parts", 1, b"\x15\x01de".to_vec()),
            ("send", 2, vec![13, 2]),
        ]
    );
    assert_eq!(driver.stats().frames_joined, 1);
    assert_eq!(driver.stats().payload_bytes_sent, 5);
    // Two frames each, in the order the machine sent them.
    assert_eq!(
        received(&mut net.endpoint(1)),
        [
            vec![10, 1],
            b"\x14\x01abc".to_vec(),
            vec![11, 1],
            b"\x15\x01de".to_vec()
        ]
    );
    assert_eq!(received(&mut net.endpoint(2)), [vec![12, 2], vec![13, 2]]);
}

/// The probe's frames for the promise tests: an activation to 1 with a head sent ahead
/// of its payload (promise 7) behind it, a frame to 2, promise 7's payload, then a
/// second head (promise 8) that is withdrawn.
fn promising_probe() -> Probe {
    let mut probe = Probe::default();
    let head = |id, len| Some(Promise::Head { id, len });
    probe.out.extend([
        (1, vec![10, 1], None, None),
        (1, vec![20, 1], None, head(7, 3)), // joins the activation
        (2, vec![12, 2], None, None),
        (
            1,
            vec![],
            Some(Bytes::from_static(b"abc")),
            Some(Promise::Payload { id: 7 }),
        ),
        (1, vec![21, 1], None, head(8, 2)),
        (1, vec![], None, Some(Promise::Withdrawn { id: 8 })),
    ]);
    probe
}

/// Drives [`promising_probe`] from rank 0 of `net` over a [`Recording`] transport
/// (`early` as given): the driver, and the send calls it made.
fn drive_promising_probe(net: &MemNet, early: bool) -> (Driver<Probe, Recording>, Vec<Call>) {
    let calls = Arc::default();
    let transport = Recording {
        inner: net.endpoint(0),
        calls: Arc::clone(&calls),
        early,
    };
    let mut driver = Driver::new(promising_probe(), transport, WallInstant::now());
    driver.command(|_, _| ()).unwrap();
    let calls = calls.lock().unwrap().clone();
    (driver, calls)
}

#[test]
fn a_head_ahead_of_its_payload_goes_in_two_steps_over_a_transport_that_sends_heads_early() {
    let net = MemNet::new(3);
    let (driver, calls) = drive_promising_probe(&net, true);
    assert_eq!(
        calls,
        [
            ("send_head", 1, vec![10, 1, 20, 1, 3, 7]),
            ("send", 2, vec![12, 2]),
            ("send_promised", 0, b"\x07abc".to_vec()),
            ("send_head", 1, vec![21, 1, 2, 8]),
            ("withdraw", 0, vec![8]),
        ]
    );
    assert_eq!(driver.stats().frames_joined, 1);
    assert_eq!(driver.stats().payload_bytes_sent, 3);
}

#[test]
fn over_any_other_transport_the_driver_sends_a_promised_frame_whole_when_its_payload_comes() {
    let net = MemNet::new(3);
    let (driver, calls) = drive_promising_probe(&net, false);
    assert_eq!(
        calls,
        [
            ("send", 1, vec![10, 1]),
            ("send", 2, vec![12, 2]),
            ("send_parts", 1, b"\x14\x01abc".to_vec()),
        ]
    );
    assert_eq!(driver.stats().payload_bytes_sent, 3);
    assert_eq!(
        received(&mut net.endpoint(1)),
        [vec![10, 1], b"\x14\x01abc".to_vec()],
        "the withdrawn frame never goes"
    );
}
