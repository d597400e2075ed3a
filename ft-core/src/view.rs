//! [`FailureView`]: one rank's knowledge of failures in one communicator.
//!
//! Sets kept at rank `i` of a communicator of size `n`:
//! - `pending`: failures the detector reported since the last validation (not yet visible
//!   to queries);
//! - `G`: the failed set all survivors agreed on at the last global validation;
//! - `L_i = G ∪ L'`: the failed set this rank validated; only the delta `L'` (disjoint
//!   from `G`) is stored apart, so memory is about `n/8` bytes plus a few per failed rank.
//!
//! Invariants, after every public call:
//! - `G ⊆ L_i`, and `L_i ∪ pending` holds only ranks that were reported failed or agreed
//!   failed by the survivors (`⊆ F` under fail-stop enforcement);
//! - `pending ∩ L_i = ∅`;
//! - `L_i` and `G` change only in [`FailureView::validate_local`] and
//!   [`FailureView::commit_global`]; queries read that snapshot, and new detector news
//!   waits in `pending`.
//!
//! Each scope counts its validations (its epoch, from 0). A failed rank's `epoch` in a
//! scope is the epoch at which it entered its current state there: the epoch that
//! added it to the scope's set, or for a `Null` rank the later of that and the scope's
//! epoch when `recognize` was called. It is `New` when it entered the scope's set at the
//! scope's current (latest) epoch. An `Ok` rank's epoch is 0, except for a rank that
//! a global validation dropped from `L_i` (see [`FailureView::commit_global`]): the local
//! epoch of that validation. Recognition belongs to the rank, not to a scope: once
//! recognized, a rank is `Null` in every scope whose set holds it.

use hashbrown::HashMap;

use crate::error::ViewError;
use crate::rank::{Modifier, Rank, RankInfo, RankState, Scope, StateMask};
use crate::rankset::RankSet;

/// What a validation reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Size of the validated failed set (`|L_i|` or `|G|`).
    pub failed: usize,
    /// How many ranks this validation added to it.
    pub new: usize,
}

/// Epochs at which a failed rank entered each scope's set and was recognized.
#[derive(Clone, Copy, Debug, Default)]
struct Marks {
    local_since: u32,
    /// The local epoch at which the rank last left `L_i` (back to `Ok` there), 0 if never.
    local_ok_since: u32,
    global_since: Option<u32>,
    recognized: Option<Recognition>,
}

/// The scope epochs current when the application recognized a rank.
#[derive(Clone, Copy, Debug)]
struct Recognition {
    local_epoch: u32,
    global_epoch: u32,
}

/// One rank's local and global failure views of one communicator.
#[derive(Clone, Debug)]
pub struct FailureView {
    n: u32,
    me: Rank,
    pending: RankSet,
    global: RankSet,
    local_delta: RankSet,
    local_epoch: u32,
    global_epoch: u32,
    marks: HashMap<Rank, Marks>,
    /// The incarnation of each rank whose number another process took (the others': 0).
    generations: HashMap<Rank, u32>,
}

impl FailureView {
    /// The view of rank `me` in a communicator of `n` ranks; nobody has failed yet.
    ///
    /// # Panics
    /// If `me >= n`.
    pub fn new(n: u32, me: Rank) -> Self {
        assert!(me < n, "rank {me} out of range for a communicator of {n}");
        FailureView {
            n,
            me,
            pending: RankSet::new(n),
            global: RankSet::new(n),
            local_delta: RankSet::new(n),
            local_epoch: 0,
            global_epoch: 0,
            marks: HashMap::new(),
            generations: HashMap::new(),
        }
    }

