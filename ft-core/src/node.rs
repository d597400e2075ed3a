//! [`Node`]: one rank's failure layer, composing the [`FailureView`] with the
//! [`Detector`] (and, once wired, the agreement of `validate_global`).
//!
//! The node decodes each frame header once, rejects frames from ranks it knows dead,
//! and dispatches by [`FrameKind::family`]. Every death the detector reports goes to
//! [`FailureView::report_failed`], where it waits until the application validates.
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

use alloc::collections::VecDeque;
use core::fmt;

use crate::detector::{Detector, DetectorConfig, DetectorEvent};
use crate::error::FrameError;
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::time::Instant;
use crate::view::{Counts, FailureView};
use crate::wire::{Header, Reader};

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
}

/// An application command the node refused; the node is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// The command needs a protocol this build does not wire yet (named).
    Unsupported(&'static str),
    /// The node was declared dead and stopped.
    Stopped,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Unsupported(what) => write!(f, "{what} is not supported yet"),
            NodeError::Stopped => f.write_str("this rank was declared dead and stopped"),
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
    events: VecDeque<NodeEvent>,
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
            detector: Detector::new(config, now),
            events: VecDeque::new(),
            stopped: false,
        }
    }

    // ----- getters -----

    /// The failure view (`L_i`, `G`, queries).
    pub fn view(&self) -> &FailureView {
        &self.view
    }
    /// The failure view, for application commands such as `recognize`.
    pub fn view_mut(&mut self) -> &mut FailureView {
        &mut self.view
    }
    /// The detector.
    pub fn detector(&self) -> &Detector {
        &self.detector
    }
    /// Whether this rank was declared dead and stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped
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

    /// Starts a global validation (collective).
    ///
    /// AGREEMENT WIRING POINT: start the agreement machine here with `self.view.local()`
    /// as this rank's contribution; its decision then goes to `FailureView::commit_global`.
    pub fn validate_global(&mut self, now: Instant) -> Result<(), NodeError> {
        let _ = now;
        if self.stopped {
            return Err(NodeError::Stopped);
        }
        Err(NodeError::Unsupported("validate_global"))
    }

    // ----- internals -----

    /// Moves the detector's news into the view and the node's events.
    fn absorb_detector(&mut self) {
        while let Some(event) = self.detector.poll_event() {
            match event {
                DetectorEvent::Suspected { rank } => {
                    // The detector never reports this rank or a rank out of range.
                    let _ = self.view.report_failed(rank);
                    self.events.push_back(NodeEvent::Suspected { rank });
                }
                DetectorEvent::Learned { rank, hops } => {
                    let _ = self.view.report_failed(rank);
                    self.events.push_back(NodeEvent::Learned { rank, hops });
                }
                DetectorEvent::DeclaredDead { by } => {
                    self.stopped = true;
                    self.events.push_back(NodeEvent::DeclaredDeadSelf { by });
                }
            }
        }
    }

    fn dispatch(
        &mut self,
        now: Instant,
        header: &Header,
        payload: Reader<'_>,
    ) -> Result<(), FrameError> {
        match header.kind.family() {
            "detector" => {
                let result = self.detector.handle_frame(now, header, payload);
                self.absorb_detector();
                result
            }
            // AGREEMENT DISPATCH POINT: "agree" frames go to the agreement machine, whose
            // decisions are committed with `FailureView::commit_global`.
            // BROADCAST/REVOKE: a bigger stack (ft-bcast) sits above this node and takes
            // "bcast" frames before they reach here.
            _ => Err(FrameError::UnexpectedKind(header.kind as u8)),
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
        // The detector's `K_i` equals the view's `L_i ∪ pending` (see the invariants);
        // one set to look at instead of three.
        if self.detector.known_dead().contains(header.sender) {
            return Err(FrameError::FromFailedRank(header.sender));
        }
        self.dispatch(now, &header, payload)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        self.detector.handle_timeout(now);
        self.absorb_detector();
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.stopped {
            return None;
        }
        self.detector.poll_transmit(now, buf)
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
    use crate::time::Duration;

    #[test]
    fn detector_news_waits_for_validate_local() {
        let config = DetectorConfig {
            comm: 1,
            n: 4,
            me: 1,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::ZERO,
        };
        let mut node = Node::new(config, Instant::ZERO);
        node.handle_timeout(Instant::from_nanos(40_000_000));
        assert_eq!(node.poll_event(), Some(NodeEvent::Suspected { rank: 0 }));
        assert!(node.view().pending().contains(0));
        assert_eq!(
            node.validate_local(Instant::from_nanos(41_000_000)),
            Ok(Counts { failed: 1, new: 1 })
        );
        assert_eq!(
            node.validate_global(Instant::from_nanos(41_000_000)),
            Err(NodeError::Unsupported("validate_global"))
        );
    }
}
