//! The discrete-event engine: a virtual clock, a network model, kills and actions,
//! driving `n` protocol machines through the common face ([`Protocol`]).
//!
//! The engine knows nothing of any protocol: it delivers bytes, fires timers when a
//! machine's `poll_timeout` comes due, runs application actions through [`SimRank`], and
//! reads only the frame header's kind byte (to count frames per kind and to kill a rank
//! at a named protocol step). It is generic over the machine `P`, so the same engine
//! drives the failure layer alone or a bigger stack.
//!
//! # What it records for the report
//!
//! - Kills: a scenario block dies as one event per rank, all at the same instant.
//! - Frames per kind: totals, and two copies of the counts, taken at the first
//!   departure and at [`RunSettings::tail_from`], so the report can tell the steady
//!   traffic before any failure from the traffic after them.
//! - Validations: started at the time of the action that called them at that rank (the
//!   engine keeps it until the validation's result arrives), finished at the result.
//! - Detections: per failed rank, when each rank learned it.
//!
//! # Network model
//!
//! A frame of `b` bytes sent at `t` arrives at `t + latency + b / bandwidth + jitter`,
//! with `jitter` uniform in `[0, jitter_max)` from the scenario's seed (splitmix64, one
//! draw per frame). Frames of different pairs may overtake each other; frames of one
//! pair never do (an arrival is pushed back behind the pair's previous one; a sender
//! remembers its last few destinations and, for the others, the latest arrival it
//! forgot, which every later frame waits for). Frames already sent when their sender
//! dies are still delivered; frames reaching a dead rank are dropped.
//!
//! # Load model
//!
//! A rank can be descheduled ([`Sim::pause`], or a scenario's `load`: random pauses of
//! every rank): while paused it handles nothing, its timers wait and it sends nothing;
//! frames that reach it wait in order. When it runs again it handles those frames
//! first, then its due timer, then the scenario actions it missed, as a driver that
//! reads its transport before its clock does. So a pause of `p` delays a rank's
//! heartbeats by at most `p`, and a watcher that was paused itself sees the heartbeats
//! that waited before it looks at its timeout.
//!
//! # Why heartbeats are cheap, and why that is faithful
//!
//! Nothing is skipped, merged or approximated: every heartbeat is a real frame, sent by
//! its machine's timer, carried by the network model (jitter, FIFO), delivered to and
//! handled by the observer's machine, exactly as a notice is. What is kept cheap is the
//! engine's bookkeeping around each of them:
//!
//! - a frame of up to [`INLINE`] bytes (every heartbeat, `Observe` and notice of a few
//!   failures) travels inline in a reused slab slot: no allocation per frame, and the
//!   machine writes it straight into the engine's one transmit buffer;
//! - bulk data (broadcast chunks) is not copied on sending: the engine drains
//!   [`Protocol::poll_transmit_parts`] and keeps the frame's head plus a shared handle
//!   on its payload (a slice of the sender's buffer) until delivery, where the two are
//!   joined into one receive buffer (the copy a network makes into the receiver's
//!   memory);
//! - a rank has at most one wake-up queued, re-armed only when its `poll_timeout`
//!   changes (a stale one is skipped when popped), so a healthy rank costs one timer
//!   event and one delivery per period;
//! - events sit in a calendar queue ([`crate::queue`]): appending to a bucket instead of
//!   sifting a heap of millions;
//! - a rank's machine and the engine's words about it (wake-up, alive flag, FIFO memory)
//!   sit side by side, so an event touches one region of memory;
//! - while an event runs, the rank (and frame) of the event a few places ahead in the
//!   queue is prefetched, so that rank's cache misses overlap this event's work;
//! - with `"phases": "staggered"` in the scenario, rank `r` beats at `r · period / n`
//!   instead of a seeded random phase: the same protocol under a different (and common)
//!   configuration, whose timer events and heartbeat deliveries then come in rank order
//!   and walk memory sequentially.
//!
//! The engine reads only the kind byte of a frame header (to count frames and to kill
//! a rank at a named step); it knows nothing else of any protocol.

use std::collections::HashMap;

use ft_core::view::FailureView;
use ft_core::wire::{self, Family, FrameKind};
use ft_core::{Bytes, Duration, FrameError, HeldHeads, Instant, Protocol, Rank};

use crate::queue::EventQueue;
use crate::scenario::{ActionKind, KillPoint, Load, Phases, Scenario, Victims};

/// Frames up to this many bytes are stored inline (no allocation).
pub const INLINE: usize = 62;

/// What the report records from one protocol event of a rank.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// The rank's own detector declared `rank` dead.
    Suspected {
        /// The declared rank.
        rank: Rank,
    },
    /// The rank learned from a notice that `rank` is dead.
    Learned {
        /// The dead rank.
        rank: Rank,
        /// Hops from the declaring rank.
        hops: u32,
    },
    /// A validation finished at the rank.
    Validated {
        /// `"local"` or `"global"`.
        kind: &'static str,
        /// When the machine saw it start, if it knows (the machine's `now` otherwise); the
        /// engine puts in the time of the action that started it.
        started: Instant,
        /// `L_i` (local) or `G` (global) it returned.
        result: Vec<Rank>,
    },
    /// A broadcast delivered the outputs this rank needed.
    Received {
        /// Broadcast number (order of the scenario's broadcast actions, from 0).
        broadcast: u32,
        /// Output names received.
        outputs: Vec<String>,
    },
}

