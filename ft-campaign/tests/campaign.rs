//! A tiny real campaign: `ftcampaign` runs three random jobs with kills on `ftofi`
//! (`tcp;ofi_rxm` on loopback) and every one must pass; then the replay of one run
//! regenerates the same job. `ftofi` is built first (`cargo build --release -p
//! backend-ofi`, a no-op when the workspace's tests built it already); the test is
//! skipped, saying why, only if that build fails (no libfabric on this machine).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The workspace root.
fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Builds `ftofi` in this build's target directory; returns it, or why it cannot be.
fn ftofi() -> Result<PathBuf, String> {
    // CARGO_BIN_EXE_ftcampaign is TARGET/PROFILE/ftcampaign.
    let target = PathBuf::from(env!("CARGO_BIN_EXE_ftcampaign"))
        .parent()
        .and_then(|profile| profile.parent())
        .map(PathBuf::from)
        .ok_or("cannot find the target directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "-p", "backend-ofi", "--bin", "ftofi"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build -p backend-ofi failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(target.join("release").join("ftofi"))
}

fn campaign(ftofi: &PathBuf, logs: &std::path::Path, extra: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ftcampaign"))
        .args([
            "--backend",
            "ofi-tcp",
            "--seed",
            "5",
            "--json",
            "--job-timeout-s",
            "60",
        ])
        .arg("--ftofi")
        .arg(ftofi)
        .arg("--logs")
        .arg(logs)
        .args(extra)
        .output()
        .expect("starting ftcampaign");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{stdout}\nstderr:\n{stderr}"));
    (out.status.success(), summary, stderr)
}

#[test]
fn a_tiny_campaign_on_ofi_tcp_passes_and_replays() {
    let ftofi = match ftofi() {
        Ok(path) => path,
        Err(why) => {
            println!("skipped: ftofi cannot be built here: {why}");
            return;
        }
    };
    let logs = std::env::temp_dir().join(format!("ftcampaign-test-{}", std::process::id()));
    let (ok, summary, stderr) = campaign(&ftofi, &logs, &["--runs", "3"]);
    assert!(ok, "the campaign failed: {summary:#}\nprogress:\n{stderr}");
    assert_eq!(summary["runs"], 3, "{summary}");
    assert_eq!(summary["ok"], 3, "{summary}");
    for key in ["hangs", "disagreements", "lost_outputs", "other_failures"] {
        assert_eq!(summary[key], 0, "{key}: {summary}");
    }
    assert!(summary["wall_s"].as_f64() > Some(0.0), "{summary}");
    assert!(logs.join("summary.json").exists());
    // Passing runs leave no logs behind.
    assert!(!logs.join("run-0").exists());

    // --only replays one run: the same job as in the campaign.
    let (ok, replay, stderr) = campaign(&ftofi, &logs, &["--only", "1", "--keep-all"]);
    assert!(ok, "the replay failed: {replay:#}\nprogress:\n{stderr}");
    assert_eq!(replay["runs"], 1, "{replay}");
    let kept = std::fs::read_to_string(logs.join("run-1").join("verdict")).unwrap();
    assert!(kept.starts_with("ok"), "{kept}");
    assert!(kept.contains("seed 5 run 1"), "{kept}");
    let replay_line = std::fs::read_to_string(logs.join("run-1").join("replay")).unwrap();
    assert!(replay_line.contains("--seed 5 --only 1"), "{replay_line}");
    let _ = std::fs::remove_dir_all(&logs);
}
