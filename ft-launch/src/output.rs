//! Passing the ranks' output on, whole lines at a time.
//!
//! Every rank's standard output and standard error are pipes that a thread per pipe
//! reads. A line is written with one `write_all` while the launcher's stream is locked,
//! so two ranks' lines never interleave within a line. A last line without a newline
//! gets one, so the next rank's line starts on a line of its own; every other byte
//! passes unchanged.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::Arc;

use crate::Rank;

/// Where the ranks' standard output goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Each line to the launcher's standard output as soon as the rank writes it.
    #[default]
    Stream,
    /// Kept until the job ends, then all of rank 0's lines, then rank 1's, ... (the
    /// lines of ranks that were killed too), whatever the job's outcome.
    Ordered,
    /// Kept and returned in [`crate::RankReport::stdout`], unchanged; the launcher
    /// prints nothing of it.
    Captured,
}

/// Decides whether a rank's standard error line (without its newline) is passed on.
pub(crate) type StderrFilter = Arc<dyn Fn(Rank, &str) -> bool + Send + Sync>;

/// Calls `each` with every line `from` gives, its newline included (added to a last
/// line without one), until the end of `from` or a read error.
fn for_each_line(from: impl Read, mut each: impl FnMut(&[u8])) {
    let mut from = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                each(&line);
            }
        }
    }
}

/// Writes `bytes` to standard output at once. A launcher whose own output is closed
/// keeps reading the ranks' (so none blocks on a full pipe) and drops it.
fn to_stdout(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// Passes a rank's standard output on as [`Output::Stream`] says.
pub(crate) fn stream_stdout(from: impl Read) {
    for_each_line(from, to_stdout);
}

/// Reads a rank's whole standard output ([`Output::Ordered`], [`Output::Captured`]).
pub(crate) fn keep_stdout(mut from: impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let _ = from.read_to_end(&mut kept);
    kept
}

/// Prints one rank's kept output ([`Output::Ordered`]), its last line ended.
pub(crate) fn print_kept(kept: &[u8]) {
    if kept.is_empty() {
        return;
    }
    let mut out = io::stdout().lock();
    let _ = out.write_all(kept);
    if kept.last() != Some(&b'\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

/// Passes a rank's standard error on, each line that `filter` lets pass prefixed
/// `[rank N] `.
pub(crate) fn forward_stderr(rank: Rank, from: impl Read, filter: Option<StderrFilter>) {
    let prefix = format!("[rank {rank}] ");
    let mut prefixed = Vec::new();
    for_each_line(from, |line| {
        if let Some(filter) = &filter {
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            if !filter(rank, &text) {
                return;
            }
        }
        prefixed.clear();
        prefixed.extend_from_slice(prefix.as_bytes());
        prefixed.extend_from_slice(line);
        let mut err = io::stderr().lock();
        let _ = err.write_all(&prefixed);
        let _ = err.flush();
    });
}
