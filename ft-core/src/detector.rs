//! The failure detector: a heartbeat ring plus a reliable, logarithmic propagation of
//! failure notices over the circulant graph. Sans-IO; it shows the [`Protocol`] face.
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
//! it) plus `(⌈log2 n⌉ + 1)` delays (propagation and one repair hop). A run of `k`
//! ring-adjacent ranks dying together is detected one rank at a time, each re-target
//! adding up to `2 · timeout`.
//!
//! *Accuracy.* Heartbeats leave every `period` and a pair's frames arrive in order, so an
//! observer hears from a live predecessor at least every `period + (d_max - d_min)`; with
//! every delay below `timeout - period` that is under `timeout`. After a re-target, the
//! `Observe` and the first heartbeat take two delays, under the `2 · timeout` given.
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
//! - `Heartbeat`, `Observe`: empty payload.
//! - `FailureNotice`: `varint hops` (the declaring rank sends 1), `u8 tree` (0: point
//!   to point, 1: increasing-offset tree, 2: decreasing-offset tree), for a tree
//!   `varint origin, varint seq, varint end` (the declaration's rank and number, and the
//!   end of the receiver's range, in offsets from `origin`), then the sender's `K` as a
//!   rank set (never holding the sender).
//!
//! # Cost
//!
//! A rank holds a few words, its `K_i` (a [`RankSet`]), the send queue, and per
//! declaration it took part in, one record per tree (what it covered) and one per child
//! it sent to (about one per tree on average): a few dozen bytes per failure. Heartbeats
//! and `Observe` frames are written straight into the caller's buffer (no allocation).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::FrameError;
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::time::{Duration, Instant};
use crate::wire::{self, Context, FrameKind, Header, Reader};

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
    /// When the watched predecessor is declared dead unless heard from.
    Suspect = 1,
}

const TIMERS: usize = 2;

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
    Observe(Rank),
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
        let mut d = Detector {
            config,
            dead: RankSet::new(config.n),
            watched: None,
            extra_observer: None,
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
                    let deadline = self.now + self.config.timeout;
                    // Never shorten a re-target grace with an early heartbeat.
                    if deadline > self.timers[Timer::Suspect as usize] {
                        self.set_timer(Timer::Suspect, deadline);
                    }
                }
                Ok(())
            }
            FrameKind::Observe => {
                payload.finish()?;
                if from == self.config.me {
                    return Err(FrameError::Malformed("observe from self"));
                }
                if Some(from) != self.observer() {
                    self.extra_observer = Some(from);
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

    /// Declares `rank` dead by our own timeout: tell the suspect, everyone through the
    /// two trees rooted here, and our ring predecessor.
    fn declare(&mut self, rank: Rank) {
        self.events.push_back(DetectorEvent::Suspected { rank });
        self.declarations += 1;
        // Our own suspicion: tell the suspect, so a live one stops (fail-stop). Nobody
        // else will: every rank skips the ranks it knows dead.
        self.outbox
            .push_back(Outgoing::Direct { to: rank, hops: 1 });
        self.learn(&[rank], 1);
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
        if let Some(x) = self.extra_observer {
            if self.dead.contains(x) || Some(x) == self.observer() {
                self.extra_observer = None;
            }
        }
        if watched != self.watched {
            self.watched = watched;
            match watched {
                Some(p) => {
                    self.outbox.push_back(Outgoing::Observe(p));
                    let grace = self.now + self.config.timeout.saturating_mul(2);
                    self.set_timer(Timer::Suspect, grace);
                }
                None => {
                    self.set_timer(Timer::Suspect, Instant::MAX);
                    self.set_timer(Timer::Heartbeat, Instant::MAX);
                }
            }
        }
    }

    fn header(&self, kind: FrameKind) -> Header {
        Header {
            kind,
            comm: self.config.comm,
            epoch: 0,
            sender: self.config.me,
        }
    }

    /// Writes a payload-less frame straight into `buf` (the header layout of [`wire`]).
    fn write_bare(&self, kind: FrameKind, buf: &mut [u8]) -> usize {
        let mut head = [0u8; wire::HEADER_LEN];
        head[0] = wire::VERSION;
        head[1] = kind as u8;
        head[2..6].copy_from_slice(&self.config.comm.to_le_bytes());
        head[6..10].copy_from_slice(&0u32.to_le_bytes());
        head[10..14].copy_from_slice(&self.config.me.to_le_bytes());
        wire::copy_out(&head, buf)
    }

    fn write_notice(&self, hops: u32, tree: Option<(TreeId, u32)>, buf: &mut [u8]) -> usize {
        let mut w = self.header(FrameKind::FailureNotice).start();
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
        wire::copy_out(&w.finish(), buf)
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
            if let Some(to) = self.observer() {
                self.outbox.push_back(Outgoing::Heartbeat(to));
            }
            if let Some(x) = self.extra_observer {
                self.outbox.push_back(Outgoing::Heartbeat(x));
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
            if let Some(p) = self.watched {
                self.declare(p);
            }
        }
    }

    fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let next = self.outbox.pop_front()?;
        let transmit = match next {
            Outgoing::Heartbeat(to) => Transmit {
                to,
                len: self.write_bare(FrameKind::Heartbeat, buf),
            },
            Outgoing::Observe(to) => Transmit {
                to,
                len: self.write_bare(FrameKind::Observe, buf),
            },
            Outgoing::Direct { to, hops } => Transmit {
                to,
                len: self.write_notice(hops, None, buf),
            },
            Outgoing::Tree {
                to,
                tree,
                end,
                hops,
            } => Transmit {
                to,
                len: self.write_notice(hops, Some((tree, end)), buf),
            },
        };
        if self.outbox.is_empty() && self.outbox.capacity() > 64 {
            // A declaring rank's burst (two trees) need not stay allocated.
            self.outbox = VecDeque::new();
        }
        Some(transmit)
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
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn config(n: u32, me: Rank) -> DetectorConfig {
        DetectorConfig {
            comm: 9,
            n,
            me,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::ZERO,
            span: DEFAULT_SPAN,
        }
    }

    fn drain(d: &mut Detector) -> Vec<(Rank, Vec<u8>)> {
        let mut buf = alloc::vec![0u8; wire::frame_capacity(d.config.n)];
        let mut out = Vec::new();
        while let Some(t) = d.poll_transmit(d.now, &mut buf) {
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
