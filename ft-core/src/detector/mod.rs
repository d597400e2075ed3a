//! The failure detector: a heartbeat ring with long edges (so that a node's block of
//! adjacent ranks is found in about one timeout, not one timeout per rank) plus a
//! reliable, logarithmic propagation of failure notices over the circulant graph.
//! Sans-IO; it shows the [`Protocol`] face.
//!
//! # What it does
//!
//! Each rank `i` keeps `K_i`, the ranks it knows to be dead (declared by itself or by a
//! notice). Over the ranks *not* in `K_i`, arranged on a ring:
//!
//! - **Heartbeats.** Every `period`, `i` sends a [`FrameKind::Heartbeat`] to its
//!   *observer*, the nearest successor not in `K_i` (and to a rank that told it "I observe
//!   you" with [`FrameKind::Observe`] while `K_i` has not caught up with that rank's).
//! - **Suspicion.** `i` watches `pred(i)`, its nearest predecessor not in `K_i`. When no
//!   heartbeat from it arrived for `timeout`, `i` declares it dead. A suspected rank is
//!   dead from then on, right or wrong (fail-stop enforcement).
//! - **Start-up.** Until a watched rank (the ring predecessor, each long-watched rank)
//!   has been heard from once, its deadline is the start-up grace,
//!   [`STARTUP_GRACE_TIMEOUTS`] timeouts after the detector's creation (two periods more
//!   on a long edge); its first heartbeat replaces that deadline with the usual one. A
//!   first heartbeat waits for the peers' start (launch skew) and for the connection
//!   its first send makes: transports such as libfabric's `tcp;ofi_rxm` connect inside
//!   the first send to a peer, and on a loaded node that alone can take longer than a
//!   timeout.
//! - **Re-targeting.** Whenever `pred(i)` changes, `i` sends the new one an
//!   [`FrameKind::Observe`] and gives it `2 · timeout` to be heard from (a round trip:
//!   the `Observe` goes out, the first heartbeat comes back).
//! - **Long edges.** Launchers place ranks on nodes in blocks, so a node failure kills a
//!   run of adjacent ranks, and the ring observer of each of them but the last dies
//!   with it. So every rank also heartbeats its *long observer*, the first rank not in
//!   `K_i` at `span` ranks ahead or farther (`span` = [`DetectorConfig::span`], capped
//!   at `n / 2`; 64 by default, the ranks per node when known), and watches the ranks
//!   whose long observer it is: those not in `K_i` whose rank plus `span` falls in
//!   `(pred(i), i]` (one rank, `i - span`, while nobody near is dead; at most `span`).
//!   Long-edge heartbeats leave every other period (half the traffic of a second
//!   ring), and a long-watched rank is declared after `timeout + 2 · period` of
//!   silence: one period for the sparser beat, and one more than the ring would wait,
//!   so a lone death, which its ring observer finds, is declared once (the notice
//!   reaches the long observer in `⌈log2 span⌉` hops).
//!   Distances count every rank, dead or not, so a death moves no other rank's long
//!   edge: only ranks that join a watcher's set (its `pred` moved back past a dead run)
//!   get an `Observe` and a fresh grace, and the ranks just before a dead run stay
//!   watched, by the ranks just after it.
//! - **Windows.** A run of more than `span` dead ranks outruns the long edges: after
//!   the first `span` are declared, the survivor `i` just after the run finds `run =
//!   back(pred(i)) - 1 ≥ span` known-dead ranks behind it. It then probes the next
//!   `3 · run` ranks not in `K_i` at once (`Observe` marked as a probe: one heartbeat
//!   back, no subscription) and gives them `2 · timeout - period`. When that ends, the
//!   probed ranks nearer than the nearest answer are declared together, as one
//!   declaration (one pair of trees). The known run so grows fourfold per window.
//! - **Propagation.** Every [`FrameKind::FailureNotice`] carries the sender's whole
//!   `K_i` (a compact rank set; failures are few) and a hop count. A declaring rank `o`
//!   starts two spanning trees of the circulant graph, one over the offsets
//!   `o + 1, o + 2, ...` and one over `o - 1, o - 2, ...`: a rank at offset `d` that
//!   covers `[d, e)` sends to its peer at `d + 2^k` (a circulant edge `i ± 2^k`) the
//!   sub-range `[d + 2^k, min(d + 2^(k+1), e))`, for every `k` with `d + 2^k < e`;
//!   the sub-range goes to its first rank not known dead (known-dead peers are skipped,
//!   never targeted). Each rank forwards once per tree, on first receipt (a second,
//!   larger range for the same tree only sends the part not yet covered). So each live
//!   rank gets each declaration twice, along two different paths, within
//!   `⌈log2 n⌉` hops, for about `2n` frames per declaration (flooding every `±2^k`
//!   edge would cost `2n⌈log2 n⌉`).
//! - **Repair.** (a) Whenever `K_i` grows, `i` sends `K_i` to `pred(i)` (the ring edge
//!   `-1`; also to a new `pred(i)`), unless a tree notice to `pred(i)` leaves in the
//!   same batch (it carries `K_i` as well). (b) When `i` learns that a tree child `c` died,
//!   `i` sends `c`'s sub-range, with its current `K_i`, to the next rank of that range
//!   not known dead.
//! - **Fail-stop.** The declaring rank also sends its notice to the suspect itself (no
//!   one else will: known-dead ranks are skipped). A rank that finds itself in a notice
//!   stops: it sends nothing more, ignores all input and reports
//!   [`DetectorEvent::DeclaredDead`]. Frames from ranks in `K_i` are rejected with
//!   [`FrameError::FromFailedRank`].
//!
//! # Why propagation is reliable
//!
//! *Eventually everyone knows everything (the ring).* By rule (a), once the network is
//! quiet, `K_i ⊆ K_{pred(i)}` for every surviving `i`. And `pred(i)` of a surviving `i`
//! is alive: otherwise `i` would still be waiting out its timeout on it. Following `pred`
//! from `i` walks backward over the ring, skipping only ranks in some `K` (dead, or
//! declared and therefore stopped), so it visits every survivor and returns to `i`: all
//! survivors end with the same `K`. That `K` holds every dead rank `x`: the first
//! survivor after `x` would otherwise have a dead `pred` it is not suspecting.
//!
//! *Quickly (the trees).* Without further deaths a tree reaches every live rank of its
//! range in at most `⌈log2 n⌉` hops (binomial depth). A forwarder `f` that dies before
//! forwarding (or a forward that was sent to an already dead `f`) strands `f`'s range:
//! - in the mirror tree, the same ranks hang under other forwarders, so one death
//!   rarely cuts both paths;
//! - `f`'s death is itself declared (≤ `timeout` + one delay after it), and `f`'s tree
//!   parent then hands `f`'s range to the next live rank in it (rule b), with everything
//!   the parent knows. A rank that *received* from a forwarder that then died needs to
//!   do nothing: it already has the news and covers its own range itself.
//! - every later notice carries the sender's whole `K`, so the declaration of the last
//!   death also carries every earlier death to everyone its trees reach.
//!
//! The only news that is lost outright is news nobody alive holds (a declaring rank that
//! died before sending anything); then the ring detects the same death again, because
//! no survivor skips a rank it does not know dead.
//!
//! So after the last death, a survivor knows every dead rank within `timeout` + one
//! delay (for a rank that died before its observer heard it once, the end of the
//! start-up grace, `STARTUP_GRACE_TIMEOUTS · timeout` after creation, + one delay) (detection by the observer, for a rank whose ring neighbours did not die with
//! it) plus `(⌈log2 n⌉ + 1)` delays (propagation and one repair hop).
//!
//! # Why a node failure takes one timeout
//!
//! Let `k` adjacent ranks `[a, a + k)` die (the last at `t`), with `d` the largest delay.
//! - *`k ≤ span`.* Each dead `x` has a live long observer: the first rank not known dead
//!   at `x + span` or beyond lies past the block. It heard `x`'s last long heartbeat by
//!   `t + d` and declares `x` by `t + d + timeout + 2 · period`; the last rank of the
//!   block is also found by its ring observer by `t + d + timeout`. Propagation and one
//!   repair hop add `⌈log2 n⌉ + 1` delays: every survivor knows the block within
//!   `timeout + 2 · period + (⌈log2 n⌉ + 2) · d`, inside the target
//!   `2 · timeout + period + (⌈log2 n⌉ + 4) · d` whenever `period ≤ timeout`.
//!   Declarations of a block run concurrently: about `k` declarations of `2n` frames
//!   each, the same total as one at a time.
//! - *`k > span`.* The first round declares the top `span` ranks as above. The survivor
//!   `s = a + k` then has `run ≥ span` and probes a window of `3 · run`: after
//!   `2 · timeout - period` (plus a propagation) it declares all of them that are dead,
//!   and the known run has grown fourfold. A block of `span · 2^j` ranks so takes
//!   `⌈j / 2⌉` windows, each `2 · timeout - period + (⌈log2 n⌉ + 2) · d`: at most one
//!   `timeout` per doubling of `k` while `(⌈log2 n⌉ + 2) · d ≤ period`, i.e. whenever a
//!   notice crosses the group faster than one heartbeat period.
//! - A window's probes go to ranks past the block too (up to `3 · run`): a one-off
//!   burst proportional to the failure, `O(k)` frames.
//!
//! These bounds hold while the ranks watching the block (the `span` ranks after it)
//! live until they declare. When one of them dies too, before declaring, its watch
//! passes to the next survivor with a re-target's round trip (`2 · timeout`), or the
//! ring reaches the rank first: such a compound failure takes up to about three
//! timeouts after its last death. (`backend-sim`'s `node_failure` test holds every run
//! of adjacent deaths whose watchers lived to its bound, over 10^4 random schedules.)
//!
//! In steady state a rank sends one and a half heartbeats per period (ring observer
//! every period, long observer every other; more only while an `Observe` from a rank
//! whose `K` differs is pending, at most two more).
//!
//! *Accuracy.* Heartbeats leave every `period` and a pair's frames arrive in order, so an
//! observer hears from a live predecessor at least every `period + (d_max - d_min)`; with
//! every delay below `timeout - period` that is under `timeout`. At start-up a live rank
//! is safe while its first heartbeat arrives within the grace: the skew between the
//! two detectors' creation, plus the phase, plus the first send's connection set-up and
//! delay, under `STARTUP_GRACE_TIMEOUTS · timeout`. Long-edge beats leave
//! every `2 · period`, so the long observer hears at least every `2 · period +
//! (d_max - d_min)`, under the long edge's `timeout + 2 · period` with a period to
//! spare. A rank descheduled for `p` (off its core, stopped) sends its next heartbeats,
//! ring and long edge both, on its first tick after: the gap grows by at most `p`, so a
//! live rank is never declared while `p + period + (d_max - d_min) < timeout`, and a
//! watcher that was descheduled itself reads the heartbeats that waited for it before
//! its timeout is checked (a driver reads its transport before its clock).
//! `backend-sim`'s `load` test holds this over 10^4 schedules with such pauses. After a re-target, or when a rank joins a long-watched
//! set, the `Observe` and the first heartbeat take two delays, under the `2 · timeout`
//! given. A probe and its answer take two delays too, under `2 · (timeout - period)`,
//! less than the window's `2 · timeout - period`; only probed ranks nearer than the
//! nearest answer are declared, and each of those was probed and stayed silent.
//!
//! # Call order
//!
//! Create with [`Detector::new`]; then, as for every [`Protocol`]: feed frames with
//! `handle_message` (or, for a layer that decoded the header already,
//! [`Detector::handle_frame`]), call `handle_timeout` once `poll_timeout` has passed,
//! and after every input drain `poll_transmit` and then `poll_event`.
//!
//! # Wire format (header epoch is 0)
//!
//! - `Heartbeat`: empty payload.
//! - `Observe`: `u8` relation: 0 ring ("send me your heartbeats"), 1 long edge (the
//!   same, for the long edge), 2 probe (one heartbeat back, nothing more).
//! - `FailureNotice`: `varint hops` (the declaring rank sends 1), `u8 tree` (0: point
//!   to point, 1: increasing-offset tree, 2: decreasing-offset tree), for a tree
//!   `varint origin, varint seq, varint end` (the declaration's rank and number, and the
//!   end of the receiver's range, in offsets from `origin`), then the sender's `K` as a
//!   rank set (never holding the sender).
//!
//! # Cost
//!
//! A rank holds a few words, its `K_i` (a [`RankSet`]), its long-watched set (one entry
//! in steady state), the send queue, and per declaration it took part in, one record
//! per tree (what it covered) and one per child it sent to (about one per tree on
//! average): a few dozen bytes per failure. Heartbeats and `Observe` frames are written
//! straight into the caller's buffer (no allocation).
//!
//! # Layout
//!
//! This module holds the detector's face (configuration, events, the [`Detector`]
//! state, its inputs and outputs); the parts named above live in submodules: `ring`
//! (`K_i`, the watched predecessor, re-targeting), `long_edges` (long observers and the
//! long-watched set), `windows` (probes past a long known-dead run) and `propagation`
//! (notices over the circulant graph, repair, the notice codec).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::{BufferTooShort, FrameError};
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::time::{Duration, Instant};
use crate::wire::{Context, FrameKind, Header, Reader};

