//! The agreement's typed messages and their codec.

use alloc::vec::Vec;

use super::Ballot;
use crate::error::FrameError;
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::wire::{FrameKind, Header, Reader, Writer};

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

/// A decoded agreement frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Msg {
    Prepare {
        ballot: Ballot,
        excluded: RankSet,
    },
    Promise {
        ballot: Ballot,
        report: Report,
    },
    Accept {
        ballot: Ballot,
        value: RankSet,
    },
    Accepted {
        ballot: Ballot,
        reject: Option<Ballot>,
    },
    Decide {
        excluded: RankSet,
        value: RankSet,
    },
    /// Fast path, sweep 1, round `round`: the sender's union of contributions so far.
    Sweep {
        round: u32,
        union: RankSet,
    },
    /// Fast path, sweep 2, round `round`: the sender finished sweep 1.
    SweepDone {
        round: u32,
    },
}

pub(super) const HAS_ACCEPTED: u8 = 1;
pub(super) const HAS_DECIDED: u8 = 2;
pub(super) const HAS_REJECT: u8 = 4;

pub(super) fn put_ballot(w: &mut Writer, b: Ballot) {
    w.put_varint(b.round.into());
    w.put_rank(b.coord);
}

pub(super) fn read_ballot(r: &mut Reader<'_>) -> Result<Ballot, FrameError> {
    Ok(Ballot {
        round: r.varint_u32()?,
        coord: r.rank()?,
    })
}

impl Msg {
    pub(super) fn kind(&self) -> FrameKind {
        match self {
            Msg::Prepare { .. } => FrameKind::AgreePrepare,
            Msg::Promise { .. } => FrameKind::AgreePromise,
            Msg::Accept { .. } => FrameKind::AgreeAccept,
            Msg::Accepted { .. } => FrameKind::AgreeAccepted,
            Msg::Decide { .. } => FrameKind::AgreeDecide,
            Msg::Sweep { .. } => FrameKind::AgreeSweep,
            Msg::SweepDone { .. } => FrameKind::AgreeSweepDone,
        }
    }

    pub(super) fn encode(&self, comm: u32, epoch: u32, sender: Rank) -> Vec<u8> {
        let mut w = Header {
            kind: self.kind(),
            comm,
            epoch,
            sender,
        }
        .start();
        match self {
            Msg::Prepare { ballot, excluded } => {
                put_ballot(&mut w, *ballot);
                w.put_rankset(excluded);
            }
            Msg::Promise { ballot, report } => {
                put_ballot(&mut w, *ballot);
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
                    put_ballot(&mut w, *b);
                    w.put_rankset(v);
                }
                if let Some(v) = &report.decided {
                    w.put_rankset(v);
                }
                if let Some(b) = report.reject {
                    put_ballot(&mut w, b);
                }
            }
            Msg::Accept { ballot, value } => {
                put_ballot(&mut w, *ballot);
                w.put_rankset(value);
            }
            Msg::Accepted { ballot, reject } => {
                put_ballot(&mut w, *ballot);
                w.put_u8(u8::from(reject.is_some()) * HAS_REJECT);
                if let Some(b) = reject {
                    put_ballot(&mut w, *b);
                }
            }
            Msg::Decide { excluded, value } => {
                w.put_rankset(excluded);
                w.put_rankset(value);
            }
            Msg::Sweep { round, union } => {
                w.put_varint((*round).into());
                w.put_rankset(union);
            }
            Msg::SweepDone { round } => {
                w.put_varint((*round).into());
            }
        }
        w.finish()
    }

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
                union: r.rankset()?,
            },
            FrameKind::AgreeSweepDone => Msg::SweepDone {
                round: r.varint_u32()?,
            },
            other => return Err(FrameError::UnexpectedKind(other as u8)),
        };
        Ok(msg)
    }
}
