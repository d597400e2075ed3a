//! [`Driver`]: the backend loop of [`ft_core::machine`] for one rank, over any
//! [`Transport`] (MPI, libfabric) and the wall clock.
//!
//! One [`Driver::pump`] receives every frame that has arrived (handing each to the
//! machine), fires the machine's timer if it is due, sends every frame the machine
//! has, completes finished sends, and moves the machine's events to the driver's
//! queue; a frame that gives the caller news (an event) ends the round there, with no
//! further call into the transport, whose calls can cost a scheduling rotation on an
//! oversubscribed node, unless a timer is due: then the round first reads what has
//! arrived, so a timeout is never judged with a heartbeat left unread. [`Driver::run_until`] pumps until the caller's condition
//! holds, and does not pump at all if it holds already. When a pump
//! finds nothing to do, the loop spins (yielding the CPU now and then) for a short window after the
//! last frame or command, since an exchange in progress answers within microseconds,
//! and past the window waits without the CPU, so idle ranks oversubscribed on few cores
//! leave each other the CPU and heartbeats stay on time ([`Driver::set_idle`]): in the
//! transport until the next timer when the transport wakes on arrival (libfabric's
//! completion-queue wait object), else in naps of at most the idle sleep (MPI).
//!
//! Frames come in as the transport gives them: a lent frame through
//! [`Protocol::handle_message`], a frame handed over ([`Received::Owned`]) through
//! [`Protocol::handle_message_owned`], so a broadcast chunk in it is kept without a
//! copy; a transport that receives a head before its payload asks the machine where the
//! payload goes ([`Transport::try_recv_placing`] with [`Protocol::place_payload`]), and
//! a payload received there comes in through [`Protocol::handle_message_placed`]. Frames go out through [`Protocol::poll_transmit_parts`]: control frames as one
//! slice of the driver's buffer ([`Transport::send`]), broadcast chunks as a head in
//! that buffer plus the payload shared with the machine ([`Transport::send_parts`]), so
//! the driver and the machine copy no payload byte; [`DriverStats`] counts the payload
//! bytes sent and those the transport says it copies. A control frame followed by a
//! frame with a payload to the same peer (an activation and the data pushed behind it)
//! goes out in one call, [`Transport::send_then_parts`], which MPI sends as one
//! message (the driver polls the frame after a control frame into a second buffer to
//! see). A frame whose head goes ahead of its payload ([`ft_core::Promise`]) goes out
//! in two steps, [`Transport::send_head`] then [`Transport::send_promised`], over a
//! transport that [`Transport::sends_heads_early`]; over any other, the driver keeps
//! the head and sends the whole frame when the payload comes. [`Driver::for_stack`]
//! lets the stack's broadcaster send heads early exactly when the transport does.
//! With [`crate::timeline`] on, a pump marks each frame handed to the machine and
//! handled, and the sending of what the machine answered.
//!
//! Invariants: the clock passed to the machine never goes back (it is one monotonic
//! `std::time::Instant` origin per driver); after every public call that touched the
//! machine, its transmit queue is drained into the transport. Frames the machine
//! rejects are counted, never fatal: peer input cannot stop a rank.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::{RankStack, StackEvent};
use ft_core::node::NodeEvent;
use ft_core::{wire, HeldHeads, Instant, Promise, Protocol, Rank, TransmitParts};

use crate::groups::{GroupEvent, GroupId, Groups, StackTuning};
use crate::runtime::Engine;
use crate::timeline::{self, Mark};
use crate::transport::{Bytes, Delivery, Received, Transport, Wake};

/// The longest an idle loop sleeps, by default: a frame that arrives while the rank
/// sleeps waits at most this long ([`Driver::set_idle`]).
pub const IDLE_SLEEP: StdDuration = StdDuration::from_micros(200);

/// The longest one idle wait blocks in a transport that wakes on arrival (the machine
/// may have no timer armed).
const MAX_BLOCK: StdDuration = StdDuration::from_millis(100);