use propagation::{Child, Spread, TreeId};
use windows::Window;

mod long_edges;
mod propagation;
mod ring;
#[cfg(test)]
mod tests;
mod windows;

/// Settings of one rank's detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Communicator id carried by every frame.
    pub comm: u32,
    /// Communicator size.
    pub n: u32,
    /// This rank.
    pub me: Rank,
    /// Heartbeat period.
    pub period: Duration,
    /// Silence after which the watched predecessor is declared dead.
    pub timeout: Duration,
    /// Delay of the first heartbeat after creation (below `period`); backends may spread
    /// ranks over the period with it, from a seeded generator.
    pub phase: Duration,
    /// The longest run of adjacent ranks whose joint death is found in one timeout: each
    /// rank also watches its `span`-th live predecessor (see the module documentation).
    /// Set it to the ranks per node, or leave [`DEFAULT_SPAN`]; `0` or `1` turns the
    /// long edge off.
    pub span: u32,
}

/// The default [`DetectorConfig::span`]: nodes of up to 64 ranks.
pub const DEFAULT_SPAN: u32 = 64;

/// What the detector reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DetectorEvent {
    /// This rank's timeout on its watched predecessor expired: `rank` is declared dead.
    Suspected {
        /// The declared rank.
        rank: Rank,
    },
    /// A notice told this rank, for the first time, that `rank` is dead.
    Learned {
        /// The dead rank.
        rank: Rank,
        /// Hops the notice travelled from the rank that declared it.
        hops: u32,
    },
    /// A notice named this rank: it has been declared dead and has stopped.
    DeclaredDead {
        /// The rank whose notice said so.
        by: Rank,
    },
}

