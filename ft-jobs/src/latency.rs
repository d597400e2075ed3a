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
//! The raw phase runs on the crate's `raw` module: stack frames that arrive during it
//! (from a faster peer already in the stack phase) are kept and handed to the driver
//! when it starts (`Driver::deliver`), so none is lost.

use std::time::{Duration as StdDuration, Instant as WallInstant};

use serde_json::json;

use crate::raw::{Raw, PING, PONG};
use crate::{median, validate_once, Finished, JobArgs, Launch};

/// The latency job: prints `{"rank", "n", "reps", "median_us": {"raw_barrier",
/// "raw_round_trip", "validate_global"}, "validate_global_in": {"raw_barriers",
/// "raw_round_trips"}}` (the figures of interest are rank 0's). The job is
/// failure-free and needs ranks 0 and 1 (`JobCommand::check` refuses `--kill` and a
/// single rank).
pub fn latency<L: Launch>(launch: &L, args: &JobArgs, reps: u32) -> Result<Finished, String> {
    let (me, n) = (launch.rank(), launch.size());
    let mut raw = Raw::new(launch.connect()?, args.limit());
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
    use crate::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }
}
