//! [`MemNet`]: an in-process network of `n` mailboxes, and [`MemTransport`], one rank's
//! [`Transport`] over it: the network of a group whose ranks are threads of one process
//! (the `ft` crate's simulated group, tests, demos). It moves bytes, as every backend
//! does; the protocol runs unchanged on top.
//!
//! Each rank owns one mailbox (a queue of frames behind a mutex, and a condition
//! variable its progress thread waits on). [`MemNet::kill`] makes a rank fail-stop as
//! a `SIGKILL` would: its queued frames are dropped, frames sent to it are dropped, and
//! frames it still sends are dropped, so the other ranks see it fall silent.
//!
//! A frame sent with [`Transport::send_parts`] (a broadcast chunk) waits in the mailbox
//! as its head and a clone of the sender's shared payload, and is joined into the
//! receiver's one receive buffer when taken: the sending side copies no payload byte.
//!
//! Invariants (checked by the loom tests under `cfg(loom)`): a frame sent to a live
//! rank is received exactly once, in send order per sender; a progress thread waiting
//! in [`Transport::wait`] wakes when a frame arrives or its waker fires (no lost
//! wake-up); nothing a killed rank sends reaches anyone, and it receives nothing.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::RankStack;
use ft_core::detector::DetectorConfig;
use ft_core::wire::FrameKind;
use ft_core::{Instant, Rank};

use crate::driver::Driver;
use crate::runtime::{Runtime, RuntimeError};
use crate::sync::{Arc, Condvar, Mutex, MutexGuard};
use crate::transport::{Bytes, Received, Transport, Wake};

/// The in-process network failed (never: the type exists for [`Transport::Error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemError {}

impl fmt::Display for MemError {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

impl std::error::Error for MemError {}

/// A frame in a mailbox: one buffer, or a head and a payload shared with its sender
/// ([`Transport::send_parts`]: nothing of the payload is copied until the receiver
/// takes the frame).
enum Frame {
    Whole(Vec<u8>),
    Parts(Vec<u8>, Bytes),
}

#[derive(Default)]
struct BoxState {
    frames: VecDeque<(Rank, Frame)>,
    dead: bool,
    /// Every frame this rank sends is lost, while it keeps receiving.
    muted: bool,
    /// The frame kind (header code) whose first send kills this rank, if any.
    dies_before: Option<u8>,
    /// A wake-up not consumed by a wait yet.
    woken: bool,
}

#[derive(Default)]
struct Mailbox {
    state: Mutex<BoxState>,
    changed: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, BoxState> {
        // Every update is one push, pop or assignment: a poisoned lock is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.lock().woken = true;
        self.changed.notify_all();
    }
}

/// `n` mailboxes, one per rank: see the [module docs](self). Cloning shares the network.
#[derive(Clone)]
pub struct MemNet {
    boxes: Arc<Vec<Mailbox>>,
}

impl fmt::Debug for MemNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemNet")
            .field("ranks", &self.boxes.len())
            .finish()
    }
}

impl MemNet {
    /// A network of `n` live ranks with nothing in flight.
    pub fn new(n: u32) -> Self {
        MemNet {
            boxes: Arc::new((0..n).map(|_| Mailbox::default()).collect()),
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.boxes.len() as u32
    }

    /// Rank `rank`'s transport.
    ///
    /// # Panics
    /// If `rank >= size()`.
    pub fn endpoint(&self, rank: Rank) -> MemTransport {
        assert!(rank < self.size(), "rank {rank} of {} ranks", self.size());
        MemTransport {
            net: self.clone(),
            rank,
            current: Vec::new(),
        }
    }

    /// Kills `rank` (fail-stop): see the [module docs](self). Idempotent; out-of-range
    /// ranks are ignored.
    pub fn kill(&self, rank: Rank) {
        if let Some(mailbox) = self.boxes.get(rank as usize) {
            let mut state = mailbox.lock();
            state.dead = true;
            state.frames.clear();
            state.woken = true;
            drop(state);
            mailbox.changed.notify_all();
        }
    }

    /// Mutes `rank`: every frame it sends from now on is lost, while it stays alive and
    /// keeps receiving (a one-way partition). Its peers hear it fall silent and
    /// declare it dead, and the notice reaches it: the case of a live rank declared
    /// dead, which must stop (fail-stop). Out-of-range ranks are ignored.
    pub fn mute(&self, rank: Rank) {
        if let Some(mailbox) = self.boxes.get(rank as usize) {
            mailbox.lock().muted = true;
        }
    }

    /// Arms a kill at a protocol step: `rank` dies (as by [`MemNet::kill`]) just
    /// before it sends its first frame of kind `kind`, which is lost. Tests use it to
    /// kill a rank at an exact point (a root before its first broadcast data).
    pub fn kill_before_sending(&self, rank: Rank, kind: FrameKind) {
        if let Some(mailbox) = self.boxes.get(rank as usize) {
            mailbox.lock().dies_before = Some(kind as u8);
        }
    }

    /// Rank `rank`'s stack on its own progress thread, over this network, with the
    /// detector settings of `config` (its `n` must be this network's size).
    pub fn spawn_rank(&self, config: DetectorConfig) -> Result<Runtime, RuntimeError> {
        let transport = self.endpoint(config.me);
        Runtime::spawn(move || {
            let stack = RankStack::new(config, Instant::ZERO);
            Ok(Driver::for_groups(stack, transport, WallInstant::now()))
        })
    }

    /// Whether `rank` was killed.
    pub fn is_dead(&self, rank: Rank) -> bool {
        self.boxes
            .get(rank as usize)
            .is_none_or(|mailbox| mailbox.lock().dead)
    }
}

/// One rank's [`Transport`] over a [`MemNet`].
pub struct MemTransport {
    net: MemNet,
    rank: Rank,
    /// The frame last received (lent out by `try_recv`).
    current: Vec<u8>,
}

impl fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTransport")
            .field("rank", &self.rank)
            .field("size", &self.net.size())
            .finish()
    }
}

