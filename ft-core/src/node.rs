//! [`Node`]: one rank's failure layer, composing the [`FailureView`] with the
//! [`Detector`], the [`Agreement`] of `validate_global`, and the communicator's revoke
//! flag.
//!
//! The node decodes each frame header once, rejects frames from ranks it knows dead,
//! and dispatches by [`FrameKind::family`]. Every death the detector reports goes to
//! [`FailureView::on_rank_failed`], where it waits until the application validates, and
//! to [`Agreement::on_rank_failed`], so a running agreement stops waiting for the dead.
//! A decision of the agreement is committed with [`FailureView::commit_global`] in the
//! same call that produced it.
//!
//! # Revoke
//!
//! [`Node::revoke`] marks the communicator revoked and floods a [`FrameKind::Revoke`]
//! frame, which names the rank that revoked (a rank varint), over the circulant graph
//! (peers at `i ± 2^k`, skipping ranks known dead); each rank forwards it once, on
//! first receipt, and raises [`NodeEvent::Revoked`] with that rank, whichever peer the
//! frame came from. Flooding
//! (about `2·log2 n` frames per rank, once per communicator) reaches every survivor as
//! long as the live part of the circulant graph stays connected, which with `2·log2 n`
//! disjoint-offset edges per rank takes far more deaths than a run of adjacent ranks.
//! Layers above (broadcasts) fail their in-flight operations with a typed error on that
//! event. As in ULFM, the failure layer keeps working on a revoked communicator:
//! `validate_local`, `validate_global` and the shrink renumbering
//! ([`crate::shrink::Survivors`] of the agreed `G`) are how the application recovers.
//!
//! Invariants, after every call: the view's `L_i ∪ pending` equals the detector's
//! `K_i` (so `G ⊆ L_i ⊆ K_i ⊆ F` under fail-stop enforcement); once the node learns it
//! was declared dead it is stopped for good: it sends nothing and ignores every input.
//!
//! # Call order
//!
//! As for every [`Protocol`]: `handle_message` / `handle_timeout` / application commands
//! ([`Node::validate_local`], [`Node::validate_global`]) in, then drain `poll_transmit`,
//! then `poll_event`.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use core::fmt;

use crate::agreement::{self, Agreement, AgreementError};
use crate::detector::{Detector, DetectorConfig, DetectorEvent};
use crate::error::{BufferTooShort, FrameError, ViewError};
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::time::Instant;
use crate::view::{Counts, FailureView};
use crate::wire::{Family, FrameKind, Header, Reader};

/// What a node reports to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// This rank's detector declared `rank` dead (its heartbeats stopped).
    Suspected {
        /// The declared rank.
        rank: Rank,
    },
    /// A failure notice told this rank, for the first time, that `rank` is dead.
    Learned {
        /// The dead rank.
        rank: Rank,
        /// Hops the notice travelled from the rank that declared it.
        hops: u32,
    },
    /// This rank was declared dead by `by` and stopped (fail-stop enforcement).
    DeclaredDeadSelf {
        /// The rank whose notice named this one.
        by: Rank,
    },
    /// `validate_local` finished with these counts (`|L_i|`, newly added).
    LocalValidated(Counts),
    /// `validate_global` of `epoch` finished: `G` is committed to the view (query it
    /// there) and every live rank holds the same `G`.
    GlobalValidated {
        /// The global validation epoch (1 for the first).
        epoch: u32,
        /// `|G|` and how many ranks this validation added to it.
        counts: Counts,
    },
    /// The survivors agreed that this rank is dead (it was falsely suspected); the node
    /// stopped (fail-stop enforcement).
    SelfExcluded {
        /// The validation epoch that excluded it.
        epoch: u32,
    },
    /// The communicator was revoked (by rank `by`); in-flight operations of the layers
    /// above fail.
    Revoked {
        /// The rank that called `revoke` first, as far as this rank saw.
        by: Rank,
    },
}

