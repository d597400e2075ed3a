//! What a rank does when a failure interrupts the solver, under `--mode shrink`:
//!
//! 1. agree on `G` over the group it works in (`validate_global`; a checkpoint
//!    commit that failed already did, and its `G` serves);
//! 2. shrink into the survivors' group ([`ft::Runtime::shrink`]): renumbered in
//!    order, over the same connections;
//! 3. cut the rows evenly over the survivors and hand each its rows of the last
//!    committed checkpoint: a row range comes from its owner if it survived, else from
//!    the rank that holds the owner's copy in the store ([`ft::Runtime::store_holder`],
//!    on another node);
//! 4. commit that as the new group's checkpoint of the same iteration;
//! 5. resume the solver from that iteration (a rollback).
//!
//! A failure at any step starts over from step 1 on the newest group, and the group of
//! the last committed checkpoint ([`Source`]) stays open until the next checkpoint
//! commits, so its store still answers for the rows.
//!
//! Invariants: every survivor makes exactly one `validate_global` per failure it
//! recovers from (step 1, or the failed commit that stands for it), so all shrink
//! after the same agreement, hence into the same group; the rows a survivor resumes
//! with are, bit for bit, the committed checkpoint's, so the run ends with the
//! failure-free checksum; a checkpoint that a failure took with both its copies (its
//! owner and its holder died) is a [`RecoveryError::Lost`], never a wrong answer.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use ft::{GlobalValidation, Rank, RuntimeError};

use crate::checkpoint::{restore, Checkpoints, RestoreError};
use crate::cli::Mode;
use crate::halo::{HaloError, Handle, Kind, Mailbox};
use crate::layout::Layout;
use crate::solver::Interrupted;
use crate::strip::{Side, Strip};

/// Where the solver goes on from after a recovery.
#[derive(Clone, Debug)]
pub struct Resume {
    /// Who owns which rows now (in the numbering of the mailbox's handle).
    pub layout: Layout,
    /// This rank's strip, holding the values after `start` iterations.
    pub strip: Strip,
    /// The iteration to go on from.
    pub start: u32,
}

/// The group of the last committed checkpoint: where a recovery reads the rows.
#[derive(Clone)]
pub struct Source<'h> {
    /// Its handle (kept open until a newer checkpoint commits).
    pub handle: Handle<'h>,
    /// Each of its ranks in the job's first numbering.
    pub first: Vec<Rank>,
    /// Who owned which rows at the checkpoint.
    pub layout: Layout,
    /// The checkpoint's iteration.
    pub iteration: u32,
}

/// What a rank keeps across recoveries.
pub struct State<'h> {
    /// The last committed checkpoint's group.
    pub source: Source<'h>,
    /// Each rank of the group the mailbox works in, in the job's first numbering.
    pub first: Vec<Rank>,
    /// The ranks that failed, in the job's first numbering.
    pub dead: BTreeSet<Rank>,
    /// Rollbacks so far.
    pub rollbacks: u32,
}

/// Why a rank cannot go on after a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryError {
    /// This build rebuilds no rank yet: `--mode rebuild` stops at the first failure.
    Unsupported {
        /// The failure that interrupted the solver.
        interrupted: Interrupted,
        /// The mode asked for.
        mode: Mode,
    },
    /// Both copies of a rank's checkpoint died with their ranks.
    Lost {
        /// The checkpoint's owner, in the job's first numbering.
        owner: Rank,
    },
    /// A checkpoint could not be read back.
    Restore(RestoreError),
    /// A peer sent rows that are not the ones asked for.
    Malformed {
        /// The sender, in the group's numbering.
        from: Rank,
    },
    /// The rank's handle failed otherwise (it was declared dead, the job's time limit
    /// passed, ...).
    Runtime(String),
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryError::Unsupported { interrupted, mode } => write!(
                f,
                "{interrupted}; --mode {} does not replace ranks yet",
                mode.name()
            ),
            RecoveryError::Lost { owner } => write!(
                f,
                "rank {owner}'s checkpoint is lost: it and the rank holding its copy died"
            ),
            RecoveryError::Restore(e) => write!(f, "{e}"),
            RecoveryError::Malformed { from } => {
                write!(f, "rank {from} sent rows that are not the ones asked for")
            }
            RecoveryError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// How one attempt at recovering ended without resuming.
enum Failed {
    /// A failure during the recovery: start over (with the agreement already made,
    /// if the failed step made one).
    Again(Option<GlobalValidation>),
    /// No recovery is possible.
    Fatal(RecoveryError),
}

impl From<HaloError> for Failed {
    fn from(e: HaloError) -> Self {
        match e {
            HaloError::NeighbourFailed(_) | HaloError::PeerFailed(_) => Failed::Again(None),
            HaloError::CommitFailed(validation) => Failed::Again(Some(validation)),
            other => Failed::Fatal(RecoveryError::Runtime(other.to_string())),
        }
    }
}

impl From<RuntimeError> for Failed {
    fn from(e: RuntimeError) -> Self {
        Failed::Fatal(RecoveryError::Runtime(e.to_string()))
    }
}