/// Settings handed to the factory that builds each rank's machine.
#[derive(Clone, Copy, Debug)]
pub struct RankSetup {
    /// The rank.
    pub rank: Rank,
    /// Communicator size.
    pub n: u32,
    /// Communicator id (0).
    pub comm: u32,
    /// Heartbeat period.
    pub period: Duration,
    /// Detector timeout.
    pub timeout: Duration,
    /// The offset in `[0, period)` of this rank's heartbeats (seeded or staggered, per
    /// the scenario).
    pub phase: Duration,
    /// A per-rank seed derived from the scenario's.
    pub seed: u64,
    /// The detector span: the scenario's `ranks_per_node`, or the core's default.
    pub span: u32,
}

/// What the engine needs from a rank's machine beyond the protocol face.
pub trait SimRank: Protocol {
    /// The rank's failure view (its `L_i` and `G` go into the report).
    fn view(&self) -> &FailureView;
    /// Whether the machine stopped itself (it learned it was declared dead).
    fn is_stopped(&self) -> bool;
    /// Whether this kind of machine can run `action` (checked at scenario load).
    fn supports(action: &ActionKind) -> Result<(), String>;
    /// Runs an application action. `index` numbers the scenario's actions of the same
    /// kind (e.g. the broadcast number).
    fn apply(&mut self, now: Instant, action: &ActionKind, index: u32) -> Result<(), String>;
    /// Maps a protocol event to what the report records, if anything.
    fn observe(&self, now: Instant, event: &Self::Event) -> Option<Observation>;
}

/// The engine gave up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// The event budget ran out before the run reached its end time (a protocol that
    /// does not settle, e.g. a message storm).
    EventBudgetExhausted {
        /// Events processed.
        events: u64,
        /// Simulated time reached.
        at: Instant,
    },
    /// A condition awaited by [`Sim::drive_until`] did not hold by the deadline.
    NotConverged {
        /// The deadline.
        deadline: Instant,
        /// Events processed.
        events: u64,
    },
    /// An action the machines cannot run.
    Unsupported(String),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::EventBudgetExhausted { events, at } => {
                write!(f, "event budget exhausted after {events} events at {at}")
            }
            SimError::NotConverged { deadline, events } => {
                write!(f, "did not converge by {deadline} ({events} events)")
            }
            SimError::Unsupported(what) => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for SimError {}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Deliver {
        to: Rank,
        slot: u32,
    },
    Timer {
        rank: Rank,
    },
    Kill {
        rank: Rank,
    },
    Action {
        index: u32,
    },
    /// Action `index` at one rank, deferred while that rank was paused.
    ActionAt {
        index: u32,
        rank: Rank,
    },
    /// `rank` is descheduled for `micros` µs from now ([`Sim::pause`]).
    Pause {
        rank: Rank,
        micros: u32,
    },
}

#[derive(Clone, Debug)]
enum Payload {
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Box<[u8]>),
    /// A head and the shared bulk bytes that follow it (boxed: rare and large, so the
    /// slab slot stays small).
    Parts(Box<(Box<[u8]>, Bytes)>),
}

impl Payload {
    fn new(frame: &[u8]) -> Self {
        if frame.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..frame.len()].copy_from_slice(frame);
            Payload::Inline {
                len: frame.len() as u8,
                bytes,
            }
        } else {
            Payload::Heap(frame.into())
        }
    }
    fn parts(head: &[u8], payload: Option<Bytes>) -> Self {
        match payload {
            Some(data) if !data.is_empty() => Payload::Parts(Box::new((head.into(), data))),
            _ => Payload::new(head),
        }
    }
    /// The frame as one slice: joined into `scratch` if it travels in two parts.
    fn bytes<'a>(&'a self, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        match self {
            Payload::Inline { len, bytes } => &bytes[..*len as usize],
            Payload::Heap(b) => b,
            Payload::Parts(parts) => {
                scratch.clear();
                scratch.extend_from_slice(&parts.0);
                scratch.extend_from_slice(&parts.1);
                scratch
            }
        }
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    from: Rank,
    payload: Payload,
}

/// The engine's only source of randomness (jitter, random phases), seeded by the scenario.
pub use ft_core::rng::SplitMix;

#[derive(Clone, Debug)]
struct StepKill {
    family: Family,
    nth: u64,
    seen: u64,
}

/// How a rank left the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// Killed by the scenario at this time.
    Killed(Instant),
    /// Learned it was declared dead and stopped at this time.
    Stopped(Instant),
}

/// Per failed rank: when it was first suspected, when each rank learned it, max hops.
#[derive(Clone, Debug)]
pub struct DetectionLog {
    /// Earliest suspicion by any rank.
    pub first_suspected: Option<Instant>,
    /// Per rank: when it learned (by suspicion or notice), `Instant::MAX` if never.
    pub learned: Vec<Instant>,
    /// Largest hop count over all notices that taught it.
    pub max_hops: u32,
}

