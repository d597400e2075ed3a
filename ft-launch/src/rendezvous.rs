//! The directory where a job's ranks meet (each rank writes its endpoint's name there
//! and reads the others').

use std::io;
use std::path::{Path, PathBuf};

/// A job's rendezvous directory: a fresh one, removed (with what the ranks wrote in
/// it) when this is dropped, or one the caller named, which is left as it is.
#[derive(Debug)]
pub struct Rendezvous {
    path: PathBuf,
    fresh: bool,
}

impl Rendezvous {
    /// A new empty directory in the system's temporary directory, named
    /// `PREFIX-PID-NANOS` (this process's id and the time, so two jobs never share one).
    pub fn fresh(prefix: &str) -> io::Result<Self> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| in_words(&path, e))?;
        Ok(Rendezvous { path, fresh: true })
    }

    /// The directory `path` (made if it does not exist); never removed.
    pub fn given(path: impl Into<PathBuf>) -> io::Result<Self> {
        let path = path.into();
        std::fs::create_dir_all(&path).map_err(|e| in_words(&path, e))?;
        Ok(Rendezvous { path, fresh: false })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `e`, saying which directory could not be made.
fn in_words(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot make {}: {e}", path.display()))
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if self.fresh {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
