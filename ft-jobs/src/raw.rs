//! The bare transport before a driver takes it: what the timing jobs ([`latency`] and
//! [`bench_bcast`]) measure the stack against.
//!
//! Two kinds of raw frame, told apart from stack frames (whose first byte is the wire
//! version) by their first four bytes: control frames ([`MAGIC`]: a dissemination
//! barrier, a ping, a pong; exactly 10 bytes) and bulk-data frames ([`DATA_MAGIC`]:
//! header and payload bytes of the two-sided broadcast baseline). Whatever arrives while
//! a rank waits for something else is kept: control frames counted by key, data frames
//! queued in order, and stack frames (from a faster peer already in its stack phase)
//! kept for the driver (`Driver::deliver`), so none is lost.
//!
//! [`latency`]: crate::latency
//! [`bench_bcast`]: crate::bench_bcast

use std::collections::{HashMap, VecDeque};
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_core::Rank;
use ft_runtime::{Received, Transport};

/// The first bytes of every raw control frame (no stack frame starts so: its first
/// byte is the wire version).
pub const MAGIC: [u8; 4] = *b"\xFFlat";

/// The first bytes of every raw bulk-data frame.
pub const DATA_MAGIC: [u8; 4] = *b"\xFFbcd";

/// Control frame kinds.
pub(crate) const BARRIER: u8 = 1;
pub(crate) const PING: u8 = 2;
pub(crate) const PONG: u8 = 3;

/// A control frame: `MAGIC`, kind, tag (a repetition), round.
pub(crate) fn raw_frame(kind: u8, tag: u32, round: u8) -> [u8; 10] {
    let mut f = [0u8; 10];
    f[..4].copy_from_slice(&MAGIC);
    f[4] = kind;
    f[5..9].copy_from_slice(&tag.to_le_bytes());
    f[9] = round;
    f
}

/// The kind, tag and round of a control frame; `None` for any other frame.
pub(crate) fn parse_raw(bytes: &[u8]) -> Option<(u8, u32, u8)> {
    if bytes.len() != 10 || bytes[..4] != MAGIC {
        return None;
    }
    let tag = u32::from_le_bytes(bytes[5..9].try_into().ok()?);
    Some((bytes[4], tag, bytes[9]))
}

/// The bare transport of one rank, with what arrived early.
pub(crate) struct Raw<T: Transport> {
    pub(crate) transport: T,
    /// Control frames received and not consumed yet: (kind, tag, round, from) -> count.
    arrived: HashMap<(u8, u32, u8, Rank), u32>,
    /// Data frames received while the rank waited for a control frame.
    data: VecDeque<(Rank, Vec<u8>)>,
    /// Stack frames that came during the raw phase, for the driver.
    pub(crate) early: Vec<(Rank, Vec<u8>)>,
    limit: StdDuration,
}

/// What one receive attempt found.
enum Got {
    Control,
    Data(Rank),
    Nothing,
}

impl<T: Transport> Raw<T> {
    /// The raw phase over `transport`; any one wait gives up after `limit`.
    pub(crate) fn new(transport: T, limit: StdDuration) -> Self {
        Raw {
            transport,
            arrived: HashMap::new(),
            data: VecDeque::new(),
            early: Vec::new(),
            limit,
        }
    }

    /// Sends control frame `(kind, tag, round)` to `to`.
    pub(crate) fn send(&mut self, to: Rank, kind: u8, tag: u32, round: u8) -> Result<(), String> {
        self.transport
            .send(to, &raw_frame(kind, tag, round))
            .map_err(|e| e.to_string())
    }

    /// One receive attempt: a control frame is counted, a stack frame kept for the
    /// driver, a data frame copied into `scratch` (and reported).
    fn receive(&mut self, scratch: &mut Vec<u8>) -> Result<Got, String> {
        self.transport.progress().map_err(|e| e.to_string())?;
        let got = self.transport.try_recv().map_err(|e| e.to_string())?;
        match got.as_ref().and_then(Received::frame) {
            Some((from, bytes)) => {
                if let Some((kind, tag, round)) = parse_raw(bytes) {
                    *self.arrived.entry((kind, tag, round, from)).or_default() += 1;
                    Ok(Got::Control)
                } else if bytes.starts_with(&DATA_MAGIC) {
                    scratch.clear();
                    scratch.extend_from_slice(bytes);
                    Ok(Got::Data(from))
                } else {
                    self.early.push((from, bytes.to_vec()));
                    Ok(Got::Control)
                }
            }
            None if got.is_some() => Ok(Got::Control), // oversized, discarded
            None => Ok(Got::Nothing),
        }
    }

    /// Waits for control frame `(kind, tag, round)` from `from`.
    pub(crate) fn expect(
        &mut self,
        kind: u8,
        tag: u32,
        round: u8,
        from: Rank,
    ) -> Result<(), String> {
        let key = (kind, tag, round, from);
        let start = WallInstant::now();
        let mut scratch = Vec::new();
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
                    "raw phase: no frame {kind}/{tag}/{round} from rank {from}"
                ));
            }
            match self.receive(&mut scratch)? {
                Got::Data(from) => self.data.push_back((from, std::mem::take(&mut scratch))),
                Got::Control => {}
                // Spin, yielding the CPU: latency as MPI's own loops measure it, while
                // ranks oversubscribed on few cores still take turns (as the driver's
                // spin window does).
                Got::Nothing => std::thread::yield_now(),
            }
        }
    }

    /// Waits for the next data frame; copies it into `frame` and returns its sender.
    pub(crate) fn next_data(&mut self, frame: &mut Vec<u8>) -> Result<Rank, String> {
        if let Some((from, bytes)) = self.data.pop_front() {
            *frame = bytes;
            return Ok(from);
        }
        let start = WallInstant::now();
        loop {
            match self.receive(frame)? {
                Got::Data(from) => return Ok(from),
                Got::Control => {}
                Got::Nothing => {
                    if start.elapsed() > self.limit {
                        return Err("raw phase: no data frame arrived".into());
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// One dissemination barrier, tagged `tag` (unique per barrier of the phase).
    pub(crate) fn barrier(&mut self, tag: u32) -> Result<(), String> {
        let (me, n) = (self.transport.rank(), self.transport.size());
        let mut step = 1u32;
        let mut round = 0u8;
        while step < n {
            self.send((me + step) % n, BARRIER, tag, round)?;
            self.expect(BARRIER, tag, round, (me + n - step) % n)?;
            step *= 2;
            round += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_round_trip_and_other_frames_are_not_control() {
        let f = raw_frame(PING, 70_000, 3);
        assert_eq!(parse_raw(&f), Some((PING, 70_000, 3)));
        assert_eq!(parse_raw(&f[..9]), None);
        let mut stack = vec![ft_core::wire::VERSION];
        stack.extend_from_slice(&f[1..]);
        assert_eq!(parse_raw(&stack), None);
        let mut data = DATA_MAGIC.to_vec();
        data.extend_from_slice(&f[4..]);
        assert_eq!(parse_raw(&data), None);
        assert_ne!(DATA_MAGIC[0], ft_core::wire::VERSION);
    }
}