/// Recovers from `interrupted` in `mode`: the layout, strip and iteration to resume
/// from (see the [module docs](self)). `during(iteration, dead)` runs once the
/// survivors agreed, before the shrink (a `--kill` that fires during a recovery).
pub fn recover<'h>(
    mailbox: &mut Mailbox<'h>,
    mode: Mode,
    state: &mut State<'h>,
    checkpoints: &mut Checkpoints,
    interrupted: Interrupted,
    during: &mut dyn FnMut(u32, &BTreeSet<Rank>),
) -> Result<Resume, RecoveryError> {
    if mode == Mode::Rebuild {
        return Err(RecoveryError::Unsupported { interrupted, mode });
    }
    let mut agreed = match interrupted.cause {
        HaloError::CommitFailed(validation) => Some(validation),
        _ => None,
    };
    loop {
        match attempt(mailbox, state, checkpoints, agreed.take(), during) {
            Ok(resume) => {
                state.rollbacks += 1;
                return Ok(resume);
            }
            Err(Failed::Again(validation)) => agreed = validation,
            Err(Failed::Fatal(e)) => return Err(e),
        }
    }
}

// ANCHOR: attempt
/// One pass of steps 1–4.
fn attempt<'h>(
    mailbox: &mut Mailbox<'h>,
    state: &mut State<'h>,
    checkpoints: &mut Checkpoints,
    agreed: Option<GlobalValidation>,
    during: &mut dyn FnMut(u32, &BTreeSet<Rank>),
) -> Result<Resume, Failed> {
    let handle = mailbox.shared_handle();
    let agreed = match agreed {
        Some(validation) => validation,
        None => handle.validate_global()?,
    };
    state
        .dead
        .extend(agreed.agreed.iter().map(|r| state.first[r as usize]));
    let iteration = state.source.iteration;
    during(iteration, &state.dead);
    let shrunk = Arc::new(handle.shrink()?);
    let first: Vec<Rank> = handle
        .view()
        .survivors()
        .iter()
        .map(|old| state.first[old as usize])
        .collect();
    mailbox.switch_to(shrunk);
    state.first = first;
    let ranks: Vec<Rank> = (0..state.first.len() as Rank).collect();
    let layout = Layout::even(state.source.layout.total_rows(), &ranks);
    let strip = redistribute(mailbox, &state.source, &state.first, &layout)?;
    let new = mailbox.shared_handle();
    checkpoints.take(&new, iteration, &strip)?;
    state.source = Source {
        handle: new,
        first: state.first.clone(),
        layout: layout.clone(),
        iteration,
    };
    Ok(Resume {
        layout,
        strip,
        start: iteration,
    })
}
// ANCHOR_END: attempt

/// Step 3: sends the checkpoint rows this rank provides to their new owners, and
/// assembles its own strip under `layout` from what the providers send it.
fn redistribute(
    mailbox: &mut Mailbox<'_>,
    source: &Source<'_>,
    first: &[Rank],
    layout: &Layout,
) -> Result<Strip, Failed> {
    let me = mailbox.me();
    let now = |f: Rank| first.iter().position(|&x| x == f).map(|k| k as Rank);
    let owners = source.first.len() as Rank;
    let mut providers = Vec::with_capacity(owners as usize);
    for owner in 0..owners {
        let provider = match now(source.first[owner as usize]) {
            Some(k) => k,
            None => {
                let holder = source.handle.store_holder(owner)?;
                now(source.first[holder as usize]).ok_or(Failed::Fatal(RecoveryError::Lost {
                    owner: source.first[owner as usize],
                }))?
            }
        };
        providers.push(provider);
    }
    let tag = |mailbox: &Mailbox<'_>, owner: Rank| mailbox.tag(Kind::Restore, owner, Side::Above);
    let mut mine = Vec::new();
    let my_rows = layout.rows_of(me).expect("every survivor owns rows");
    for owner in (0..owners).filter(|&o| providers[o as usize] == me) {
        let strip = restore(&source.handle, owner, source.iteration)
            .map_err(|e| Failed::Fatal(RecoveryError::Restore(e)))?;
        for &to in layout.ranks() {
            let rows = layout.rows_of(to).expect("a rank of the layout");
            let part = strip.rows().start.max(rows.start)..strip.rows().end.min(rows.end);
            if part.is_empty() {
                continue;
            }
            let piece = strip.slice(part);
            if to == me {
                mine.push(piece);
            } else {
                mailbox.send(to, tag(mailbox, owner), piece.to_bytes())?;
            }
        }
    }
    for (owner, rows) in source.layout.sources(my_rows) {
        let provider = providers[owner as usize];
        if provider == me {
            continue;
        }
        let bytes = mailbox.receive(provider, tag(mailbox, owner), &[provider])?;
        let piece = Strip::from_bytes(&bytes)
            .ok()
            .filter(|p| p.rows() == rows)
            .ok_or(Failed::Fatal(RecoveryError::Malformed { from: provider }))?;
        mine.push(piece);
    }
    Strip::join(mine).map_err(|_| Failed::Fatal(RecoveryError::Malformed { from: me }))
}
