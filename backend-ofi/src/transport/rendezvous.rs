//! How the ranks of a job find each other: each publishes its endpoint name as a file
//! in the shared rendezvous directory (written to a temporary name and renamed, so a
//! reader never sees half of one) and reads everyone's, in rank order.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ft_core::Rank;

use super::{OfiConfig, OfiError};

/// How often the rendezvous looks for the names still missing.
const RENDEZVOUS_POLL: Duration = Duration::from_millis(5);

/// Publishes `name` as this rank's and waits for every rank's; names in rank order.
pub(super) fn exchange_names(config: &OfiConfig, name: &[u8]) -> Result<Vec<Vec<u8>>, OfiError> {
    let dir = &config.rendezvous;
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| OfiError::Rendezvous { path, source }
    };
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let mine = name_file(dir, config.rank);
    let temp = dir.join(format!(
        ".rank-{}.addr.{}.tmp",
        config.rank,
        std::process::id()
    ));
    fs::write(&temp, name).map_err(io_error(&temp))?;
    fs::rename(&temp, &mine).map_err(io_error(&mine))?;

    let start = Instant::now();
    let mut names: Vec<Option<Vec<u8>>> = vec![None; config.size as usize];
    loop {
        for (rank, slot) in names.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let path = name_file(dir, rank as Rank);
            match fs::read(&path) {
                Ok(bytes) if !bytes.is_empty() => *slot = Some(bytes),
                Ok(_) => return Err(OfiError::BadAddress { rank: rank as Rank }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path)(e)),
            }
        }
        if names.iter().all(Option::is_some) {
            return Ok(names.into_iter().flatten().collect());
        }
        if start.elapsed() >= config.connect_timeout {
            let missing = (0..config.size)
                .filter(|&rank| names[rank as usize].is_none())
                .collect();
            return Err(OfiError::RendezvousTimeout {
                missing,
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(RENDEZVOUS_POLL);
    }
}

/// Where rank `rank` publishes its endpoint name.
fn name_file(dir: &Path, rank: Rank) -> PathBuf {
    dir.join(format!("rank-{rank}.addr"))
}
