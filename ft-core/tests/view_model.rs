//! `FailureView` against a naive model, over random operation sequences.
//!
//! The model keeps plain `BTreeSet`s and `BTreeMap`s and updates each rank's state,
//! generation and "entered the set at" epoch event by event, as the docs of `view.rs`
//! and `rank.rs` describe them. After every step the test checks the invariants
//! (`G ⊆ L_i ⊆ reported ∪ agreed`, `pending ∩ L_i = ∅`), the sets themselves, and every
//! query (all 32 masks, both scopes) including the too-small-buffer contract.

use std::collections::{BTreeMap, BTreeSet};

use ft_core::{
    Counts, FailureView, Modifier, Rank, RankInfo, RankSet, RankState, Scope, StateMask, ViewError,
};
use proptest::prelude::*;

/// One operation of the generated script.
#[derive(Clone, Debug)]
enum Op {
    Report(Rank),
    ValidateLocal,
    /// Agree on `G ∪ {members of L_i picked by keep} ∪ {pending picked by keep} ∪ others`.
    CommitGlobal {
        keep: Vec<bool>,
        others: Vec<Rank>,
    },
    Recognize(Rank),
}

/// A rank's record in one scope's failed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    state: RankState,
    generation: u32,
    /// Epoch at which the rank entered the scope's set.
    since: u32,
}

#[derive(Debug)]
struct Model {
    n: u32,
    me: Rank,
    pending: BTreeSet<Rank>,
    local: BTreeMap<Rank, Entry>,
    global: BTreeMap<Rank, Entry>,
    /// Generation of ranks that went back to `Ok` in the local scope.
    local_ok_since: BTreeMap<Rank, u32>,
    recognized: BTreeSet<Rank>,
    local_epoch: u32,
    global_epoch: u32,
    /// Every rank ever reported or agreed failed: `L_i ∪ pending` must stay inside it.
    ever_failed: BTreeSet<Rank>,
}

impl Model {
    fn new(n: u32, me: Rank) -> Self {
        Model {
            n,
            me,
            pending: BTreeSet::new(),
            local: BTreeMap::new(),
            global: BTreeMap::new(),
            local_ok_since: BTreeMap::new(),
            recognized: BTreeSet::new(),
            local_epoch: 0,
            global_epoch: 0,
            ever_failed: BTreeSet::new(),
        }
    }

    fn entering(&self, rank: Rank, epoch: u32) -> Entry {
        let state = if self.recognized.contains(&rank) {
            RankState::Null
        } else {
            RankState::Failed
        };
        Entry {
            state,
            generation: epoch,
            since: epoch,
        }
    }

    fn on_rank_failed(&mut self, rank: Rank) -> Result<bool, ViewError> {
        if rank >= self.n {
            return Err(ViewError::RankOutOfRange { rank, n: self.n });
        }
        if rank == self.me {
            return Err(ViewError::SelfReported);
        }
        if self.local.contains_key(&rank) || self.pending.contains(&rank) {
            return Ok(false);
        }
        self.ever_failed.insert(rank);
        self.pending.insert(rank);
        Ok(true)
    }

    fn validate_local(&mut self) -> Counts {
        self.local_epoch += 1;
        let news = std::mem::take(&mut self.pending);
        for &rank in &news {
            let entry = self.entering(rank, self.local_epoch);
            self.local.insert(rank, entry);
        }
        Counts {
            failed: self.local.len(),
            new: news.len(),
        }
    }

    /// The set an agreement could produce: `G`, plus some of `L_i`, some of the pending
    /// news, and some ranks only other survivors knew about (never this rank: a rank that
    /// others declared failed stops and commits nothing).
    fn agreed(&self, keep: &[bool], others: &[Rank]) -> BTreeSet<Rank> {
        let mut agreed: BTreeSet<Rank> = self.global.keys().copied().collect();
        let mut picks = keep.iter().copied().cycle();
        for &rank in self.local.keys().chain(self.pending.iter()) {
            if picks.next().unwrap_or(false) {
                agreed.insert(rank);
            }
        }
        agreed.extend(
            others
                .iter()
                .copied()
                .filter(|&r| r < self.n && r != self.me),
        );
        agreed
    }