    /// The communicator size.
    pub fn size(&self) -> u32 {
        self.n
    }
    /// This rank.
    pub fn rank(&self) -> Rank {
        self.me
    }
    /// Validations of `scope` so far.
    pub fn epoch(&self, scope: Scope) -> u32 {
        match scope {
            Scope::Local => self.local_epoch,
            Scope::Global => self.global_epoch,
        }
    }
    /// `G`, as of the last global validation.
    pub fn global(&self) -> &RankSet {
        &self.global
    }
    /// Detector news not yet validated.
    pub fn pending(&self) -> &RankSet {
        &self.pending
    }
    /// `L_i`, as of the last validation (a fresh set: `G ∪ L'`).
    pub fn local(&self) -> RankSet {
        let mut l = self.global.clone();
        l.union_with(&self.local_delta);
        l
    }
    /// Everything this rank knows to be failed, validated or not (`L_i ∪ pending`): the
    /// ranks protocols must treat as dead.
    pub fn known_failed(&self) -> RankSet {
        let mut k = self.local();
        k.union_with(&self.pending);
        k
    }
    /// Whether `rank` is in `L_i`.
    pub fn is_locally_failed(&self, rank: Rank) -> bool {
        self.global.contains(rank) || self.local_delta.contains(rank)
    }
    /// Whether `rank` is in `L_i ∪ pending`.
    pub fn is_known_failed(&self, rank: Rank) -> bool {
        self.is_locally_failed(rank) || self.pending.contains(rank)
    }
    /// Heap bytes held by the view.
    pub fn heap_bytes(&self) -> usize {
        self.pending.heap_bytes()
            + self.global.heap_bytes()
            + self.local_delta.heap_bytes()
            + self.marks.capacity() * (core::mem::size_of::<(Rank, Marks)>() + 1)
    }

    fn check_rank(&self, rank: Rank) -> Result<(), ViewError> {
        if rank >= self.n {
            Err(ViewError::RankOutOfRange { rank, n: self.n })
        } else {
            Ok(())
        }
    }

    /// Records detector news: `rank` failed. It stays pending (invisible to queries) until
    /// the next validation. Returns whether the news was new.
    pub fn on_rank_failed(&mut self, rank: Rank) -> Result<bool, ViewError> {
        self.check_rank(rank)?;
        if rank == self.me {
            return Err(ViewError::SelfReported);
        }
        if self.is_known_failed(rank) {
            return Ok(false);
        }
        Ok(self.pending.insert(rank))
    }

    /// Folds the pending news into `L_i`. Reports `|L_i|` and how many ranks it added.
    pub fn validate_local(&mut self) -> Counts {
        self.local_epoch += 1;
        let epoch = self.local_epoch;
        let new = self.pending.len();
        for rank in self.pending.iter() {
            self.marks.entry(rank).or_default().local_since = epoch;
        }
        self.local_delta.union_with(&self.pending);
        self.pending.clear();
        Counts {
            failed: self.global.len() + self.local_delta.len(),
            new,
        }
    }

    /// Ends a global validation: `G = agreed` and `L_i = G`. Reports `|G|` and how many
    /// ranks it added to `G`.
    ///
    /// Ranks of `L_i` that the agreement left out (news folded in after this rank gave
    /// its contribution) go back to `pending`, so the next validation picks them up.
    /// Until then they are `Ok` in the local scope, with this commit's local epoch as
    /// their generation; a recognition made earlier still holds when they come back.
    ///
    /// # Panics
    /// If `agreed` is from another communicator, or drops a rank of the previous `G`
    /// (agreed sets only grow; the agreement guarantees it).
    pub fn commit_global(&mut self, agreed: &RankSet) -> Counts {
        assert_eq!(
            agreed.universe(),
            self.n,
            "agreed set of another communicator"
        );
        assert!(
            self.global.is_subset(agreed),
            "an agreed failed set never shrinks"
        );
        self.global_epoch += 1;
        self.local_epoch += 1;
        let (global_epoch, local_epoch) = (self.global_epoch, self.local_epoch);
        let new = agreed.len() - self.global.len();
        for rank in agreed.difference(&self.global) {
            let newly_local = !self.local_delta.contains(rank);
            let marks = self.marks.entry(rank).or_default();
            marks.global_since = Some(global_epoch);
            if newly_local {
                marks.local_since = local_epoch;
            }
        }
        self.local_delta.difference_with(agreed);
        for rank in self.local_delta.iter() {
            // Left out of the agreement: `Ok` in the local scope again as of this epoch.
            // The application's recognition of the failure stands: if the rank comes
            // back into `L_i`, it comes back as `Null`.
            if let Some(marks) = self.marks.get_mut(&rank) {
                marks.local_ok_since = local_epoch;
            }
        }
        self.pending.union_with(&self.local_delta);
        self.pending.difference_with(agreed);
        self.local_delta.clear();
        self.global = agreed.clone();
        Counts {
            failed: self.global.len(),
            new,
        }
    }

    /// The application has dealt with failed `rank`: its state becomes `Null`.
    pub fn recognize(&mut self, rank: Rank) -> Result<(), ViewError> {
        self.check_rank(rank)?;
        if !self.is_locally_failed(rank) {
            return Err(ViewError::NotFailed(rank));
        }
        let recognition = Recognition {
            local_epoch: self.local_epoch,
            global_epoch: self.global_epoch,
        };
        let marks = self.marks.entry(rank).or_default();
        marks.recognized.get_or_insert(recognition);
        Ok(())
    }

