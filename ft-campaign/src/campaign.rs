//! A campaign: generate each run's job, write its plan file, run it on the backend
//! within the timeout, judge it, keep the logs of the runs that failed, and count.
//!
//! Log layout under the log directory: `run-<i>/` per failing run, holding `plan.json`
//! (broadcast jobs), `command` (the exact command line), `stdout`, `stderr`, `verdict`
//! (class, detail, job) and `replay` (the `ftcampaign` line that reruns it alone); the
//! directory of a run that passed is removed. `summary.json` holds the summary.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend::{quote, Backend, CommandLine, Tools};
use crate::generate::{generate, GenConfig, Job, Timing};
use crate::verdict::{judge, Class, Outcome, Verdict};

/// Everything a campaign is run with.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// The backend.
    pub backend: Backend,
    /// The seed of every run's generator.
    pub seed: u64,
    /// The run indices to run.
    pub runs: Vec<u64>,
    /// The generator's knobs.
    pub gen: GenConfig,
    /// Detector and step limits given to every job.
    pub timing: Timing,
    /// The longest one job may run.
    pub job_timeout: Duration,
    /// Where failing runs' logs go.
    pub logs: PathBuf,
    /// Keep the logs of the runs that passed too.
    pub keep_all: bool,
    /// Where the programs are.
    pub tools: Tools,
}

/// One run's result.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The job.
    pub job: Job,
    /// How it was judged.
    pub verdict: Verdict,
    /// How long it took.
    pub wall: Duration,
    /// The command that ran it.
    pub command: String,
    /// Where its logs are, if kept.
    pub logs: Option<PathBuf>,
}

/// What a campaign came to.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Every run, in order.
    pub results: Vec<RunResult>,
    /// The campaign's wall time.
    pub wall: Duration,
}

impl Summary {
    /// Runs of class `class`.
    pub fn count(&self, class: Class) -> usize {
        self.results
            .iter()
            .filter(|r| r.verdict.class == class)
            .count()
    }

    /// Whether every run passed.
    pub fn passed(&self) -> bool {
        self.count(Class::Ok) == self.results.len()
    }
}

impl Campaign {
    /// The `ftcampaign` line that reruns run `run` alone, with this campaign's settings
    /// and programs.
    pub fn replay(&self, run: u64) -> String {
        let exe = std::env::current_exe().map_or("ftcampaign".into(), |p| p.display().to_string());
        let tools = match self.backend {
            Backend::OfiTcp | Backend::OfiSockets => {
                format!("--ftofi {}", quote(&self.tools.ftofi.display().to_string()))
            }
            Backend::Mpi => format!(
                "--ftmpi {} --mpiexec {}",
                quote(&self.tools.ftmpi.display().to_string()),
                quote(&self.tools.mpiexec.display().to_string())
            ),
        };
        format!(
            "{} --backend {} --seed {} --only {run} --ranks-max {} --max-kills {} \
             --period-ms {} --timeout-ms {} --job-timeout-s {} {tools} --logs {}",
            quote(&exe),
            self.backend,
            self.seed,
            self.gen.ranks_max,
            self.gen.max_kills,
            self.timing.period_ms,
            self.timing.timeout_ms,
            self.job_timeout.as_secs(),
            quote(&self.logs.join("replay").display().to_string()),
        )
    }

    /// Runs every run in turn; `progress` hears of each as it ends.
    pub fn run(&self, mut progress: impl FnMut(&RunResult)) -> std::io::Result<Summary> {
        std::fs::create_dir_all(&self.logs)?;
        let started = Instant::now();
        let mut summary = Summary::default();
        for &run in &self.runs {
            let result = self.run_one(run)?;
            progress(&result);
            summary.results.push(result);
        }
        summary.wall = started.elapsed();
        std::fs::write(
            self.logs.join("summary.json"),
            self.summary_json(&summary).to_string() + "\n",
        )?;
        Ok(summary)
    }

