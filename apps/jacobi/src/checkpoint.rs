//! When a rank checkpoints its strip, and where the last checkpoint is kept.
//!
//! Invariant: a checkpoint of iteration `i` holds the strip's values after `i`
//! iterations (taken before iteration `i`'s halos go out), and `i` is a multiple of
//! the period; the last one kept is the newest taken.

use crate::strip::Strip;

/// This rank's checkpoints: every `every` iterations, the strip's bytes.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    every: u32,
    last: Option<(u32, Vec<u8>)>,
    taken: u64,
    bytes: u64,
}

impl Checkpoints {
    /// A checkpoint every `every` iterations (`every ≥ 1`), from iteration 0.
    pub fn every(every: u32) -> Self {
        assert!(every >= 1, "a checkpoint period of 0");
        Checkpoints {
            every,
            last: None,
            taken: 0,
            bytes: 0,
        }
    }

    /// Whether iteration `iteration` starts with a checkpoint.
    pub fn due(&self, iteration: u32) -> bool {
        iteration % self.every == 0
    }

    /// Keeps `strip` as the checkpoint of `iteration`.
    pub fn take(&mut self, iteration: u32, strip: &Strip) {
        let bytes = strip.to_bytes();
        self.taken += 1;
        self.bytes += bytes.len() as u64;
        self.last = Some((iteration, bytes));
    }

    /// The newest checkpoint: its iteration and the strip's bytes.
    pub fn last(&self) -> Option<(u32, &[u8])> {
        self.last.as_ref().map(|(i, b)| (*i, b.as_slice()))
    }

    /// Checkpoints taken, and their bytes in all.
    pub fn taken(&self) -> (u64, u64) {
        (self.taken, self.bytes)
    }
}