/// How long a rank's watched predecessor and long-watched ranks have, from the
/// detector's creation, to be heard from once, in timeouts: a rank's first heartbeat
/// waits for its peers' start (launch skew) and for the connection its first send makes
/// (a transport may connect lazily, inside that send). After the first heartbeat, or a
/// re-target, the usual deadlines hold.
pub const STARTUP_GRACE_TIMEOUTS: u32 = 3;

/// One rank watched over the long edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LongWatch {
    rank: Rank,
    /// Declared dead unless heard from by then.
    deadline: Instant,
    /// The deadline is the start-up grace: the first heartbeat replaces it (a re-target
    /// grace is only ever extended).
    startup: bool,
}

/// The detector's timers; the table is indexed by this enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Next heartbeat to send.
    Heartbeat = 0,
    /// When the watched predecessor (or the probed window) is declared dead unless
    /// heard from.
    Suspect = 1,
    /// When the long-edge predecessor is declared dead unless heard from.
    LongSuspect = 2,
}

const TIMERS: usize = 3;

/// Why a rank sends an [`FrameKind::Observe`]: its one-byte payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    /// "I watch you as my ring predecessor": heartbeats every period.
    Ring = 0,
    /// "I watch you as my `span`-th predecessor": heartbeats every other period.
    Long = 1,
    /// "Are you alive?": one heartbeat back, no subscription.
    Probe = 2,
}

