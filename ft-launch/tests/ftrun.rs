//! `ftrun` on real processes: each test launches `ftrun-probe` (this crate's helper
//! program, which acts on its arguments at the ranks they name) and checks what the
//! job printed and how it ended.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const FTRUN: &str = env!("CARGO_BIN_EXE_ftrun");
const PROBE: &str = env!("CARGO_BIN_EXE_ftrun-probe");

/// Runs `ftrun OPTIONS -- ftrun-probe ACTIONS`; its output and how long it took.
fn ftrun(options: &[&str], actions: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(FTRUN)
        .args(options)
        .arg("--")
        .arg(PROBE)
        .args(actions)
        .output()
        .expect("starting ftrun");
    (out, started.elapsed())
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `env` lines of a job that exited 0, one per rank of `ranks`, in rank order.
fn env_lines(out: &Output, ranks: usize) -> Vec<String> {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    let text = stdout(out);
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines.len(), ranks, "{text}");
    lines
}

/// The lines of `text` that `ftrun` itself printed.
fn ftrun_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("ftrun:")).collect()
}

/// Whether process `pid` is gone (or a zombie: killed, not yet reaped by init).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[test]
fn a_rank_killed_by_sigkill_is_survived_and_the_survivors_lines_are_kept() {
    let (out, _) = ftrun(
        &["-n", "3"],
        &["lines:3", "sleep:300", "kill@1", "lines:3@0,2"],
    );
    let (text, errors) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{errors}");
    for rank in [0, 2] {
        let mine = text
            .lines()
            .filter(|l| l.starts_with(&format!("rank {rank} ")))
            .count();
        assert_eq!(mine, 6, "rank {rank}:\n{text}");
    }
    let killed = text.lines().filter(|l| l.starts_with("rank 1 ")).count();
    assert_eq!(killed, 3, "rank 1's lines before its death:\n{text}");
    assert_eq!(
        ftrun_lines(&errors),
        ["ftrun: rank 1 was killed by signal 9"],
        "{errors}"
    );
}

#[test]
fn a_rank_that_exits_non_zero_ends_the_job_at_once_with_its_status() {
    // The other ranks (and a child each of them started) would sleep for a minute.
    let (out, took) = ftrun(
        &["-n", "3"],
        &["child:60000@0,1", "sleep:300@2", "exit:3@2", "sleep:60000"],
    );
    let (text, errors) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(3), "{errors}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        ftrun_lines(&errors),
        ["ftrun: rank 2 exited with status 3; the other ranks were stopped"],
        "{errors}"
    );
    let children: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("child "))
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    assert_eq!(children.len(), 2, "{text}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !children.iter().all(|&pid| gone(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        children.iter().all(|&pid| gone(pid)),
        "the ranks' children {children:?} outlived the job"
    );
}

