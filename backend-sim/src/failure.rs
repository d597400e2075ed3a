//! The failure layer ([`ft_core::node::Node`]) as a simulated rank, and the one-call
//! scenario runner `ftsim run` uses (which runs the whole stack, [`SimStack`], so
//! scenarios may broadcast too).

use std::time::Instant as WallInstant;

use ft_core::detector::DetectorConfig;
use ft_core::node::{Node, NodeEvent};
use ft_core::view::FailureView;
use ft_core::Instant;

use crate::engine::{Observation, RankSetup, Sim, SimError, SimRank};
use crate::report::Report;
use crate::scenario::{ActionKind, Scenario};
use crate::stack::SimStack;

/// The detector settings of a simulated rank.
pub fn detector_config(setup: &RankSetup) -> DetectorConfig {
    DetectorConfig {
        comm: setup.comm,
        n: setup.n,
        me: setup.rank,
        period: setup.period,
        timeout: setup.timeout,
        phase: setup.phase,
        span: setup.span,
    }
}

/// A failure-layer node for `setup`, started at time 0.
pub fn make_node(setup: &RankSetup) -> Node {
    Node::new(detector_config(setup), Instant::ZERO)
}

impl SimRank for Node {
    fn view(&self) -> &FailureView {
        Node::view(self)
    }

    fn is_stopped(&self) -> bool {
        Node::is_stopped(self)
    }

    fn supports(action: &ActionKind) -> Result<(), String> {
        match action {
            ActionKind::ValidateLocal | ActionKind::ValidateGlobal => Ok(()),
            other => Err(format!(
                "\"{}\" actions are not supported yet by this simulator build",
                other.name()
            )),
        }
    }

    fn apply(&mut self, now: Instant, action: &ActionKind, _index: u32) -> Result<(), String> {
        match action {
            ActionKind::ValidateLocal => self
                .validate_local(now)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            ActionKind::ValidateGlobal => self
                .validate_global(now)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            ActionKind::Broadcast(_) => Err("broadcast is not supported yet".into()),
        }
    }

    fn observe(&self, now: Instant, event: &NodeEvent) -> Option<Observation> {
        match *event {
            NodeEvent::Suspected { rank } => Some(Observation::Suspected { rank }),
            NodeEvent::Learned { rank, hops } => Some(Observation::Learned { rank, hops }),
            NodeEvent::LocalValidated(_) => Some(Observation::Validated {
                kind: "local",
                started: now,
                result: self.view().local().iter().collect(),
            }),
            NodeEvent::GlobalValidated { .. } => Some(Observation::Validated {
                kind: "global",
                started: now,
                result: self.view().global().iter().collect(),
            }),
            _ => None,
        }
    }
}

/// Options of a scenario run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Keep `per_rank` in the report.
    pub per_rank: bool,
    /// Show a progress bar on stderr once the run has taken more than two seconds.
    pub progress: bool,
    /// Cap on processed events (`None`: no cap).
    pub max_events: Option<u64>,
}

/// Runs `scenario` with the whole stack (failure layer and broadcaster) on every rank
/// and reports. Also returns the
/// wall time taken.
pub fn run_scenario(
    scenario: &Scenario,
    options: RunOptions,
) -> Result<(Report, std::time::Duration), SimError> {
    run_scenario_keeping_state(scenario, options).map(|(report, wall, _)| (report, wall))
}

/// [`run_scenario`], also handing back the finished simulator (a CLI about to exit may
/// `std::mem::forget` it rather than free millions of small allocations one by one).
pub fn run_scenario_keeping_state(
    scenario: &Scenario,
    options: RunOptions,
) -> Result<(Report, std::time::Duration, Sim<SimStack>), SimError> {
    let started = WallInstant::now();
    let mut sim: Sim<SimStack> = Sim::new(scenario, SimStack::factory(scenario))?;
    if let Some(max) = options.max_events {
        sim.set_event_budget(max);
    }
    let until_ms = sim.until().as_millis_f64();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let result = sim.run_to_end(|now| {
        if !options.progress {
            return;
        }
        let bar = match &bar {
            Some(b) => b,
            None if started.elapsed().as_secs_f64() > 2.0 => {
                let b = indicatif::ProgressBar::with_draw_target(
                    Some(until_ms.max(1.0) as u64),
                    indicatif::ProgressDrawTarget::stderr(),
                );
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:40}] {pos}/{len} simulated ms {msg}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.get_or_insert(b)
            }
            None => return,
        };
        bar.set_position(now.as_millis_f64() as u64);
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    result?;
    let report = Report::build(&sim, options.per_rank);
    Ok((report, started.elapsed(), sim))
}
