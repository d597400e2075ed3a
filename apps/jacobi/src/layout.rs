//! [`Layout`]: which rank owns which rows. The rows `0..N` are cut into one contiguous
//! strip per rank of a list, in the list's order; after a shrink the recovery builds a
//! new layout over the survivors' new numbers and moves rows to match
//! ([`Layout::sources`] says who held them before).
//!
//! Invariants:
//! - the strips are non-empty, disjoint, in row order, and cover `0..N`: strip `i` of
//!   `k` is rows `[i·N/k, (i+1)·N/k)` (so `1 ≤ k ≤ N`);
//! - each rank of the list owns exactly one strip; the neighbours of a rank are the
//!   owners of the strips next to its own.

use std::ops::Range;

use ft::Rank;

/// Who owns which rows: see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    total_rows: u32,
    owners: Vec<Rank>,
}

impl Layout {
    /// `total_rows` cut evenly over `ranks`, strip `i` to `ranks[i]`.
    ///
    /// # Panics
    /// If `ranks` is empty, names a rank twice, or has more ranks than there are rows.
    pub fn even(total_rows: u32, ranks: &[Rank]) -> Layout {
        assert!(
            !ranks.is_empty() && ranks.len() as u64 <= u64::from(total_rows),
            "{} ranks for {total_rows} rows",
            ranks.len()
        );
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ranks.len(), "a rank twice in {ranks:?}");
        Layout {
            total_rows,
            owners: ranks.to_vec(),
        }
    }

    /// The grid's rows.
    pub fn total_rows(&self) -> u32 {
        self.total_rows
    }

    /// The owning ranks, in the order of their strips.
    pub fn ranks(&self) -> &[Rank] {
        &self.owners
    }

    /// The rank that reports the result: the lowest rank of the layout.
    pub fn reporter(&self) -> Rank {
        *self.owners.iter().min().expect("a layout has a rank")
    }

    /// The rows of strip `index`.
    fn strip(&self, index: usize) -> Range<u32> {
        let (k, n) = (self.owners.len() as u64, u64::from(self.total_rows));
        let at = |i: u64| (i * n / k) as u32;
        at(index as u64)..at(index as u64 + 1)
    }

    /// The index of `rank`'s strip, if it owns one.
    fn index_of(&self, rank: Rank) -> Option<usize> {
        self.owners.iter().position(|&r| r == rank)
    }

    /// The rows `rank` owns, if it owns any.
    pub fn rows_of(&self, rank: Rank) -> Option<Range<u32>> {
        self.index_of(rank).map(|i| self.strip(i))
    }

    /// The owner of the strip above `rank`'s, if there is one.
    pub fn above(&self, rank: Rank) -> Option<Rank> {
        let i = self.index_of(rank)?;
        i.checked_sub(1).map(|j| self.owners[j])
    }

    /// The owner of the strip below `rank`'s, if there is one.
    pub fn below(&self, rank: Rank) -> Option<Rank> {
        let i = self.index_of(rank)?;
        self.owners.get(i + 1).copied()
    }

    /// The owners of the rows `rows` under this layout and which part each holds, in
    /// row order (the strips a new owner of `rows` is assembled from).
    pub fn sources(&self, rows: Range<u32>) -> Vec<(Rank, Range<u32>)> {
        (0..self.owners.len())
            .filter_map(|i| {
                let strip = self.strip(i);
                let part = strip.start.max(rows.start)..strip.end.min(rows.end);
                (part.start < part.end).then_some((self.owners[i], part))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_cover_the_rows_in_order() {
        for (rows, k) in [(10, 1), (10, 3), (10, 10), (64, 7), (5, 4)] {
            let ranks: Vec<Rank> = (0..k).collect();
            let layout = Layout::even(rows, &ranks);
            let mut next = 0;
            for &r in &ranks {
                let own = layout.rows_of(r).unwrap();
                assert_eq!(own.start, next);
                assert!(own.end > own.start, "{rows} rows over {k}: rank {r} empty");
                next = own.end;
            }
            assert_eq!(next, rows);
        }
    }

    #[test]
    fn neighbours_and_sources_follow_the_strips() {
        let layout = Layout::even(12, &[0, 2, 5]);
        assert_eq!(layout.rows_of(2), Some(4..8));
        assert_eq!((layout.above(2), layout.below(2)), (Some(0), Some(5)));
        assert_eq!((layout.above(0), layout.below(5)), (None, None));
        assert_eq!(layout.rows_of(1), None);
        assert_eq!(layout.reporter(), 0);
        assert_eq!(layout.sources(3..9), [(0, 3..4), (2, 4..8), (5, 8..9)]);
        let shrunk = Layout::even(12, &[0, 1]);
        assert_eq!(shrunk.rows_of(1), Some(6..12));
    }
}