impl MemTransport {
    fn mailbox(&self) -> &Mailbox {
        &self.net.boxes[self.rank as usize]
    }

    /// Queues the frame `make` builds (its kind byte is `kind`) for `to`, unless this
    /// rank dies before sending it or either end is dead.
    fn post(&mut self, to: Rank, kind: Option<u8>, make: impl FnOnce() -> Frame) {
        {
            let own = self.mailbox().lock();
            if own.dies_before.is_some() && own.dies_before == kind {
                drop(own);
                self.net.kill(self.rank);
                return;
            }
            if own.dead || own.muted {
                return;
            }
        }
        if let Some(mailbox) = self.net.boxes.get(to as usize) {
            let mut state = mailbox.lock();
            if state.dead {
                return;
            }
            state.frames.push_back((self.rank, make()));
            drop(state);
            mailbox.changed.notify_all();
        }
    }
}

struct MemWaker {
    net: MemNet,
    rank: Rank,
}

impl Wake for MemWaker {
    fn wake(&self) {
        self.net.boxes[self.rank as usize].wake();
    }
}

impl Transport for MemTransport {
    type Error = MemError;

    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.net.size()
    }
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), MemError> {
        self.post(to, frame.get(1).copied(), || Frame::Whole(frame.to_vec()));
        Ok(())
    }
    /// Queues the head (copied: a few dozen bytes) and a clone of the shared payload:
    /// no payload byte is copied on the sending side.
    fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), MemError> {
        self.post(to, head.get(1).copied(), || {
            Frame::Parts(head.to_vec(), payload.clone())
        });
        Ok(())
    }
    fn copies_payload(&self) -> bool {
        false
    }
    /// A frame sent in parts is joined here, into this transport's one receive buffer
    /// (the copy a network makes into the receiver's memory).
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, MemError> {
        let next = self.mailbox().lock().frames.pop_front();
        Ok(next.map(|(from, frame)| {
            match frame {
                Frame::Whole(bytes) => self.current = bytes,
                Frame::Parts(head, payload) => {
                    self.current.clear();
                    self.current.extend_from_slice(&head);
                    self.current.extend_from_slice(&payload);
                }
            }
            Received::Frame {
                from,
                bytes: &self.current,
            }
        }))
    }
    fn progress(&mut self) -> Result<(), MemError> {
        Ok(())
    }
    fn pending_sends(&self) -> usize {
        0
    }
    fn wait(&mut self, timeout: StdDuration) -> Result<(), MemError> {
        let mailbox = self.mailbox();
        let mut state = mailbox.lock();
        if state.frames.is_empty() && !state.woken {
            state = mailbox
                .changed
                .wait_timeout(state, timeout)
                .map(|(state, _)| state)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        state.woken = false;
        Ok(())
    }
    fn wakes_on_arrival(&self) -> bool {
        true
    }
    fn waker(&self) -> Option<std::sync::Arc<dyn Wake>> {
        Some(std::sync::Arc::new(MemWaker {
            net: self.net.clone(),
            rank: self.rank,
        }))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn recv(t: &mut MemTransport) -> Option<(Rank, Vec<u8>)> {
        match t.try_recv().unwrap()? {
            Received::Frame { from, bytes } => Some((from, bytes.to_vec())),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn frames_arrive_in_order_and_the_dead_fall_silent() {
        let net = MemNet::new(3);
        let (mut a, mut b, mut c) = (net.endpoint(0), net.endpoint(1), net.endpoint(2));
        a.send(1, b"one").unwrap();
        a.send(1, b"two").unwrap();
        c.send(1, b"three").unwrap();
        assert_eq!(recv(&mut b), Some((0, b"one".to_vec())));
        assert_eq!(recv(&mut b), Some((0, b"two".to_vec())));
        net.kill(2);
        c.send(1, b"after death").unwrap();
        assert_eq!(
            recv(&mut b),
            Some((2, b"three".to_vec())),
            "sent before the kill"
        );
        assert_eq!(recv(&mut b), None);
        a.send(2, b"to the dead").unwrap();
        assert_eq!(recv(&mut c), None);
        assert!(net.is_dead(2) && !net.is_dead(0));
    }

    #[test]
    fn a_waker_ends_a_wait() {
        let net = MemNet::new(1);
        let mut t = net.endpoint(0);
        let waker = t.waker().unwrap();
        let thread = std::thread::spawn(move || waker.wake());
        // Without the wake this wait would last an hour.
        t.wait(StdDuration::from_secs(3600)).unwrap();
        thread.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom_model::model;
    use loom::thread;

    /// A sender and a receiver that waits whenever its mailbox is empty: the frame
    /// arrives in every interleaving, and the wait never sleeps through it (loom's
    /// timed wait never times out, so a lost wake-up would deadlock the model).
    #[test]
    fn a_waiting_receiver_gets_the_frame() {
        model("mem: a_waiting_receiver_gets_the_frame", || {
            let net = MemNet::new(2);
            let mut sender = net.endpoint(0);
            let thread = thread::spawn(move || sender.send(1, b"x").unwrap());
            let mut receiver = net.endpoint(1);
            loop {
                if let Some(Received::Frame { from, bytes }) = receiver.try_recv().unwrap() {
                    assert_eq!((from, bytes), (0, &b"x"[..]));
                    break;
                }
                receiver.wait(StdDuration::from_secs(1)).unwrap();
            }
            thread.join().unwrap();
        });
    }

    /// Two frames from one sender to a receiver that waits between them: both arrive,
    /// in send order, in every interleaving.
    #[test]
    fn frames_of_one_sender_keep_their_order() {
        model("mem: frames_of_one_sender_keep_their_order", || {
            let net = MemNet::new(2);
            let mut sender = net.endpoint(0);
            let thread = thread::spawn(move || {
                sender.send(1, b"1").unwrap();
                sender.send(1, b"2").unwrap();
            });
            let mut receiver = net.endpoint(1);
            let mut got = Vec::new();
            while got.len() < 2 {
                match receiver.try_recv().unwrap() {
                    Some(Received::Frame { bytes, .. }) => got.push(bytes[0]),
                    _ => receiver.wait(StdDuration::from_secs(1)).unwrap(),
                }
            }
            assert_eq!(got, b"12");
            thread.join().unwrap();
        });
    }

    /// The waker (an application thread submitting a command) ends the wait in every
    /// interleaving, whether it fires before or during it.
    #[test]
    fn the_waker_ends_a_wait() {
        model("mem: the_waker_ends_a_wait", || {
            let net = MemNet::new(1);
            let mut receiver = net.endpoint(0);
            let waker = receiver.waker().unwrap();
            let thread = thread::spawn(move || waker.wake());
            receiver.wait(StdDuration::from_secs(1)).unwrap();
            thread.join().unwrap();
        });
    }

    /// A kill racing a send: the killed rank's frame is either delivered before the
    /// kill or never, and the receiver of a kill wakes.
    #[test]
    fn a_kill_races_a_send() {
        model("mem: a_kill_races_a_send", || {
            let net = MemNet::new(2);
            let mut victim = net.endpoint(0);
            let sender = thread::spawn(move || victim.send(1, b"v").unwrap());
            let killer = {
                let net = net.clone();
                thread::spawn(move || net.kill(1))
            };
            sender.join().unwrap();
            killer.join().unwrap();
            let mut receiver = net.endpoint(1);
            assert!(
                receiver.try_recv().unwrap().is_none(),
                "killed: hears nothing"
            );
            receiver.wait(StdDuration::from_secs(1)).unwrap();
        });
    }
}