    fn commit_global(&mut self, agreed: &BTreeSet<Rank>) -> Counts {
        self.global_epoch += 1;
        self.local_epoch += 1;
        let new = agreed
            .iter()
            .filter(|r| !self.global.contains_key(r))
            .count();
        for &rank in agreed {
            self.ever_failed.insert(rank);
            if !self.global.contains_key(&rank) {
                let entry = self.entering(rank, self.global_epoch);
                self.global.insert(rank, entry);
            }
            if !self.local.contains_key(&rank) {
                let entry = self.entering(rank, self.local_epoch);
                self.local.insert(rank, entry);
            }
            self.pending.remove(&rank);
        }
        let dropped: Vec<Rank> = self
            .local
            .keys()
            .copied()
            .filter(|r| !agreed.contains(r))
            .collect();
        for rank in dropped {
            self.local.remove(&rank);
            self.local_ok_since.insert(rank, self.local_epoch);
            self.pending.insert(rank);
        }
        Counts {
            failed: self.global.len(),
            new,
        }
    }

    fn recognize(&mut self, rank: Rank) -> Result<(), ViewError> {
        if rank >= self.n {
            return Err(ViewError::RankOutOfRange { rank, n: self.n });
        }
        let Some(local) = self.local.get_mut(&rank) else {
            return Err(ViewError::NotFailed(rank));
        };
        self.recognized.insert(rank);
        if local.state == RankState::Failed {
            local.state = RankState::Null;
            local.generation = self.local_epoch;
        }
        if let Some(global) = self.global.get_mut(&rank) {
            if global.state == RankState::Failed {
                global.state = RankState::Null;
                global.generation = self.global_epoch;
            }
        }
        Ok(())
    }

    fn describe(&self, scope: Scope, rank: Rank) -> (RankInfo, Modifier) {
        let (set, epoch) = match scope {
            Scope::Local => (&self.local, self.local_epoch),
            Scope::Global => (&self.global, self.global_epoch),
        };
        match set.get(&rank) {
            Some(entry) => (
                RankInfo {
                    rank,
                    state: entry.state,
                    epoch: entry.generation,
                    generation: 0,
                },
                if entry.since == epoch {
                    Modifier::New
                } else {
                    Modifier::Old
                },
            ),
            None => {
                let epoch = match scope {
                    Scope::Local => self.local_ok_since.get(&rank).copied().unwrap_or(0),
                    Scope::Global => 0,
                };
                (
                    RankInfo {
                        rank,
                        state: RankState::Ok,
                        epoch,
                        generation: 0,
                    },
                    Modifier::Old,
                )
            }
        }
    }

    fn query(&self, scope: Scope, mask: StateMask) -> Vec<RankInfo> {
        (0..self.n)
            .map(|r| self.describe(scope, r))
            .filter(|(info, modifier)| mask.matches(info.state, *modifier))
            .map(|(info, _)| info)
            .collect()
    }
}

fn members(set: &RankSet) -> BTreeSet<Rank> {
    set.iter().collect()
}

const SENTINEL: RankInfo = RankInfo {
    rank: u32::MAX,
    state: RankState::Null,
    epoch: u32::MAX,
    generation: u32::MAX,
};

