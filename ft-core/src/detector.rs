//! The failure detector: a heartbeat ring plus a reliable, logarithmic propagation of
//! failure notices over a circulant graph. Sans-IO; it shows the [`Protocol`] face.
//!
//! # What it does
//!
//! Each rank `i` keeps `K_i`, the ranks it knows to be dead (declared by itself or by a
//! notice). Over the ranks *not* in `K_i`, arranged on a ring:
//!
//! - **Heartbeats.** Every `period`, `i` sends a [`FrameKind::Heartbeat`] to its
//!   *observer*, the nearest successor not in `K_i` (and to a rank that told it "I observe
//!   you" with [`FrameKind::Observe`] while `K_i` has not caught up with that rank's).
//! - **Suspicion.** `i` watches its nearest predecessor not in `K_i`. When no heartbeat
//!   from it arrived for `timeout`, `i` declares it dead: it adds it to `K_i` and floods a
//!   notice. A suspected rank is dead from then on, right or wrong (fail-stop enforcement).
//! - **Re-targeting.** Whenever its nearest live predecessor changes, `i` sends the new
//!   one an [`FrameKind::Observe`] and gives it `2 · timeout` to be heard from (a round
//!   trip: the `Observe` goes out, the first heartbeat comes back).
//! - **Propagation.** A [`FrameKind::FailureNotice`] carries a hop count and a rank set.
//!   The *neighbours* of `i` under `K_i` are, for every `k` with `2^k < n` and both signs,
//!   the first rank not in `K_i` at or past `i ± 2^k (mod n)`, walking away from `i` in
//!   that direction (so known-dead peers are skipped, never targeted). When `K_i` grows
//!   by `Δ` (a suspicion, or the first receipt of ranks in a notice), `i` sends `Δ` once
//!   to every neighbour it already had (but not back to the sender it got `Δ` from), and
//!   the whole of `K_i` to every neighbour that is new because `K_i` grew. Nothing else is
//!   ever re-sent.
//! - **Fail-stop.** The suspecting rank also sends its notice to the suspect itself (no
//!   one else will: known-dead ranks are skipped). A rank that finds itself in a notice
//!   stops: it sends nothing more,
//!   ignores all input and reports [`DetectorEvent::DeclaredDead`]. Frames from ranks in
//!   `K_i` are rejected with [`FrameError::FromFailedRank`].
//!
//! # Why propagation is reliable
//!
//! *Invariant.* For every rank `i` and every current neighbour `j` of `i` under `K_i`,
//! every member of `K_i` has been sent to `j` by `i`, or `j` sent it to `i`. It holds at the
//! start (`K_i = ∅`), and both rules above keep it: old neighbours get the delta, new ones
//! the whole set.
//!
//! *Ring closure.* The `-2^0` neighbour of `i` is `pred_K(i)`, its nearest predecessor not
//! in `K_i`: the very rank `i` watches. Once the network is quiet (every sent frame
//! delivered, no timer of a live rank about to fire), `pred_K(i)` of a surviving `i` is
//! alive: otherwise `i` would still be waiting out its timeout on it. So for survivors,
//! `K_i ⊆ K_{pred_K(i)}` by the invariant, and following `pred_K` from `i` walks backward
//! over the ring, skipping only ranks in some `K` (dead, or declared dead and therefore
//! stopped), so it visits every survivor and comes back to `i`: all survivors end with the
//! same `K`. That `K` holds every dead rank `x`: the first survivor after `x` on the ring
//! would otherwise have a dead `pred_K` it is not suspecting.
//!
//! *Why a death of a forwarder cannot lose news.* If `j`, to whom `i` forwarded, dies
//! before forwarding, `i` learns of `j`'s death and `j`'s replacement in that position
//! becomes a new neighbour of `i`, which gets all of `K_i`, including what was stranded at
//! `j`. If `i` received news from a `j` that then died, nothing is needed: `i` floods on
//! first receipt itself, so `j`'s unfinished sends are covered by every other receiver's
//! flood. The only news that can be lost outright is news held by nobody alive (a
//! detector that died before sending anything); then the ring detects the same death
//! again, one timeout later, because no survivor skips a rank it does not know dead.
//!
//! *Why it is fast.* Without further deaths a notice floods the circulant graph along
//! shortest paths: a rank at ring distance `d` from the origin is reached in at most
//! `popcount(d) ≤ ⌈log2 n⌉` hops (fewer with both signs). A death during propagation
//! removes one relay; the flood reaches everyone over the `2⌈log2 n⌉ - 1` other edges, so
//! the notice still arrives within about `⌈log2 n⌉ + 1` hops, and the new death's notice,
//! which also carries everything stranded, follows the same bound after its detection.
//! So after the last death, every survivor knows every dead rank within
//! `timeout + max latency` (detection by the observer, for a rank whose ring neighbours
//! did not die with it) plus `(⌈log2 n⌉ + 1) · max latency` (propagation). A run of `k`
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
//! - `FailureNotice`: `varint hops` (hops travelled, the detecting rank sends 1), then a
//!   rank set (never holding its sender).
//!
//! # Cost
//!
//! A rank holds a few words, its `K_i` (a [`RankSet`]) and its queue of frames to send.
//! Heartbeats and `Observe` frames are written straight into the caller's buffer (no
//! allocation); a notice is encoded once per batch however many neighbours it goes to.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::FrameError;
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::time::{Duration, Instant};
use crate::wire::{self, Context, FrameKind, Header, Reader};

