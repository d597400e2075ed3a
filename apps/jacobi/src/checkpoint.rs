//! Checkpoints in the group's redundant store ([`ft::Runtime::store_put`]): every
//! `every` iterations each rank puts its strip under [`KEY`], version = the iteration,
//! and the group commits it ([`ft::Runtime::store_commit`], collective). A committed
//! checkpoint has a copy on a rank of another node, so a node's failure leaves one.
//!
//! Invariants: a checkpoint of iteration `i` holds the strip's values after `i`
//! iterations (taken before iteration `i`'s halos go out), and `i` is a multiple of the
//! period or a recovery's restart; a commit is decided alike at every survivor, and
//! one that failed (a rank died since the group started) is reported as the failure
//! it is, so the caller recovers.

use ft::{Rank, Runtime, RuntimeError, StoreCommit};

use crate::halo::HaloError;
use crate::strip::Strip;

/// The store key of a rank's strip.
pub const KEY: u64 = 0;

/// This rank's checkpoints: when they are due, and what they cost.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    every: u32,
    taken: u64,
    bytes: u64,
}

impl Checkpoints {
    /// A checkpoint every `every` iterations (`every ≥ 1`), from iteration 0.
    pub fn every(every: u32) -> Self {
        assert!(every >= 1, "a checkpoint period of 0");
        Checkpoints {
            every,
            taken: 0,
            bytes: 0,
        }
    }

    /// Whether iteration `iteration` starts with a checkpoint.
    pub fn due(&self, iteration: u32) -> bool {
        iteration % self.every == 0
    }

    // ANCHOR: take
    /// Puts `strip` as the checkpoint of `iteration` in `handle`'s store and commits it
    /// with the group. A commit that failed because ranks died is
    /// [`HaloError::CommitFailed`], with the agreement it made.
    pub fn take(
        &mut self,
        handle: &Runtime,
        iteration: u32,
        strip: &Strip,
    ) -> Result<StoreCommit, HaloError> {
        let bytes = strip.to_bytes();
        let len = bytes.len() as u64;
        handle
            .store_put(KEY, u64::from(iteration), bytes)
            .map_err(HaloError::Runtime)?;
        let commit = handle
            .store_commit(u64::from(iteration))
            .map_err(HaloError::Runtime)?;
        if !commit.committed {
            return Err(HaloError::CommitFailed(commit.validation));
        }
        self.taken += 1;
        self.bytes += len;
        Ok(commit)
    }
    // ANCHOR_END: take

    /// Checkpoints committed, and their bytes in all.
    pub fn taken(&self) -> (u64, u64) {
        (self.taken, self.bytes)
    }
}

/// The strip of `owner` at `iteration`, read from what `handle`'s store keeps here
/// (`owner`'s own, or the copy this rank holds for it).
pub fn restore(handle: &Runtime, owner: Rank, iteration: u32) -> Result<Strip, RestoreError> {
    let (version, bytes) = handle
        .store_get(owner, KEY)
        .map_err(RestoreError::Runtime)?
        .ok_or(RestoreError::Missing { owner })?;
    if version != u64::from(iteration) {
        return Err(RestoreError::Version {
            owner,
            version,
            iteration,
        });
    }
    Strip::from_bytes(&bytes).map_err(|e| RestoreError::Decode {
        owner,
        why: e.to_string(),
    })
}

/// Why a checkpoint cannot be read back.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestoreError {
    /// The store keeps no committed checkpoint of `owner` here.
    Missing {
        /// The checkpoint's owner.
        owner: Rank,
    },
    /// The committed checkpoint here is of another iteration.
    Version {
        /// The checkpoint's owner.
        owner: Rank,
        /// The version kept.
        version: u64,
        /// The iteration wanted.
        iteration: u32,
    },
    /// The bytes kept are not a strip.
    Decode {
        /// The checkpoint's owner.
        owner: Rank,
        /// Why.
        why: String,
    },
    /// The handle failed.
    Runtime(RuntimeError),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Missing { owner } => {
                write!(f, "no committed checkpoint of rank {owner} is kept here")
            }
            RestoreError::Version {
                owner,
                version,
                iteration,
            } => write!(
                f,
                "rank {owner}'s checkpoint kept here is of iteration {version}, not {iteration}"
            ),
            RestoreError::Decode { owner, why } => {
                write!(f, "rank {owner}'s checkpoint does not decode: {why}")
            }
            RestoreError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RestoreError {}
