//! `ftrun-probe`: the program `ft-launch`'s tests launch. It reads its rank from
//! `FTOFI_RANK` and runs its arguments in order, each `ACTION` or `ACTION@RANKS`
//! (`RANKS` a comma list: only those ranks do it):
//!
//! - `lines:K`: prints `rank R line I` for I in 0..K to standard output;
//! - `long:K`: prints K lines of 4000 bytes, each a repeated digit of its rank, in
//!   many small writes (a line split across writes must still pass whole);
//! - `say:TEXT`: prints TEXT; `partial:TEXT`: prints TEXT with no newline;
//! - `err:TEXT`: prints TEXT to standard error;
//! - `env`: prints `rank=R size=S rendezvous=DIR address=A provider=P exists=BOOL
//!   spares=K`;
//! - `sleep:MS`: sleeps; `exit:CODE`: exits; `kill`: sends itself `SIGKILL`;
//! - `child:MS`: starts a child `sleep` of MS milliseconds (seconds, rounded up) and
//!   prints `child PID`.

use std::io::Write;
use std::time::Duration;

fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| "-".into());
    let rank: u32 = var("FTOFI_RANK").parse().expect("FTOFI_RANK is a number");
    for arg in std::env::args().skip(1) {
        let (action, ranks) = arg.split_once('@').unwrap_or((&arg, ""));
        if !ranks.is_empty() && !ranks.split(',').any(|r| r.parse() == Ok(rank)) {
            continue;
        }
        let (name, value) = action.split_once(':').unwrap_or((action, ""));
        let number = || -> u64 { value.parse().expect("a number") };
        let mut out = std::io::stdout();
        match name {
            "lines" => {
                for i in 0..number() {
                    println!("rank {rank} line {i}");
                }
            }
            "long" => {
                let digit = char::from_digit(rank % 10, 10)
                    .expect("a digit")
                    .to_string();
                for _ in 0..number() {
                    for _ in 0..40 {
                        let _ = out.write_all(digit.repeat(100).as_bytes());
                        let _ = out.flush();
                    }
                    let _ = out.write_all(b"\n");
                    let _ = out.flush();
                }
            }
            "say" => println!("{value}"),
            "partial" => {
                print!("{value}");
                let _ = out.flush();
            }
            "err" => eprintln!("{value}"),
            "env" => {
                let dir = var("FTOFI_RENDEZVOUS");
                println!(
                    "rank={} size={} rendezvous={dir} address={} provider={} exists={} spares={}",
                    var("FTOFI_RANK"),
                    var("FTOFI_SIZE"),
                    var("FTOFI_ADDRESS"),
                    var("FTOFI_PROVIDER"),
                    std::path::Path::new(&dir).is_dir(),
                    var("FT_SPARES")
                );
            }
            "sleep" => std::thread::sleep(Duration::from_millis(number())),
            "exit" => std::process::exit(value.parse().expect("a status")),
            "kill" => {
                let _ = out.flush();
                // SAFETY: kill(2) on this process's own pid; no memory is involved.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                std::thread::sleep(Duration::from_secs(60));
            }
            // The child is left running on purpose: the launcher must end it.
            #[allow(clippy::zombie_processes)]
            "child" => {
                let child = std::process::Command::new("sleep")
                    .arg(number().div_ceil(1000).to_string())
                    .spawn()
                    .expect("starting sleep");
                println!("child {}", child.id());
            }
            other => panic!("unknown action {other}"),
        }
    }
}
