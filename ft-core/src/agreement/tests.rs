//! Unit tests of the trees and the codec.

use super::msg::{Msg, Report};
use super::round::Tree;
use super::*;
use crate::wire::{Context, Header};

#[test]
fn tree_is_binomial_over_the_live_ranks() {
    let excluded = RankSet::from_ranks(10, [0, 4]);
    let t = Tree::new(&excluded);
    // Live: 1 2 3 5 6 7 8 9 -> indices 0..8.
    assert_eq!(t.root(), Some(1));
    assert_eq!(t.children(1), [6, 3, 2]);
    assert_eq!(t.children(6), [8, 7]);
    assert_eq!(t.children(3), [5]);
    assert_eq!(t.parent(7), Some(6));
    assert_eq!(t.parent(9), Some(8));
    assert_eq!(t.parent(4), None);
    assert!(t.is_inner(1) && t.is_inner(6) && t.is_inner(3) && t.is_inner(8));
    assert!(!t.is_inner(2) && !t.is_inner(5) && !t.is_inner(7) && !t.is_inner(9));
    for r in [2, 3, 5, 6, 7, 8, 9] {
        let p = t.parent(r).unwrap();
        assert!(t.children(p).contains(&r));
        assert_eq!(t.is_inner(r), !t.children(r).is_empty());
    }
}

#[test]
fn trees_span_every_live_rank_with_logarithmic_depth() {
    for n in 1u32..=70 {
        for mask in [0u64, 1, 0b1011, 0x0f0f_0f0f, u64::MAX >> 3] {
            let excluded = RankSet::from_ranks(n, (0..n).filter(|r| mask >> (r % 64) & 1 == 1));
            let t = Tree::new(&excluded);
            let live: Vec<Rank> = (0..n).filter(|r| !excluded.contains(*r)).collect();
            let m = live.len() as u32;
            assert_eq!(t.root(), live.first().copied());
            let mut edges = 0;
            for &r in &live {
                let kids = t.children(r);
                assert_eq!(t.is_inner(r), !kids.is_empty());
                edges += kids.len();
                for &c in &kids {
                    assert_eq!(t.parent(c), Some(r));
                }
                let mut depth = 0;
                let mut at = r;
                while let Some(p) = t.parent(at) {
                    at = p;
                    depth += 1;
                }
                assert_eq!(Some(at), t.root());
                assert!(depth <= 32 - m.saturating_sub(1).leading_zeros());
            }
            assert_eq!(edges as u32, m.saturating_sub(1));
        }
    }
}

#[test]
fn frames_round_trip() {
    let n = 300;
    let set = |v: &[u32]| RankSet::from_ranks(n, v.iter().copied());
    let b = Ballot { round: 7, coord: 3 };
    let msgs = [
        Msg::Prepare {
            ballot: b,
            excluded: set(&[0, 1, 2]),
        },
        Msg::Promise {
            ballot: b,
            report: Report {
                contrib: set(&[9]),
                accepted: Some((Ballot { round: 2, coord: 0 }, set(&[1, 299]))),
                decided: Some(set(&[])),
                reject: Some(Ballot { round: 9, coord: 1 }),
            },
        },
        Msg::Promise {
            ballot: b,
            report: Report::empty(n),
        },
        Msg::Accept {
            ballot: b,
            value: set(&[5]),
        },
        Msg::Accepted {
            ballot: b,
            reject: None,
        },
        Msg::Decide {
            excluded: set(&[]),
            value: set(&(0..200).collect::<Vec<_>>()),
        },
        Msg::Sweep {
            round: 3,
            excluded: set(&[]),
            union: set(&[4, 8, 15]),
        },
        Msg::Sweep {
            round: 0,
            excluded: set(&[16, 17, 18, 19]),
            union: set(&[16, 17, 18, 19, 299]),
        },
        Msg::SweepDone { round: 0 },
        Msg::SweepDone { round: 17 },
        Msg::SweepLeft,
    ];
    for m in msgs {
        let mut w = m.header(4, 2, 11).start();
        m.put_payload(&mut w);
        let bytes = w.finish();
        let mut buf = alloc::vec![0u8; bytes.len()];
        assert_eq!(m.encode(4, 2, 11, &mut buf), Ok(bytes.len()));
        assert_eq!(buf, bytes);
        let (h, mut r) = Header::decode(&bytes, Context { comm: 4, n }, 11).unwrap();
        assert_eq!(h.epoch, 2);
        assert_eq!(Msg::decode(h.kind, &mut r).unwrap(), m);
        r.finish().unwrap();
    }
}