impl Watch {
    fn from_code(code: u8) -> Result<Watch, FrameError> {
        match code {
            0 => Ok(Watch::Ring),
            1 => Ok(Watch::Long),
            2 => Ok(Watch::Probe),
            _ => Err(FrameError::Malformed("unknown observe relation")),
        }
    }
}

/// A frame waiting in the send queue; notices are encoded when polled, with the `K_i`
/// of that moment (it only grows, so later is never worse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outgoing {
    Heartbeat(Rank),
    Observe(Rank, Watch),
    /// A notice carrying `K_i`, outside any tree.
    Direct {
        to: Rank,
        hops: u32,
    },
    /// A notice carrying `K_i` in `tree`, asking `to` to cover offsets up to `end`.
    Tree {
        to: Rank,
        tree: TreeId,
        end: u32,
        hops: u32,
    },
}

/// One rank's failure detector. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Detector {
    config: DetectorConfig,
    /// `K_i`: ranks known dead.
    dead: RankSet,
    /// The predecessor watched (nearest not in `K_i`), if any rank but us is left.
    watched: Option<Rank>,
    /// A rank that asked for our heartbeats and is not our nearest live successor yet.
    extra_observer: Option<Rank>,
    /// The long edge's length: `min(config.span, n / 2)`, or 0 when it is off.
    span: u32,
    /// The ranks watched over the long edge, each with the deadline by which it must be
    /// heard from: the ranks not in `K_i` whose long observer we are (see
    /// [`Detector::long_set`]); one in steady state, at most `span`.
    long_watched: Vec<LongWatch>,
    /// The watched predecessor has not been heard from since creation: its deadline is
    /// the start-up grace, which its first heartbeat replaces with a `timeout` (see
    /// [`STARTUP_GRACE_TIMEOUTS`]). Cleared by the first heartbeat or a re-target.
    awaiting_first: bool,
    /// The `span`-th successor not in `K_i`: it gets our heartbeats too.
    long_observer: Option<Rank>,
    /// A rank that asked for our heartbeats as its long edge and is not our
    /// `long_observer` yet.
    extra_long_observer: Option<Rank>,
    /// Predecessors probed past a long run of known-dead ranks, while unresolved.
    window: Option<Window>,
    /// When the last long-edge heartbeats left (`None`: never): the next leave on the
    /// first heartbeat tick at least one and a half periods later, so every other tick
    /// in steady state, and on the first tick after a stall.
    last_long_beat: Option<Instant>,
    timers: [Instant; TIMERS],
    now: Instant,
    stopped: bool,
    /// Declarations made by this rank so far.
    declarations: u32,
    spreads: Vec<Spread>,
    children: Vec<Child>,
    outbox: VecDeque<Outgoing>,
    events: VecDeque<DetectorEvent>,
    /// `K_i` grew during this input: it must reach `pred(i)` (rule a), unless a tree
    /// notice to `pred(i)` already carries it (see [`Detector::flush_ring_edge`]).
    ring_edge_due: Option<(Rank, u32)>,
}