    /// Records that `rank` is in its `generation`-th incarnation (a rebuilt group's
    /// replaced ranks): its rows report it.
    pub fn set_generation(&mut self, rank: Rank, generation: u32) -> Result<(), ViewError> {
        self.check_rank(rank)?;
        if generation == 0 {
            self.generations.remove(&rank);
        } else {
            self.generations.insert(rank, generation);
        }
        Ok(())
    }

    /// The incarnation of `rank` (0 unless [`FailureView::set_generation`] said more).
    pub fn generation(&self, rank: Rank) -> u32 {
        self.generations.get(&rank).copied().unwrap_or(0)
    }

    /// State, modifier, epoch and generation of `rank` in `scope`.
    pub fn rank_info(&self, scope: Scope, rank: Rank) -> Result<(RankInfo, Modifier), ViewError> {
        self.check_rank(rank)?;
        Ok(self.describe(scope, rank))
    }

    fn describe(&self, scope: Scope, rank: Rank) -> (RankInfo, Modifier) {
        let generation = self.generation(rank);
        let ok = (
            RankInfo {
                rank,
                state: RankState::Ok,
                epoch: 0,
                generation,
            },
            Modifier::Old,
        );
        let Some(marks) = self.marks.get(&rank) else {
            return ok;
        };
        let ok_since = |epoch| {
            (
                RankInfo {
                    rank,
                    state: RankState::Ok,
                    epoch,
                    generation,
                },
                Modifier::Old,
            )
        };
        let (since, current, recognized_at) = match scope {
            Scope::Local if self.is_locally_failed(rank) => (
                marks.local_since,
                self.local_epoch,
                marks.recognized.map(|r| r.local_epoch),
            ),
            Scope::Global => match marks.global_since {
                Some(since) => (
                    since,
                    self.global_epoch,
                    marks.recognized.map(|r| r.global_epoch),
                ),
                None => return ok,
            },
            Scope::Local => return ok_since(marks.local_ok_since),
        };
        let modifier = if since == current {
            Modifier::New
        } else {
            Modifier::Old
        };
        let info = match recognized_at {
            Some(at) => RankInfo {
                rank,
                state: RankState::Null,
                epoch: at.max(since),
                generation,
            },
            None => RankInfo {
                rank,
                state: RankState::Failed,
                epoch: since,
                generation,
            },
        };
        (info, modifier)
    }

    fn failed_set(&self, scope: Scope) -> RankSet {
        match scope {
            Scope::Local => self.local(),
            Scope::Global => self.global.clone(),
        }
    }

    fn matching(&self, scope: Scope, mask: StateMask) -> impl Iterator<Item = RankInfo> + '_ {
        let failed = self.failed_set(scope);
        let want_ok = mask.matches(RankState::Ok, Modifier::Old);
        let ranks: alloc::boxed::Box<dyn Iterator<Item = Rank>> = if want_ok {
            alloc::boxed::Box::new(0..self.n)
        } else {
            alloc::boxed::Box::new(failed.into_iter_owned())
        };
        ranks
            .map(move |r| self.describe(scope, r))
            .filter(move |(info, m)| mask.matches(info.state, *m))
            .map(|(info, _)| info)
    }

    /// How many ranks of `scope` match `mask`.
    pub fn num_state(&self, scope: Scope, mask: StateMask) -> usize {
        let failed = self.failed_set(scope);
        let failed_matching = failed.iter().filter(|&r| {
            let (info, m) = self.describe(scope, r);
            mask.matches(info.state, m)
        });
        let failed_count = failed_matching.count();
        let ok_count = if mask.matches(RankState::Ok, Modifier::Old) {
            self.n as usize - failed.len()
        } else {
            0
        };
        failed_count + ok_count
    }

    /// Writes the ranks of `scope` that match `mask`, in increasing rank order, into
    /// `out` and returns how many it wrote. If `out` is too small, nothing is written and
    /// the error names the number of entries needed.
    pub fn get_state(
        &self,
        scope: Scope,
        mask: StateMask,
        out: &mut [RankInfo],
    ) -> Result<usize, ViewError> {
        let needed = self.num_state(scope, mask);
        if out.len() < needed {
            return Err(ViewError::BufferTooSmall { needed });
        }
        let mut written = 0;
        for (slot, info) in out.iter_mut().zip(self.matching(scope, mask)) {
            *slot = info;
            written += 1;
        }
        debug_assert_eq!(written, needed);
        Ok(written)
    }
}