/// Most neighbours a rank has: two per power of two below `n ≤ 2^32`.
const MAX_NEIGHBOURS: usize = 64;

type Neighbours = heapless::Vec<Rank, MAX_NEIGHBOURS>;

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
}

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

/// A frame waiting in the send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outgoing {
    Heartbeat(Rank),
    Observe(Rank),
    /// The encoded notice `frames[index]` to `to`.
    Notice { to: Rank, index: u32 },
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
    outbox: VecDeque<Outgoing>,
    /// Encoded notices referenced by `outbox`; emptied when the outbox drains.
    frames: Vec<Vec<u8>>,
    events: VecDeque<DetectorEvent>,
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
            outbox: VecDeque::new(),
            frames: Vec::new(),
            events: VecDeque::new(),
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
    /// The propagation neighbours under the current `K_i`, sorted.
    pub fn neighbours(&self) -> impl Iterator<Item = Rank> {
        self.neighbour_set().into_iter()
    }
    /// The header context frames are checked against.
    pub fn context(&self) -> Context {
        Context {
            comm: self.config.comm,
            n: self.config.n,
        }
    }

    // ----- inputs -----

    /// Feeds a frame whose header was already decoded and checked (by a layer that
    /// dispatches on [`FrameKind::family`]); `payload` is positioned after the header.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        header: &Header,
        mut payload: Reader<'_>,
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
                let hops = payload.varint_u32()?;
                let set = payload.rankset()?;
                payload.finish()?;
                if hops == 0 {
                    return Err(FrameError::Malformed("notice with zero hops"));
                }
                if set.contains(from) {
                    return Err(FrameError::Malformed("notice names its sender"));
                }
                if set.contains(self.config.me) {
                    self.stop(from);
                    return Ok(());
                }
                let fresh: Vec<Rank> = set.difference(&self.dead).collect();
                for &rank in &fresh {
                    self.events
                        .push_back(DetectorEvent::Learned { rank, hops });
                }
                self.declare(&fresh, hops.saturating_add(1), Some(from));
                Ok(())
            }
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

    fn stop(&mut self, by: Rank) {
        self.stopped = true;
        self.outbox.clear();
        self.frames.clear();
        self.timers = [Instant::MAX; TIMERS];
        self.events.push_back(DetectorEvent::DeclaredDead { by });
    }

    /// The first rank not in `K_i` and not us, starting `dist` away from `from` and
    /// walking forward (towards higher ranks) or backward, modulo `n`.
    fn walk(&self, from: Rank, dist: u32, forward: bool) -> Option<Rank> {
        let n = u64::from(self.config.n);
        let step = |r: u64, d: u64| if forward { (r + d) % n } else { (r + n - d % n) % n };
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

    fn neighbour_set(&self) -> Neighbours {
        let mut out = Neighbours::new();
        let n = self.config.n;
        let mut dist: u32 = 1;
        while dist < n {
            for forward in [true, false] {
                if let Some(r) = self.walk(self.config.me, dist, forward) {
                    // Capacity is 2·32 ≥ 2·⌈log2 n⌉: the push cannot fail.
                    let _ = out.push(r);
                }
            }
            dist = match dist.checked_mul(2) {
                Some(d) => d,
                None => break,
            };
        }
        out.sort_unstable();
        let mut kept = 0;
        for i in 0..out.len() {
            if i == 0 || out[i] != out[kept - 1] {
                out[kept] = out[i];
                kept += 1;
            }
        }
        out.truncate(kept);
        out
    }

    /// Adds `fresh` (not yet in `K_i`, not us) to `K_i`, sends it on per the propagation
    /// rule with hop count `hops`, and re-targets the watch.
    fn declare(&mut self, fresh: &[Rank], hops: u32, from: Option<Rank>) {
        if fresh.is_empty() {
            return;
        }
        let before = self.neighbour_set();
        // Neighbours change only when one of them dies: a walk ends at the first rank
        // not in K, and it stays the first unless it joins K.
        let changed = fresh.iter().any(|r| before.binary_search(r).is_ok());
        for &r in fresh {
            self.dead.insert(r);
        }
        let after = if changed {
            self.neighbour_set()
        } else {
            before.clone()
        };
        let delta = RankSet::from_ranks(self.config.n, fresh.iter().copied());
        let delta_index = self.push_frame(hops, &delta);
        if from.is_none() {
            // Our own suspicion: tell the suspect too, so a live one stops (fail-stop).
            // Nobody else will: every rank skips the ranks it knows dead.
            for &to in fresh {
                self.outbox.push_back(Outgoing::Notice {
                    to,
                    index: delta_index,
                });
            }
        }
        let mut full_index = None;
        for &to in after.iter() {
            if before.binary_search(&to).is_ok() {
                if Some(to) != from {
                    self.outbox.push_back(Outgoing::Notice {
                        to,
                        index: delta_index,
                    });
                }
            } else {
                let index = match full_index {
                    Some(i) => i,
                    None => {
                        let dead = self.dead.clone();
                        let i = self.push_frame(hops, &dead);
                        full_index = Some(i);
                        i
                    }
                };
                self.outbox.push_back(Outgoing::Notice { to, index });
            }
        }
        if let Some(x) = self.extra_observer {
            if self.dead.contains(x) || Some(x) == self.observer() {
                self.extra_observer = None;
            }
        }
        let watched = self.walk(self.config.me, 1, false);
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

    fn push_frame(&mut self, hops: u32, set: &RankSet) -> u32 {
        let frame = self
            .header(FrameKind::FailureNotice)
            .start()
            .put_varint(hops.into())
            .put_rankset(set)
            .finish();
        self.frames.push(frame);
        (self.frames.len() - 1) as u32
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
                self.events.push_back(DetectorEvent::Suspected { rank: p });
                self.declare(&[p], 1, None);
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
            Outgoing::Notice { to, index } => Transmit {
                to,
                len: wire::copy_out(&self.frames[index as usize], buf),
            },
        };
        if self.outbox.is_empty() {
            self.frames.clear();
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

    fn notice(sender: Rank, hops: u32, ranks: &[Rank], n: u32) -> Vec<u8> {
        Header {
            kind: FrameKind::FailureNotice,
            comm: 9,
            epoch: 0,
            sender,
        }
        .start()
        .put_varint(hops.into())
        .put_rankset(&RankSet::from_ranks(n, ranks.iter().copied()))
        .finish()
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
    fn silence_declares_the_predecessor_and_floods() {
        let mut d = Detector::new(config(8, 3), Instant::ZERO);
        d.handle_timeout(Instant::from_nanos(40 * MS));
        assert_eq!(d.poll_event(), Some(DetectorEvent::Suspected { rank: 2 }));
        assert_eq!(d.watched(), Some(1));
        let sent = drain(&mut d);
        let observe: Vec<_> = sent
            .iter()
            .filter(|(_, f)| f[1] == FrameKind::Observe as u8)
            .collect();
        assert_eq!(observe.len(), 1);
        assert_eq!(observe[0].0, 1);
        let notified: Vec<Rank> = sent
            .iter()
            .filter(|(_, f)| f[1] == FrameKind::FailureNotice as u8)
            .map(|(to, _)| *to)
            .collect();
        // First the suspect itself (so it stops if alive), then the neighbours of 3 in 8
        // ranks at ±1, ±2, ±4, where the -1 walk skips 2 (now dead) to 1.
        assert_eq!(notified, [2, 1, 4, 5, 7]);
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
    fn a_replaced_neighbour_gets_the_whole_known_set() {
        let mut d = Detector::new(config(16, 0), Instant::ZERO);
        d.handle_message(Instant::ZERO, 8, &notice(8, 1, &[5], 16))
            .unwrap();
        drain(&mut d);
        // 4 dies: the +4 walk now ends at 6, a new neighbour that must hear of 5 too.
        d.handle_message(Instant::ZERO, 8, &notice(8, 1, &[4], 16))
            .unwrap();
        let sent = drain(&mut d);
        let to6 = sent.iter().find(|(to, _)| *to == 6).unwrap();
        let (_, mut r) = Header::decode(&to6.1, d.context(), 0).unwrap();
        assert_eq!(r.varint().unwrap(), 2);
        assert_eq!(r.rankset().unwrap(), RankSet::from_ranks(16, [4, 5]));
        assert!(sent.iter().all(|(to, _)| *to != 8));
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
