//! One rank of a job from start to end: a working rank builds its strip of the
//! starting grid, runs the solver, hands each interruption to the recovery and
//! resumes where it says, and ends with [`finish`]; a spare waits for the end.
//!
//! Invariants: the layout starts as the working ranks `0..ranks` in order; a
//! `--kill` fires from the dying rank's own thread as it reaches the flag's iteration
//! ([`KillPlan::due`]), before that iteration's halos go out, and nothing of that
//! iteration leaves the rank after it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ft::{Rank, Runtime, RuntimeError};

use crate::checkpoint::Checkpoints;
use crate::cli::Config;
use crate::halo::{HaloError, Kind, Mailbox};
use crate::kills::KillPlan;
use crate::layout::Layout;
use crate::recovery::recover;
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
}

/// How a rank ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RankEnd {
    /// The rank reports the job.
    Reported(Report),
    /// Another rank reports.
    Quiet,
}

/// The hooks of a working rank: its checkpoints, and its `--kill`.
struct RankHooks<'a> {
    /// The rank in the job's first numbering.
    rank: Rank,
    incarnation: u32,
    kills: &'a KillPlan,
    checkpoints: Checkpoints,
    /// The ranks reported failed, in the job's first numbering.
    failed: Vec<Rank>,
    die: &'a (dyn Fn() + Sync),
}

impl Hooks for RankHooks<'_> {
    fn before_iteration(&mut self, iteration: u32, strip: &Strip) -> Result<(), HaloError> {
        if self
            .kills
            .due(self.rank, self.incarnation, iteration, &self.failed)
        {
            (self.die)();
            return Err(HaloError::Runtime(RuntimeError::Stopped(format!(
                "rank {} killed at iteration {iteration} (--kill)",
                self.rank
            ))));
        }
        if self.checkpoints.due(iteration) {
            self.checkpoints.take(iteration, strip);
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
        return wait_as_spare(&mut mailbox, config.limit);
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
        failed: Vec::new(),
        die,
    };
    let (mut start, mut rollbacks) = (0, 0);
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
        match ended {
            Ok(checksum) => break checksum,
            Err(interrupted) => {
                hooks.failed = mailbox.failed().to_vec();
                let resume = recover(
                    &mut mailbox,
                    config.mode,
                    &layout,
                    &hooks.checkpoints,
                    interrupted,
                )
                .map_err(|e| format!("rank {me}: {e}"))?;
                (layout, strip, start) = (resume.layout, resume.strip, resume.start);
                rollbacks += 1;
            }
        }
    };
    let Some(checksum) = checksum else {
        return Ok(RankEnd::Quiet);
    };
    let mut dead = mailbox.failed().to_vec();
    dead.sort_unstable();
    Ok(RankEnd::Reported(Report {
        checksum,
        seconds: started.elapsed().as_secs_f64(),
        dead,
        generations: BTreeMap::new(),
        rollbacks,
        checkpoints: hooks.checkpoints.taken(),
    }))
}

/// A spare's life until a recovery gives it work: it waits for the job's end, through
/// failures of other ranks.
fn wait_as_spare(mailbox: &mut Mailbox<'_>, limit: Duration) -> Result<RankEnd, String> {
    let me = mailbox.me();
    loop {
        match mailbox.receive_any(Kind::Done) {
            Ok(_) => return Ok(RankEnd::Quiet),
            Err(HaloError::PeerFailed(_) | HaloError::NeighbourFailed(_)) => {}
            Err(HaloError::TimedOut { .. }) => {
                return Err(format!(
                    "spare rank {me}: the job did not end within {limit:?}"
                ))
            }
            Err(e) => return Err(format!("spare rank {me}: {e}")),
        }
    }
}