impl RankSet {
    /// Consumes the set into its members in increasing order.
    pub(crate) fn into_iter_owned(self) -> impl Iterator<Item = Rank> {
        let members: alloc::vec::Vec<Rank> = self.iter().collect();
        members.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rank: Rank, state: RankState, epoch: u32) -> RankInfo {
        RankInfo {
            rank,
            state,
            epoch,
            generation: 0,
        }
    }

    #[test]
    fn news_is_invisible_until_validated() {
        let mut v = FailureView::new(8, 0);
        assert_eq!(v.on_rank_failed(3), Ok(true));
        assert_eq!(v.on_rank_failed(3), Ok(false));
        assert_eq!(v.num_state(Scope::Local, StateMask::FAILED), 0);
        assert_eq!(v.validate_local(), Counts { failed: 1, new: 1 });
        assert_eq!(v.validate_local(), Counts { failed: 1, new: 0 });
        assert_eq!(v.num_state(Scope::Local, StateMask::FAILED), 1);
        assert_eq!(v.num_state(Scope::Global, StateMask::FAILED), 0);
        assert_eq!(v.num_state(Scope::Local, StateMask::OK), 7);
    }

    #[test]
    fn bad_calls_are_typed_errors() {
        let mut v = FailureView::new(4, 1);
        assert_eq!(
            v.on_rank_failed(4),
            Err(ViewError::RankOutOfRange { rank: 4, n: 4 })
        );
        assert_eq!(v.on_rank_failed(1), Err(ViewError::SelfReported));
        assert_eq!(v.recognize(2), Err(ViewError::NotFailed(2)));
    }

    #[test]
    fn new_old_null_and_generations_follow_validations() {
        let mut v = FailureView::new(8, 0);
        v.on_rank_failed(2).unwrap();
        v.validate_local(); // local epoch 1: 2 is NEW
        v.on_rank_failed(5).unwrap();
        v.validate_local(); // local epoch 2: 5 is NEW, 2 is OLD
        let mut out = [info(0, RankState::Ok, 0); 2];
        assert_eq!(
            v.get_state(Scope::Local, StateMask::FAILED | StateMask::NEW, &mut out),
            Ok(1)
        );
        assert_eq!(out[0], info(5, RankState::Failed, 2));
        v.recognize(2).unwrap();
        assert_eq!(v.get_state(Scope::Local, StateMask::NULL, &mut out), Ok(1));
        assert_eq!(out[0], info(2, RankState::Null, 2));
        // Global validation agrees on {2, 5, 6}: 6 learned from another survivor.
        let agreed = RankSet::from_ranks(8, [2, 5, 6]);
        assert_eq!(v.commit_global(&agreed), Counts { failed: 3, new: 3 });
        assert_eq!(
            v.get_state(Scope::Global, StateMask::FAILED, &mut out),
            Ok(2)
        );
        assert_eq!(
            out,
            [info(5, RankState::Failed, 1), info(6, RankState::Failed, 1)]
        );
        assert_eq!(
            v.rank_info(Scope::Global, 2).unwrap(),
            (info(2, RankState::Null, 1), Modifier::New)
        );
        assert_eq!(
            v.rank_info(Scope::Local, 6).unwrap(),
            (info(6, RankState::Failed, 3), Modifier::New)
        );
        assert_eq!(v.rank_info(Scope::Local, 5).unwrap().1, Modifier::Old);
    }

    #[test]
    fn too_small_buffer_names_the_size_and_is_untouched() {
        let mut v = FailureView::new(8, 0);
        v.on_rank_failed(1).unwrap();
        v.on_rank_failed(2).unwrap();
        v.validate_local();
        let sentinel = info(7, RankState::Null, 99);
        let mut out = [sentinel; 1];
        assert_eq!(
            v.get_state(Scope::Local, StateMask::FAILED, &mut out),
            Err(ViewError::BufferTooSmall { needed: 2 })
        );
        assert_eq!(out, [sentinel]);
    }

    #[test]
    fn ranks_left_out_of_the_agreement_stay_pending() {
        let mut v = FailureView::new(8, 0);
        v.on_rank_failed(3).unwrap();
        v.validate_local();
        v.commit_global(&RankSet::new(8));
        assert!(!v.is_locally_failed(3));
        assert!(v.pending().contains(3));
        assert_eq!(v.validate_local(), Counts { failed: 1, new: 1 });
    }
}
