//! How a rank ended, what that means for the job ([`Policy`], [`Verdict`]), and how the
//! job ended ([`Report`]).

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use crate::Rank;

/// How a rank's process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exit {
    /// It exited with this status (0 is success).
    Status(i32),
    /// A signal killed it.
    Signal(i32),
    /// Waiting for it failed (the error, in words); how it ended is unknown.
    Unknown(String),
}

impl Exit {
    pub(crate) fn from_wait(status: std::io::Result<ExitStatus>) -> Self {
        match status {
            Ok(status) => match (status.signal(), status.code()) {
                (Some(signal), _) => Exit::Signal(signal),
                (None, Some(code)) => Exit::Status(code),
                (None, None) => Exit::Unknown(format!("ended without a status ({status})")),
            },
            Err(e) => Exit::Unknown(format!("could not be waited for: {e}")),
        }
    }

    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        *self == Exit::Status(0)
    }

    /// The signal that killed it, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self {
            Exit::Signal(signal) => Some(*signal),
            _ => None,
        }
    }

    /// A launcher's exit status that passes this rank's failure on: its own status when
    /// that is 1..=255, else 1.
    pub fn failure_code(&self) -> u8 {
        match self {
            Exit::Status(code @ 1..=255) => *code as u8,
            _ => 1,
        }
    }
}

/// How it ended, as the end of a sentence that starts with the rank: "exited with
/// status 3", "was killed by signal 9".
impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Status(code) => write!(f, "exited with status {code}"),
            Exit::Signal(signal) => write!(f, "was killed by signal {signal}"),
            Exit::Unknown(why) => f.write_str(why),
        }
    }
}

/// What a rank's end means for the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The job goes on (and succeeds if every rank ends so).
    Continue,
    /// The job fails: the other ranks are stopped at once. The reason is for a person
    /// (the launcher prints it).
    Stop(String),
}

/// The rule that judges each rank's end, in the order the ends are seen; it may also
/// say something about an end it lets pass (it runs on the launcher's thread).
pub trait Policy {
    /// What `rank` ending as `exit` means for the job.
    fn judge(&mut self, rank: Rank, exit: &Exit) -> Verdict;
}

impl<F: FnMut(Rank, &Exit) -> Verdict> Policy for F {
    fn judge(&mut self, rank: Rank, exit: &Exit) -> Verdict {
        self(rank, exit)
    }
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Every rank ended and the policy let every end pass.
    Completed,
    /// The policy stopped the job at `rank`'s end, for `reason`; the other ranks were
    /// killed.
    Stopped {
        /// The rank whose end stopped the job.
        rank: Rank,
        /// The policy's reason.
        reason: String,
    },
    /// The job ran past its limit and was killed.
    TimedOut {
        /// The limit ([`crate::Job::job_limit`]).
        limit: Duration,
    },
    /// The launcher received this signal (`SIGINT`, `SIGTERM`) and passed it on to
    /// the ranks; those still running a few seconds later were killed.
    Interrupted {
        /// The signal.
        signal: i32,
    },
}

/// How the job ended, in words: the policy's reason, the limit it ran past, the
/// signal it got; "every rank ended" when it completed.
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Completed => f.write_str("every rank ended"),
            Outcome::Stopped { reason, .. } => f.write_str(reason),
            Outcome::TimedOut { limit } => {
                write!(f, "the job ran past {} s and was killed", limit.as_secs())
            }
            Outcome::Interrupted { signal } => {
                write!(f, "interrupted by signal {signal}; the ranks were stopped")
            }
        }
    }
}

/// What one rank left behind.
#[derive(Clone, Debug)]
pub struct RankReport {
    /// Its rank.
    pub rank: Rank,
    /// How it ended; `None` if it was not seen ending before the job returned.
    pub exit: Option<Exit>,
    /// Its whole standard output under [`crate::Output::Captured`]; empty otherwise.
    pub stdout: Vec<u8>,
}

/// How a job ended and what each rank left behind.
#[derive(Clone, Debug)]
pub struct Report {
    /// How the job ended.
    pub outcome: Outcome,
    /// Every rank, in rank order.
    pub ranks: Vec<RankReport>,
}

impl Report {
    /// The exit of `rank`, if it was seen.
    pub fn exit(&self, rank: Rank) -> Option<&Exit> {
        self.ranks.get(rank as usize).and_then(|r| r.exit.as_ref())
    }
}
