//! What a rank does when a failure interrupts the solver:
//!
//! 1. agree on `G` over the group it works in (`validate_global`; a checkpoint
//!    commit that failed already did, and its `G` serves);
//! 2. under `--mode shrink`, shrink into the survivors' group ([`ft::Runtime::shrink`]:
//!    renumbered in order) and cut the rows evenly over them; under `--mode rebuild`,
//!    rebuild the group ([`ft::Runtime::rebuild`]: each failed rank's number goes to
//!    the next spare, which joins with [`join_as_replacement`]) and keep the layout;
//! 3. hand each rank its rows of the last committed checkpoint: a row range comes from
//!    its owner if that process survived, else from the rank that holds the owner's
//!    copy in the store ([`ft::Runtime::store_holder`], on another node);
//! 4. commit that as the new group's checkpoint of the same iteration;
//! 5. resume the solver from that iteration (a rollback).
//!
//! A process is named by its rank in the job's first numbering and its incarnation
//! (a shrink keeps incarnation 0; a rebuild's replacement has its rank's next one), so
//! "its owner survived" means the same process still runs under some number.
//!
//! A failure at any step starts over from step 1 on the newest group, and the group of
//! the last committed checkpoint ([`Source`]) stays open until the next checkpoint
//! commits, so its store still answers for the rows.
//!
//! Invariants: every survivor makes exactly one `validate_global` per failure it
//! recovers from (step 1, or the failed commit that stands for it), so all derive the
//! new group after the same agreement, hence the same group; the rows a survivor resumes
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

/// A process: its rank in the job's first numbering and its incarnation.
pub type Process = (Rank, u32);

/// The processes of `handle`'s group: under a rebuild, rank `r` with its incarnation.
pub fn processes(handle: &ft::Runtime) -> Vec<Process> {
    let view = handle.view();
    (0..view.size())
        .map(|r| {
            let generation = view
                .rank_info(ft::Scope::Global, r)
                .map_or(0, |(info, _)| info.generation);
            (r, generation)
        })
        .collect()
}

/// The group of the last committed checkpoint: where a recovery reads the rows.
#[derive(Clone)]
pub struct Source<'h> {
    /// Its handle (kept open until a newer checkpoint commits).
    pub handle: Handle<'h>,
    /// The process of each of its ranks.
    pub first: Vec<Process>,
    /// Who owned which rows at the checkpoint.
    pub layout: Layout,
    /// The checkpoint's iteration.
    pub iteration: u32,
}

/// What a rank keeps across recoveries.
pub struct State<'h> {
    /// The last committed checkpoint's group.
    pub source: Source<'h>,
    /// The process of each rank of the group the mailbox works in.
    pub first: Vec<Process>,
    /// The ranks that failed, in the job's first numbering.
    pub dead: BTreeSet<Rank>,
    /// Rollbacks so far.
    pub rollbacks: u32,
}