impl Detector {
    /// A detector for `config.me`, started at `now`: first heartbeat at
    /// `now + config.phase`; the predecessor (and each long-watched rank) is given the
    /// start-up grace to be heard from once, then `timeout` between heartbeats.
    ///
    /// # Panics
    /// If `config.me >= config.n` or `config.period` is zero.
    pub fn new(config: DetectorConfig, now: Instant) -> Self {
        assert!(
            config.me < config.n,
            "rank {} out of range for a communicator of {}",
            config.me,
            config.n
        );
        assert!(config.period > Duration::ZERO, "heartbeat period is zero");
        let span = config.span.min(config.n / 2);
        let mut d = Detector {
            config,
            dead: RankSet::new(config.n),
            watched: None,
            extra_observer: None,
            span: if span >= 2 { span } else { 0 },
            long_watched: Vec::new(),
            awaiting_first: true,
            long_observer: None,
            extra_long_observer: None,
            window: None,
            last_long_beat: None,
            timers: [Instant::MAX; TIMERS],
            now,
            stopped: false,
            declarations: 0,
            spreads: Vec::new(),
            children: Vec::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            ring_edge_due: None,
        };
        d.watched = d.walk(config.me, 1, false);
        d.long_observer = d.long_observer_now();
        let grace = d.startup_grace();
        let deadline = now + grace + config.period.saturating_mul(2);
        d.long_watched = d
            .long_set()
            .into_iter()
            .map(|rank| LongWatch {
                rank,
                deadline,
                startup: true,
            })
            .collect();
        d.arm_long_timer();
        if d.watched.is_some() {
            d.set_timer(Timer::Heartbeat, now + config.phase);
            d.set_timer(Timer::Suspect, now + grace);
        }
        d
    }