/// The most frames one round reads past a frame with news when a timer is due
/// ([`Driver::pump`]): enough for every frame that arrived since the last round, a
/// bound should they keep coming faster than the machine takes them.
const DRAIN_BEFORE_TIMER: usize = 4096;

/// How long after its last frame or command an idle loop spins instead of sleeping,
/// by default ([`Driver::set_idle`]).
pub const IDLE_SPIN: StdDuration = StdDuration::from_micros(500);

/// Why a [`Driver::run_until`] stopped without its condition.
#[derive(Debug)]
#[non_exhaustive]
pub enum DriverError<E> {
    /// The transport failed (not because of a dead peer: that is a dropped frame).
    Transport(E),
    /// The condition did not hold by the deadline.
    TimedOut {
        /// What was awaited.
        what: String,
        /// How long the driver waited.
        waited: StdDuration,
    },
}

impl<E: fmt::Display> fmt::Display for DriverError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverError::Transport(e) => e.fmt(f),
            DriverError::TimedOut { what, waited } => {
                write!(f, "timed out after {waited:?} waiting for {what}")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for DriverError<E> {}

/// Counters of what the driver saw (the transport keeps its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Frames the machine rejected (malformed, from a rank it knows dead, ...).
    pub rejected: u64,
    /// Messages longer than any frame, discarded by the transport.
    pub oversized: u64,
    /// Timer firings.
    pub timeouts: u64,
    /// Bulk payload bytes (broadcast chunks, sent or forwarded) handed to the transport
    /// as shared slices ([`Transport::send_parts`]).
    pub payload_bytes_sent: u64,
    /// Of those, the bytes the transport copies ([`Transport::copies_payload`]). The
    /// machine copies none on this path: the driver drains
    /// [`Protocol::poll_transmit_parts`], where chunks stay slices of their buffer.
    pub payload_bytes_copied: u64,
    /// Frames the transport handed over ([`Received::Owned`]) and the driver passed on
    /// whole ([`Protocol::handle_message_owned`]); the rest were lent.
    pub frames_owned: u64,
    /// Frames whose payload the transport received where the machine asked
    /// ([`Protocol::place_payload`], [`Delivery::Placed`]).
    pub frames_placed: u64,
    /// Control frames sent together with the payload frame that followed them to the
    /// same peer ([`Transport::send_then_parts`]).
    pub frames_joined: u64,
}

/// One rank's machine `P` driven over the transport `T`: see the [module docs](self).
pub struct Driver<P: Protocol, T: Transport> {
    machine: P,
    transport: T,
    origin: WallInstant,
    buf: Vec<u8>,
    /// The frame polled after a control frame, to send with it if it carries a
    /// payload to the same peer ([`Transport::send_then_parts`]).
    ahead: Vec<u8>,
    events: VecDeque<(Instant, P::Event)>,
    stats: DriverStats,
    idle_sleep: StdDuration,
    idle_spin: StdDuration,
    /// The last frame received or command run.
    last_activity: WallInstant,
    /// The wall clock at the last read ([`Driver::tick`]): one read serves a whole
    /// loop round (the pump, the caller's limit, the idle decision).
    last_tick: WallInstant,
    /// Idle rounds spent spinning: every [`Transport::idle_yield_every`]th yields the
    /// CPU.
    spin_rounds: u32,
    /// The dead rank an event of the machine names, if it names one: each is passed to
    /// [`Transport::forget_peer`] ([`Driver::for_stack`] sets it).
    death_of: fn(&P::Event) -> Option<Rank>,
    /// Heads sent ahead of their payload, kept here over a transport that does not
    /// send heads early: each goes with its payload ([`Promise`]).
    held_heads: HeldHeads,
}