/// An application command the node refused; the node is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// The node was declared dead and stopped.
    Stopped,
    /// A global validation is already running at this rank (its epoch).
    ValidationRunning {
        /// The running epoch.
        epoch: u32,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Stopped => f.write_str("this rank was declared dead and stopped"),
            NodeError::ValidationRunning { epoch } => {
                write!(f, "global validation of epoch {epoch} is still running")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for NodeError {}

/// One rank's failure layer. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Node {
    view: FailureView,
    detector: Detector,
    /// Created on first use (a `validate_global` or an agreement frame): an idle rank of
    /// a million-rank simulation should not carry one. It learns every death the
    /// detector knew before its creation at creation.
    agreement: Option<Box<Agreement>>,
    events: VecDeque<NodeEvent>,
    /// Revoke frames waiting to go out (one per circulant peer, on first knowledge).
    revoke_out: VecDeque<Rank>,
    revoked_by: Option<Rank>,
    stopped: bool,
}

impl Node {
    /// The node of rank `config.me`, started at `now`.
    ///
    /// # Panics
    /// If `config.me >= config.n` or the period is zero.
    pub fn new(config: DetectorConfig, now: Instant) -> Self {
        Node {
            view: FailureView::new(config.n, config.me),
            agreement: None,
            detector: Detector::new(config, now),
            events: VecDeque::new(),
            revoke_out: VecDeque::new(),
            revoked_by: None,
            stopped: false,
        }
    }

    // ----- getters -----

    /// The failure view (`L_i`, `G`, queries).
    pub fn view(&self) -> &FailureView {
        &self.view
    }
    /// The detector.
    pub fn detector(&self) -> &Detector {
        &self.detector
    }
    /// The agreement machine of `validate_global`.
    /// `None` until this rank first took part in a global validation.
    pub fn agreement(&self) -> Option<&Agreement> {
        self.agreement.as_deref()
    }
    /// Whether this rank was declared dead and stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    /// The rank that revoked the communicator, once this rank knows it is revoked.
    pub fn revoked_by(&self) -> Option<Rank> {
        self.revoked_by
    }

    // ----- application commands -----

    /// Folds the detector's news into `L_i`; also raises [`NodeEvent::LocalValidated`].
    pub fn validate_local(&mut self, now: Instant) -> Result<Counts, NodeError> {
        let _ = now;
        if self.stopped {
            return Err(NodeError::Stopped);
        }
        let counts = self.view.validate_local();
        self.events.push_back(NodeEvent::LocalValidated(counts));
        Ok(counts)
    }

    /// Starts a global validation (collective: every live rank calls it). This rank
    /// contributes everything it knows failed (`L_i` and the detector's pending news);
    /// [`NodeEvent::GlobalValidated`] reports the end, with `G` committed to the view.
    /// Returns the validation's epoch.
    pub fn validate_global(&mut self, now: Instant) -> Result<u32, NodeError> {
        if self.stopped {
            return Err(NodeError::Stopped);
        }
        let contribution = self.view.known_failed();
        let started = self.agreement_mut(now).start(now, &contribution);
        self.absorb_agreement();
        started.map_err(|e| match e {
            AgreementError::AlreadyRunning { epoch } => NodeError::ValidationRunning { epoch },
            // The contribution is built from this node's own view (same universe, ranks in
            // range): the only other refusal is exclusion, after which the node stopped.
            _ => NodeError::Stopped,
        })
    }

    /// The application has dealt with failed `rank`: it becomes `Null` in every scope
    /// whose failed set holds it ([`FailureView::recognize`]). The only change the
    /// application may make to the view directly: everything else it holds comes from
    /// the detector and the agreement, which keep `G ⊆ L_i ⊆ K_i`.
    pub fn recognize(&mut self, rank: Rank) -> Result<(), ViewError> {
        self.view.recognize(rank)
    }

    /// [`FailureView::set_generation`]: `rank` is in its `generation`-th incarnation.
    pub fn set_generation(&mut self, rank: Rank, generation: u32) -> Result<(), ViewError> {
        self.view.set_generation(rank, generation)
    }

    /// Revokes the communicator: every survivor learns it and raises
    /// [`NodeEvent::Revoked`]. Idempotent.
    pub fn revoke(&mut self, now: Instant) -> Result<(), NodeError> {
        let _ = now;
        if self.stopped {
            return Err(NodeError::Stopped);
        }
        self.mark_revoked(self.view.rank());
        Ok(())
    }

    // ----- internals -----

    /// Moves the detector's news into the view, the agreement and the node's events.
    fn absorb_detector(&mut self, now: Instant) {
        while let Some(event) = self.detector.poll_event() {
            match event {
                DetectorEvent::Suspected { rank } => {
                    // The detector never reports this rank or a rank out of range.
                    let _ = self.view.on_rank_failed(rank);
                    self.tell_agreement(now, rank);
                    self.events.push_back(NodeEvent::Suspected { rank });
                }
                DetectorEvent::Learned { rank, hops } => {
                    let _ = self.view.on_rank_failed(rank);
                    self.tell_agreement(now, rank);
                    self.events.push_back(NodeEvent::Learned { rank, hops });
                }
                DetectorEvent::DeclaredDead { by } => {
                    self.stopped = true;
                    self.events.push_back(NodeEvent::DeclaredDeadSelf { by });
                }
            }
        }
    }

    /// The agreement machine, created on first use with every death known so far.
    fn agreement_mut(&mut self, now: Instant) -> &mut Agreement {
        let view = &self.view;
        let known_dead = self.detector.known_dead();
        self.agreement.get_or_insert_with(|| {
            let config =
                agreement::Config::new(self.detector.context().comm, view.size(), view.rank());
            let mut agreement = Agreement::new(config);
            for rank in known_dead.iter() {
                // Ranks from the detector: in range and never this rank.
                let _ = agreement.on_rank_failed(now, rank);
            }
            Box::new(agreement)
        })
    }

    /// Passes a death to the agreement, if it exists (a later one learns it at creation).
    fn tell_agreement(&mut self, now: Instant, rank: Rank) {
        if let Some(agreement) = &mut self.agreement {
            let _ = agreement.on_rank_failed(now, rank);
        }
    }

    /// Commits the agreement's decisions to the view and reports them.
    fn absorb_agreement(&mut self) {
        let Some(agreement) = &mut self.agreement else {
            return;
        };
        while let Some(event) = agreement.poll_event() {
            match event {
                agreement::Event::Decided { epoch, agreed } => {
                    let counts = self.view.commit_global(&agreed);
                    self.events
                        .push_back(NodeEvent::GlobalValidated { epoch, counts });
                }
                agreement::Event::SelfExcluded { epoch, .. } => {
                    self.stopped = true;
                    self.events.push_back(NodeEvent::SelfExcluded { epoch });
                }
            }
        }
    }

    /// Records that the communicator is revoked and queues the flood to the circulant
    /// peers (first knowledge only).
    fn mark_revoked(&mut self, by: Rank) {
        if self.revoked_by.is_some() {
            return;
        }
        self.revoked_by = Some(by);
        self.events.push_back(NodeEvent::Revoked { by });
        let (n, me) = (self.view.size(), self.view.rank());
        let mut step: u32 = 1;
        while step < n {
            for peer in [(me + step) % n, (me + n - step) % n] {
                if peer != me
                    && !self.detector.known_dead().contains(peer)
                    && !self.revoke_out.contains(&peer)
                {
                    self.revoke_out.push_back(peer);
                }
            }
            step = match step.checked_mul(2) {
                Some(s) => s,
                None => break,
            };
        }
    }

    /// Feeds a frame whose header was already decoded and checked against this node's
    /// communicator (by a layer stacked above that dispatches on
    /// [`FrameKind::family`]); `payload` is positioned after the header. The same as
    /// [`Protocol::handle_message`] without decoding the header a second time.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        header: &Header,
        payload: Reader<'_>,
    ) -> Result<(), FrameError> {
        if self.stopped {
            return Ok(());
        }
        // The detector's `K_i` equals the view's `L_i ∪ pending` (see the invariants);
        // one set to look at instead of three.
        if self.detector.known_dead().contains(header.sender) {
            return Err(FrameError::FromFailedRank(header.sender));
        }
        if header.kind.family() == Family::Agree {
            let result = self.agreement_mut(now).handle_frame(now, header, payload);
            self.absorb_agreement();
            return result;
        }
        self.dispatch(now, header, payload)
    }

    fn dispatch(
        &mut self,
        now: Instant,
        header: &Header,
        mut payload: Reader<'_>,
    ) -> Result<(), FrameError> {
        match header.kind.family() {
            Family::Detector => {
                let result = self.detector.handle_frame(now, header, payload);
                self.absorb_detector(now);
                self.absorb_agreement();
                result
            }
            Family::Revoke => {
                // The rank that revoked, not the peer that forwarded it.
                let by = payload.rank()?;
                payload.finish()?;
                self.mark_revoked(by);
                Ok(())
            }
            // Bcast frames belong to the broadcast layer stacked above this node.
            Family::Agree | Family::Bcast | Family::Message => {
                Err(FrameError::UnexpectedKind(header.kind as u8))
            }
        }
    }
}