/// Why a rank cannot go on after a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryError {
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
    let mut agreed = match interrupted.cause {
        HaloError::CommitFailed(validation) => Some(validation),
        _ => None,
    };
    loop {
        match attempt(mailbox, mode, state, checkpoints, agreed.take(), during) {
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
    mode: Mode,
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
        .extend(agreed.agreed.iter().map(|r| state.first[r as usize].0));
    let iteration = state.source.iteration;
    during(iteration, &state.dead);
    let (group, first, layout) = match mode {
        Mode::Shrink => {
            let shrunk = Arc::new(handle.shrink()?);
            let first: Vec<Process> = handle
                .view()
                .survivors()
                .iter()
                .map(|old| state.first[old as usize])
                .collect();
            let ranks: Vec<Rank> = (0..first.len() as Rank).collect();
            let layout = Layout::even(state.source.layout.total_rows(), &ranks);
            (shrunk, first, layout)
        }
        Mode::Rebuild => {
            let rebuilt = Arc::new(handle.rebuild()?);
            let first = processes(&rebuilt);
            (rebuilt, first, state.source.layout.clone())
        }
    };
    mailbox.switch_to(group);
    state.first = first;
    let strip = redistribute(mailbox, state, &layout)?;
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

/// A checkpoint piece as it travels: what a replacement needs to join the recovery
/// (which knows none of it), then the rows.
struct Piece {
    /// The checkpoint's iteration.
    iteration: u32,
    /// The rollbacks so far.
    rollbacks: u32,
    /// The incarnation of each rank of the checkpoint's group.
    generations: Vec<u32>,
    /// The rows.
    strip: Strip,
}

impl Piece {
    fn encode(&self) -> Vec<u8> {
        let words = [
            self.iteration,
            self.rollbacks,
            self.generations.len() as u32,
        ];
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(self.generations.iter().flat_map(|g| g.to_le_bytes()));
        bytes.extend_from_slice(&self.strip.to_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Piece> {
        let word = |i: usize| {
            let b: [u8; 4] = bytes.get(4 * i..4 * i + 4)?.try_into().ok()?;
            Some(u32::from_le_bytes(b))
        };
        let n = word(2)? as usize;
        let generations = (0..n).map(|i| word(3 + i)).collect::<Option<Vec<_>>>()?;
        let strip = Strip::from_bytes(bytes.get(4 * (3 + n)..)?).ok()?;
        Some(Piece {
            iteration: word(0)?,
            rollbacks: word(1)?,
            generations,
            strip,
        })
    }
}

/// Step 3: sends the checkpoint rows this rank provides to their owners under
/// `layout`, and assembles its own strip from what the providers send it.
fn redistribute(
    mailbox: &mut Mailbox<'_>,
    state: &State<'_>,
    layout: &Layout,
) -> Result<Strip, Failed> {
    let (source, first) = (&state.source, &state.first);
    let me = mailbox.me();
    let now = |p: Process| first.iter().position(|&x| x == p).map(|k| k as Rank);
    let owners = source.first.len() as Rank;
    let mut providers = Vec::with_capacity(owners as usize);
    for owner in 0..owners {
        let provider = match now(source.first[owner as usize]) {
            Some(k) => k,
            None => {
                let holder = source.handle.store_holder(owner)?;
                now(source.first[holder as usize]).ok_or(Failed::Fatal(RecoveryError::Lost {
                    owner: source.first[owner as usize].0,
                }))?
            }
        };
        providers.push(provider);
    }
    let tag = |mailbox: &Mailbox<'_>, owner: Rank| mailbox.tag(Kind::Restore, owner, Side::Above);
    let mut mine = Vec::new();
    let my_rows = layout.rows_of(me).expect("every member owns rows");
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
                let piece = Piece {
                    iteration: source.iteration,
                    rollbacks: state.rollbacks,
                    generations: source.first.iter().map(|p| p.1).collect(),
                    strip: piece,
                };
                mailbox.send(to, tag(mailbox, owner), piece.encode())?;
            }
        }
    }
    for (owner, rows) in source.layout.sources(my_rows) {
        let provider = providers[owner as usize];
        if provider == me {
            continue;
        }
        let bytes = mailbox.receive(provider, tag(mailbox, owner), &[provider])?;
        let piece = Piece::decode(&bytes)
            .filter(|p| p.iteration == source.iteration && p.strip.rows() == rows)
            .ok_or(Failed::Fatal(RecoveryError::Malformed { from: provider }))?;
        mine.push(piece.strip);
    }
    Strip::join(mine).map_err(|_| Failed::Fatal(RecoveryError::Malformed { from: me }))
}

/// A spare admitted into a rebuilt group (as rank `mailbox.me()`): receives its rows of
/// the last committed checkpoint from the rank holding them (a rebuild keeps the
/// layout, so they come as one piece, with what the recovery knows), and commits that
/// checkpoint with the group. Returns the recovery state, and where to resume, or the
/// failure that interrupted the joining (the recovery then goes on from the state:
/// its source is the checkpoint's group, read through this rank's own handle, which
/// gives the same holders, and which it never provides rows from).
pub fn join_as_replacement<'h>(
    mailbox: &mut Mailbox<'h>,
    layout: &Layout,
    checkpoints: &mut Checkpoints,
) -> Result<(State<'h>, Result<Resume, Interrupted>), RecoveryError> {
    let me = mailbox.me();
    let handle = mailbox.shared_handle();
    let (from, _, bytes) = match mailbox.receive_any(Kind::Restore) {
        Ok(received) => received,
        Err(cause @ (HaloError::NeighbourFailed(_) | HaloError::PeerFailed(_))) => {
            return Err(RecoveryError::Runtime(format!(
                "a failure before this replacement learned the checkpoint: {cause}"
            )))
        }
        Err(e) => return Err(RecoveryError::Runtime(e.to_string())),
    };
    let piece = Piece::decode(&bytes)
        .filter(|p| Some(p.strip.rows()) == layout.rows_of(me))
        .ok_or(RecoveryError::Malformed { from })?;
    let first = processes(&handle);
    let source_first: Vec<Process> = piece
        .generations
        .iter()
        .enumerate()
        .map(|(r, &g)| (r as Rank, g))
        .collect();
    let mut state = State {
        source: Source {
            handle: handle.clone(),
            first: source_first,
            layout: layout.clone(),
            iteration: piece.iteration,
        },
        first: first.clone(),
        dead: first.iter().filter(|p| p.1 > 0).map(|p| p.0).collect(),
        rollbacks: piece.rollbacks,
    };
    let resume = Resume {
        layout: layout.clone(),
        strip: piece.strip,
        start: piece.iteration,
    };
    match checkpoints.take(&handle, piece.iteration, &resume.strip) {
        Ok(_) => {
            state.source.first = first;
            state.rollbacks += 1;
            Ok((state, Ok(resume)))
        }
        Err(cause) => {
            let interrupted = Interrupted {
                iteration: piece.iteration,
                cause,
            };
            Ok((state, Err(interrupted)))
        }
    }
}
