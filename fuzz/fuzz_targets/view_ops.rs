//! An arbitrary sequence of `FailureView` operations, checked after every step against a
//! compact model (plain sets): `G ⊆ L_i ⊆ reported ∪ agreed`, `pending ∩ L_i = ∅`, the
//! validation counts, query counts per state, and the caller-buffer contract (a too-small
//! buffer is an error naming the size and is left untouched; a large one is written only
//! up to the answer).
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use ft_core::{
    Counts, FailureView, Rank, RankInfo, RankSet, RankState, Scope, StateMask, ViewError,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Report(u8),
    ValidateLocal,
    /// Agree on `G ∪ {members of L_i ∪ pending picked by the bits of keep} ∪ others`.
    CommitGlobal {
        keep: u32,
        others: Vec<u8>,
    },
    Recognize(u8),
    Query {
        global: bool,
        mask: u8,
        len: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    me: u8,
    ops: Vec<Op>,
}

#[derive(Default)]
struct Model {
    pending: BTreeSet<Rank>,
    local: BTreeSet<Rank>,
    global: BTreeSet<Rank>,
    recognized: BTreeSet<Rank>,
    ever_failed: BTreeSet<Rank>,
}

const SENTINEL: RankInfo = RankInfo {
    rank: u32::MAX,
    state: RankState::Ok,
    epoch: u32::MAX,
    generation: u32::MAX,
};

fn set(s: &RankSet) -> BTreeSet<Rank> {
    s.iter().collect()
}

fn check_sets(view: &FailureView, model: &Model) {
    let (local, global, pending) = (set(&view.local()), set(view.global()), set(view.pending()));
    assert!(global.is_subset(&local));
    assert!(local.is_subset(&model.ever_failed));
    assert!(pending.is_disjoint(&local));
    assert_eq!(local, model.local);
    assert_eq!(global, model.global);
    assert_eq!(pending, model.pending);
}

fn check_query(view: &FailureView, model: &Model, n: u32, scope: Scope, bits: u8, len: usize) {
    let mask = StateMask::from_bits_truncate(bits);
    let failed = match scope {
        Scope::Local => &model.local,
        Scope::Global => &model.global,
    };
    let needed = view.num_state(scope, mask);
    let mut out = vec![SENTINEL; len];
    match view.get_state(scope, mask, &mut out) {
        Err(ViewError::BufferTooSmall { needed: named }) => {
            assert_eq!(named, needed);
            assert!(len < needed);
            assert!(out.iter().all(|i| *i == SENTINEL));
        }
        Ok(written) => {
            assert_eq!(written, needed);
            assert!(out[written..].iter().all(|i| *i == SENTINEL));
            let rows = &out[..written];
            assert!(rows.windows(2).all(|w| w[0].rank < w[1].rank));
            for row in rows {
                assert!(row.rank < n);
                let expected = if !failed.contains(&row.rank) {
                    RankState::Ok
                } else if model.recognized.contains(&row.rank) {
                    RankState::Null
                } else {
                    RankState::Failed
                };
                assert_eq!(row.state, expected);
                let (info, modifier) = view.rank_info(scope, row.rank).unwrap();
                assert_eq!(info, *row);
                assert!(mask.matches(info.state, modifier));
            }
        }
        Err(e) => panic!("unexpected {e}"),
    }
    // Per-state totals, whatever the modifiers.
    let null = failed.intersection(&model.recognized).count();
    let any_modifier = StateMask::NEW | StateMask::OLD;
    assert_eq!(view.num_state(scope, StateMask::NULL), null);
    assert_eq!(
        view.num_state(scope, StateMask::FAILED),
        failed.len() - null
    );
    assert_eq!(
        view.num_state(scope, StateMask::OK | any_modifier),
        n as usize - failed.len()
    );
    assert_eq!(
        view.num_state(scope, StateMask::FAILED | StateMask::NULL | StateMask::NEW)
            + view.num_state(scope, StateMask::FAILED | StateMask::NULL | StateMask::OLD),
        failed.len()
    );
    assert_eq!(
        view.num_state(scope, StateMask::OK | StateMask::NEW),
        0,
        "an Ok rank is always Old"
    );
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 64) + 1;
    let me = u32::from(input.me) % n;
    let mut view = FailureView::new(n, me);
    let mut model = Model::default();
    // Ranks a little past n exercise the range checks.
    let rank = |b: u8| u32::from(b) % (n + 2);
    for op in input.ops.iter().take(256) {
        match op {
            Op::Report(r) => {
                let r = rank(*r);
                let got = view.on_rank_failed(r);
                let want = if r >= n {
                    Err(ViewError::RankOutOfRange { rank: r, n })
                } else if r == me {
                    Err(ViewError::SelfReported)
                } else if model.local.contains(&r) || model.pending.contains(&r) {
                    Ok(false)
                } else {
                    model.pending.insert(r);
                    model.ever_failed.insert(r);
                    Ok(true)
                };
                assert_eq!(got, want);
            }
            Op::ValidateLocal => {
                let new = model.pending.len();
                model.local.append(&mut model.pending);
                let want = Counts {
                    failed: model.local.len(),
                    new,
                };
                assert_eq!(view.validate_local(), want);
            }
            Op::CommitGlobal { keep, others } => {
                let mut agreed = model.global.clone();
                let candidates = model.local.iter().chain(&model.pending);
                for (i, &r) in candidates.enumerate() {
                    if keep >> (i % 32) & 1 == 1 {
                        agreed.insert(r);
                    }
                }
                agreed.extend(
                    others
                        .iter()
                        .map(|&b| u32::from(b) % n)
                        .filter(|&r| r != me),
                );
                let want = Counts {
                    failed: agreed.len(),
                    new: agreed.difference(&model.global).count(),
                };
                let got = view.commit_global(&RankSet::from_ranks(n, agreed.iter().copied()));
                assert_eq!(got, want);
                let dropped: Vec<Rank> = model.local.difference(&agreed).copied().collect();
                model.pending.extend(dropped);
                model.pending.retain(|r| !agreed.contains(r));
                model.ever_failed.extend(agreed.iter().copied());
                model.local = agreed.clone();
                model.global = agreed;
            }
            Op::Recognize(r) => {
                let r = rank(*r);
                let want = if r >= n {
                    Err(ViewError::RankOutOfRange { rank: r, n })
                } else if !model.local.contains(&r) {
                    Err(ViewError::NotFailed(r))
                } else {
                    model.recognized.insert(r);
                    Ok(())
                };
                assert_eq!(view.recognize(r), want);
            }
            Op::Query { global, mask, len } => {
                let scope = if *global { Scope::Global } else { Scope::Local };
                check_query(&view, &model, n, scope, *mask, usize::from(*len));
            }
        }
        check_sets(&view, &model);
    }
});
