//! One rank of a job from start to end: a working rank builds its strip of the
//! starting grid, runs the solver, hands each interruption to the recovery and
//! resumes where it says, and ends with [`finish`]; a spare waits for the end.
//!
//! Invariants: the layout starts as the working ranks `0..ranks` in order; a
//! `--kill` fires from the dying rank's own thread as it reaches the flag's iteration
//! ([`KillPlan::due`]), before that iteration's halos go out, and nothing of that
//! iteration leaves the rank after it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ft::{Rank, Runtime, RuntimeError};

use crate::checkpoint::Checkpoints;
use crate::cli::Config;
use crate::halo::{HaloError, Handle, Kind, Mailbox};
use crate::kills::KillPlan;
use crate::layout::Layout;
use crate::recovery::{recover, Source, State};
use crate::solver::{finish, run_from, Hooks};
use crate::strip::Strip;

/// What the reporting rank tells of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The final grid's checksum ([`crate::checksum`]).
    pub checksum: String,
    /// From the rank's start to the checksum, in seconds.
    pub seconds: f64,
    /// The ranks that failed, in the job's first numbering.
    pub dead: Vec<Rank>,
    /// The incarnation of every rank replaced, in the job's first numbering.
    pub generations: BTreeMap<Rank, u32>,
    /// Rollbacks to a checkpoint.
    pub rollbacks: u32,
    /// Checkpoints this rank took, and their bytes.
    pub checkpoints: (u64, u64),
    /// Each recovery's time at this rank, in seconds: from the start of the iteration
    /// a failure interrupted to the solver's return to it.
    pub recoveries: Vec<f64>,
    /// What this rank's store (of the group it ended in) holds and sent.
    pub store: ft::StoreStats,
}

/// How a rank ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RankEnd {
    /// The rank reports the job.
    Reported(Report),
    /// Another rank reports.
    Quiet,
}

/// The hooks of a working rank: its checkpoints, its `--kill`, and the clock of its
/// recoveries.
struct RankHooks<'a, 'h> {
    /// The rank in the job's first numbering.
    rank: Rank,
    incarnation: u32,
    kills: &'a KillPlan,
    checkpoints: Checkpoints,
    /// The handle checkpoints go through (the mailbox's).
    handle: Handle<'h>,
    /// The ranks that failed, in the job's first numbering.
    dead: BTreeSet<Rank>,
    die: &'a (dyn Fn() + Sync),
    /// When this rank first started each iteration a failure interrupted, until it is
    /// back there: (iteration, instant).
    interrupted_at: Option<(u32, Instant)>,
    /// From each interruption's iteration start to the solver's return there.
    recoveries: Vec<Duration>,
    /// When the iteration under way started.
    iteration_started: Instant,
    /// A checkpoint committed at the iteration under way: the recovery's new source.
    committed: Option<u32>,
}

impl Hooks for RankHooks<'_, '_> {
    fn before_iteration(&mut self, iteration: u32, strip: &Strip) -> Result<(), HaloError> {
        if let Some((at, since)) = self.interrupted_at {
            if iteration == at {
                self.recoveries.push(since.elapsed());
                self.interrupted_at = None;
            }
        }
        self.iteration_started = Instant::now();
        let dead: Vec<Rank> = self.dead.iter().copied().collect();
        if self
            .kills
            .due(self.rank, self.incarnation, iteration, &dead)
        {
            (self.die)();
            return Err(HaloError::Runtime(RuntimeError::Stopped(format!(
                "rank {} killed at iteration {iteration} (--kill)",
                self.rank
            ))));
        }
        if self.checkpoints.due(iteration) {
            self.checkpoints.take(&self.handle, iteration, strip)?;
            self.committed = Some(iteration);
        }
        Ok(())
    }
}

