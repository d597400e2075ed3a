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
//! delay (detection by the observer, for a rank whose ring neighbours did not die with
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
//!   `2 · timeout + period + (⌈log2 n⌉ + 4) · d` whenever `period ≤ timeout`. Declarations of a block run
//!   concurrently: about `k` declarations of `2n` frames each, the same total as one at
//!   a time.
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
//! timeouts after its last death. (In 10^4 random schedules of the simulator's tests,
//! every run of adjacent deaths whose watchers lived met its bound.)
//!
//! Steady state is unchanged in order: one and a half heartbeats per rank per period
//! (ring observer every period, long observer every other; more only while an
//! `Observe` from a rank whose `K` differs is pending, at most two more).
//!
//! *Accuracy.* Heartbeats leave every `period` and a pair's frames arrive in order, so an
//! observer hears from a live predecessor at least every `period + (d_max - d_min)`; with
//! every delay below `timeout - period` that is under `timeout`. Long-edge beats leave
//! every `2 · period`, so the long observer hears at least every `2 · period +
//! (d_max - d_min)`, under the long edge's `timeout + 2 · period` with a period to
//! spare. After a re-target, or when a rank joins a long-watched
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
//! in steady state), the send queue, and per declaration it took part in, one record per tree (what it covered) and one per child
//! it sent to (about one per tree on average): a few dozen bytes per failure. Heartbeats
//! and `Observe` frames are written straight into the caller's buffer (no allocation).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::{BufferTooShort, FrameError};
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::time::{Duration, Instant};
use crate::wire::{Context, FrameKind, Header, Reader};

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

/// The predecessors probed at once after a re-target past a long run of dead ranks:
/// every rank not known dead at backward distance `[back(watched), far]` got a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    /// Backward distance of the farthest probed rank.
    far: u32,
    /// Backward distance of the nearest probed rank that answered.
    nearest_reply: Option<u32>,
}

/// Wire code of a notice sent point to point (to the suspect, or along the ring edge).
const DIRECT: u8 = 0;
/// Wire code of a notice in the tree of increasing offsets from its origin.
const PLUS: u8 = 1;
/// Wire code of a notice in the tree of decreasing offsets from its origin.
const MINUS: u8 = 2;

/// One spanning tree of one notice: who declared, which of its declarations, which
/// direction. `seq` counts the origin's declarations from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TreeId {
    origin: Rank,
    seq: u32,
    plus: bool,
}

/// This rank's part in one tree: it has forwarded to cover offsets `[own, covered_end)`
/// (offsets from the origin, in the tree's direction); its frames carry `hops`.
#[derive(Clone, Copy, Debug)]
struct Spread {
    tree: TreeId,
    covered_end: u32,
    hops: u32,
}

