//! What the real-process tests share: a bounded run of a launcher, the reporting
//! rank's JSON line, and the checksum of the same job on the simulator.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `ftjacobi` under test.
pub const FTJACOBI: &str = env!("CARGO_BIN_EXE_ftjacobi");

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `command`, killed past `limit`; its output.
pub fn run_within(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    let started = Instant::now();
    while child.try_wait().expect("waiting for the job").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("the job's output");
            panic!(
                "{command:?} ran past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("the job's output")
}

/// The one JSON line of a job that must end well (the reporting rank's).
pub fn report(what: &str, out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 1, "{what}: one JSON line:\n{stdout}");
    let json: Value = serde_json::from_str(lines[0]).expect("JSON");
    assert_eq!(json["ok"], true, "{what}: {json}");
    json
}

/// The checksum of `args` on one simulated rank.
pub fn sim_checksum(args: &[&str]) -> Value {
    let out = run_within(
        Command::new(FTJACOBI).args(["-n", "1"]).args(args),
        Duration::from_secs(60),
    );
    report("ftjacobi -n 1", &out)["checksum"].clone()
}