/// One validation a rank finished.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidationLog {
    /// `"local"` or `"global"`.
    pub kind: &'static str,
    /// Started.
    pub started: Instant,
    /// Finished.
    pub finished: Instant,
    /// The set it returned.
    pub result: Vec<Rank>,
}

/// One broadcast a rank received.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedLog {
    /// Broadcast number.
    pub broadcast: u32,
    /// Outputs received.
    pub outputs: Vec<String>,
    /// When.
    pub finished: Instant,
}

/// What the engine recorded for the report.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// Events processed.
    pub events: u64,
    /// Frames sent.
    pub messages: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Frames sent per kind code.
    pub by_kind: Vec<u64>,
    /// Frames a machine rejected (typed errors from `handle_message`).
    pub rejected: u64,
    /// Application actions a live rank refused (e.g. `validate_global` while one runs).
    pub refused_actions: u64,
    /// The first refusal: the rank and why.
    pub first_refusal: Option<(Rank, String)>,
    /// Largest network delay drawn for a frame (before FIFO push-back).
    pub max_delay: Duration,
    /// Per failed rank.
    pub detections: HashMap<Rank, DetectionLog>,
    /// Per rank, validations (sparse: only ranks that validated).
    pub validations: HashMap<Rank, Vec<ValidationLog>>,
    /// Per rank, broadcasts received.
    pub received: HashMap<Rank, Vec<ReceivedLog>>,
    /// Ranks that left the run.
    pub departures: HashMap<Rank, Departure>,
    /// The first departure's time, and the frames per kind code sent before it: the
    /// steady state of a run, before any failure.
    pub before_first_departure: Option<(Instant, Vec<u64>)>,
    /// The frames per kind code sent before [`RunSettings::tail_from`], once the run got
    /// there: with the totals, the traffic of the run's last stretch.
    pub before_tail: Option<Vec<u64>>,
    /// Per rank and validation kind (`"local"`, `"global"`): when the action that started
    /// the validation running there ran (taken when it finishes).
    validation_started: HashMap<(Rank, &'static str), Instant>,
}

/// The scenario's settings the report judges a run by, in engine units.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// Heartbeat period.
    pub period: Duration,
    /// Detector timeout.
    pub timeout: Duration,
    /// The scenario's `ranks_per_node`, if it declared one.
    pub ranks_per_node: Option<u32>,
    /// The detector span every rank runs with.
    pub span: u32,
    /// The checked kills, in file order.
    pub kills: Vec<(Victims, KillPoint)>,
    /// Start of the run's last stretch, whose traffic the report shows as the steady
    /// state after the failures: the last quarter of the run, at most 10 periods.
    pub tail_from: Instant,
}

/// The network parameters in engine units.
#[derive(Clone, Copy, Debug)]
pub struct NetModel {
    /// Fixed latency.
    pub latency: Duration,
    /// Picoseconds per byte (1000 / (GB/s)).
    pub ps_per_byte: u64,
    /// Exclusive bound of the uniform jitter.
    pub jitter: Duration,
}

impl NetModel {
    /// The model of a scenario's `network` section.
    pub fn from_scenario(s: &Scenario) -> Self {
        NetModel {
            latency: Duration::from_nanos((s.network.latency_us * 1e3).round() as u64),
            ps_per_byte: (1e3 / s.network.gbytes_per_s).round() as u64,
            jitter: Duration::from_nanos((s.network.jitter_us() * 1e3).round() as u64),
        }
    }
    /// The largest delay of a frame of `bytes` bytes.
    pub fn max_delay(&self, bytes: usize) -> Duration {
        self.latency + self.jitter + Duration::from_nanos(self.ps_per_byte * bytes as u64 / 1000)
    }

    /// One message delay for detection bounds: latency plus the jitter bound (a frame's
    /// size adds picoseconds per byte, which these bounds leave out).
    pub fn delay(&self) -> Duration {
        self.latency + self.jitter
    }
}

/// `⌈log2 n⌉` (0 for `n ≤ 1`).
pub fn ceil_log2(n: u32) -> u32 {
    32 - n.saturating_sub(1).leading_zeros()
}

/// The detector's promise for a run of `k` adjacent deaths (issue 11, item 1): every
/// survivor knows every rank of it within
/// `2·timeout + period + (⌈log2 n⌉ + 4)·delay` after the last of them died, where
/// `delay` is [`NetModel::delay`], for `k ≤ span`; a longer run may take one more
/// `timeout` per doubling past the span (`⌈log2 ⌈k / span⌉⌉` of them). The span is the
/// one the detector runs with: the scenario's, capped at `n / 2`.
pub fn detection_bound(n: u32, k: u32, settings: &RunSettings, net: &NetModel) -> Duration {
    let doublings = ceil_log2(k.div_ceil(settings.span.min(n / 2).max(1)));
    settings.timeout.saturating_mul(2 + u64::from(doublings))
        + settings.period
        + net.delay().saturating_mul(u64::from(ceil_log2(n) + 4))
}