/// A child this rank sent a tree notice to, for the sub-range `[start, end)`.
#[derive(Clone, Copy, Debug)]
struct Child {
    tree: TreeId,
    start: u32,
    end: u32,
    /// The rank that got it (the first live one at or past `start`), or `None` once
    /// every rank of the range is known dead.
    child: Option<Rank>,
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
    long_watched: Vec<(Rank, Instant)>,
    /// The `span`-th successor not in `K_i`: it gets our heartbeats too.
    long_observer: Option<Rank>,
    /// A rank that asked for our heartbeats as its long edge and is not our
    /// `long_observer` yet.
    extra_long_observer: Option<Rank>,
    /// Predecessors probed past a long run of known-dead ranks, while unresolved.
    window: Option<Window>,
    /// Heartbeat ticks so far; long-edge heartbeats leave on the even ones.
    beats: u64,
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

/// A decoded notice, checked against this rank's position before anything changes.
struct Notice {
    hops: u32,
    tree: Option<(TreeId, u32)>,
    set: RankSet,
}

impl Detector {
    /// A detector for `config.me`, started at `now`: first heartbeat at
    /// `now + config.phase`, and the predecessor has `timeout` to be heard from.
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
            long_observer: None,
            extra_long_observer: None,
            window: None,
            beats: 0,
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
        let deadline = now + d.long_timeout();
        d.long_watched = d.long_set().into_iter().map(|r| (r, deadline)).collect();
        d.arm_long_timer();
        if d.watched.is_some() {
            d.set_timer(Timer::Heartbeat, now + config.phase);
            d.set_timer(Timer::Suspect, now + config.timeout);
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
        self.long_watched.iter().map(|&(rank, _)| rank)
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
                    self.extend(Timer::Suspect, self.config.timeout);
                }
                let long_deadline = self.now + self.long_timeout();
                if let Some(entry) = self.long_watched.iter_mut().find(|e| e.0 == from) {
                    // Never shorten a re-target grace with an early heartbeat.
                    entry.1 = entry.1.max(long_deadline);
                    self.arm_long_timer();
                }
                let back = self.back(from);
                if let Some(w) = self.window.as_mut() {
                    if back <= w.far && w.nearest_reply.is_none_or(|b| back < b) {
                        w.nearest_reply = Some(back);
                    }
                }
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
            FrameKind::FailureNotice => {
                let notice = self.decode_notice(from, payload)?;
                if notice.set.contains(self.config.me) {
                    self.stop(from);
                    return Ok(());
                }
                let fresh: Vec<Rank> = notice.set.difference(&self.dead).collect();
                for &rank in &fresh {
                    self.events.push_back(DetectorEvent::Learned {
                        rank,
                        hops: notice.hops,
                    });
                }
                self.learn(&fresh, notice.hops.saturating_add(1));
                if let Some((tree, end)) = notice.tree {
                    self.relay(tree, end, notice.hops.saturating_add(1));
                }
                self.flush_ring_edge();
                Ok(())
            }
            other => Err(FrameError::UnexpectedKind(other as u8)),
        }
    }

    // ----- internals -----

    fn decode_notice(&self, from: Rank, mut r: Reader<'_>) -> Result<Notice, FrameError> {
        let hops = r.varint_u32()?;
        if hops == 0 {
            return Err(FrameError::Malformed("notice with zero hops"));
        }
        let tree = match r.u8()? {
            DIRECT => None,
            code @ (PLUS | MINUS) => {
                let origin = r.rank()?;
                let seq = r.varint_u32()?;
                let end = r.varint_u32()?;
                let tree = TreeId {
                    origin,
                    seq,
                    plus: code == PLUS,
                };
                let own = self.offset(self.config.me, tree);
                if own == 0 || end <= own || end > self.config.n {
                    return Err(FrameError::Malformed(
                        "tree range does not hold the receiver",
                    ));
                }
                Some((tree, end))
            }
            _ => return Err(FrameError::Malformed("unknown notice tree")),
        };
        let set = r.rankset()?;
        r.finish()?;
        if set.contains(from) {
            return Err(FrameError::Malformed("notice names its sender"));
        }
        Ok(Notice { hops, tree, set })
    }

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

    /// Silence after which a long-watched rank is declared: two periods more than the
    /// ring's. One covers the long edge's beat, every other period; the other lets the
    /// ring observer's notice of a lone death (`⌈log2 span⌉` hops away) usually arrive
    /// first, so that the death is declared once.
    fn long_timeout(&self) -> Duration {
        self.config.timeout + self.config.period.saturating_mul(2)
    }

    /// When a rank just asked for heartbeats (a re-target, a new long-watched rank) must
    /// have answered: a round trip, `2 · timeout` from now.
    fn round_trip_deadline(&self) -> Instant {
        self.now + self.config.timeout.saturating_mul(2)
    }

    /// Grace given to the window's probes: two delays (probe and answer) fit in it while
    /// delays stay below `timeout - period`, with a period to spare.
    fn window_grace(&self) -> Duration {
        self.config
            .timeout
            .saturating_mul(2)
            .saturating_sub(self.config.period)
    }

    /// How far back from us `rank` is on the ring (`1` for our ring neighbour).
    fn back(&self, rank: Rank) -> u32 {
        let n = u64::from(self.config.n);
        ((u64::from(self.config.me) + n - u64::from(rank)) % n) as u32
    }

    /// Our long observer: the first rank not in `K_i` at `span` ranks ahead or farther
    /// (distance counted over every rank, dead or not), if the long edge is on.
    fn long_observer_now(&self) -> Option<Rank> {
        if self.span == 0 {
            return None;
        }
        self.walk(self.config.me, self.span, true)
    }

    /// The ranks whose long observer we are: those not in `K_i` whose rank plus `span`
    /// falls in `(pred(i), i]`, i.e. at backward distance `[span, span + back(pred))`.
    /// Counting over every rank keeps the edges still while ranks die: a rank joins the
    /// set only when our ring predecessor moves back past a dead run, so the watchers
    /// of a block never chase one another, and the ranks just before a dead run stay
    /// watched by the ranks just after it. At most `span` ranks: the distances past
    /// `back(pred)` all land in the dead run between `pred(i)` and us.
    fn long_set(&self) -> Vec<Rank> {
        let Some(pred) = self.watched.filter(|_| self.span > 0) else {
            return Vec::new();
        };
        let n = u64::from(self.config.n);
        let me = u64::from(self.config.me);
        let span = u64::from(self.span);
        let stop = (span + u64::from(self.back(pred))).min(n);
        (span..stop)
            .map(|b| ((me + n - b) % n) as Rank)
            .filter(|&r| !self.dead.contains(r))
            .collect()
    }

    /// The LongSuspect timer at the earliest long-watched deadline.
    fn arm_long_timer(&mut self) {
        let next = self.long_watched.iter().map(|&(_, at)| at).min();
        self.set_timer(Timer::LongSuspect, next.unwrap_or(Instant::MAX));
    }

    fn stop(&mut self, by: Rank) {
        self.stopped = true;
        self.outbox.clear();
        self.timers = [Instant::MAX; TIMERS];
        self.events.push_back(DetectorEvent::DeclaredDead { by });
    }

    /// The first rank not in `K_i` and not us, starting `dist` away from `from` and
    /// walking forward (towards higher ranks) or backward, modulo `n`.
    fn walk(&self, from: Rank, dist: u32, forward: bool) -> Option<Rank> {
        let n = u64::from(self.config.n);
        let step = |r: u64, d: u64| {
            if forward {
                (r + d) % n
            } else {
                (r + n - d % n) % n
            }
        };
        let mut r = step(u64::from(from), u64::from(dist));
        for _ in 0..n {
            let rank = r as Rank;
            if rank == self.config.me {
                return None;
            }
            if !self.dead.contains(rank) {
                return Some(rank);
            }
            r = step(r, 1);
        }
        None
    }

    /// The offset of `rank` from the tree's origin, in the tree's direction.
    fn offset(&self, rank: Rank, tree: TreeId) -> u32 {
        let n = u64::from(self.config.n);
        let (r, o) = (u64::from(rank), u64::from(tree.origin));
        let off = if tree.plus { r + n - o } else { o + n - r };
        (off % n) as u32
    }

    /// The rank at `offset` from the tree's origin.
    fn at_offset(&self, tree: TreeId, offset: u32) -> Rank {
        let n = u64::from(self.config.n);
        let (o, d) = (u64::from(tree.origin), u64::from(offset) % n);
        let r = if tree.plus { o + d } else { o + n - d };
        (r % n) as Rank
    }

    /// The first rank of offsets `[start, end)` not known dead (nor us).
    fn first_live(&self, tree: TreeId, start: u32, end: u32) -> Option<Rank> {
        (start..end)
            .map(|off| self.at_offset(tree, off))
            .find(|&r| r != self.config.me && !self.dead.contains(r))
    }

    /// Declares `suspects` (not known dead, not us) dead by our own timeout, as one
    /// declaration: tell each suspect, everyone through the two trees rooted here, and
    /// our ring predecessor.
    fn declare(&mut self, suspects: &[Rank]) {
        if suspects.is_empty() {
            return;
        }
        self.declarations += 1;
        for &rank in suspects {
            self.events.push_back(DetectorEvent::Suspected { rank });
            // Our own suspicion: tell the suspect, so a live one stops (fail-stop).
            // Nobody else will: every rank skips the ranks it knows dead.
            self.outbox
                .push_back(Outgoing::Direct { to: rank, hops: 1 });
        }
        self.learn(suspects, 1);
        for plus in [true, false] {
            let tree = TreeId {
                origin: self.config.me,
                seq: self.declarations,
                plus,
            };
            self.spreads.push(Spread {
                tree,
                covered_end: self.config.n,
                hops: 1,
            });
            self.cover(tree, 0, 1, self.config.n, 1);
        }
        self.flush_ring_edge();
    }

    /// Sends `K_i` to `pred(i)` if it grew and no queued notice to `pred(i)` carries it
    /// already (every notice carries the whole `K_i` when it is polled; in the
    /// decreasing-offset tree, `pred(i)` is often our first child).
    fn flush_ring_edge(&mut self) {
        let Some((pred, hops)) = self.ring_edge_due.take() else {
            return;
        };
        let covered = self.outbox.iter().any(
            |o| matches!(o, Outgoing::Direct { to, .. } | Outgoing::Tree { to, .. } if *to == pred),
        );
        if !covered {
            self.outbox.push_back(Outgoing::Direct { to: pred, hops });
        }
    }

    /// We were asked to cover our subtree of `tree` up to offset `end`.
    fn relay(&mut self, tree: TreeId, end: u32, hops: u32) {
        let own = self.offset(self.config.me, tree);
        match self.spreads.iter_mut().find(|s| s.tree == tree) {
            None => {
                self.spreads.push(Spread {
                    tree,
                    covered_end: end,
                    hops,
                });
                self.cover(tree, own, own + 1, end, hops);
            }
            Some(spread) if end > spread.covered_end => {
                let (old, hops) = (spread.covered_end, spread.hops);
                spread.covered_end = end;
                self.cover(tree, own, old, end, hops);
            }
            Some(_) => {}
        }
    }

    /// Binomial forwarding from offset `own`: child `k` covers
    /// `[own + 2^k, min(own + 2^(k+1), end))` and gets the notice at its first rank not
    /// known dead. Only the part past `old_end` (already covered) is sent.
    fn cover(&mut self, tree: TreeId, own: u32, old_end: u32, end: u32, hops: u32) {
        let (own, old_end, end) = (u64::from(own), u64::from(old_end), u64::from(end));
        let mut step: u64 = 1;
        while own + step < end {
            let start = own + step;
            let new_stop = (own + 2 * step).min(end);
            let old_stop = (own + 2 * step).min(old_end).max(start);
            if new_stop > old_stop {
                let (start, stop) = (start as u32, new_stop as u32);
                let child = self.first_live(tree, start, stop);
                if let Some(to) = child {
                    self.outbox.push_back(Outgoing::Tree {
                        to,
                        tree,
                        end: stop,
                        hops,
                    });
                }
                match self
                    .children
                    .iter_mut()
                    .find(|c| c.tree == tree && c.start == start)
                {
                    Some(c) => {
                        c.end = stop;
                        c.child = child;
                    }
                    None => self.children.push(Child {
                        tree,
                        start,
                        end: stop,
                        child,
                    }),
                }
            }
            step *= 2;
        }
    }

    /// Adds `fresh` (not yet in `K_i`, not us) to `K_i`, then: sends `K_i` to our ring
    /// predecessor, hands the sub-range of every tree child now known dead to the next
    /// live rank of that range, and re-targets the watch.
    fn learn(&mut self, fresh: &[Rank], hops: u32) {
        if fresh.is_empty() {
            return;
        }
        for &r in fresh {
            self.dead.insert(r);
        }
        let watched = self.walk(self.config.me, 1, false);
        self.ring_edge_due = watched.map(|p| (p, hops));
        for i in 0..self.children.len() {
            let c = self.children[i];
            let Some(gone) = c.child else { continue };
            if !fresh.contains(&gone) {
                continue;
            }
            let replacement = self.first_live(c.tree, c.start, c.end);
            self.children[i].child = replacement;
            if let Some(to) = replacement {
                let hops = self
                    .spreads
                    .iter()
                    .find(|s| s.tree == c.tree)
                    .map_or(hops, |s| s.hops);
                self.outbox.push_back(Outgoing::Tree {
                    to,
                    tree: c.tree,
                    end: c.end,
                    hops,
                });
            }
        }
        self.long_observer = self.long_observer_now();
        if let Some(x) = self.extra_observer {
            if self.dead.contains(x) || Some(x) == self.observer() {
                self.extra_observer = None;
            }
        }
        if let Some(x) = self.extra_long_observer {
            if self.dead.contains(x) || Some(x) == self.long_observer {
                self.extra_long_observer = None;
            }
        }
        if watched != self.watched {
            self.watched = watched;
            match watched {
                Some(p) => self.retarget(p),
                None => {
                    self.window = None;
                    self.timers = [Instant::MAX; TIMERS];
                }
            }
        }
        // Members keep their deadlines; a new one is asked for heartbeats and gets a
        // round trip's grace.
        let grace = self.round_trip_deadline();
        let old = core::mem::take(&mut self.long_watched);
        for rank in self.long_set() {
            match old.iter().find(|e| e.0 == rank) {
                Some(&kept) => self.long_watched.push(kept),
                None => {
                    self.outbox.push_back(Outgoing::Observe(rank, Watch::Long));
                    self.long_watched.push((rank, grace));
                }
            }
        }
        self.arm_long_timer();
    }

    /// Our ring predecessor became `p` (every rank between it and us is known dead):
    /// ask it for heartbeats, and give it two delays' worth of grace. Past a run of at
    /// least `span` known-dead ranks (the long edges may have missed the rest of a
    /// block), also probe the next `3 · run` predecessors at once; when the grace ends,
    /// every probed rank nearer than the nearest answer is declared in one go.
    fn retarget(&mut self, p: Rank) {
        self.outbox.push_back(Outgoing::Observe(p, Watch::Ring));
        let back = self.back(p);
        if let Some(w) = self.window {
            if back <= w.far && w.nearest_reply.is_none_or(|b| back < b) {
                // `p` was probed and has not answered yet: the window's grace holds.
                return;
            }
            self.window = None;
            if w.nearest_reply == Some(back) {
                // `p` answered its probe: it is alive, no window behind it is ours.
                let grace = self.round_trip_deadline();
                self.set_timer(Timer::Suspect, grace);
                return;
            }
        }
        let run = back - 1;
        if self.span == 0 || run < self.span {
            let grace = self.round_trip_deadline();
            self.set_timer(Timer::Suspect, grace);
            return;
        }
        let width = run.saturating_mul(3);
        let (mut at, mut far) = (p, back);
        for _ in 1..width {
            let Some(next) = self.walk(at, 1, false) else {
                break;
            };
            self.outbox.push_back(Outgoing::Observe(next, Watch::Probe));
            far = self.back(next);
            at = next;
        }
        self.window = Some(Window {
            far,
            nearest_reply: None,
        });
        let grace = self.now + self.window_grace();
        self.set_timer(Timer::Suspect, grace);
    }

    /// The ranks the Suspect timer declares: the watched predecessor, or with a window,
    /// every rank not known dead from it back to (not including) the nearest answer.
    fn suspects(&self) -> Vec<Rank> {
        let Some(p) = self.watched else {
            return Vec::new();
        };
        let Some(w) = self.window else {
            return alloc::vec![p];
        };
        let n = u64::from(self.config.n);
        let me = u64::from(self.config.me);
        let stop = w.nearest_reply.unwrap_or(w.far + 1);
        (self.back(p)..stop)
            .map(|b| ((me + n - u64::from(b)) % n) as Rank)
            .filter(|&r| !self.dead.contains(r))
            .collect()
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

    fn write_notice(
        &self,
        hops: u32,
        tree: Option<(TreeId, u32)>,
        buf: &mut [u8],
    ) -> Result<usize, BufferTooShort> {
        let mut w = self.header(FrameKind::FailureNotice).write_into(buf);
        w.put_varint(hops.into());
        match tree {
            None => {
                w.put_u8(DIRECT);
            }
            Some((tree, end)) => {
                w.put_u8(if tree.plus { PLUS } else { MINUS })
                    .put_rank(tree.origin)
                    .put_varint(tree.seq.into())
                    .put_varint(end.into());
            }
        }
        w.put_rankset(&self.dead);
        w.finish()
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
            // `long_timeout`, which leaves room for the longer gap.
            let long_beat = self.beats % 2 == 0;
            self.beats += 1;
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
                .filter(|&&(_, at)| at <= now)
                .map(|&(rank, _)| rank)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    /// The ring alone (no long edge), as the propagation tests expect.
    fn config(n: u32, me: Rank) -> DetectorConfig {
        spanned(n, me, 0)
    }

    fn spanned(n: u32, me: Rank, span: u32) -> DetectorConfig {
        DetectorConfig {
            comm: 9,
            n,
            me,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::ZERO,
            span,
        }
    }

    fn frame(kind: FrameKind, sender: Rank) -> Header {
        Header {
            kind,
            comm: 9,
            epoch: 0,
            sender,
        }
    }

    fn heartbeat(sender: Rank) -> Vec<u8> {
        frame(FrameKind::Heartbeat, sender).start().finish()
    }

    /// The ranks `sent` frames of `kind` go to, with the observe relation (or 0).
    fn sent_to(sent: &[(Rank, Vec<u8>)], kind: FrameKind) -> Vec<(Rank, u8)> {
        sent.iter()
            .filter(|(_, f)| f[1] == kind as u8)
            .map(|(to, f)| (*to, f.get(wire::HEADER_LEN).copied().unwrap_or(0)))
            .collect()
    }

    #[test]
    fn the_long_edge_gets_heartbeats_and_is_watched() {
        let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
        assert_eq!((d.span(), d.long_observer()), (4, Some(12)));
        assert_eq!(d.long_watched().collect::<Vec<_>>(), [4]);
        d.handle_timeout(Instant::ZERO);
        let sent = drain(&mut d);
        assert_eq!(sent_to(&sent, FrameKind::Heartbeat), [(9, 0), (12, 0)]);
        // The span is capped at n / 2, and a span below 2 is no long edge.
        assert_eq!(Detector::new(spanned(6, 0, 64), Instant::ZERO).span(), 3);
        assert_eq!(Detector::new(spanned(3, 0, 64), Instant::ZERO).span(), 0);
    }

    #[test]
    fn a_silent_long_predecessor_is_declared_two_periods_after_the_ring_timeout() {
        let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
        // 7 keeps beating; 4 is silent from the start.
        for t in (0..=50).step_by(10) {
            let now = Instant::from_nanos(t * MS);
            d.handle_message(now, 7, &heartbeat(7)).unwrap();
            d.handle_timeout(now);
            drain(&mut d);
        }
        // timeout 40 + one period: the ring would have declared by now, not the long edge.
        assert_eq!(d.poll_event(), None);
        let now = Instant::from_nanos(60 * MS);
        d.handle_message(now, 7, &heartbeat(7)).unwrap();
        d.handle_timeout(now);
        drain(&mut d);
        assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 4 }));
        // 4's death moves no edge: 3 is long-watched by 7, the first rank not known
        // dead at 4 or more ahead of it.
        assert_eq!(d.long_watched().count(), 0);
        assert_eq!(d.watched(), Some(7));
        assert_eq!(d.poll_timeout(), Some(Instant::from_nanos(70 * MS)));
    }

    #[test]
    fn a_probe_gets_one_heartbeat_and_no_subscription() {
        let mut d = Detector::new(spanned(16, 8, 4), Instant::ZERO);
        let probe = frame(FrameKind::Observe, 2).start().put_u8(2).finish();
        d.handle_message(Instant::ZERO, 2, &probe).unwrap();
        assert_eq!(sent_to(&drain(&mut d), FrameKind::Heartbeat), [(2, 0)]);
        d.handle_timeout(Instant::from_nanos(10 * MS));
        assert_eq!(
            sent_to(&drain(&mut d), FrameKind::Heartbeat),
            [(9, 0), (12, 0)]
        );
        // A long-edge observe from a rank that is not our long observer subscribes it;
        // long edges beat every other period.
        let long = frame(FrameKind::Observe, 13).start().put_u8(1).finish();
        d.handle_message(Instant::from_nanos(10 * MS), 13, &long)
            .unwrap();
        drain(&mut d);
        d.handle_timeout(Instant::from_nanos(20 * MS));
        assert_eq!(sent_to(&drain(&mut d), FrameKind::Heartbeat), [(9, 0)]);
        d.handle_timeout(Instant::from_nanos(30 * MS));
        assert_eq!(
            sent_to(&drain(&mut d), FrameKind::Heartbeat),
            [(9, 0), (12, 0), (13, 0)]
        );
        for bad in [alloc::vec![], alloc::vec![3], alloc::vec![0, 0]] {
            let mut f = frame(FrameKind::Observe, 2).start();
            for b in bad {
                f.put_u8(b);
            }
            assert!(d.handle_message(Instant::ZERO, 2, &f.finish()).is_err());
        }
    }

    #[test]
    fn past_a_long_dead_run_a_window_is_probed_and_declared_at_once() {
        let mut d = Detector::new(spanned(64, 40, 4), Instant::ZERO);
        // Told that 32..=39 died (a run of 8 >= span 4): watch 31, probe 3 * 8 ranks.
        let dead: Vec<Rank> = (32..40).collect();
        d.handle_message(Instant::ZERO, 41, &notice(41, 1, &dead, 64))
            .unwrap();
        let sent = drain(&mut d);
        let observes = sent_to(&sent, FrameKind::Observe);
        assert!(observes.contains(&(31, Watch::Ring as u8)), "{observes:?}");
        let probed: Vec<Rank> = observes
            .iter()
            .filter(|o| o.1 == Watch::Probe as u8)
            .map(|o| o.0)
            .collect();
        assert_eq!(probed, (8..31).rev().collect::<Vec<_>>());
        // 20 answers (and 12, farther); 31..=21 stay silent.
        let t = Instant::from_nanos(5 * MS);
        d.handle_message(t, 12, &heartbeat(12)).unwrap();
        d.handle_message(t, 20, &heartbeat(20)).unwrap();
        while d.poll_event().is_some() {}
        // The grace is 2 * timeout - period = 70 ms.
        d.handle_timeout(Instant::from_nanos(69 * MS));
        assert_eq!(d.poll_event(), None);
        d.handle_timeout(Instant::from_nanos(70 * MS));
        let mut suspected = Vec::new();
        while let Some(e) = d.poll_event() {
            if let DetectorEvent::Suspected { rank } = e {
                suspected.push(rank);
            }
        }
        assert_eq!(suspected, (21..32).rev().collect::<Vec<_>>());
        assert_eq!(d.watched(), Some(20));
        // One declaration (two trees), and 20 answered: no second window.
        let sent = drain(&mut d);
        assert!(sent_to(&sent, FrameKind::Observe)
            .iter()
            .all(|o| o.1 != Watch::Probe as u8));
        assert_eq!(d.declarations, 1);
    }

    #[test]
    fn an_answer_from_the_watched_rank_closes_the_window() {
        let mut d = Detector::new(spanned(64, 40, 4), Instant::ZERO);
        let dead: Vec<Rank> = (34..40).collect();
        d.handle_message(Instant::ZERO, 41, &notice(41, 1, &dead, 64))
            .unwrap();
        drain(&mut d);
        assert!(d.window.is_some());
        for t in (1..75).step_by(10) {
            let now = Instant::from_nanos(t * MS);
            d.handle_message(now, 33, &heartbeat(33)).unwrap();
            d.handle_timeout(now);
        }
        assert!(d.window.is_none());
        d.handle_timeout(Instant::from_nanos(75 * MS));
        while let Some(e) = d.poll_event() {
            assert!(!matches!(e, DetectorEvent::Suspected { .. }), "{e:?}");
        }
    }

    fn drain(d: &mut Detector) -> Vec<(Rank, Vec<u8>)> {
        let mut buf = alloc::vec![0u8; wire::frame_capacity(d.config.n)];
        let mut out = Vec::new();
        while let Some(t) = d
            .poll_transmit(d.now, &mut buf)
            .expect("frame_capacity fits")
        {
            out.push((t.to, buf[..t.len].to_vec()));
        }
        out
    }

    /// A point-to-point notice.
    fn notice(sender: Rank, hops: u32, ranks: &[Rank], n: u32) -> Vec<u8> {
        Header {
            kind: FrameKind::FailureNotice,
            comm: 9,
            epoch: 0,
            sender,
        }
        .start()
        .put_varint(hops.into())
        .put_u8(DIRECT)
        .put_rankset(&RankSet::from_ranks(n, ranks.iter().copied()))
        .finish()
    }

    /// The notices in `sent`: (to, tree code, end of range, set).
    fn notices(d: &Detector, sent: &[(Rank, Vec<u8>)]) -> Vec<(Rank, u8, u32, Vec<Rank>)> {
        sent.iter()
            .filter(|(_, f)| f[1] == FrameKind::FailureNotice as u8)
            .map(|(to, f)| {
                let (_, mut r) = Header::decode(f, d.context(), d.config.me).unwrap();
                r.varint().unwrap();
                let code = r.u8().unwrap();
                let end = if code == DIRECT {
                    0
                } else {
                    r.rank().unwrap();
                    r.varint().unwrap();
                    r.varint_u32().unwrap()
                };
                (*to, code, end, r.rankset().unwrap().iter().collect())
            })
            .collect()
    }

    #[test]
    fn heartbeats_go_to_the_successor_every_period() {
        let mut d = Detector::new(config(8, 3), Instant::ZERO);
        d.handle_timeout(Instant::ZERO);
        let sent = drain(&mut d);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, 4);
        assert_eq!(sent[0].1[1], FrameKind::Heartbeat as u8);
        assert_eq!(d.poll_timeout(), Some(Instant::from_nanos(10 * MS)));
    }

    #[test]
    fn silence_declares_the_predecessor_and_starts_two_trees() {
        let mut d = Detector::new(config(8, 3), Instant::ZERO);
        d.handle_timeout(Instant::from_nanos(40 * MS));
        assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 2 }));
        assert_eq!(d.watched(), Some(1));
        let sent = drain(&mut d);
        let observe: Vec<Rank> = sent
            .iter()
            .filter(|(_, f)| f[1] == FrameKind::Observe as u8)
            .map(|(to, _)| *to)
            .collect();
        assert_eq!(observe, [1]);
        let got = notices(&d, &sent);
        // The suspect itself first.
        assert_eq!(got[0], (2, DIRECT, 0, alloc::vec![2]));
        // Increasing tree from 3: offsets 1, 2, 4 are ranks 4, 5, 7 with ranges ending
        // at 2, 4, 8. Decreasing tree: offset 1 is rank 2 (dead, its range [1, 2) is
        // empty), offset 2 is rank 1 (range [2, 4)), offset 4 is rank 7 (range [4, 8)).
        // The ring predecessor, 1, is a tree child: no separate ring-edge notice.
        let tree: Vec<(Rank, u8, u32)> =
            got[1..].iter().map(|(to, c, e, _)| (*to, *c, *e)).collect();
        assert_eq!(
            tree,
            [
                (4, PLUS, 2),
                (5, PLUS, 4),
                (7, PLUS, 8),
                (1, MINUS, 4),
                (7, MINUS, 8)
            ]
        );
    }

    #[test]
    fn frames_from_dead_ranks_are_rejected_and_self_notice_stops() {
        let mut d = Detector::new(config(8, 3), Instant::ZERO);
        let n = notice(6, 1, &[5], 8);
        d.handle_message(Instant::ZERO, 6, &n).unwrap();
        assert_eq!(
            d.poll_event(),
            Some(DetectorEvent::Learned { rank: 5, hops: 1 })
        );
        let hb = Header {
            kind: FrameKind::Heartbeat,
            comm: 9,
            epoch: 0,
            sender: 5,
        }
        .start()
        .finish();
        assert_eq!(
            d.handle_message(Instant::ZERO, 5, &hb),
            Err(FrameError::FromFailedRank(5))
        );
        d.handle_message(Instant::ZERO, 6, &notice(6, 2, &[3], 8))
            .unwrap();
        assert_eq!(d.poll_event(), Some(DetectorEvent::DeclaredDead { by: 6 }));
        assert!(d.is_stopped());
        assert_eq!(d.poll_timeout(), None);
        assert!(drain(&mut d).is_empty());
    }

    #[test]
    fn a_dead_child_s_range_goes_to_the_next_live_rank_with_everything_known() {
        let mut d = Detector::new(config(16, 0), Instant::ZERO);
        d.handle_timeout(Instant::from_nanos(40 * MS)); // declares 15
        drain(&mut d);
        // 4, child for offsets [4, 8) of the increasing tree, dies: 5 takes its range.
        d.handle_message(Instant::ZERO, 8, &notice(8, 1, &[4], 16))
            .unwrap();
        let sent = drain(&mut d);
        let got = notices(&d, &sent);
        assert!(got.contains(&(5, PLUS, 8, alloc::vec![4, 15])), "{got:?}");
    }

    #[test]
    fn a_tree_range_that_misses_the_receiver_is_malformed() {
        let mut d = Detector::new(config(16, 5), Instant::ZERO);
        let frame = |end: u32| {
            Header {
                kind: FrameKind::FailureNotice,
                comm: 9,
                epoch: 0,
                sender: 1,
            }
            .start()
            .put_varint(1)
            .put_u8(PLUS)
            .put_rank(1)
            .put_varint(1)
            .put_varint(end.into())
            .put_rankset(&RankSet::from_ranks(16, [0]))
            .finish()
        };
        // 5 is at offset 4 from origin 1: a range ending at 4 does not hold it.
        assert!(matches!(
            d.handle_message(Instant::ZERO, 1, &frame(4)),
            Err(FrameError::Malformed(_))
        ));
        assert!(d.known_dead().is_empty());
        d.handle_message(Instant::ZERO, 1, &frame(8)).unwrap();
        // 5 covers [4, 8): offsets 5 and 6 (ranks 6, 7), with ranges ending at 6 and 8.
        let sent = drain(&mut d);
        let got = notices(&d, &sent);
        let tree: Vec<(Rank, u8, u32)> = got
            .iter()
            .filter(|n| n.1 != DIRECT)
            .map(|(to, c, e, _)| (*to, *c, *e))
            .collect();
        assert_eq!(tree, [(6, PLUS, 6), (7, PLUS, 8)]);
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(frames in prop::collection::vec((0u32..8, prop::collection::vec(any::<u8>(), 0..40)), 0..20)) {
            let mut d = Detector::new(config(8, 3), Instant::ZERO);
            for (i, (from, mut bytes)) in frames.into_iter().enumerate() {
                if bytes.len() >= wire::HEADER_LEN && i % 2 == 0 {
                    bytes[0] = wire::VERSION;
                    bytes[1] = (bytes[1] % 4) + 1;
                    bytes[2..6].copy_from_slice(&9u32.to_le_bytes());
                    bytes[6..10].copy_from_slice(&0u32.to_le_bytes());
                    bytes[10..14].copy_from_slice(&from.to_le_bytes());
                }
                let _ = d.handle_message(Instant::from_nanos(i as u64 * MS), from, &bytes);
                d.handle_timeout(Instant::from_nanos(i as u64 * 7 * MS));
                drain(&mut d);
                while d.poll_event().is_some() {}
            }
        }
    }
}