/// Runs rank `handle` of the job `config` describes to its end. `die` ends this rank
/// the way a crash does (for `--kill`).
pub fn run_rank(
    handle: &Runtime,
    config: &Config,
    die: &(dyn Fn() + Sync),
) -> Result<RankEnd, String> {
    let started = Instant::now();
    let mut mailbox = Mailbox::new(handle, started + config.limit);
    let me = mailbox.me();
    if me >= config.ranks {
        return wait_as_spare(&mut mailbox, config);
    }
    let working: Vec<Rank> = (0..config.ranks).collect();
    let spares: Vec<Rank> = (config.ranks..config.ranks + config.spares).collect();
    let mut layout = Layout::even(config.grid, &working);
    let rows = layout.rows_of(me).expect("a working rank owns rows");
    let mut strip = Strip::initial(config.grid, rows);
    let mut hooks = RankHooks {
        rank: me,
        incarnation: 0,
        kills: &config.kills,
        checkpoints: Checkpoints::every(config.checkpoint_every),
        handle: mailbox.shared_handle(),
        dead: BTreeSet::new(),
        die,
        interrupted_at: None,
        recoveries: Vec::new(),
        iteration_started: started,
        committed: None,
    };
    let first: Vec<Rank> = (0..config.ranks + config.spares).collect();
    let mut state = State {
        source: Source {
            handle: mailbox.shared_handle(),
            first: first.clone(),
            layout: layout.clone(),
            iteration: 0,
        },
        first,
        dead: BTreeSet::new(),
        rollbacks: 0,
    };
    let mut start = 0;
    let checksum = loop {
        let ended = run_from(
            &mut mailbox,
            &layout,
            &mut strip,
            start,
            config.iterations,
            &mut hooks,
        )
        .and_then(|()| finish(&mut mailbox, &layout, &strip, config.iterations, &spares));
        // A checkpoint the solver committed is where the next recovery starts from.
        if let Some(iteration) = hooks.committed.take() {
            state.source = Source {
                handle: hooks.handle.clone(),
                first: state.first.clone(),
                layout: layout.clone(),
                iteration,
            };
        }
        match ended {
            Ok(checksum) => break checksum,
            Err(interrupted) => {
                if hooks.interrupted_at.is_none() {
                    hooks.interrupted_at = Some((interrupted.iteration, hooks.iteration_started));
                }
                let kill = |iteration: u32, dead: &BTreeSet<Rank>| {
                    let dead: Vec<Rank> = dead.iter().copied().collect();
                    if config.kills.due(me, 0, iteration, &dead) {
                        die();
                    }
                };
                let resume = recover(
                    &mut mailbox,
                    config.mode,
                    &mut state,
                    &mut hooks.checkpoints,
                    interrupted,
                    &mut { kill },
                )
                .map_err(|e| format!("rank {me}: {e}"))?;
                hooks.handle = mailbox.shared_handle();
                hooks.dead.clone_from(&state.dead);
                (layout, strip, start) = (resume.layout, resume.strip, resume.start);
            }
        }
    };
    let Some(checksum) = checksum else {
        return Ok(RankEnd::Quiet);
    };
    Ok(RankEnd::Reported(Report {
        checksum,
        seconds: started.elapsed().as_secs_f64(),
        dead: state.dead.iter().copied().collect(),
        generations: BTreeMap::new(),
        rollbacks: state.rollbacks,
        checkpoints: hooks.checkpoints.taken(),
        recoveries: hooks.recoveries.iter().map(Duration::as_secs_f64).collect(),
        store: mailbox.handle().store_stats().unwrap_or_default(),
    }))
}

/// A spare's life until a recovery gives it work: it takes part in the group's
/// checkpoint commits (collective: it puts nothing), then waits for the job's end.
fn wait_as_spare(mailbox: &mut Mailbox<'_>, config: &Config) -> Result<RankEnd, String> {
    let me = mailbox.me();
    let every = config.checkpoint_every as usize;
    for iteration in (0..config.iterations).step_by(every) {
        let commit = mailbox
            .handle()
            .store_commit(u64::from(iteration))
            .map_err(|e| format!("spare rank {me}: {e}"))?;
        if !commit.committed {
            return Err(format!(
                "spare rank {me}: ranks failed; --mode rebuild does not replace ranks yet"
            ));
        }
    }
    loop {
        match mailbox.receive_any(Kind::Done) {
            Ok(_) => return Ok(RankEnd::Quiet),
            Err(HaloError::PeerFailed(_) | HaloError::NeighbourFailed(_)) => {}
            Err(HaloError::TimedOut { .. }) => {
                return Err(format!(
                    "spare rank {me}: the job did not end within {:?}",
                    config.limit
                ))
            }
            Err(e) => return Err(format!("spare rank {me}: {e}")),
        }
    }
}
