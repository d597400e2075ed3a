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

/// Who tells `ftjacobi` how many of the launcher's ranks are spares.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each test binary that includes this module uses one of the two
pub enum Spares {
    /// The launcher (`ftrun --spares K`, through `FT_SPARES`).
    Launcher,
    /// `ftjacobi --spares K`, the launcher starting the spares as K more ranks.
    Flag,
}

/// Runs the kill cases of the real-backend tests: six working ranks of `backend`
/// started by `launcher(working, spares)` (the launcher's command up to the program),
/// each case ending with the simulator's checksum and exactly the killed ranks dead:
/// four by shrinking, and three by rebuilding from two spares (the last two
/// processes), with the incarnations expected.
pub fn survives_kills(backend: &str, spares: Spares, launcher: impl Fn(u32, u32) -> Command) {
    let job = [
        "--grid",
        "96",
        "--iterations",
        "80",
        "--checkpoint-every",
        "10",
    ];
    let want = sim_checksum(&job);
    let shrink: [(&[&str], &[u32]); 4] = [
        (&["--kill", "2@25"], &[2]),
        (&["--ranks-per-node", "2", "--kill", "2,3@25"], &[2, 3]),
        (&["--kill", "1@15", "--kill", "4@50"], &[1, 4]),
        (&["--kill", "1@15", "--kill", "3@0"], &[1, 3]),
    ];
    let rebuild: [(&[&str], &[u32], serde_json::Value); 3] = [
        (&["--kill", "2@25"], &[2], serde_json::json!({"2": 1})),
        (
            &["--kill", "1@15", "--kill", "1@50"],
            &[1],
            serde_json::json!({"1": 2}),
        ),
        (
            &["--kill", "1@15", "--kill", "3@0"],
            &[1, 3],
            serde_json::json!({"1": 1, "3": 1}),
        ),
    ];
    let cases = shrink
        .iter()
        .map(|(kills, dead)| (*kills, *dead, None, 0))
        .chain(rebuild.iter().map(|(k, d, g)| (*k, *d, Some(g.clone()), 2)));
    for (kills, dead, generations, spare_count) in cases {
        let mut command = launcher(6, spare_count);
        command
            .arg(FTJACOBI)
            .args([
                "--backend",
                backend,
                "--timeout-ms",
                "1000",
                "--limit-s",
                "90",
            ])
            .args(job)
            .args(kills);
        if spare_count > 0 {
            command.args(["--mode", "rebuild"]);
            if spares == Spares::Flag {
                command.args(["--spares", &spare_count.to_string()]);
            }
        }
        let out = run_within(&mut command, Duration::from_secs(150));
        let json = report(&format!("{kills:?}"), &out);
        assert_eq!(json["checksum"], want, "{kills:?}: {json}");
        assert_eq!(json["dead"], serde_json::json!(dead), "{kills:?}: {json}");
        assert_eq!(json["ranks"], 6, "{json}");
        if let Some(generations) = generations {
            assert_eq!(json["generations"], generations, "{kills:?}: {json}");
        }
    }
}
