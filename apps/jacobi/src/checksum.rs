//! The checksum of a grid, the same for every strip layout: an xxh3-128 digest of each
//! row's `f64` bits (little-endian, in column order), then an xxh3-128 over the grid's
//! side and those row digests in row order. Each rank digests its own rows; only the
//! digests (16 bytes a row) travel to the reporting rank, never the grid.

use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::strip::{row_bytes, Strip};

/// The digest of one row.
pub fn row_digest(row: &[f64]) -> u128 {
    xxh3_128(&row_bytes(row))
}

/// The digests of `strip`'s rows, in row order.
pub fn strip_digests(strip: &Strip) -> Vec<u128> {
    strip.rows().map(|r| row_digest(strip.row(r))).collect()
}

/// The grid's checksum from its side and every row's digest in row order, in hex.
pub fn combine(grid: u32, row_digests: impl IntoIterator<Item = u128>) -> String {
    let mut h = Xxh3::new();
    h.update(&u64::from(grid).to_le_bytes());
    for digest in row_digests {
        h.update(&digest.to_le_bytes());
    }
    format!("{:032x}", h.digest128())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_does_not_depend_on_the_cut() {
        let whole = strip_digests(&Strip::initial(10, 0..10));
        let mut cut = strip_digests(&Strip::initial(10, 0..3));
        cut.extend(strip_digests(&Strip::initial(10, 3..10)));
        assert_eq!(combine(10, whole.clone()), combine(10, cut));
        let mut swapped = whole.clone();
        swapped.swap(1, 2);
        assert_ne!(combine(10, whole), combine(10, swapped));
    }
}