impl Protocol for Node {
    type Event = NodeEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        if self.stopped {
            return Ok(());
        }
        let (header, payload) = Header::decode(bytes, self.detector.context(), from)?;
        self.handle_frame(now, &header, payload)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        self.detector.handle_timeout(now);
        self.absorb_detector(now);
        self.absorb_agreement();
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        if self.stopped {
            return Ok(None);
        }
        if let Some(t) = self.detector.poll_transmit(now, buf)? {
            return Ok(Some(t));
        }
        if let Some(agreement) = self.agreement.as_mut() {
            if let Some(t) = agreement.poll_transmit(now, buf)? {
                return Ok(Some(t));
            }
        }
        let (Some(&to), Some(by)) = (self.revoke_out.front(), self.revoked_by) else {
            return Ok(None);
        };
        let header = Header {
            kind: FrameKind::Revoke,
            comm: self.detector.context().comm,
            epoch: 0,
            sender: self.view.rank(),
        };
        let mut w = header.write_into(buf);
        w.put_rank(by);
        let len = w.finish()?;
        self.revoke_out.pop_front();
        Ok(Some(Transmit { to, len }))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        self.detector.poll_timeout()
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rankset::RankSet;
    use crate::time::Duration;
    use crate::wire;
    use alloc::vec::Vec;

