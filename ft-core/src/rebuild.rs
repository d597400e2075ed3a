//! The admission rule of a rebuild: which spare takes each failed rank's number, and in
//! which incarnation.
//!
//! A group rebuilt after an agreed failed set `G` keeps its size and numbering. Each
//! rank of `G`, in increasing order, runs on the next spare of the list every member
//! holds (the first spare for the lowest failed rank), one incarnation more than the
//! process it replaces; the spares not taken stay for later rebuilds.
//!
//! Invariant (why admissions are agreed without a protocol of their own): the rule is
//! a function of `G`, the spare list and the generation table alone. `G` is decided by
//! `validate_global`'s uniform agreement; the spare list and the generations are the
//! same at every member, since the group that started them (a split) gave all members
//! the same list and every later change is this rule applied to an agreed `G`. So every
//! survivor that calls [`admissions`] after the same validation computes the same
//! admissions, and a member computing them from anything it alone knows (its local
//! view `L_i`) would break that: `ft-core`'s agreement tests check both.

use alloc::vec::Vec;

use crate::rank::Rank;
use crate::rankset::RankSet;

/// One admission: `spare` takes rank `rank`'s number in its `generation`-th incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The group rank replaced.
    pub rank: Rank,
    /// The spare taking its number (as the caller numbers spares).
    pub spare: Rank,
    /// The rank's incarnation from now on.
    pub generation: u32,
}

/// The admissions of one rebuild, and the spares left after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admissions {
    /// One per rank of `G`, in increasing rank order.
    pub admitted: Vec<Admitted>,
    /// The spares not taken, in their order.
    pub spares_left: Vec<Rank>,
}

/// `G` holds more ranks than there are spares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotEnoughSpares {
    /// The ranks to replace: `|G|`.
    pub needed: u32,
    /// The spares there are.
    pub left: u32,
}

/// The admissions of a rebuild after the agreed failed set `failed`, with `spares` the
/// spare list and `generations[r]` rank `r`'s incarnation (missing entries are 0).
pub fn admissions(
    failed: &RankSet,
    spares: &[Rank],
    generations: &[u32],
) -> Result<Admissions, NotEnoughSpares> {
    let needed = failed.len();
    if needed > spares.len() {
        return Err(NotEnoughSpares {
            needed: needed as u32,
            left: spares.len() as u32,
        });
    }
    let admitted = failed
        .iter()
        .zip(spares)
        .map(|(rank, &spare)| Admitted {
            rank,
            spare,
            generation: generations.get(rank as usize).copied().unwrap_or(0) + 1,
        })
        .collect();
    Ok(Admissions {
        admitted,
        spares_left: spares[needed..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: u32, ranks: &[Rank]) -> RankSet {
        let mut s = RankSet::new(n);
        for &r in ranks {
            s.insert(r);
        }
        s
    }

    #[test]
    fn the_lowest_failed_rank_takes_the_first_spare_one_incarnation_more() {
        let got = admissions(&set(6, &[4, 1]), &[10, 11, 12], &[0, 2, 0, 0, 0, 0]).unwrap();
        assert_eq!(
            got.admitted,
            [
                Admitted {
                    rank: 1,
                    spare: 10,
                    generation: 3
                },
                Admitted {
                    rank: 4,
                    spare: 11,
                    generation: 1
                },
            ]
        );
        assert_eq!(got.spares_left, [12]);
    }

    #[test]
    fn more_failures_than_spares_is_an_error_naming_both() {
        assert_eq!(
            admissions(&set(4, &[0, 1, 2]), &[7, 8], &[]),
            Err(NotEnoughSpares { needed: 3, left: 2 })
        );
        let none = admissions(&RankSet::new(4), &[], &[]).unwrap();
        assert!(none.admitted.is_empty() && none.spares_left.is_empty());
    }
}
