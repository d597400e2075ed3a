//! The latency job: what `validate_global` costs next to the plainest synchronization
//! the same transport can do, measured in the same run, so the report is a ratio that
//! holds across machines and loads.
//!
//! 1. **Raw phase**, before the stack exists, on the bare transport: `reps` dissemination
//!    barriers (`⌈log2 n⌉` rounds; in round `k` rank `i` sends to `i + 2^k` and waits
//!    for `i - 2^k`, mod `n`), then `reps` round trips between ranks 0 and 1, then one
//!    more barrier so that every rank leaves the raw phase together.
//! 2. **Stack phase**: the transport goes to an `ft_runtime::Driver` and the rank runs `reps` global
//!    validations back to back (each is itself a collective, so the next starts from a
//!    common point).
//!
//! Raw frames start with [`MAGIC`]; a stack frame that arrives during the raw phase
//! (from a faster peer already in the stack phase) is kept and handed to the driver
//! when it starts (`Driver::deliver`), so none is lost.

use std::collections::HashMap;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_core::Rank;
use ft_runtime::{Received, Transport};
use serde_json::json;

use crate::{median, validate_once, Finished, JobArgs, Launch};

/// The first bytes of every raw-phase frame (no stack frame starts so: its first byte
/// is the wire version).
pub const MAGIC: [u8; 4] = *b"\xFFlat";

/// Frame kinds of the raw phase.
const BARRIER: u8 = 1;
const PING: u8 = 2;
const PONG: u8 = 3;

/// A raw-phase frame: `MAGIC`, kind, repetition, round.
fn raw_frame(kind: u8, rep: u32, round: u8) -> [u8; 10] {
    let mut f = [0u8; 10];
    f[..4].copy_from_slice(&MAGIC);
    f[4] = kind;
    f[5..9].copy_from_slice(&rep.to_le_bytes());
    f[9] = round;
    f
}

/// The kind, repetition and round of a raw-phase frame; `None` for any other frame.
fn parse_raw(bytes: &[u8]) -> Option<(u8, u32, u8)> {
    if bytes.len() != 10 || bytes[..4] != MAGIC {
        return None;
    }
    let rep = u32::from_le_bytes(bytes[5..9].try_into().ok()?);
    Some((bytes[4], rep, bytes[9]))
}

/// The bare transport during the raw phase, with what arrived early.
struct Raw<T: Transport> {
    transport: T,
    /// Raw frames received and not consumed yet: (kind, rep, round, from) -> count.
    arrived: HashMap<(u8, u32, u8, Rank), u32>,
    /// Stack frames that came during the raw phase, for the driver.
    early: Vec<(Rank, Vec<u8>)>,
    limit: StdDuration,
}

impl<T: Transport> Raw<T> {
    fn send(&mut self, to: Rank, kind: u8, rep: u32, round: u8) -> Result<(), String> {
        self.transport
            .send(to, &raw_frame(kind, rep, round))
            .map_err(|e| e.to_string())
    }

    /// Waits for raw frame `(kind, rep, round)` from `from`.
    fn expect(&mut self, kind: u8, rep: u32, round: u8, from: Rank) -> Result<(), String> {
        let key = (kind, rep, round, from);
        let start = WallInstant::now();
        loop {
            if let Some(count) = self.arrived.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.arrived.remove(&key);
                }
                return Ok(());
            }
            if start.elapsed() > self.limit {
                return Err(format!(
                    "raw phase: no frame {kind}/{rep}/{round} from rank {from}"
                ));
            }
            self.transport.progress().map_err(|e| e.to_string())?;
            match self.transport.try_recv().map_err(|e| e.to_string())? {
                Some(Received::Frame { from, bytes }) => match parse_raw(bytes) {
                    Some((kind, rep, round)) => {
                        *self.arrived.entry((kind, rep, round, from)).or_default() += 1;
                    }
                    None => self.early.push((from, bytes.to_vec())),
                },
                Some(Received::Oversized { .. }) => {}
                // Spin, yielding the CPU: latency as MPI's own loops measure it, while
                // ranks oversubscribed on few cores still take turns (as the driver's
                // spin window does).
                None => std::thread::yield_now(),
            }
        }
    }

    /// One dissemination barrier, repetition `rep`.
    fn barrier(&mut self, rep: u32) -> Result<(), String> {
        let (me, n) = (self.transport.rank(), self.transport.size());
        let mut step = 1u32;
        let mut round = 0u8;
        while step < n {
            self.send((me + step) % n, BARRIER, rep, round)?;
            self.expect(BARRIER, rep, round, (me + n - step) % n)?;
            step *= 2;
            round += 1;
        }
        Ok(())
    }
}

/// The latency job: prints `{"rank", "n", "reps", "median_us": {"raw_barrier",
/// "raw_round_trip", "validate_global"}, "validate_global_in": {"raw_barriers",
/// "raw_round_trips"}}` (the figures of interest are rank 0's). The job is
/// failure-free and needs ranks 0 and 1 (`JobCommand::check` refuses `--kill` and a
/// single rank).
pub fn latency<L: Launch>(launch: &L, args: &JobArgs, reps: u32) -> Result<Finished, String> {
    let (me, n) = (launch.rank(), launch.size());
    let mut raw = Raw {
        transport: launch.connect()?,
        arrived: HashMap::new(),
        early: Vec::new(),
        limit: args.limit(),
    };
    let micros = |since: WallInstant| since.elapsed().as_secs_f64() * 1e6;
    let mut barrier = Vec::with_capacity(reps as usize);
    for rep in 0..reps {
        let since = WallInstant::now();
        raw.barrier(rep)?;
        barrier.push(micros(since));
    }
    let mut round_trip = Vec::with_capacity(reps as usize);
    if n >= 2 && me < 2 {
        for rep in 0..reps {
            let since = WallInstant::now();
            if me == 0 {
                raw.send(1, PING, rep, 0)?;
                raw.expect(PONG, rep, 0, 1)?;
            } else {
                raw.expect(PING, rep, 0, 0)?;
                raw.send(0, PONG, rep, 0)?;
            }
            round_trip.push(micros(since));
        }
    }
    raw.barrier(reps)?;

    let mut driver = crate::drive(raw.transport, me, n, args);
    for (from, bytes) in std::mem::take(&mut raw.early) {
        driver.deliver(from, &bytes).map_err(|e| e.to_string())?;
    }
    let mut validate = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        let since = WallInstant::now();
        validate_once(&mut driver, args.limit())?;
        validate.push(micros(since));
    }
    driver
        .run_for(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let [barrier, round_trip, validate] = [barrier, round_trip, validate].map(median);
    let per = |base: Option<f64>| Some(validate? / base?);
    let line = json!({
        "rank": me,
        "n": n,
        "reps": reps,
        "median_us": {
            "raw_barrier": barrier,
            "raw_round_trip": round_trip,
            "validate_global": validate,
        },
        "validate_global_in": {
            "raw_barriers": per(barrier),
            "raw_round_trips": per(round_trip),
        },
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: crate::saw_failure(&driver),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_frames_round_trip_and_stack_frames_are_not_raw() {
        let f = raw_frame(PING, 70_000, 3);
        assert_eq!(parse_raw(&f), Some((PING, 70_000, 3)));
        assert_eq!(parse_raw(&f[..9]), None);
        let mut stack = vec![ft_core::wire::VERSION];
        stack.extend_from_slice(&f[1..]);
        assert_eq!(parse_raw(&stack), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }
}