    fn config(n: u32, me: Rank) -> DetectorConfig {
        DetectorConfig {
            comm: 1,
            n,
            me,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::ZERO,
            span: crate::detector::DEFAULT_SPAN,
        }
    }

    /// Delivers every queued frame instantly, in send order, until nothing moves, at a
    /// fixed time (no timer fires). Returns every event seen per rank.
    fn settle(nodes: &mut [Node], now: Instant, dead: &[Rank]) -> Vec<Vec<NodeEvent>> {
        let mut events: Vec<Vec<NodeEvent>> = nodes.iter().map(|_| Vec::new()).collect();
        let mut buf = alloc::vec![0u8; wire::frame_capacity(nodes.len() as u32)];
        for _ in 0..10_000 {
            let mut moved = false;
            for from in 0..nodes.len() {
                while let Some(t) = nodes[from]
                    .poll_transmit(now, &mut buf)
                    .expect("frame_capacity fits")
                {
                    moved = true;
                    if !dead.contains(&t.to) {
                        let frame = buf[..t.len].to_vec();
                        nodes[t.to as usize]
                            .handle_message(now, from as Rank, &frame)
                            .unwrap();
                    }
                }
                while let Some(e) = nodes[from].poll_event() {
                    events[from].push(e);
                }
            }
            if !moved {
                return events;
            }
        }
        panic!("frames still moving after 10^4 sweeps");
    }

    #[test]
    fn detector_news_waits_for_validate_local() {
        let mut node = Node::new(config(4, 1), Instant::ZERO);
        // Past the start-up grace (3 timeouts): rank 0 was never heard from.
        node.handle_timeout(Instant::from_nanos(120_000_000));
        assert_eq!(node.poll_event(), Some(NodeEvent::Suspected { rank: 0 }));
        assert!(node.view().pending().contains(0));
        assert_eq!(
            node.validate_local(Instant::from_nanos(121_000_000)),
            Ok(Counts { failed: 1, new: 1 })
        );
    }

    #[test]
    fn validate_global_commits_the_union_at_every_rank() {
        let now = Instant::from_nanos(1);
        let mut nodes: Vec<Node> = (0..6)
            .map(|r| Node::new(config(6, r), Instant::ZERO))
            .collect();
        // Rank 4 died; only ranks 0 and 5 know it so far (say, from their detectors).
        for r in [0, 5] {
            nodes[r].view.on_rank_failed(4).unwrap();
            nodes[r].agreement_mut(now).on_rank_failed(now, 4).unwrap();
        }
        for r in [1, 2, 3] {
            nodes[r].agreement_mut(now).on_rank_failed(now, 4).unwrap();
        }
        for r in [0, 1, 2, 3, 5] {
            assert_eq!(nodes[r].validate_global(now), Ok(1));
        }
        assert_eq!(
            nodes[0].validate_global(now),
            Err(NodeError::ValidationRunning { epoch: 1 })
        );
        let events = settle(&mut nodes, now, &[4]);
        let g = RankSet::from_ranks(6, [4]);
        for r in [0usize, 1, 2, 3, 5] {
            let counts = Counts { failed: 1, new: 1 };
            assert!(
                events[r].contains(&NodeEvent::GlobalValidated { epoch: 1, counts }),
                "rank {r}: {:?}",
                events[r]
            );
            assert_eq!(nodes[r].view().global(), &g);
            assert!(nodes[r].view().is_locally_failed(4));
        }
    }

    #[test]
    fn revoke_floods_every_live_rank_once() {
        let now = Instant::from_nanos(1);
        let mut nodes: Vec<Node> = (0..13)
            .map(|r| Node::new(config(13, r), Instant::ZERO))
            .collect();
        nodes[7].revoke(now).unwrap();
        nodes[7].revoke(now).unwrap();
        let events = settle(&mut nodes, now, &[]);
        for (r, seen) in events.iter().enumerate() {
            let revokes: Vec<_> = seen
                .iter()
                .filter(|e| matches!(e, NodeEvent::Revoked { .. }))
                .collect();
            assert_eq!(revokes.len(), 1, "rank {r}");
            // The rank that revoked, whichever neighbour forwarded it first.
            assert_eq!(nodes[r].revoked_by(), Some(7), "rank {r}");
            assert!(matches!(revokes[0], NodeEvent::Revoked { by: 7 }));
        }
        assert_eq!(
            nodes[3].validate_global(now),
            Ok(1),
            "validation still works once revoked"
        );
    }
}
