//! The agreement's typed messages and their codec.
//!
//! One enum, [`Msg`], serves both directions, generic over how it holds its rank sets:
//! decoded frames own theirs (`Msg`, the default parameters); queued frames ([`Out`])
//! share them behind `Arc`s, so a broadcast to `c` children holds one copy of its body,
//! not `c`, and a sweep frame shares the sender's union instead of copying it. A queued
//! message is encoded only in `poll_transmit`, in place into the caller's buffer.

use alloc::sync::Arc;
use core::borrow::Borrow;

use super::Ballot;
use crate::error::{BufferTooShort, FrameError};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::wire::{FrameKind, Header, Reader, Sink, Writer};

/// What a subtree reports up in the promise reduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Report {
    pub(super) contrib: RankSet,
    pub(super) accepted: Option<(Ballot, RankSet)>,
    pub(super) decided: Option<RankSet>,
    pub(super) reject: Option<Ballot>,
}

impl Report {
    pub(super) fn empty(n: u32) -> Self {
        Report {
            contrib: RankSet::new(n),
            accepted: None,
            decided: None,
            reject: None,
        }
    }
    pub(super) fn rejection(n: u32, promised: Ballot) -> Self {
        Report {
            reject: Some(promised),
            ..Report::empty(n)
        }
    }
    pub(super) fn merge(&mut self, other: Report) {
        self.contrib.union_with(&other.contrib);
        if let Some((b, v)) = other.accepted {
            if self.accepted.as_ref().is_none_or(|(mine, _)| b > *mine) {
                self.accepted = Some((b, v));
            }
        }
        if self.decided.is_none() {
            self.decided = other.decided;
        }
        self.reject = self.reject.max(other.reject);
    }
}

/// An agreement frame: decoded (`S = RankSet`, `R = Report`, the defaults) or queued
/// ([`Out`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Msg<S = RankSet, R = Report> {
    Prepare {
        ballot: Ballot,
        excluded: S,
    },
    Promise {
        ballot: Ballot,
        report: R,
    },
    Accept {
        ballot: Ballot,
        value: S,
    },
    Accepted {
        ballot: Ballot,
        reject: Option<Ballot>,
    },
    Decide {
        excluded: S,
        value: S,
    },
    /// Fast path, sweep 1, round `round` of the sweep over the participants outside
    /// `excluded` (the deaths the sender knew at its call): the sender's union of
    /// contributions so far. A receiver counts it only if its own exclusion is the same.
    Sweep {
        round: u32,
        excluded: S,
        union: S,
    },
    /// Fast path, sweep 2, round `round`: the sender finished sweep 1.
    SweepDone {
        round: u32,
    },
    /// Fast path: the sender left it without deciding because its view and a sweep
    /// frame's exclusion differ; sent to the coordinator, which then starts ballot 1.
    SweepLeft,
}

pub(super) const HAS_ACCEPTED: u8 = 1;
pub(super) const HAS_DECIDED: u8 = 2;
pub(super) const HAS_REJECT: u8 = 4;

/// A queued frame's body: its sets are shared with the machine's state and with the
/// same broadcast's other children.
pub(super) type Out = Msg<Arc<RankSet>, Arc<Report>>;

pub(super) fn put_ballot<K: Sink>(w: &mut Writer<K>, b: Ballot) {
    w.put_varint(b.round.into());
    w.put_rank(b.coord);
}

pub(super) fn read_ballot(r: &mut Reader<'_>) -> Result<Ballot, FrameError> {
    Ok(Ballot {
        round: r.varint_u32()?,
        coord: r.rank()?,
    })
}

impl<S: Borrow<RankSet>, R: Borrow<Report>> Msg<S, R> {
    pub(super) fn kind(&self) -> FrameKind {
        match self {
            Msg::Prepare { .. } => FrameKind::AgreePrepare,
            Msg::Promise { .. } => FrameKind::AgreePromise,
            Msg::Accept { .. } => FrameKind::AgreeAccept,
            Msg::Accepted { .. } => FrameKind::AgreeAccepted,
            Msg::Decide { .. } => FrameKind::AgreeDecide,
            Msg::Sweep { .. } => FrameKind::AgreeSweep,
            Msg::SweepDone { .. } | Msg::SweepLeft => FrameKind::AgreeSweepDone,
        }
    }

    /// Encodes the frame in place at the start of `buf`.
    pub(super) fn encode(
        &self,
        comm: u32,
        epoch: u32,
        sender: Rank,
        buf: &mut [u8],
    ) -> Result<usize, BufferTooShort> {
        let mut w = self.header(comm, epoch, sender).write_into(buf);
        self.put_payload(&mut w);
        w.finish()
    }