impl<P: Protocol, T: Transport> fmt::Debug for Driver<P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("rank", &self.transport.rank())
            .field("now", &self.now())
            .field("events", &self.events.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<P: Protocol, T: Transport> Driver<P, T> {
    /// Drives `machine` over `transport`; the machine's clock reads
    /// `origin.elapsed()` (the origin the machine was created at, as
    /// [`Instant::ZERO`]).
    pub fn new(machine: P, transport: T, origin: WallInstant) -> Self {
        let n = transport.size();
        Driver {
            machine,
            transport,
            origin,
            buf: vec![0; wire::frame_capacity(n)],
            ahead: vec![0; wire::frame_capacity(n)],
            events: VecDeque::new(),
            stats: DriverStats::default(),
            idle_sleep: IDLE_SLEEP,
            idle_spin: IDLE_SPIN,
            last_activity: origin,
            last_tick: origin,
            spin_rounds: 0,
            death_of: |_| None,
            held_heads: HeldHeads::default(),
        }
    }

    /// How an idle loop waits: it spins (yielding the CPU) for `spin` after the last
    /// frame or command, then sleeps at most `sleep` at a time ([`IDLE_SPIN`],
    /// [`IDLE_SLEEP`] by default). A zero `sleep` always spins: lowest latency, one
    /// core busy per rank.
    pub fn set_idle(&mut self, spin: StdDuration, sleep: StdDuration) {
        self.idle_spin = spin;
        self.idle_sleep = sleep;
    }

    /// The machine's clock now.
    pub fn now(&self) -> Instant {
        self.machine_time(WallInstant::now())
    }

    /// `wall` on the machine's clock.
    fn machine_time(&self, wall: WallInstant) -> Instant {
        let nanos = wall.saturating_duration_since(self.origin).as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Reads the wall clock (the one read of a loop round) and returns it on the
    /// machine's clock.
    fn tick(&mut self) -> Instant {
        self.last_tick = WallInstant::now();
        self.machine_time(self.last_tick)
    }

    /// The machine.
    pub fn machine(&self) -> &P {
        &self.machine
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// What the driver saw so far.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Runs an application command (`validate_global`, `start_broadcast`, ...) on the
    /// machine at the current time, then sends what it produced.
    pub fn command<R>(&mut self, f: impl FnOnce(&mut P, Instant) -> R) -> Result<R, T::Error> {
        let now = self.tick();
        let result = f(&mut self.machine, now);
        self.last_activity = self.last_tick;
        self.flush(now)?;
        Ok(result)
    }

    /// Hands the machine a frame that reached this rank before the driver took over its
    /// transport (a backend's own start-up traffic may overlap the first frames of
    /// faster peers); a frame the machine rejects is counted, as in [`Driver::pump`].
    pub fn deliver(&mut self, from: Rank, bytes: &[u8]) -> Result<(), T::Error> {
        let now = self.tick();
        hand_over(&mut self.machine, &mut self.stats, now, from, bytes);
        self.last_activity = self.last_tick;
        self.flush(now)
    }

    /// The next event the machine reported, with the time it was collected.
    pub fn poll_event(&mut self) -> Option<(Instant, P::Event)> {
        self.events.pop_front()
    }

    /// One round of the backend loop; returns whether it received a frame (if not, the
    /// caller may wait: [`Driver::wait_idle`]). A due timer fires too. It reads the
    /// clock once, and the round's other time checks reuse that read.
    ///
    /// A round stops receiving as soon as a frame gave the machine news for the caller
    /// (an event), unless the machine's timer is due (then it reads on until the
    /// transport has nothing, at most `DRAIN_BEFORE_TIMER` frames, before the timer
    /// fires), and leaves the transport's send progress to the next round, so the
    /// caller sees the news without another call into the transport. That call may
    /// cost a whole scheduling rotation: Open MPI's progress yields the CPU when it
    /// finds nothing to do on an oversubscribed node (`mpi_yield_when_idle`), and a
    /// destination that had just received its last byte then waited for every other
    /// rank on its core before it could see its outputs complete.
    pub fn pump(&mut self) -> Result<bool, T::Error> {
        let mut busy = false;
        let mut news = false;
        let now = self.tick();
        // A due timer is judged only once the frames that arrived before it are read:
        // a heartbeat left unread behind a frame with news would let the detector
        // declare a live rank.
        let due = self.machine.poll_timeout().is_some_and(|t| t <= now);
        let mut read = 0;
        while !news || (due && read < DRAIN_BEFORE_TIMER) {
            read += 1;
            let events = self.events.len();
            let machine = &mut self.machine;
            let mut place = |from, head: &[u8], len| machine.place_payload(now, from, head, len);
            match self.transport.try_recv_placing(&mut place)? {
                None => break,
                Some(Delivery::Received(Received::Frame { from, bytes })) => {
                    busy = true;
                    timeline::mark(Mark::FrameReceived, from);
                    hand_over(&mut self.machine, &mut self.stats, now, from, bytes);
                    timeline::mark(Mark::FrameHandled, from);
                }
                Some(Delivery::Received(Received::Owned { from, frame })) => {
                    busy = true;
                    self.stats.frames_owned += 1;
                    timeline::mark(Mark::FrameReceived, from);
                    if self.machine.handle_message_owned(now, from, frame).is_err() {
                        self.stats.rejected += 1;
                    }
                    timeline::mark(Mark::FrameHandled, from);
                }
                Some(Delivery::Received(Received::Oversized { .. })) => {
                    busy = true;
                    self.stats.oversized += 1;
                }
                Some(Delivery::Placed {
                    from,
                    head,
                    payload,
                }) => {
                    busy = true;
                    self.stats.frames_placed += 1;
                    timeline::mark(Mark::FrameReceived, from);
                    if self
                        .machine
                        .handle_message_placed(now, from, head, payload)
                        .is_err()
                    {
                        self.stats.rejected += 1;
                    }
                    timeline::mark(Mark::FrameHandled, from);
                }
                Some(Delivery::Unplaced { slot }) => {
                    busy = true;
                    self.machine.placement_lost(now, slot);
                }
            }
            // Answer as we go, so a burst of frames does not hold back replies.
            self.flush(now)?;
            timeline::mark(Mark::Flushed, 0);
            news = self.events.len() > events;
        }
        if self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.stats.timeouts += 1;
            self.machine.handle_timeout(now);
        }
        self.flush(now)?;
        if !news {
            self.transport.progress()?;
        }
        if busy {
            self.last_activity = self.last_tick;
        }
        Ok(busy)
    }

    /// Pumps until `done` (asked first, then after every pump, with the machine and
    /// the events collected so far) returns a value, or `limit` passes. A condition
    /// that already holds returns at once, without a call into the transport (see
    /// [`Driver::pump`] for what one may cost).
    pub fn run_until<V>(
        &mut self,
        what: impl fmt::Display,
        limit: StdDuration,
        mut done: impl FnMut(&P, &mut VecDeque<(Instant, P::Event)>) -> Option<V>,
    ) -> Result<V, DriverError<T::Error>> {
        let start = WallInstant::now();
        if let Some(value) = done(&self.machine, &mut self.events) {
            return Ok(value);
        }
        loop {
            let busy = self.pump().map_err(DriverError::Transport)?;
            if let Some(value) = done(&self.machine, &mut self.events) {
                return Ok(value);
            }
            let waited = self.last_tick.saturating_duration_since(start);
            if waited >= limit {
                return Err(DriverError::TimedOut {
                    what: what.to_string(),
                    waited,
                });
            }
            if !busy {
                self.wait_idle().map_err(DriverError::Transport)?;
            }
        }
    }

    /// Pumps for `span` (keeping the rank alive for its peers: heartbeats, late
    /// requests), then waits up to `span` more for its own sends to complete.
    pub fn run_for(&mut self, span: StdDuration) -> Result<(), T::Error> {
        let end = WallInstant::now() + span;
        loop {
            let busy = self.pump()?;
            if self.last_tick >= end {
                break;
            }
            if !busy {
                self.wait_idle()?;
            }
        }
        let end = self.last_tick + span;
        while self.transport.pending_sends() > 0 {
            self.tick();
            if self.last_tick >= end {
                break;
            }
            self.transport.progress()?;
            // Send completions need not wake a waiting transport: nap.
            let nap = self.idle_sleep;
            self.idle_wait(Some(nap))?;
        }
        Ok(())
    }

    /// Waits, a pump having found nothing to do (the wait reckons from that pump's
    /// clock read): spins within the spin window after the last activity (yielding the
    /// CPU every [`Transport::idle_yield_every`]th round); past it, waits in the
    /// transport until the machine's next deadline if the transport wakes when a frame
    /// arrives, else naps at most the idle sleep ([`Driver::set_idle`]).
    pub fn wait_idle(&mut self) -> Result<(), T::Error> {
        self.idle_wait(None)
    }

    /// [`Driver::wait_idle`], never longer than `cap`.
    ///
    /// Time is the last pump's clock read: the caller has just pumped.
    fn idle_wait(&mut self, cap: Option<StdDuration>) -> Result<(), T::Error> {
        let since_activity = self.last_tick.saturating_duration_since(self.last_activity);
        if self.idle_sleep.is_zero() || since_activity < self.idle_spin {
            self.spin_rounds = self.spin_rounds.wrapping_add(1);
            if self.spin_rounds % self.transport.idle_yield_every().max(1) == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        let now = self.machine_time(self.last_tick);
        let until_timer = self.machine.poll_timeout().map_or(MAX_BLOCK, |t| {
            StdDuration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos()))
        });
        let mut nap = until_timer.min(MAX_BLOCK);
        if !self.transport.wakes_on_arrival() {
            nap = nap.min(self.idle_sleep);
        }
        if let Some(cap) = cap {
            nap = nap.min(cap);
        }
        if nap.is_zero() {
            std::thread::yield_now();
            Ok(())
        } else {
            self.transport.wait(nap)
        }
    }

    /// Sends every frame the machine has queued, then collects its events. A control
    /// frame followed by a frame with a payload to the same peer (an activation and
    /// the data pushed behind it) goes out in one call, [`Transport::send_then_parts`],
    /// which a transport whose cost is per message sends as one; likewise a control
    /// frame followed by a head sent ahead of its payload ([`Transport::send_head`]).
    fn flush(&mut self, now: Instant) -> Result<(), T::Error> {
        // A frame polled into `ahead` that did not join the one before it: sent next.
        let mut carried = None;
        loop {
            let frame = match carried.take() {
                Some(frame) => frame,
                None => match poll_frame(&mut self.machine, now, &mut self.buf) {
                    Some(frame) => frame,
                    None => break,
                },
            };
            let TransmitParts {
                to,
                head,
                payload,
                promise,
            } = frame;
            if let Some(promise) = promise {
                self.promise(to, None, head, promise, payload)?;
                continue;
            }
            if let Some(payload) = payload {
                self.count_payload(&payload);
                self.transport.send_parts(to, &self.buf[..head], &payload)?;
                continue;
            }
            match poll_frame(&mut self.machine, now, &mut self.ahead) {
                Some(TransmitParts {
                    to: next,
                    head: next_head,
                    payload: Some(payload),
                    promise: None,
                }) if next == to => {
                    self.count_payload(&payload);
                    self.stats.frames_joined += 1;
                    self.transport.send_then_parts(
                        to,
                        &self.buf[..head],
                        &self.ahead[..next_head],
                        &payload,
                    )?;
                }
                Some(TransmitParts {
                    to: next,
                    head: next_head,
                    payload: None,
                    promise: Some(promise @ Promise::Head { .. }),
                }) if next == to => {
                    self.stats.frames_joined += 1;
                    // The control frame rides in `buf`, the head is `ahead`'s.
                    std::mem::swap(&mut self.buf, &mut self.ahead);
                    self.promise(to, Some(head), next_head, promise, None)?;
                }
                other => {
                    self.transport.send(to, &self.buf[..head])?;
                    let Some(next) = other else {
                        break;
                    };
                    std::mem::swap(&mut self.buf, &mut self.ahead);
                    carried = Some(next);
                }
            }
        }
        while let Some(event) = self.machine.poll_event() {
            if let Some(dead) = (self.death_of)(&event) {
                self.transport.forget_peer(dead);
                self.held_heads.forget_peer(dead);
            }
            self.events.push_back((now, event));
        }
        Ok(())
    }

    /// One step of a frame sent in two ([`Promise`]): the head is `buf[..head]`, after
    /// the control frame `ahead[..first]` if given. Over a transport that does not send
    /// heads early, the driver keeps the head and sends the whole frame with its
    /// payload.
    fn promise(
        &mut self,
        to: Rank,
        first: Option<usize>,
        head: usize,
        promise: Promise,
        payload: Option<Bytes>,
    ) -> Result<(), T::Error> {
        if let (Promise::Payload { .. }, Some(payload)) = (promise, &payload) {
            self.count_payload(payload);
        }
        let first = first.map(|len| &self.ahead[..len]);
        let head = &self.buf[..head];
        if self.transport.sends_heads_early() {
            return match (promise, payload) {
                (Promise::Head { id, len }, _) => {
                    self.transport.send_head(to, first, head, len, id)
                }
                (Promise::Payload { id }, Some(payload)) => {
                    self.transport.send_promised(id, &payload)
                }
                (Promise::Payload { .. }, None) => Ok(()),
                (Promise::Withdrawn { id }, _) => self.transport.withdraw(id),
            };
        }
        let whole = self.held_heads.step(to, head, promise);
        if let Some(frame) = first {
            self.transport.send(to, frame)?;
        }
        match (whole, payload) {
            (Some(held), Some(payload)) => self.transport.send_parts(held.to, &held.head, &payload),
            _ => Ok(()), // a head kept, a withdrawal, or a payload whose peer died
        }
    }

    /// Counts a payload the driver hands to the transport.
    fn count_payload(&mut self, payload: &Bytes) {
        let len = payload.len() as u64;
        self.stats.payload_bytes_sent += len;
        if self.transport.copies_payload() {
            self.stats.payload_bytes_copied += len;
        }
    }
}

/// The machine's next frame, its head written into `buf` (grown to fit one that does
/// not: the frame stays queued until then).
fn poll_frame<P: Protocol>(
    machine: &mut P,
    now: Instant,
    buf: &mut Vec<u8>,
) -> Option<TransmitParts> {
    loop {
        match machine.poll_transmit_parts(now, buf) {
            Ok(frame) => return frame,
            // `frame_capacity` fits every frame of the library's machines; a machine
            // of the caller's may send more.
            Err(short) => buf.resize(short.needed, 0),
        }
    }
}

impl<T: Transport> Driver<RankStack, T> {
    /// Drives a [`RankStack`] over `transport` ([`Driver::new`]), its broadcast chunks
    /// sized for the transport ([`Transport::chunk_bytes`], and
    /// [`Transport::leaf_chunk_bytes`] to leaves), heads sent ahead of their payloads
    /// if the transport does so ([`Transport::sends_heads_early`]), and the transport told of
    /// every death the stack learns ([`Transport::forget_peer`]: a declaration by this
    /// rank's detector or a notice from another rank).
    pub fn for_stack(mut stack: RankStack, transport: T, origin: WallInstant) -> Self {
        tuning_of(&transport).apply(&mut stack);
        let mut driver = Driver::new(stack, transport, origin);
        driver.death_of = stack_death;
        driver
    }

    /// The same driver over [`Groups`] of this one stack (group 0), so that groups can
    /// be shrunk from it on this transport: what a [`crate::Runtime`] runs. Events not
    /// polled yet are kept, as group 0's.
    pub fn into_groups(self) -> Driver<Groups, T> {
        let tuning = tuning_of(&self.transport);
        let events = self
            .events
            .into_iter()
            .map(|(at, event)| {
                let dead = stack_death(&event);
                (
                    at,
                    GroupEvent {
                        group: 0,
                        event,
                        dead,
                    },
                )
            })
            .collect();
        Driver {
            machine: Groups::new(self.machine, tuning),
            transport: self.transport,
            origin: self.origin,
            buf: self.buf,
            ahead: self.ahead,
            events,
            stats: self.stats,
            idle_sleep: self.idle_sleep,
            idle_spin: self.idle_spin,
            last_activity: self.last_activity,
            last_tick: self.last_tick,
            spin_rounds: self.spin_rounds,
            death_of: |event| event.dead,
            held_heads: self.held_heads,
        }
    }
}

impl<T: Transport> Driver<Groups, T> {
    /// [`Driver::for_stack`], then [`Driver::into_groups`]: a [`crate::Runtime`]'s
    /// engine.
    pub fn for_groups(stack: RankStack, transport: T, origin: WallInstant) -> Self {
        Driver::for_stack(stack, transport, origin).into_groups()
    }
}

/// How `transport` wants broadcast frames ([`Driver::for_stack`]).
fn tuning_of<T: Transport>(transport: &T) -> StackTuning {
    StackTuning {
        chunk_bytes: transport.chunk_bytes(),
        leaf_chunk_bytes: transport.leaf_chunk_bytes(),
        early_heads: transport.sends_heads_early(),
    }
}

/// The rank a stack event reports dead, if it reports a death.
fn stack_death(event: &StackEvent) -> Option<Rank> {
    match *event {
        StackEvent::Node(NodeEvent::Suspected { rank })
        | StackEvent::Node(NodeEvent::Learned { rank, .. }) => Some(rank),
        _ => None,
    }
}

/// Gives `machine` one received frame; a rejected one is counted in `stats`, never
/// fatal (a free function: in [`Driver::pump`] the frame borrows the transport).
fn hand_over<P: Protocol>(
    machine: &mut P,
    stats: &mut DriverStats,
    now: Instant,
    from: Rank,
    bytes: &[u8],
) {
    if machine.handle_message(now, from, bytes).is_err() {
        stats.rejected += 1;
    }
}

/// Driven groups are an engine for [`crate::Runtime`]: the progress thread runs this
/// very loop, for every handle of the process's groups.
impl<T: Transport> Engine for Driver<Groups, T> {
    type Error = T::Error;

    fn stack(&self, group: GroupId) -> Option<&RankStack> {
        self.machine().stack(group)
    }
    fn command(
        &mut self,
        group: GroupId,
        f: &mut dyn FnMut(&mut RankStack, Instant),
    ) -> Result<(), T::Error> {
        Driver::command(self, |groups, now| {
            if let Some(stack) = groups.stack_mut(group) {
                f(stack, now);
            }
        })
    }
    fn on_groups(&mut self, f: &mut dyn FnMut(&mut Groups, Instant)) -> Result<(), T::Error> {
        Driver::command(self, |groups, now| f(groups, now))
    }
    fn remove(&mut self, group: GroupId) {
        self.machine.remove(group);
    }
    fn pump(&mut self) -> Result<bool, T::Error> {
        Driver::pump(self)
    }
    fn next_event(&mut self) -> Option<GroupEvent> {
        self.poll_event().map(|(_, event)| event)
    }
    fn driver_stats(&self) -> DriverStats {
        self.stats()
    }
    /// Until the next timer if the transport has a waker (application commands wake
    /// it); else capped at the idle sleep, so commands are noticed soon.
    fn wait_idle(&mut self) -> Result<(), T::Error> {
        let cap = match self.transport.waker() {
            Some(_) => None,
            None => Some(self.idle_sleep),
        };
        self.idle_wait(cap)
    }
    fn waker(&self) -> Option<Arc<dyn Wake>> {
        self.transport.waker()
    }
    fn linger(&mut self, span: StdDuration) -> Result<(), T::Error> {
        self.run_for(span)
    }
}