    // ----- getters -----

    /// The settings.
    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }
    /// `K_i`: every rank this detector knows to be dead.
    pub fn known_dead(&self) -> &RankSet {
        &self.dead
    }
    /// The predecessor this rank watches.
    pub fn watched(&self) -> Option<Rank> {
        self.watched
    }
    /// The rank heartbeats go to: the nearest successor not known dead.
    pub fn observer(&self) -> Option<Rank> {
        self.walk(self.config.me, 1, true)
    }
    /// The ranks watched over the long edge: those not known dead whose long observer
    /// this rank is (one in steady state: the rank `span` behind us).
    pub fn long_watched(&self) -> impl Iterator<Item = Rank> + '_ {
        self.long_watched.iter().map(|watch| watch.rank)
    }
    /// The successor watching us over the long edge: the first not known dead at
    /// `span` ranks ahead or farther.
    pub fn long_observer(&self) -> Option<Rank> {
        self.long_observer
    }
    /// The long edge's length in use (`min(span, n / 2)`; 0 when off).
    pub fn span(&self) -> u32 {
        self.span
    }
    /// Whether this rank was declared dead and stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    /// The header context frames are checked against.
    pub fn context(&self) -> Context {
        Context {
            comm: self.config.comm,
            n: self.config.n,
        }
    }
    /// Heap bytes held (dead set, propagation records, queues).
    pub fn heap_bytes(&self) -> usize {
        self.dead.heap_bytes()
            + self.spreads.capacity() * core::mem::size_of::<Spread>()
            + self.children.capacity() * core::mem::size_of::<Child>()
            + self.outbox.capacity() * core::mem::size_of::<Outgoing>()
            + self.events.capacity() * core::mem::size_of::<DetectorEvent>()
    }

    // ----- inputs -----

    /// Feeds a frame whose header was already decoded and checked (by a layer that
    /// dispatches on [`FrameKind::family`]); `payload` is positioned after the header.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        header: &Header,
        payload: Reader<'_>,
    ) -> Result<(), FrameError> {
        self.advance(now);
        if self.stopped {
            return Ok(());
        }
        let from = header.sender;
        if self.dead.contains(from) {
            return Err(FrameError::FromFailedRank(from));
        }
        if header.epoch != 0 {
            return Err(FrameError::Malformed("detector frames carry epoch 0"));
        }
        match header.kind {
            FrameKind::Heartbeat => {
                payload.finish()?;
                if Some(from) == self.watched {
                    // Alive: whatever lies behind it is its own watch, not ours.
                    self.window = None;
                    if self.awaiting_first {
                        // Heard once: the start-up grace ends, silence counts from now.
                        self.awaiting_first = false;
                        self.set_timer(Timer::Suspect, self.now + self.config.timeout);
                    } else {
                        self.extend(Timer::Suspect, self.config.timeout);
                    }
                }
                self.heard_long(from);
                self.heard_probed(from);
                Ok(())
            }
            FrameKind::Observe => {
                let mut payload = payload;
                let watch = Watch::from_code(payload.u8()?)?;
                payload.finish()?;
                if from == self.config.me {
                    return Err(FrameError::Malformed("observe from self"));
                }
                match watch {
                    Watch::Ring if Some(from) != self.observer() => {
                        self.extra_observer = Some(from);
                    }
                    Watch::Long if Some(from) != self.long_observer => {
                        self.extra_long_observer = Some(from);
                    }
                    _ => {}
                }
                self.outbox.push_back(Outgoing::Heartbeat(from));
                Ok(())
            }
            FrameKind::FailureNotice => self.handle_notice(from, payload),
            other => Err(FrameError::UnexpectedKind(other as u8)),
        }
    }

    // ----- internals -----

    fn advance(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    fn set_timer(&mut self, timer: Timer, at: Instant) {
        self.timers[timer as usize] = at;
    }

    /// Moves `timer` to `now + after`, unless it is already later (an early heartbeat
    /// never shortens a re-target grace).
    fn extend(&mut self, timer: Timer, after: Duration) {
        let deadline = self.now + after;
        if deadline > self.timers[timer as usize] {
            self.set_timer(timer, deadline);
        }
    }

    fn stop(&mut self, by: Rank) {
        self.stopped = true;
        self.outbox.clear();
        self.timers = [Instant::MAX; TIMERS];
        self.events.push_back(DetectorEvent::DeclaredDead { by });
    }

    fn header(&self, kind: FrameKind) -> Header {
        Header {
            kind,
            comm: self.config.comm,
            epoch: 0,
            sender: self.config.me,
        }
    }

    /// Encodes `next` in place into `buf`.
    fn write(&self, next: &Outgoing, buf: &mut [u8]) -> Result<Transmit, BufferTooShort> {
        let (to, len) = match *next {
            Outgoing::Heartbeat(to) => (
                to,
                self.header(FrameKind::Heartbeat).write_into(buf).finish()?,
            ),
            Outgoing::Observe(to, watch) => (
                to,
                self.header(FrameKind::Observe)
                    .write_into(buf)
                    .put_u8(watch as u8)
                    .finish()?,
            ),
            Outgoing::Direct { to, hops } => (to, self.write_notice(hops, None, buf)?),
            Outgoing::Tree {
                to,
                tree,
                end,
                hops,
            } => (to, self.write_notice(hops, Some((tree, end)), buf)?),
        };
        Ok(Transmit { to, len })
    }
}