fn check(view: &FailureView, model: &Model) -> Result<(), TestCaseError> {
    let local = members(&view.local());
    let global = members(view.global());
    let pending = members(view.pending());
    prop_assert!(global.is_subset(&local), "G ⊄ L_i: {global:?} {local:?}");
    prop_assert!(
        local.is_subset(&model.ever_failed),
        "L_i ⊄ reported ∪ agreed"
    );
    prop_assert!(pending.is_subset(&model.ever_failed));
    prop_assert!(pending.is_disjoint(&local), "pending ∩ L_i ≠ ∅");
    prop_assert_eq!(
        &local,
        &model.local.keys().copied().collect::<BTreeSet<_>>()
    );
    prop_assert_eq!(
        &global,
        &model.global.keys().copied().collect::<BTreeSet<_>>()
    );
    prop_assert_eq!(&pending, &model.pending);
    prop_assert_eq!(view.epoch(Scope::Local), model.local_epoch);
    prop_assert_eq!(view.epoch(Scope::Global), model.global_epoch);

    for scope in [Scope::Local, Scope::Global] {
        for rank in 0..model.n {
            prop_assert_eq!(
                view.rank_info(scope, rank),
                Ok(model.describe(scope, rank)),
                "rank {} in {:?}",
                rank,
                scope
            );
        }
        prop_assert_eq!(
            view.rank_info(scope, model.n),
            Err(ViewError::RankOutOfRange {
                rank: model.n,
                n: model.n
            })
        );
        for bits in 0u8..32 {
            let mask = StateMask::from_bits_truncate(bits);
            let expected = model.query(scope, mask);
            let needed = expected.len();
            prop_assert_eq!(
                view.num_state(scope, mask),
                needed,
                "{:?} {:?}",
                scope,
                mask
            );

            // Roomy buffer: the answer, then the untouched rest.
            let mut out = vec![SENTINEL; needed + 2];
            prop_assert_eq!(view.get_state(scope, mask, &mut out), Ok(needed));
            prop_assert_eq!(&out[..needed], &expected[..], "{:?} {:?}", scope, mask);
            prop_assert!(out[needed..].iter().all(|i| *i == SENTINEL));

            // Exact buffer.
            let mut exact = vec![SENTINEL; needed];
            prop_assert_eq!(view.get_state(scope, mask, &mut exact), Ok(needed));
            prop_assert_eq!(&exact, &expected);

            // Too small by one, and empty: an error naming the size, nothing written.
            if needed > 0 {
                for len in [0, needed - 1] {
                    let mut small = vec![SENTINEL; len];
                    prop_assert_eq!(
                        view.get_state(scope, mask, &mut small),
                        Err(ViewError::BufferTooSmall { needed })
                    );
                    prop_assert!(small.iter().all(|i| *i == SENTINEL));
                }
            }
        }
    }
    Ok(())
}

fn arb_op(n: u32) -> impl Strategy<Value = Op> {
    // Ranks a little past n exercise the range checks.
    let any_rank = 0..n + 3;
    prop_oneof![
        4 => any_rank.clone().prop_map(Op::Report),
        2 => Just(Op::ValidateLocal),
        1 => (
            prop::collection::vec(any::<bool>(), 1..8),
            prop::collection::vec(0..n, 0..4)
        )
            .prop_map(|(keep, others)| Op::CommitGlobal { keep, others }),
        2 => any_rank.prop_map(Op::Recognize),
    ]
}

fn arb_script() -> impl Strategy<Value = (u32, Rank, Vec<Op>)> {
    (1u32..40).prop_flat_map(|n| (Just(n), 0..n, prop::collection::vec(arb_op(n), 0..60)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn failure_view_matches_the_naive_model((n, me, ops) in arb_script()) {
        let mut view = FailureView::new(n, me);
        let mut model = Model::new(n, me);
        check(&view, &model)?;
        for op in &ops {
            match op {
                Op::Report(rank) => {
                    prop_assert_eq!(view.on_rank_failed(*rank), model.on_rank_failed(*rank));
                }
                Op::ValidateLocal => {
                    prop_assert_eq!(view.validate_local(), model.validate_local());
                }
                Op::CommitGlobal { keep, others } => {
                    let agreed = model.agreed(keep, others);
                    let set = RankSet::from_ranks(n, agreed.iter().copied());
                    prop_assert_eq!(view.commit_global(&set), model.commit_global(&agreed));
                }
                Op::Recognize(rank) => {
                    prop_assert_eq!(view.recognize(*rank), model.recognize(*rank));
                }
            }
            check(&view, &model)?;
        }
    }
}

/// The case that made the model and the view disagree before the fix: a rank that an
/// agreement leaves out of `L_i` is `Ok` there with the commit's epoch, and a recognition
/// made before stands when it comes back.
#[test]
fn a_rank_dropped_by_the_agreement_keeps_its_recognition() {
    let mut view = FailureView::new(8, 0);
    view.on_rank_failed(3).unwrap();
    view.validate_local(); // local epoch 1
    view.recognize(3).unwrap();
    view.commit_global(&RankSet::new(8)); // local epoch 2: 3 dropped from L_i
    let (info, modifier) = view.rank_info(Scope::Local, 3).unwrap();
    assert_eq!(
        (info.state, info.epoch, modifier),
        (RankState::Ok, 2, Modifier::Old)
    );
    assert_eq!(view.validate_local(), Counts { failed: 1, new: 1 }); // local epoch 3
    let (info, modifier) = view.rank_info(Scope::Local, 3).unwrap();
    assert_eq!(
        (info.state, info.epoch, modifier),
        (RankState::Null, 3, Modifier::New)
    );
}