/// When the [`detection_bound`] of a death at `death` starts counting: at the death,
/// unless the rank died before its first heartbeats can have reached its watchers
/// (within one period and one [`NetModel::delay`] of the start). Such a rank is in its
/// watchers' start-up grace (`ft_core::detector::STARTUP_GRACE_TIMEOUTS` timeouts from
/// the start), and is declared as if it had died one timeout before the grace ends.
pub fn detection_origin(death: Instant, settings: &RunSettings, net: &NetModel) -> Instant {
    let heard_by = Instant::ZERO + settings.period + net.delay();
    if death >= heard_by {
        return death;
    }
    let grace = u64::from(ft_core::detector::STARTUP_GRACE_TIMEOUTS);
    death.max(Instant::ZERO + settings.timeout.saturating_mul(grace.saturating_sub(1)))
}

/// Hints the CPU to bring every cache line of `value` closer (no effect on results).
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = (value as *const T).cast::<i8>();
        for offset in (0..std::mem::size_of::<T>()).step_by(64) {
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint:
            // it never faults and never changes memory, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

fn ms(v: f64) -> Instant {
    Instant::from_nanos((v * 1e6).round() as u64)
}

/// Recent destinations a sender remembers for per-pair FIFO.
const RECENT: usize = 4;

/// One rank in the engine.
struct RankSlot<P> {
    machine: P,
    /// The wake-up it has queued (`Instant::MAX`: none).
    wake: Instant,
    /// Frames it sent (saturating).
    sent: u32,
    alive: bool,
    /// Whether a scenario kill waits for one of its sends (then `step_kills` has it).
    step_kill: bool,
    /// Arrival times of its latest frames to a few destinations, and a floor for every
    /// other destination: the latest arrival it forgot. A new frame to a remembered
    /// destination arrives after that destination's last one; to any other, after the
    /// floor. So frames of a pair never overtake each other, with no per-pair table.
    recent: [(Rank, u64); RECENT],
    next_recent: u8,
    floor: u64,
    /// While descheduled ([`Sim::pause`]): when it runs again (ns); 0 when running.
    resume: u64,
}

impl<P> RankSlot<P> {
    fn new(machine: P) -> Self {
        RankSlot {
            machine,
            wake: Instant::MAX,
            sent: 0,
            alive: true,
            step_kill: false,
            recent: [(Rank::MAX, 0); RECENT],
            next_recent: 0,
            floor: 0,
            resume: 0,
        }
    }

    /// When it runs again, if it is descheduled at `time` (ns).
    fn paused_at(&self, time: u64) -> Option<u64> {
        (self.resume > time).then_some(self.resume)
    }

    /// The arrival time of a frame to `to` that would arrive at `arrival`, kept after
    /// every earlier frame of the pair.
    fn fifo(&mut self, to: Rank, arrival: u64, now: u64) -> u64 {
        if let Some(entry) = self.recent.iter_mut().find(|(dest, _)| *dest == to) {
            let at = arrival.max(entry.1);
            entry.1 = at;
            return at;
        }
        let at = arrival.max(self.floor);
        let slot = &mut self.recent[usize::from(self.next_recent)];
        if slot.1 > now {
            // Forgetting a frame still in flight: every later frame waits for it.
            self.floor = self.floor.max(slot.1);
        }
        *slot = (to, at);
        self.next_recent = (self.next_recent + 1) % RECENT as u8;
        at
    }
}

/// The simulator: `n` machines, a clock, a network. See the [module docs](self).
pub struct Sim<P: SimRank> {
    now: Instant,
    until: Instant,
    /// Per rank: the machine and the engine's few words about it, side by side so one
    /// event touches one region of memory.
    slots: Vec<RankSlot<P>>,
    queue: EventQueue<Ev>,
    /// Frames in flight, reused through `free_slots`.
    frames: Vec<InFlight>,
    free_slots: Vec<u32>,
    net: NetModel,
    extra_send_delay: HashMap<Rank, Duration>,
    rng: SplitMix,
    step_kills: HashMap<Rank, Vec<StepKill>>,
    actions: Vec<(ActionKind, u32)>,
    settings: RunSettings,
    buf: Vec<u8>,
    /// Where a frame sent in two parts is joined on delivery.
    rx: Vec<u8>,
    /// Heads sent ahead of their payload ([`ft_core::Promise`]), by sender: the network
    /// carries the whole frame once the payload goes, as if sent then.
    held_heads: HashMap<Rank, HeldHeads>,
    budget: u64,
    log: Log,
}

impl<P: SimRank> Sim<P> {
    /// A simulator for `scenario`, building rank `r`'s machine with `make`. Kills and
    /// actions are queued; nothing runs until a `run*`/`drive*` call.
    pub fn new(
        scenario: &Scenario,
        mut make: impl FnMut(&RankSetup) -> P,
    ) -> Result<Self, SimError> {
        let n = scenario.ranks;
        let period = Duration::from_nanos((scenario.detector.period_ms * 1e6).round() as u64);
        let timeout = Duration::from_nanos((scenario.detector.timeout_ms * 1e6).round() as u64);
        let mut rng = SplitMix::new(scenario.seed);
        let span = scenario.detector_span();
        let mut machines = Vec::with_capacity(n as usize);
        for rank in 0..n {
            let seed = rng.next_u64();
            let phase = match scenario.detector.phases {
                Phases::Random => SplitMix::new(seed).below(period.as_nanos()),
                Phases::Staggered => {
                    (u128::from(rank) * u128::from(period.as_nanos()) / u128::from(n)) as u64
                }
            };
            let phase = Duration::from_nanos(phase);
            machines.push(make(&RankSetup {
                rank,
                n,
                comm: 0,
                period,
                timeout,
                phase,
                seed,
                span,
            }));
        }
        let mut sim = Sim {
            now: Instant::ZERO,
            until: ms(scenario.until_ms),
            slots: machines.into_iter().map(RankSlot::new).collect(),
            queue: EventQueue::new(),
            frames: Vec::new(),
            free_slots: Vec::new(),
            net: NetModel::from_scenario(scenario),
            extra_send_delay: HashMap::new(),
            rng,
            step_kills: HashMap::new(),
            actions: Vec::new(),
            settings: RunSettings {
                period,
                timeout,
                ranks_per_node: scenario.ranks_per_node,
                span,
                kills: scenario.kills(),
                tail_from: {
                    let until = ms(scenario.until_ms).as_nanos();
                    Instant::from_nanos(until - until.min(period.as_nanos() * 40) / 4)
                },
            },
            buf: vec![0u8; wire::frame_capacity(n)],
            rx: Vec::new(),
            held_heads: HashMap::new(),
            budget: u64::MAX,
            log: Log {
                by_kind: vec![0; 256],
                ..Log::default()
            },
        };
        for (victims, point) in sim.settings.kills.clone() {
            match (point, victims) {
                (KillPoint::At(at), victims) => {
                    for rank in victims.ranks(n) {
                        sim.queue.push(ms(at).as_nanos(), Ev::Kill { rank });
                    }
                }
                (KillPoint::BeforeSend { family, nth }, Victims::Rank(rank)) => {
                    if let Some(slot) = sim.slots.get_mut(rank as usize) {
                        slot.step_kill = true;
                    }
                    sim.step_kills.entry(rank).or_default().push(StepKill {
                        family,
                        nth,
                        seen: 0,
                    })
                }
                (KillPoint::BeforeSend { .. }, block) => {
                    return Err(SimError::Unsupported(format!(
                        "{block}: a step kill names one rank"
                    )))
                }
            }
        }
        let mut counts: HashMap<&'static str, u32> = HashMap::new();
        for (at, kind) in scenario.action_kinds() {
            P::supports(&kind).map_err(SimError::Unsupported)?;
            let count = counts.entry(kind.name()).or_default();
            let index = sim.actions.len() as u32;
            sim.actions.push((kind, *count));
            *count += 1;
            sim.queue.push(ms(at).as_nanos(), Ev::Action { index });
        }
        if let Some(load) = &scenario.load {
            let until = load.until_ms.unwrap_or(scenario.until_ms);
            sim.pause_randomly(scenario.seed, load, ms(until));
        }
        for rank in 0..n {
            sim.reschedule(rank);
        }
        Ok(sim)
    }

    /// Queues the pauses of the load model `load` for every rank until `until`, drawn
    /// from `seed` (module docs: load model).
    fn pause_randomly(&mut self, seed: u64, load: &Load, until: Instant) {
        // Its own stream: the same seed gives the same jitter with or without load.
        let mut rng = SplitMix::new(seed ^ 0x6c6f_6164_6c6f_6164);
        let gap = ms(2.0 * load.mean_gap_ms).as_nanos().max(1);
        let longest = ms(load.pause_max_ms).as_nanos();
        for rank in 0..self.size() {
            let mut at = rng.next_u64() % gap;
            while at < until.as_nanos() {
                let span = rng.next_u64() % (longest + 1);
                self.pause(rank, Instant::from_nanos(at), Duration::from_nanos(span));
                at += span + rng.next_u64() % gap;
            }
        }
    }

    /// Caps the number of events any later `run*`/`drive*` call may process in total.
    pub fn set_event_budget(&mut self, events: u64) {
        self.budget = events;
    }

    /// Adds `extra` to the delay of every frame `rank` sends from now on (a slow or
    /// partitioned process, e.g. to provoke a false suspicion).
    pub fn delay_sends_of(&mut self, rank: Rank, extra: Duration) {
        self.extra_send_delay.insert(rank, extra);
    }

    /// Deschedules `rank` for `span` from `at` (a process off its core, stopped, or
    /// swapped out): meanwhile it handles nothing, its timers do not fire and it sends
    /// nothing. Frames that reach it wait, in their order, and when it runs again it
    /// handles them first, then its timers (a driver reads its transport before it looks
    /// at the clock), then the actions it missed. A kill still strikes it. Overlapping
    /// pauses of a rank add up to their union.
    pub fn pause(&mut self, rank: Rank, at: Instant, span: Duration) {
        let micros = u32::try_from(span.as_nanos().div_ceil(1000)).unwrap_or(u32::MAX);
        if rank < self.size() && micros > 0 {
            let at = at.max(self.now);
            self.queue.push(at.as_nanos(), Ev::Pause { rank, micros });
        }
    }

    /// Kills `rank` now.
    pub fn kill(&mut self, rank: Rank) {
        self.depart(rank, Departure::Killed(self.now));
    }

    // ----- getters -----

    /// The simulated clock.
    pub fn now(&self) -> Instant {
        self.now
    }
    /// The run's end time.
    pub fn until(&self) -> Instant {
        self.until
    }
    /// Communicator size.
    pub fn size(&self) -> u32 {
        self.slots.len() as u32
    }
    /// Rank `r`'s machine.
    pub fn machine(&self, r: Rank) -> &P {
        &self.slots[r as usize].machine
    }
    /// Rank `r`'s machine, for application commands in tests.
    pub fn machine_mut(&mut self, r: Rank) -> &mut P {
        &mut self.slots[r as usize].machine
    }
    /// Whether `r` is still running (neither killed nor stopped).
    pub fn is_alive(&self, r: Rank) -> bool {
        self.slots[r as usize].alive
    }
    /// Frames rank `r` sent so far (saturating at `u32::MAX`).
    pub fn frames_sent_by(&self, r: Rank) -> u32 {
        self.slots[r as usize].sent
    }
    /// Ranks still running.
    pub fn survivors(&self) -> impl Iterator<Item = Rank> + '_ {
        (0..self.size()).filter(|&r| self.is_alive(r))
    }
    /// What was recorded so far.
    pub fn log(&self) -> &Log {
        &self.log
    }
    /// The network model.
    pub fn net(&self) -> &NetModel {
        &self.net
    }
    /// The scenario's settings (detector, kills).
    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }
    /// This run's [`detection_bound`] for a run of `k` adjacent deaths.
    pub fn detection_bound(&self, k: u32) -> Duration {
        detection_bound(self.size(), k, &self.settings, &self.net)
    }
    /// This run's [`detection_origin`] for a death at `death`.
    pub fn detection_origin(&self, death: Instant) -> Instant {
        detection_origin(death, &self.settings, &self.net)
    }

    // ----- driving -----

    /// Runs an application action on every live rank now (as a scenario action would).
    /// (A scenario's action waits for a descheduled rank to run again; this call runs
    /// it at once everywhere.)
    pub fn act(&mut self, action: &ActionKind, index: u32) -> Result<(), SimError> {
        P::supports(action).map_err(SimError::Unsupported)?;
        for rank in 0..self.size() {
            self.act_at(rank, action, index);
        }
        Ok(())
    }

    /// Runs `action` at `rank` if it is alive.
    fn act_at(&mut self, rank: Rank, action: &ActionKind, index: u32) {
        if !self.slots[rank as usize].alive {
            return;
        }
        let now = self.now;
        // A rank that refuses (stopped meanwhile, a validation still running) is left out
        // of this action; the report counts and names the refusals.
        match self.slots[rank as usize].machine.apply(now, action, index) {
            Ok(()) => {
                if let Some(kind) = action.validation_kind() {
                    self.log.validation_started.insert((rank, kind), now);
                }
            }
            Err(why) => {
                self.log.refused_actions += 1;
                self.log
                    .first_refusal
                    .get_or_insert((rank, format!("{}: {why}", action.name())));
            }
        }
        self.settle(rank);
    }

    /// Processes one event; returns its time, or `None` when nothing is queued.
    pub fn step(&mut self) -> Option<Instant> {
        let (time, ev) = self.queue.pop()?;
        if self.log.before_tail.is_none() && time >= self.settings.tail_from.as_nanos() {
            self.log.before_tail = Some(self.log.by_kind.clone());
        }
        self.prefetch_upcoming();
        self.now = self.now.max(Instant::from_nanos(time));
        self.log.events += 1;
        match ev {
            Ev::Deliver { to, slot } => {
                if let Some(resume) = self.slots[to as usize].paused_at(time) {
                    // Waits in the rank's socket, in order, until it runs again.
                    self.queue.push(resume, Ev::Deliver { to, slot });
                    return Some(self.now);
                }
                let InFlight { from, payload } = std::mem::replace(
                    &mut self.frames[slot as usize],
                    InFlight {
                        from: 0,
                        payload: Payload::Inline {
                            len: 0,
                            bytes: [0; INLINE],
                        },
                    },
                );
                self.free_slots.push(slot);
                if self.slots[to as usize].alive {
                    let now = self.now;
                    let machine = &mut self.slots[to as usize].machine;
                    let result = match &payload {
                        // Bulk data lands where the machine asks, if it asks: the copy a
                        // network makes into the receiver's memory, made into the
                        // machine's own buffer (`Protocol::place_payload`).
                        Payload::Parts(parts) => {
                            let (head, data) = (&parts.0, &parts.1);
                            match machine.place_payload(now, from, head, data.len()) {
                                Some(slot) => match slot.fill_from(data) {
                                    Ok(filled) => {
                                        machine.handle_message_placed(now, from, head, filled)
                                    }
                                    Err(slot) => {
                                        machine.placement_lost(now, slot);
                                        Err(FrameError::Malformed("a slot of the wrong length"))
                                    }
                                },
                                None => {
                                    let mut rx = std::mem::take(&mut self.rx);
                                    let r =
                                        machine.handle_message(now, from, payload.bytes(&mut rx));
                                    self.rx = rx;
                                    r
                                }
                            }
                        }
                        _ => {
                            let mut rx = std::mem::take(&mut self.rx);
                            let r = machine.handle_message(now, from, payload.bytes(&mut rx));
                            self.rx = rx;
                            r
                        }
                    };
                    if result.is_err() {
                        self.log.rejected += 1;
                    }
                    self.settle(to);
                }
            }
            Ev::Timer { rank } => {
                let slot = &mut self.slots[rank as usize];
                if let Some(resume) = slot.paused_at(time) {
                    if slot.wake == self.now {
                        // Fires once it runs again, after the frames that waited.
                        slot.wake = Instant::from_nanos(resume + 1);
                        self.queue.push(resume + 1, Ev::Timer { rank });
                    }
                    return Some(self.now);
                }
                if self.slots[rank as usize].alive && self.slots[rank as usize].wake == self.now {
                    self.slots[rank as usize].wake = Instant::MAX;
                    let now = self.now;
                    self.slots[rank as usize].machine.handle_timeout(now);
                    self.settle(rank);
                }
            }
            Ev::Kill { rank } => {
                if self.slots[rank as usize].alive {
                    self.depart(rank, Departure::Killed(self.now));
                }
            }
            Ev::Action { index } => {
                let (kind, nth) = self.actions[index as usize].clone();
                // Support was checked when the action was queued.
                for rank in 0..self.size() {
                    match self.slots[rank as usize].paused_at(time) {
                        Some(resume) => self.queue.push(resume + 2, Ev::ActionAt { index, rank }),
                        None => self.act_at(rank, &kind, nth),
                    }
                }
            }
            Ev::ActionAt { index, rank } => {
                let (kind, nth) = self.actions[index as usize].clone();
                self.act_at(rank, &kind, nth);
            }
            Ev::Pause { rank, micros } => {
                let slot = &mut self.slots[rank as usize];
                if slot.alive {
                    slot.resume = slot.resume.max(time + u64::from(micros) * 1000);
                }
            }
        }
        Some(self.now)
    }

    /// Processes every event up to and including `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: Instant) -> Result<(), SimError> {
        self.run_inner(t, &mut |_| {})
    }

    /// Runs to the scenario's end time, calling `progress(now)` every few thousand events.
    pub fn run_to_end(&mut self, mut progress: impl FnMut(Instant)) -> Result<(), SimError> {
        let until = self.until;
        self.run_inner(until, &mut progress)
    }

    fn run_inner(&mut self, t: Instant, progress: &mut dyn FnMut(Instant)) -> Result<(), SimError> {
        while let Some(next) = self.queue.peek_time() {
            if next > t.as_nanos() {
                break;
            }
            if self.log.events >= self.budget {
                return Err(SimError::EventBudgetExhausted {
                    events: self.log.events,
                    at: self.now,
                });
            }
            self.step();
            if self.log.events & 0xffff == 0 {
                progress(self.now);
            }
        }
        self.now = self.now.max(t);
        Ok(())
    }

    /// Runs until `done(self)` holds (checked whenever the clock moves, and first now),
    /// or fails with [`SimError::NotConverged`] once the clock would pass `deadline`.
    pub fn drive_until(
        &mut self,
        deadline: Instant,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<Instant, SimError> {
        if done(self) {
            return Ok(self.now);
        }
        while let Some(next) = self.queue.peek_time() {
            if next > deadline.as_nanos() {
                break;
            }
            if next > self.now.as_nanos() && done(self) {
                return Ok(self.now);
            }
            if self.log.events >= self.budget {
                return Err(SimError::EventBudgetExhausted {
                    events: self.log.events,
                    at: self.now,
                });
            }
            self.step();
        }
        if done(self) {
            return Ok(self.now);
        }
        Err(SimError::NotConverged {
            deadline,
            events: self.log.events,
        })
    }

    // ----- internals -----

    /// Asks the CPU to load the rank of an event a few places ahead: in a big run every
    /// event touches a different rank's memory, and this overlaps that cache miss with
    /// the current event's work.
    fn prefetch_upcoming(&self) {
        const AHEAD: usize = 4;
        let rank = match self.queue.upcoming(AHEAD) {
            Some(Ev::Deliver { to, slot }) => {
                if let Some(frame) = self.frames.get(*slot as usize) {
                    prefetch(frame);
                }
                *to
            }
            Some(Ev::Timer { rank }) => *rank,
            _ => return,
        };
        if let Some(slot) = self.slots.get(rank as usize) {
            prefetch(slot);
        }
    }

    fn depart(&mut self, rank: Rank, how: Departure) {
        if !self.slots[rank as usize].alive {
            return;
        }
        self.slots[rank as usize].alive = false;
        self.slots[rank as usize].wake = Instant::MAX;
        if self.log.departures.is_empty() {
            self.log.before_first_departure = Some((self.now, self.log.by_kind.clone()));
        }
        self.log.departures.insert(rank, how);
    }

    /// After any input to `rank`: send its frames, record its events, re-arm its timer.
    fn settle(&mut self, rank: Rank) {
        let now = self.now;
        let mut buf = std::mem::take(&mut self.buf);
        while self.slots[rank as usize].alive {
            let t = match self.slots[rank as usize]
                .machine
                .poll_transmit_parts(now, &mut buf)
            {
                Ok(Some(t)) => t,
                Ok(None) => break,
                // The frame stays queued: retry with a buffer that fits it.
                Err(short) => {
                    buf.resize(short.needed, 0);
                    continue;
                }
            };
            let held;
            let (to, head) = match t.promise {
                None => (t.to, &buf[..t.head]),
                Some(promise) => {
                    let kept = self.held_heads.entry(rank).or_default();
                    let Some(whole) = kept.step(t.to, &buf[..t.head], promise) else {
                        continue;
                    };
                    held = whole;
                    (held.to, &held.head[..])
                }
            };
            if self.dies_before_sending(rank, head) {
                self.depart(rank, Departure::Killed(now));
                break;
            }
            let len = head.len() + t.payload.as_ref().map_or(0, Bytes::len);
            self.send(rank, to, len, Payload::parts(head, t.payload));
        }
        self.buf = buf;
        while let Some(event) = self.slots[rank as usize].machine.poll_event() {
            if let Some(obs) = self.slots[rank as usize].machine.observe(now, &event) {
                self.record(rank, obs);
            }
        }
        if self.slots[rank as usize].alive && self.slots[rank as usize].machine.is_stopped() {
            self.depart(rank, Departure::Stopped(now));
        }
        self.reschedule(rank);
    }

    fn dies_before_sending(&mut self, rank: Rank, frame: &[u8]) -> bool {
        if !self.slots[rank as usize].step_kill {
            return false;
        }
        let Some(kills) = self.step_kills.get_mut(&rank) else {
            return false;
        };
        let family = frame
            .get(1)
            .and_then(|&code| FrameKind::from_code(code).ok())
            .map(FrameKind::family);
        let Some(family) = family else {
            return false;
        };
        let mut dies = false;
        for k in kills.iter_mut().filter(|k| k.family == family) {
            k.seen += 1;
            dies |= k.seen == k.nth;
        }
        dies
    }

    fn reschedule(&mut self, rank: Rank) {
        if !self.slots[rank as usize].alive {
            return;
        }
        let Some(at) = self.slots[rank as usize].machine.poll_timeout() else {
            self.slots[rank as usize].wake = Instant::MAX;
            return;
        };
        let at = at.max(self.now);
        if self.slots[rank as usize].wake != at {
            self.slots[rank as usize].wake = at;
            self.queue.push(at.as_nanos(), Ev::Timer { rank });
        }
    }

    /// Sends the frame `payload` (`len` bytes, its kind byte at 1 of its head).
    fn send(&mut self, from: Rank, to: Rank, len: usize, payload: Payload) {
        self.log.messages += 1;
        self.slots[from as usize].sent = self.slots[from as usize].sent.saturating_add(1);
        self.log.bytes += len as u64;
        let kind = match &payload {
            Payload::Inline { len, bytes } => (*len > 1).then_some(bytes[1]),
            Payload::Heap(b) => b.get(1).copied(),
            Payload::Parts(parts) => parts.0.get(1).copied(),
        };
        if let Some(kind) = kind {
            self.log.by_kind[kind as usize] += 1;
        }
        if to as usize >= self.slots.len() {
            return;
        }
        let mut delay = self.net.latency
            + Duration::from_nanos(self.net.ps_per_byte * len as u64 / 1000)
            + Duration::from_nanos(self.rng.below(self.net.jitter.as_nanos()));
        self.log.max_delay = self.log.max_delay.max(delay);
        if let Some(&extra) = (!self.extra_send_delay.is_empty())
            .then(|| self.extra_send_delay.get(&from))
            .flatten()
        {
            delay = delay + extra;
        }
        let mut arrival = (self.now + delay).as_nanos();
        arrival = self.slots[from as usize].fifo(to, arrival, self.now.as_nanos());
        let inflight = InFlight { from, payload };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.frames[s as usize] = inflight;
                s
            }
            None => {
                self.frames.push(inflight);
                (self.frames.len() - 1) as u32
            }
        };
        self.queue.push(arrival, Ev::Deliver { to, slot });
    }

    fn record(&mut self, rank: Rank, obs: Observation) {
        let n = self.slots.len();
        let now = self.now;
        let learn = |log: &mut Log, dead: Rank, hops: u32, suspected: bool| {
            let entry = log.detections.entry(dead).or_insert_with(|| DetectionLog {
                first_suspected: None,
                learned: vec![Instant::MAX; n],
                max_hops: 0,
            });
            if suspected && entry.first_suspected.is_none() {
                entry.first_suspected = Some(now);
            }
            let slot = &mut entry.learned[rank as usize];
            if *slot == Instant::MAX {
                *slot = now;
            }
            entry.max_hops = entry.max_hops.max(hops);
        };
        match obs {
            Observation::Suspected { rank: dead } => learn(&mut self.log, dead, 0, true),
            Observation::Learned { rank: dead, hops } => learn(&mut self.log, dead, hops, false),
            Observation::Validated {
                kind,
                started,
                result,
            } => {
                // The action that started it, if the engine ran one (a test may call
                // the machine directly).
                let started = self
                    .log
                    .validation_started
                    .remove(&(rank, kind))
                    .unwrap_or(started);
                self.log
                    .validations
                    .entry(rank)
                    .or_default()
                    .push(ValidationLog {
                        kind,
                        started,
                        finished: now,
                        result,
                    })
            }
            Observation::Received { broadcast, outputs } => self
                .log
                .received
                .entry(rank)
                .or_default()
                .push(ReceivedLog {
                    broadcast,
                    outputs,
                    finished: now,
                }),
        }
    }
}
