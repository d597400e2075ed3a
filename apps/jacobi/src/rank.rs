//! One rank of a job from start to end: a working rank builds its strip of the
//! starting grid, runs the solver, hands each interruption to the recovery and
//! resumes where it says, and ends with [`finish`]; a spare waits for the end.
//!
//! Invariants: the layout starts as the working ranks `0..ranks` in order; a
//! `--kill` fires from the dying rank's own thread as it reaches the flag's iteration
//! ([`KillPlan::due`]), before that iteration's halos go out, and nothing of that
//! iteration leaves the rank after it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ft::{Event, Rank, Runtime, RuntimeError};

use crate::checkpoint::Checkpoints;
use crate::cli::Config;
use crate::halo::{HaloError, Handle, Kind, Mailbox, Tag};
use crate::kills::KillPlan;
use crate::layout::Layout;
use crate::recovery::{join_as_replacement, processes, recover, Process, Resume, Source, State};
use crate::solver::{finish, run_from, Hooks, Interrupted};
use crate::strip::{Side, Strip};

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

impl<'a, 'h> RankHooks<'a, 'h> {
    fn new(
        rank: Rank,
        incarnation: u32,
        config: &'a Config,
        handle: Handle<'h>,
        die: &'a (dyn Fn() + Sync),
        started: Instant,
    ) -> Self {
        RankHooks {
            rank,
            incarnation,
            kills: &config.kills,
            checkpoints: Checkpoints::every(config.checkpoint_every),
            handle,
            dead: BTreeSet::new(),
            die,
            interrupted_at: None,
            recoveries: Vec::new(),
            iteration_started: started,
            committed: None,
        }
    }
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
/// the way a crash does (for `--kill`). Under `--spares K` the last K ranks wait as
/// spares, and the others work in the group of the first ones.
pub fn run_rank(
    handle: &Runtime,
    config: &Config,
    die: &(dyn Fn() + Sync),
) -> Result<RankEnd, String> {
    let started = Instant::now();
    let mailbox = if config.spares > 0 {
        match handle
            .split_spares(config.spares)
            .map_err(|e| format!("splitting the spares off: {e}"))?
        {
            Some(team) => Mailbox::shared(Arc::new(team), started + config.limit),
            None => return wait_as_spare(handle, config, die, started),
        }
    } else {
        Mailbox::new(handle, started + config.limit)
    };
    let me = mailbox.me();
    let working: Vec<Rank> = (0..config.ranks).collect();
    let layout = Layout::even(config.grid, &working);
    let rows = layout.rows_of(me).expect("a working rank owns rows");
    let strip = Strip::initial(config.grid, rows);
    let first: Vec<Process> = working.iter().map(|&r| (r, 0)).collect();
    let state = State {
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
    let hooks = RankHooks::new(me, 0, config, mailbox.shared_handle(), die, started);
    let at = Resume {
        layout,
        strip,
        start: 0,
    };
    work(handle, mailbox, Ok(at), hooks, state, config, started)
}

/// A working rank from `at` to the job's end: the solver, each interruption handed to
/// the recovery, and the report at the reporting rank, which also tells the spares
/// still waiting on `world` that the job is over.
fn work<'h>(
    world: &Runtime,
    mut mailbox: Mailbox<'h>,
    at: Result<Resume, Interrupted>,
    mut hooks: RankHooks<'_, 'h>,
    mut state: State<'h>,
    config: &Config,
    started: Instant,
) -> Result<RankEnd, String> {
    // A replacement whose joining a failure interrupted recovers first.
    let (mut layout, mut strip, mut start, mut pending) = match at {
        Ok(at) => (at.layout, at.strip, at.start, None),
        Err(interrupted) => {
            let layout = state.source.layout.clone();
            let rows = layout.rows_of(mailbox.me()).expect("a member owns rows");
            let strip = Strip::initial(config.grid, rows);
            (layout, strip, state.source.iteration, Some(interrupted))
        }
    };
    let checksum = loop {
        let ended = match pending.take() {
            Some(interrupted) => Err(interrupted),
            None => run_from(
                &mut mailbox,
                &layout,
                &mut strip,
                start,
                config.iterations,
                &mut hooks,
            )
            .and_then(|()| finish(&mut mailbox, &layout, &strip, config.iterations, &[])),
        };
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
                let (rank, incarnation) = (hooks.rank, hooks.incarnation);
                let die = hooks.die;
                let kill = |iteration: u32, dead: &BTreeSet<Rank>| {
                    let dead: Vec<Rank> = dead.iter().copied().collect();
                    if config.kills.due(rank, incarnation, iteration, &dead) {
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
                .map_err(|e| format!("rank {}: {e}", mailbox.me()))?;
                hooks.handle = mailbox.shared_handle();
                hooks.dead.clone_from(&state.dead);
                (layout, strip, start) = (resume.layout, resume.strip, resume.start);
            }
        }
    };
    let Some(checksum) = checksum else {
        return Ok(RankEnd::Quiet);
    };
    // The spares still waiting end too (a dead or admitted one ignores it).
    let done = mailbox
        .tag(Kind::Done, config.iterations, Side::Above)
        .encode();
    let group = world.view().size();
    for spare in group.saturating_sub(config.spares)..group {
        let _ = world.send(spare, done, Vec::new());
    }
    let generations = processes(mailbox.handle())
        .into_iter()
        .filter(|p| p.1 > 0)
        .collect();
    Ok(RankEnd::Reported(Report {
        checksum,
        seconds: started.elapsed().as_secs_f64(),
        dead: state.dead.iter().copied().collect(),
        generations,
        rollbacks: state.rollbacks,
        checkpoints: hooks.checkpoints.taken(),
        recoveries: hooks.recoveries.iter().map(Duration::as_secs_f64).collect(),
        store: mailbox.handle().store_stats().unwrap_or_default(),
    }))
}

/// A spare's life: it waits on `world` until it is admitted into the rebuilt group
/// (then it joins the recovery under the rank it takes, and works to the end) or the
/// reporting rank says the job is over.
fn wait_as_spare(
    world: &Runtime,
    config: &Config,
    die: &(dyn Fn() + Sync),
    started: Instant,
) -> Result<RankEnd, String> {
    let me = world.view().rank();
    let deadline = started + config.limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match world.next_event(Some(left)) {
            Ok(Some(Event::Admitted { group, .. })) => {
                let handle = world
                    .admitted(group)
                    .map_err(|e| format!("spare rank {me}: {e}"))?
                    .ok_or_else(|| format!("spare rank {me}: the admission was taken"))?;
                return replace(world, Arc::new(handle), config, die, started);
            }
            Ok(Some(Event::Message { tag, .. }))
                if Tag::decode(tag).is_some_and(|t| t.kind == Kind::Done) =>
            {
                return Ok(RankEnd::Quiet);
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(format!(
                    "spare rank {me}: the job did not end within {:?}",
                    config.limit
                ))
            }
            Err(e) => return Err(format!("spare rank {me}: {e}")),
        }
    }
}

/// A spare admitted into `handle`'s group: it takes its rows and works to the end.
fn replace(
    world: &Runtime,
    handle: Arc<Runtime>,
    config: &Config,
    die: &(dyn Fn() + Sync),
    started: Instant,
) -> Result<RankEnd, String> {
    let mut mailbox = Mailbox::shared(handle, started + config.limit);
    let me = mailbox.me();
    let working: Vec<Rank> = (0..config.ranks).collect();
    let layout = Layout::even(config.grid, &working);
    let generation = processes(mailbox.handle())[me as usize].1;
    let mut hooks = RankHooks::new(
        me,
        generation,
        config,
        mailbox.shared_handle(),
        die,
        started,
    );
    let (state, at) = join_as_replacement(&mut mailbox, &layout, &mut hooks.checkpoints)
        .map_err(|e| format!("rank {me} (incarnation {generation}): {e}"))?;
    hooks.dead.clone_from(&state.dead);
    work(world, mailbox, at, hooks, state, config, started)
}
