//! The problem every layout solves: an `N × N` grid of `f64` with a fixed boundary and
//! a deterministic interior, relaxed by the 5-point Jacobi stencil.
//!
//! Invariants:
//! - [`initial_value`] is a function of `(N, row, col)` alone, so every rank builds its
//!   rows of the starting grid without talking to anyone, and a serial run builds the
//!   same grid;
//! - boundary cells ([`is_boundary`]) never change;
//! - an interior cell's next value is [`stencil`] of its four neighbours' old values,
//!   always in the same order of operations, so the result is bit for bit the same
//!   whichever rank computes it: the final grid does not depend on the strip layout.

/// Whether `(row, col)` lies on the boundary of an `n × n` grid.
pub fn is_boundary(n: u32, row: u32, col: u32) -> bool {
    row == 0 || col == 0 || row + 1 == n || col + 1 == n
}

/// The value of `(row, col)` before the first iteration: on the boundary, 1.0 along
/// the top row, falling linearly from 1.0 to 0.0 down the left column, 0.0 along the
/// bottom row and the right column; inside, a fixed pattern in `[0, 1)` that makes the
/// result depend on every cell's place.
pub fn initial_value(n: u32, row: u32, col: u32) -> f64 {
    if row == 0 {
        1.0
    } else if row + 1 == n || col + 1 == n {
        0.0
    } else if col == 0 {
        1.0 - f64::from(row) / f64::from(n - 1)
    } else {
        let pattern = (u64::from(row) * 31 + u64::from(col) * 17) % 97;
        pattern as f64 / 97.0
    }
}

/// The next value of an interior cell from its neighbours' old values.
#[inline]
pub fn stencil(up: f64, down: f64, left: f64, right: f64) -> f64 {
    0.25 * ((up + down) + (left + right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boundary_is_where_the_initial_values_say() {
        let n = 5;
        assert_eq!(initial_value(n, 0, 4), 1.0);
        assert_eq!(initial_value(n, 2, 0), 0.5);
        assert_eq!(initial_value(n, 4, 0), 0.0);
        assert_eq!(initial_value(n, 2, 4), 0.0);
        assert!(is_boundary(n, 4, 2) && !is_boundary(n, 1, 3));
        let inside = initial_value(n, 1, 1);
        assert!((0.0..1.0).contains(&inside));
    }
}