    /// Generates, runs and judges run `run`; keeps its logs if it failed.
    pub fn run_one(&self, run: u64) -> std::io::Result<RunResult> {
        let job = generate(self.seed, run, &self.gen);
        let dir = self.logs.join(format!("run-{run}"));
        std::fs::create_dir_all(&dir)?;
        let dir = std::fs::canonicalize(&dir)?;
        let plan_path = dir.join("plan.json");
        if let Some(plan) = job.plan() {
            std::fs::write(&plan_path, plan.to_json() + "\n")?;
        }
        let args = job.args(&plan_path.display().to_string(), &self.timing);
        let launcher_limit = self.job_timeout.as_secs() + 30;
        let command = CommandLine::new(self.backend, &self.tools, job.ranks, &args, launcher_limit);
        let shell = command.shell();
        std::fs::write(dir.join("command"), shell.clone() + "\n")?;
        let started = Instant::now();
        let verdict = match command.run(&dir.join("stdout"), &dir.join("stderr"), self.job_timeout)
        {
            Ok(outcome) => judge(&job, &outcome),
            Err(e) => judge(
                &job,
                &Outcome {
                    timed_out: false,
                    success: false,
                    status: format!("could not start {}: {e}", command.program.display()),
                    stdout: String::new(),
                    stderr: format!("error: could not start {}: {e}", command.program.display()),
                },
            ),
        };
        let wall = started.elapsed();
        let keep = self.keep_all || verdict.class != Class::Ok;
        if keep {
            let mut file = std::fs::File::create(dir.join("verdict"))?;
            writeln!(file, "{}: {}", verdict.class, verdict.detail)?;
            writeln!(file, "seed {} run {run}: {}", self.seed, job.describe())?;
            std::fs::write(dir.join("replay"), self.replay(run) + "\n")?;
        } else {
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(RunResult {
            job,
            verdict,
            wall,
            command: shell,
            logs: keep.then_some(dir),
        })
    }

    /// The summary as one JSON object.
    pub fn summary_json(&self, summary: &Summary) -> Value {
        let failures: Vec<Value> = summary
            .results
            .iter()
            .filter(|r| r.verdict.class != Class::Ok)
            .map(|r| {
                json!({
                    "run": r.job.run,
                    "class": r.verdict.class.name(),
                    "detail": r.verdict.detail,
                    "job": r.job.describe(),
                    "command": r.command,
                    "logs": r.logs.as_ref().map(|p| p.display().to_string()),
                    "replay": self.replay(r.job.run),
                })
            })
            .collect();
        let walls: Vec<f64> = summary
            .results
            .iter()
            .map(|r| r.wall.as_secs_f64())
            .collect();
        json!({
            "backend": self.backend.name(),
            "seed": self.seed,
            "runs": summary.results.len(),
            "ok": summary.count(Class::Ok),
            "hangs": summary.count(Class::Hang),
            "disagreements": summary.count(Class::Disagreement),
            "lost_outputs": summary.count(Class::LostOutputs),
            "other_failures": summary.count(Class::Other),
            "wall_s": round3(summary.wall.as_secs_f64()),
            "longest_run_s": round3(walls.iter().copied().fold(0.0, f64::max)),
            "settings": {
                "ranks_max": self.gen.ranks_max,
                "max_kills": self.gen.max_kills,
                "period_ms": self.timing.period_ms,
                "timeout_ms": self.timing.timeout_ms,
                "job_timeout_s": self.job_timeout.as_secs(),
            },
            "logs": self.logs.display().to_string(),
            "failures": failures,
        })
    }

    /// The summary as readable text.
    pub fn summary_text(&self, summary: &Summary) -> String {
        let mut text = format!(
            "ftcampaign {} seed {}: {} runs, {} ok, {} hangs, {} disagreements, \
             {} lost outputs, {} other failures, wall time {:.1} s",
            self.backend,
            self.seed,
            summary.results.len(),
            summary.count(Class::Ok),
            summary.count(Class::Hang),
            summary.count(Class::Disagreement),
            summary.count(Class::LostOutputs),
            summary.count(Class::Other),
            summary.wall.as_secs_f64(),
        );
        for r in summary
            .results
            .iter()
            .filter(|r| r.verdict.class != Class::Ok)
        {
            text.push_str(&format!(
                "\n  run {} {}: {}\n    job: {}\n    logs: {}\n    replay: {}",
                r.job.run,
                r.verdict.class,
                r.verdict.detail,
                r.job.describe(),
                r.logs
                    .as_deref()
                    .map_or("-".into(), |p: &Path| p.display().to_string()),
                self.replay(r.job.run),
            ));
        }
        text
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