    pub(super) fn header(&self, comm: u32, epoch: u32, sender: Rank) -> Header {
        Header {
            kind: self.kind(),
            comm,
            epoch,
            sender,
        }
    }

    pub(super) fn put_payload<K: Sink>(&self, w: &mut Writer<K>) {
        match self {
            Msg::Prepare { ballot, excluded } => {
                put_ballot(w, *ballot);
                w.put_rankset(excluded.borrow());
            }
            Msg::Promise { ballot, report } => {
                let report: &Report = report.borrow();
                put_ballot(w, *ballot);
                let flags = [
                    (report.accepted.is_some(), HAS_ACCEPTED),
                    (report.decided.is_some(), HAS_DECIDED),
                    (report.reject.is_some(), HAS_REJECT),
                ]
                .iter()
                .filter(|(present, _)| *present)
                .fold(0, |acc, (_, bit)| acc | bit);
                w.put_u8(flags);
                w.put_rankset(&report.contrib);
                if let Some((b, v)) = &report.accepted {
                    put_ballot(w, *b);
                    w.put_rankset(v);
                }
                if let Some(v) = &report.decided {
                    w.put_rankset(v);
                }
                if let Some(b) = report.reject {
                    put_ballot(w, b);
                }
            }
            Msg::Accept { ballot, value } => {
                put_ballot(w, *ballot);
                w.put_rankset(value.borrow());
            }
            Msg::Accepted { ballot, reject } => {
                put_ballot(w, *ballot);
                w.put_u8(u8::from(reject.is_some()) * HAS_REJECT);
                if let Some(b) = reject {
                    put_ballot(w, *b);
                }
            }
            Msg::Decide { excluded, value } => {
                w.put_rankset(excluded.borrow());
                w.put_rankset(value.borrow());
            }
            Msg::Sweep {
                round,
                excluded,
                union,
            } => {
                w.put_varint((*round).into());
                w.put_rankset(excluded.borrow());
                w.put_rankset(union.borrow());
            }
            // One varint: `k + 1` for sweep 2's round `k`, 0 for the notice.
            Msg::SweepDone { round } => {
                w.put_varint(u64::from(*round) + 1);
            }
            Msg::SweepLeft => {
                w.put_varint(0);
            }
        }
    }
}

impl Msg {
    pub(super) fn decode(kind: FrameKind, r: &mut Reader<'_>) -> Result<Msg, FrameError> {
        let msg = match kind {
            FrameKind::AgreePrepare => Msg::Prepare {
                ballot: read_ballot(r)?,
                excluded: r.rankset()?,
            },
            FrameKind::AgreePromise => {
                let ballot = read_ballot(r)?;
                let flags = r.u8()?;
                if flags & !(HAS_ACCEPTED | HAS_DECIDED | HAS_REJECT) != 0 {
                    return Err(FrameError::Malformed("unknown promise flags"));
                }
                let contrib = r.rankset()?;
                let accepted = if flags & HAS_ACCEPTED != 0 {
                    Some((read_ballot(r)?, r.rankset()?))
                } else {
                    None
                };
                let decided = if flags & HAS_DECIDED != 0 {
                    Some(r.rankset()?)
                } else {
                    None
                };
                let reject = if flags & HAS_REJECT != 0 {
                    Some(read_ballot(r)?)
                } else {
                    None
                };
                Msg::Promise {
                    ballot,
                    report: Report {
                        contrib,
                        accepted,
                        decided,
                        reject,
                    },
                }
            }
            FrameKind::AgreeAccept => Msg::Accept {
                ballot: read_ballot(r)?,
                value: r.rankset()?,
            },
            FrameKind::AgreeAccepted => {
                let ballot = read_ballot(r)?;
                let reject = match r.u8()? {
                    0 => None,
                    HAS_REJECT => Some(read_ballot(r)?),
                    _ => return Err(FrameError::Malformed("unknown accepted flags")),
                };
                Msg::Accepted { ballot, reject }
            }
            FrameKind::AgreeDecide => Msg::Decide {
                excluded: r.rankset()?,
                value: r.rankset()?,
            },
            FrameKind::AgreeSweep => Msg::Sweep {
                round: r.varint_u32()?,
                excluded: r.rankset()?,
                union: r.rankset()?,
            },
            FrameKind::AgreeSweepDone => match r.varint()? {
                0 => Msg::SweepLeft,
                v => Msg::SweepDone {
                    round: u32::try_from(v - 1)
                        .map_err(|_| FrameError::Malformed("value exceeds 32 bits"))?,
                },
            },
            other => return Err(FrameError::UnexpectedKind(other as u8)),
        };
        Ok(msg)
    }
}