impl Protocol for Detector {
    type Event = DetectorEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        let (header, payload) = Header::decode(bytes, self.context(), from)?;
        self.handle_frame(now, &header, payload)
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        if self.stopped {
            return;
        }
        let now = self.now;
        let beat = self.timers[Timer::Heartbeat as usize];
        if beat <= now {
            let mut sent: [Option<Rank>; 4] = [None; 4];
            // Long edges beat every other period: their silence is judged over
            // `long_timeout`, which leaves room for the longer gap. By time, not by
            // tick count: a rank descheduled past its ticks beats its long observer on
            // the first tick after, as it beats its ring observer.
            let half = Duration::from_nanos(self.config.period.as_nanos() / 2);
            let long_beat = self
                .last_long_beat
                .is_none_or(|last| now >= last + self.config.period + half);
            if long_beat {
                self.last_long_beat = Some(now);
            }
            let long = |to: Option<Rank>| to.filter(|_| long_beat);
            let targets = [
                self.observer(),
                long(self.long_observer),
                self.extra_observer,
                long(self.extra_long_observer),
            ];
            for (i, to) in targets.into_iter().enumerate() {
                if let Some(to) = to.filter(|to| !sent[..i].contains(&Some(*to))) {
                    self.outbox.push_back(Outgoing::Heartbeat(to));
                    sent[i] = Some(to);
                }
            }
            // Keep the phase; after a long gap, resume one period from now.
            let mut next = beat + self.config.period;
            if next <= now {
                next = now + self.config.period;
            }
            self.set_timer(Timer::Heartbeat, next);
        }
        if self.timers[Timer::Suspect as usize] <= now {
            self.set_timer(Timer::Suspect, Instant::MAX);
            let suspects = self.suspects();
            self.declare(&suspects);
        }
        if self.timers[Timer::LongSuspect as usize] <= now {
            let silent: Vec<Rank> = self
                .long_watched
                .iter()
                .filter(|watch| watch.deadline <= now)
                .map(|watch| watch.rank)
                .collect();
            // Declaring them drops them from the set; re-arm for the rest either way.
            self.declare(&silent);
            self.arm_long_timer();
        }
    }

    fn poll_transmit(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        let Some(next) = self.outbox.front() else {
            return Ok(None);
        };
        // Encoded before it leaves the queue: a short buffer keeps it there.
        let transmit = self.write(next, buf)?;
        self.outbox.pop_front();
        if self.outbox.is_empty() && self.outbox.capacity() > 64 {
            // A declaring rank's burst (two trees) need not stay allocated.
            self.outbox = VecDeque::new();
        }
        Ok(Some(transmit))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let next = self.timers.iter().copied().min()?;
        (next != Instant::MAX).then_some(next)
    }

    fn poll_event(&mut self) -> Option<DetectorEvent> {
        self.events.pop_front()
    }
}