#[test]
fn ordered_output_prints_rank_0s_lines_before_rank_1s() {
    // Rank 2 prints first, rank 0 last.
    let (out, _) = ftrun(
        &["-n", "3", "--output", "ordered"],
        &["sleep:400@0", "sleep:200@1", "lines:3"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected: Vec<String> = (0..3)
        .flat_map(|rank| (0..3).map(move |i| format!("rank {rank} line {i}")))
        .collect();
    assert_eq!(stdout(&out).lines().collect::<Vec<_>>(), expected);
}

#[test]
fn streamed_lines_of_several_ranks_never_interleave() {
    // Each line goes out in 40 writes of 100 bytes.
    let (out, _) = ftrun(&["-n", "4"], &["long:30"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * 30);
    for line in lines {
        let first = line.as_bytes()[0];
        assert!(
            line.len() == 4000 && line.bytes().all(|b| b == first),
            "a mixed line: {}...",
            &line[..80.min(line.len())]
        );
    }
}

#[test]
fn standard_error_lines_carry_their_rank() {
    let (out, _) = ftrun(&["-n", "2"], &["err:something went wrong", "say:fine"]);
    assert_eq!(out.status.code(), Some(0));
    let errors = stderr(&out);
    let mut said: Vec<&str> = errors.lines().collect();
    said.sort();
    assert_eq!(
        said,
        [
            "[rank 0] something went wrong",
            "[rank 1] something went wrong"
        ]
    );
    assert_eq!(stdout(&out), "fine\nfine\n");
}

#[test]
fn spares_are_ranks_after_the_working_ones_and_every_rank_knows_how_many() {
    let (out, _) = ftrun(&["-n", "2", "--spares", "2"], &["env"]);
    let lines = env_lines(&out, 4);
    for (rank, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("rank={rank} size=4 ")), "{line}");
        assert!(line.ends_with(" spares=2"), "{line}");
    }
    let (out, _) = ftrun(&["-n", "4294967295", "--spares", "1"], &["env"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("too many ranks"), "{}", stderr(&out));
}

#[test]
fn every_rank_sees_its_rank_the_size_and_one_rendezvous_that_is_removed_after() {
    let (out, _) = ftrun(&["-n", "3", "--provider", "sockets"], &["env"]);
    let lines = env_lines(&out, 3);
    let dir = lines[0]
        .split(' ')
        .find_map(|field| field.strip_prefix("rendezvous="))
        .expect("a rendezvous");
    for (rank, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            format!("rank={rank} size=3 rendezvous={dir} address=127.0.0.1 provider=sockets exists=true spares=-")
        );
    }
    assert!(!Path::new(dir).exists(), "{dir} is left behind");

    // A named rendezvous is used as it is and left in place.
    let named = std::env::temp_dir().join(format!("ftrun-named-{}", std::process::id()));
    let (out, _) = ftrun(
        &[
            "-n",
            "2",
            "--rendezvous",
            named.to_str().expect("UTF-8"),
            "--address",
            "127.0.0.2",
        ],
        &["env"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines().all(|l| l.contains(&format!(
            "rendezvous={} address=127.0.0.2 provider=- exists=true",
            named.display()
        ))),
        "{text}"
    );
    assert!(named.is_dir());
    std::fs::remove_dir_all(&named).expect("removing the named rendezvous");
}

#[test]
fn bad_input_exits_2_before_any_rank_starts() {
    let marker = std::env::temp_dir().join(format!("ftrun-bad-{}", std::process::id()));
    let marker_arg = format!("say:{}", marker.display());
    for options in [
        &["-n", "0"][..],
        &["-n", "two"],
        &["-n", "2", "--output", "sideways"],
        &["-n", "2", "--job-limit-s", "0"],
        &["--no-such-option", "-n", "2"],
    ] {
        let (out, took) = ftrun(options, &[&marker_arg]);
        assert_eq!(out.status.code(), Some(2), "{options:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{options:?}: a rank ran");
        assert!(took < Duration::from_secs(5));
    }
    // No program, or one that does not exist.
    let out = Command::new(FTRUN)
        .args(["-n", "2"])
        .output()
        .expect("ftrun");
    assert_eq!(out.status.code(), Some(2));
    let not_executable = std::env::temp_dir().join(format!("ftrun-plain-{}", std::process::id()));
    std::fs::write(&not_executable, "not a program\n").expect("writing a plain file");
    let not_executable = not_executable
        .to_str()
        .expect("a UTF-8 temp path")
        .to_owned();
    for missing in [
        "no-such-program-anywhere",
        "/no/such/dir/program",
        &not_executable,
    ] {
        let out = Command::new(FTRUN)
            .args(["-n", "2", "--", missing])
            .output()
            .expect("ftrun");
        assert_eq!(out.status.code(), Some(2), "{missing}");
        assert_eq!(
            ftrun_lines(&stderr(&out)).len(),
            1,
            "{missing}: {}",
            stderr(&out)
        );
    }
    let _ = std::fs::remove_file(&not_executable);
}

#[test]
fn a_job_past_its_limit_is_killed() {
    let (out, took) = ftrun(&["-n", "2", "--job-limit-s", "1"], &["sleep:60000"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(
        ftrun_lines(&stderr(&out)),
        ["ftrun: the job ran past 1 s and was killed"]
    );
}

#[test]
fn a_job_whose_every_rank_was_killed_fails() {
    let (out, _) = ftrun(&["-n", "2"], &["kill"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ftrun: every rank was killed by a signal"));
}

#[test]
fn sigterm_reaches_the_ranks_and_ends_ftrun_by_it() {
    use std::os::unix::process::ExitStatusExt;
    let started = Instant::now();
    let child = Command::new(FTRUN)
        .args(["-n", "2", "--", PROBE, "say:up", "sleep:60000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting ftrun");
    std::thread::sleep(Duration::from_millis(500));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("waiting for ftrun");
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(stdout(&out), "up\nup\n");
    assert_eq!(
        ftrun_lines(&stderr(&out)),
        ["ftrun: interrupted by signal 15; the ranks were stopped"]
    );
}
