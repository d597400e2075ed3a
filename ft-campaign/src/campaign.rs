//! A campaign: generate each run's job, write its plan file, run it on the backend
//! within the timeout, judge it, keep the logs of the runs that failed, and count.
//!
//! Log layout under the log directory: `run-<i>/` per failing run, holding `plan.json`
//! (broadcast jobs), `command` (the exact command line), `stdout`, `stderr`, `verdict`
//! (class, detail, job) and `replay` (the `ftcampaign` line that reruns it alone); the
//! directory of a run that passed is removed. `summary.json` holds the summary.
//!
//! A task-graph run (`--app taskgraph`) first asks `fttask -n N --owned WORKLOAD` for
//! the failure-free mapping (its kill points are drawn below it; `owned.stdout`,
//! `owned.stderr`) and, once per workload, runs it failure-free with `fttask --backend
//! sim -n N` (`sim.stdout`, `sim.stderr`) for the checksum every run of that workload
//! must end with.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend::{quote, App, Backend, CommandLine, Tools};
use crate::generate::{generate, generate_taskgraph, GenConfig, Job, Timing, Workload};
use crate::verdict::{judge, judge_taskgraph, last_json, Class, Outcome, Verdict};

/// Everything a campaign is run with.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// The backend.
    pub backend: Backend,
    /// The application whose jobs run.
    pub app: App,
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

    /// Stall runs: how many short, how many long.
    pub fn stall_runs(&self) -> (usize, usize) {
        let stalls = self.results.iter().filter_map(|r| r.job.stall());
        stalls.fold((0, 0), |(short, long), s| {
            if s.long {
                (short, long + 1)
            } else {
                (short + 1, long)
            }
        })
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
        let path = |p: &Path| quote(&p.display().to_string());
        let t = &self.tools;
        let tools = match (self.app, self.backend) {
            (App::Jobs, Backend::OfiTcp | Backend::OfiSockets) => {
                format!("--ftofi {}", path(&t.ftofi))
            }
            (App::Jobs, Backend::Mpi) => {
                format!("--ftmpi {} --mpiexec {}", path(&t.ftmpi), path(&t.mpiexec))
            }
            (App::Taskgraph, Backend::OfiTcp | Backend::OfiSockets) => {
                format!("--fttask {} --ftrun {}", path(&t.fttask), path(&t.ftrun))
            }
            (App::Taskgraph, Backend::Mpi) => format!(
                "--fttask {} --mpiexec {}",
                path(&t.fttask),
                path(&t.mpiexec)
            ),
        };
        format!(
            "{} --app {} --backend {} --seed {} --only {run} --ranks {}..{} --max-kills {} \
             --period-ms {} --timeout-ms {} --job-timeout-s {} {tools} --logs {}",
            quote(&exe),
            self.app,
            self.backend,
            self.seed,
            self.gen.ranks_min,
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
        let mut checksums = Checksums::new();
        for &run in &self.runs {
            let result = self.run_one(run, &mut checksums)?;
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

    /// Generates, runs and judges run `run`; keeps its logs if it failed. `checksums`
    /// holds the failure-free checksums of the task-graph workloads met so far.
    pub fn run_one(&self, run: u64, checksums: &mut Checksums) -> std::io::Result<RunResult> {
        let dir = self.logs.join(format!("run-{run}"));
        std::fs::create_dir_all(&dir)?;
        let dir = std::fs::canonicalize(&dir)?;
        let job = match self.app {
            App::Jobs => generate(self.seed, run, &self.gen, &self.timing),
            App::Taskgraph => {
                generate_taskgraph(self.seed, run, &self.gen, |w, n| self.owned(&dir, w, n))
                    .map_err(std::io::Error::other)?
            }
        };
        let plan_path = dir.join("plan.json");
        if let Some(plan) = job.plan() {
            std::fs::write(&plan_path, plan.to_json() + "\n")?;
        }
        let args = job.args(&plan_path.display().to_string(), &self.timing);
        let launcher_limit = self.job_timeout.as_secs() + 30;
        let command = CommandLine::new(
            self.backend,
            self.app,
            &self.tools,
            job.ranks,
            &args,
            launcher_limit,
        );
        let shell = command.shell();
        std::fs::write(dir.join("command"), shell.clone() + "\n")?;
        let reference = job
            .taskgraph()
            .map(|task| self.reference(&dir, &task.workload, job.ranks, checksums));
        let started = Instant::now();
        let verdict = match reference {
            Some(Err(why)) => Verdict::new(Class::Other, why),
            _ => {
                let outcome = command
                    .run(&dir.join("stdout"), &dir.join("stderr"), self.job_timeout)
                    .unwrap_or_else(|e| Outcome {
                        timed_out: false,
                        success: false,
                        status: format!("could not start {}: {e}", command.program.display()),
                        stdout: String::new(),
                        stderr: format!(
                            "error: could not start {}: {e}",
                            command.program.display()
                        ),
                    });
                match (job.taskgraph(), reference) {
                    (Some(task), Some(Ok(sum))) => judge_taskgraph(&job, task, &sum, &outcome),
                    _ => judge(&job, &outcome),
                }
            }
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

    /// `fttask -n N --owned WORKLOAD`: the tasks each rank owns failure-free (its output
    /// in `dir`).
    fn owned(&self, dir: &Path, workload: &Workload, n: u32) -> Result<Vec<u32>, String> {
        let mut args = vec!["-n".to_string(), n.to_string(), "--owned".into()];
        args.extend(workload.args());
        let line = self.fttask_line(dir, "owned", &args)?;
        serde_json::from_value(line["owned"].clone())
            .map_err(|e| format!("no owned counts in {line}: {e}"))
    }

    /// The checksum of `workload` run failure-free in the simulator on `n` ranks, from
    /// `checksums` or run now (its output in `dir`).
    fn reference(
        &self,
        dir: &Path,
        workload: &Workload,
        n: u32,
        checksums: &mut Checksums,
    ) -> Result<String, String> {
        let key = workload.key();
        if let Some(sum) = checksums.get(&key) {
            return Ok(sum.clone());
        }
        let mut args = vec!["--backend".to_string(), "sim".into(), "-n".into()];
        args.push(n.to_string());
        args.extend(workload.args());
        let line = self
            .fttask_line(dir, "sim", &args)
            .map_err(|e| format!("the failure-free simulator run failed: {e}"))?;
        let sum = line["checksum"]
            .as_str()
            .ok_or_else(|| format!("the failure-free simulator run gave no checksum: {line}"))?
            .to_string();
        checksums.insert(key, sum.clone());
        Ok(sum)
    }

    /// Runs `fttask ARGS` by itself (output into `dir/NAME.stdout` and `.stderr`,
    /// within the job timeout) and returns its last JSON line.
    fn fttask_line(&self, dir: &Path, name: &str, args: &[String]) -> Result<Value, String> {
        let command = CommandLine::fttask(&self.tools, args);
        let outcome = command
            .run(
                &dir.join(format!("{name}.stdout")),
                &dir.join(format!("{name}.stderr")),
                self.job_timeout,
            )
            .map_err(|e| format!("could not start {}: {e}", command.shell()))?;
        match last_json(&outcome.stdout, |_| true) {
            Some(line) if outcome.success => Ok(line),
            _ => Err(format!(
                "{} ({}): {}",
                command.shell(),
                outcome.status,
                outcome.stderr.lines().last().unwrap_or("")
            )),
        }
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
        let (short_stalls, long_stalls) = summary.stall_runs();
        let walls: Vec<f64> = summary
            .results
            .iter()
            .map(|r| r.wall.as_secs_f64())
            .collect();
        json!({
            "app": self.app.name(),
            "backend": self.backend.name(),
            "seed": self.seed,
            "runs": summary.results.len(),
            "ok": summary.count(Class::Ok),
            "hangs": summary.count(Class::Hang),
            "disagreements": summary.count(Class::Disagreement),
            "lost_outputs": summary.count(Class::LostOutputs),
            "other_failures": summary.count(Class::Other),
            "progress_stalls": summary.count(Class::Stall),
            "stall_runs": {"short": short_stalls, "long": long_stalls},
            "wall_s": round3(summary.wall.as_secs_f64()),
            "longest_run_s": round3(walls.iter().copied().fold(0.0, f64::max)),
            "settings": {
                "ranks_min": self.gen.ranks_min,
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
            "ftcampaign {}{} seed {}: {} runs{}, {} ok, {} hangs, {} disagreements, \
             {} lost outputs, {} other failures{}, wall time {:.1} s",
            match self.app {
                App::Jobs => String::new(),
                App::Taskgraph => "taskgraph ".into(),
            },
            self.backend,
            self.seed,
            summary.results.len(),
            match (self.app, summary.stall_runs()) {
                (App::Jobs, (short, long)) => {
                    format!(" ({} stall runs: {short} short, {long} long)", short + long)
                }
                (App::Taskgraph, _) => String::new(),
            },
            summary.count(Class::Ok),
            summary.count(Class::Hang),
            summary.count(Class::Disagreement),
            summary.count(Class::LostOutputs),
            summary.count(Class::Other),
            match self.app {
                App::Jobs => String::new(),
                App::Taskgraph => format!(", {} progress stalls", summary.count(Class::Stall)),
            },
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

/// The failure-free checksum of each task-graph workload met so far, by
/// [`Workload::key`].
pub type Checksums = BTreeMap<String, String>;

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_lines_name_the_app_the_ranks_and_the_programs() {
        let campaign = Campaign {
            backend: Backend::OfiTcp,
            app: App::Taskgraph,
            seed: 7,
            runs: vec![0],
            gen: GenConfig {
                ranks_min: 3,
                ranks_max: 5,
                max_kills: 2,
            },
            timing: Timing {
                period_ms: 50,
                timeout_ms: 1000,
                limit_s: 60,
            },
            job_timeout: Duration::from_secs(60),
            logs: "/l".into(),
            keep_all: false,
            tools: Tools {
                ftofi: "/t/ftofi".into(),
                ftmpi: "/t/ftmpi".into(),
                fttask: "/t/fttask".into(),
                ftrun: "/t/ftrun".into(),
                mpiexec: "/m/mpiexec".into(),
            },
        };
        let line = campaign.replay(4);
        assert!(
            line.contains(
                "--app taskgraph --backend ofi-tcp --seed 7 --only 4 --ranks 3..5 --max-kills 2"
            ),
            "{line}"
        );
        assert!(
            line.contains("--fttask /t/fttask --ftrun /t/ftrun --logs /l/replay"),
            "{line}"
        );
        let jobs = Campaign {
            app: App::Jobs,
            backend: Backend::Mpi,
            ..campaign
        };
        let line = jobs.replay(1);
        assert!(line.contains("--app jobs --backend mpi"), "{line}");
        assert!(
            line.contains("--ftmpi /t/ftmpi --mpiexec /m/mpiexec"),
            "{line}"
        );
        assert!(!line.contains("--ranks-max"), "{line}");
    }
}
