//! [`Strip`]: the contiguous rows of the grid one rank owns, with a ghost row on each
//! side for its neighbours' halos, in two buffers (the values after the last iteration,
//! and the ones the next iteration writes).
//!
//! Invariants:
//! - a strip owns rows `first..first + rows` of an `N × N` grid, `rows ≥ 1`; its
//!   buffers hold `rows + 2` rows of `N` values: local row 0 is the ghost above (row
//!   `first - 1`), local row `rows + 1` the ghost below (row `first + rows`);
//! - [`Strip::step`] reads only the current buffer and writes only the next one, then
//!   swaps them: every cell of an iteration is computed from the same old values,
//!   whichever strip holds its neighbours;
//! - a ghost is read only for an owned interior row next to it, so the ghost above is
//!   needed iff `first > 0` and the ghost below iff `first + rows < N`, exactly when
//!   that neighbour exists;
//! - the bytes of a strip ([`Strip::to_bytes`]) are its owned rows of the current
//!   buffer (the ghosts come again with the next halo exchange); [`Strip::from_bytes`]
//!   refuses any buffer that is not such an encoding with a typed error.

use std::fmt;
use std::ops::Range;

use crate::grid::{initial_value, stencil};

/// The first bytes of an encoded strip.
const MAGIC: [u8; 4] = *b"FTJS";
/// The encoding's version.
const VERSION: u32 = 1;
/// Magic, version, grid, first row, rows.
const HEADER: usize = 20;

/// The bytes of a row: its `f64` bits, little-endian, in column order.
pub fn row_bytes(row: &[f64]) -> Vec<u8> {
    row.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
}

/// One rank's rows of the grid: see the [module docs](self).
#[derive(Clone, Debug, PartialEq)]
pub struct Strip {
    grid: u32,
    first: u32,
    rows: u32,
    current: Vec<f64>,
    next: Vec<f64>,
}

/// A ghost row of a strip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The row above the first owned one.
    Above,
    /// The row below the last owned one.
    Below,
}

impl Strip {
    /// Rows `rows` of the starting grid of side `grid`.
    ///
    /// # Panics
    /// If `rows` is empty or reaches past the grid.
    pub fn initial(grid: u32, rows: Range<u32>) -> Strip {
        let mut strip = Strip::zeroed(grid, rows);
        for row in strip.rows() {
            let at = strip.offset(row);
            for (col, cell) in strip.current[at..at + grid as usize].iter_mut().enumerate() {
                *cell = initial_value(grid, row, col as u32);
            }
        }
        strip
    }

    /// A strip of rows `rows` whose values are all 0.0.
    fn zeroed(grid: u32, rows: Range<u32>) -> Strip {
        assert!(
            rows.start < rows.end && rows.end <= grid,
            "rows {rows:?} of a grid of {grid}"
        );
        let len = (rows.len() + 2) * grid as usize;
        Strip {
            grid,
            first: rows.start,
            rows: rows.end - rows.start,
            current: vec![0.0; len],
            next: vec![0.0; len],
        }
    }

    /// The side of the grid.
    pub fn grid(&self) -> u32 {
        self.grid
    }

    /// The rows this strip owns.
    pub fn rows(&self) -> Range<u32> {
        self.first..self.first + self.rows
    }

    /// Where global row `row` (owned, or one of the ghosts) starts in a buffer.
    fn offset(&self, row: u32) -> usize {
        (row + 1 - self.first) as usize * self.grid as usize
    }

    /// The current values of owned row `row`.
    ///
    /// # Panics
    /// If the strip does not own `row`.
    pub fn row(&self, row: u32) -> &[f64] {
        assert!(self.rows().contains(&row), "row {row} of {:?}", self.rows());
        let at = self.offset(row);
        &self.current[at..at + self.grid as usize]
    }

    /// The owned row a neighbour on `side` needs as its ghost: the first row for the
    /// rank above, the last for the rank below.
    pub fn edge_row(&self, side: Side) -> &[f64] {
        match side {
            Side::Above => self.row(self.first),
            Side::Below => self.row(self.first + self.rows - 1),
        }
    }

    /// The ghost row on `side`, to be filled with the neighbour's edge row.
    pub fn ghost_mut(&mut self, side: Side) -> &mut [f64] {
        let local = match side {
            Side::Above => 0,
            Side::Below => self.rows as usize + 1,
        };
        let n = self.grid as usize;
        &mut self.current[local * n..(local + 1) * n]
    }

    /// One Jacobi iteration over the owned rows; the ghosts must hold the neighbours'
    /// edge rows of the same iteration.
    pub fn step(&mut self) {
        let n = self.grid as usize;
        for local in 1..=self.rows as usize {
            let row = self.first + local as u32 - 1;
            let (before, rest) = self.current.split_at(local * n);
            let (middle, after) = rest.split_at(n);
            let out = &mut self.next[local * n..(local + 1) * n];
            if row == 0 || row + 1 == self.grid {
                out.copy_from_slice(middle);
                continue;
            }
            let (up, down) = (&before[(local - 1) * n..], &after[..n]);
            out[0] = middle[0];
            out[n - 1] = middle[n - 1];
            for col in 1..n - 1 {
                out[col] = stencil(up[col], down[col], middle[col - 1], middle[col + 1]);
            }
        }
        std::mem::swap(&mut self.current, &mut self.next);
    }

    /// The strip's owned rows, encoded (a checkpoint): see the [module docs](self).
    pub fn to_bytes(&self) -> Vec<u8> {
        let owned = self.rows as usize * self.grid as usize;
        let mut out = Vec::with_capacity(HEADER + 8 * owned);
        out.extend_from_slice(&MAGIC);
        for word in [VERSION, self.grid, self.first, self.rows] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        let at = self.offset(self.first);
        for value in &self.current[at..at + owned] {
            out.extend_from_slice(&value.to_bits().to_le_bytes());
        }
        out
    }

    /// The strip `bytes` encode ([`Strip::to_bytes`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Strip, DecodeError> {
        if bytes.len() < HEADER {
            return Err(DecodeError::Short(bytes.len()));
        }
        if bytes[..4] != MAGIC {
            return Err(DecodeError::Magic);
        }
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        let (version, grid, first, rows) = (word(1), word(2), word(3), word(4));
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        if rows == 0 || u64::from(first) + u64::from(rows) > u64::from(grid) {
            return Err(DecodeError::Rows { grid, first, rows });
        }
        let expected = HEADER as u64 + 8 * u64::from(rows) * u64::from(grid);
        if bytes.len() as u64 != expected {
            return Err(DecodeError::Length {
                expected,
                got: bytes.len(),
            });
        }
        let mut strip = Strip::zeroed(grid, first..first + rows);
        let at = strip.offset(first);
        let values = bytes[HEADER..].chunks_exact(8);
        for (cell, value) in strip.current[at..].iter_mut().zip(values) {
            *cell = f64::from_bits(u64::from_le_bytes(value.try_into().unwrap()));
        }
        Ok(strip)
    }

    /// A strip of owned rows `rows` of this one, with their current values (for
    /// handing part of a strip to another owner).
    ///
    /// # Panics
    /// If `rows` is empty or not within [`Strip::rows`].
    pub fn slice(&self, rows: Range<u32>) -> Strip {
        assert!(
            rows.start >= self.first && rows.end <= self.first + self.rows,
            "rows {rows:?} of {:?}",
            self.rows()
        );
        let mut part = Strip::zeroed(self.grid, rows.clone());
        let (from, len) = (self.offset(rows.start), rows.len() * self.grid as usize);
        let to = part.offset(rows.start);
        part.current[to..to + len].copy_from_slice(&self.current[from..from + len]);
        part
    }

    /// The strip of `parts` put end to end: they must be of one grid and cover
    /// contiguous rows, in any order.
    pub fn join(mut parts: Vec<Strip>) -> Result<Strip, JoinError> {
        parts.sort_by_key(|p| p.first);
        let (Some(head), Some(tail)) = (parts.first(), parts.last()) else {
            return Err(JoinError::Empty);
        };
        let mut whole = Strip::zeroed(head.grid, head.first..tail.first + tail.rows);
        let mut next_row = head.first;
        for part in &parts {
            if part.grid != whole.grid {
                return Err(JoinError::Grids(whole.grid, part.grid));
            }
            if part.first != next_row {
                return Err(JoinError::Gap {
                    expected: next_row,
                    got: part.first,
                });
            }
            let len = part.rows as usize * part.grid as usize;
            let (from, to) = (part.offset(part.first), whole.offset(part.first));
            whole.current[to..to + len].copy_from_slice(&part.current[from..from + len]);
            next_row += part.rows;
        }
        Ok(whole)
    }
}

/// Bytes that are not an encoded strip (a peer's or a store's input: never a panic).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header.
    Short(usize),
    /// The first bytes are not the strip magic.
    Magic,
    /// An encoding version this build does not read.
    Version(u32),
    /// No rows, or rows past the grid.
    Rows {
        /// The grid's side.
        grid: u32,
        /// The first row.
        first: u32,
        /// The rows.
        rows: u32,
    },
    /// The values do not fill the rows exactly.
    Length {
        /// The length the header implies.
        expected: u64,
        /// The length given.
        got: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short(n) => write!(f, "a strip of {n} bytes has no header"),
            DecodeError::Magic => f.write_str("not an encoded strip"),
            DecodeError::Version(v) => write!(f, "strip encoding version {v} is unknown"),
            DecodeError::Rows { grid, first, rows } => {
                write!(
                    f,
                    "{rows} rows from row {first} do not fit a grid of {grid}"
                )
            }
            DecodeError::Length { expected, got } => {
                write!(f, "a strip of {got} bytes, its header says {expected}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Parts that do not make one strip (a caller mistake).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoinError {
    /// No parts.
    Empty,
    /// Parts of two grid sizes.
    Grids(u32, u32),
    /// Rows missing or covered twice between two parts.
    Gap {
        /// The row the next part should start at.
        expected: u32,
        /// The row it starts at.
        got: u32,
    },
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Empty => f.write_str("no strips to join"),
            JoinError::Grids(a, b) => write!(f, "strips of grids {a} and {b}"),
            JoinError::Gap { expected, got } => {
                write!(f, "a strip starts at row {got}, not at row {expected}")
            }
        }
    }
}

impl std::error::Error for JoinError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strip_round_trips_through_its_bytes() {
        let mut strip = Strip::initial(8, 2..5);
        strip.step();
        let back = Strip::from_bytes(&strip.to_bytes()).unwrap();
        assert_eq!(back.rows(), 2..5);
        for row in 2..5 {
            assert_eq!(back.row(row), strip.row(row));
        }
    }

    #[test]
    fn bad_bytes_are_refused() {
        let bytes = Strip::initial(8, 0..3).to_bytes();
        assert_eq!(Strip::from_bytes(&bytes[..7]), Err(DecodeError::Short(7)));
        let cut = Strip::from_bytes(&bytes[..bytes.len() - 1]);
        assert!(matches!(cut, Err(DecodeError::Length { .. })));
        let mut other = bytes.clone();
        other[0] = b'X';
        assert_eq!(Strip::from_bytes(&other), Err(DecodeError::Magic));
        let mut past = bytes;
        past[12..16].copy_from_slice(&7u32.to_le_bytes());
        assert!(matches!(
            Strip::from_bytes(&past),
            Err(DecodeError::Rows { .. })
        ));
    }

    #[test]
    fn slices_join_back_into_the_strip() {
        let strip = Strip::initial(9, 1..7);
        let parts = vec![strip.slice(4..7), strip.slice(1..2), strip.slice(2..4)];
        let whole = Strip::join(parts).unwrap();
        assert_eq!(whole.to_bytes(), strip.to_bytes());
        let gap = Strip::join(vec![strip.slice(1..2), strip.slice(3..7)]);
        assert_eq!(
            gap,
            Err(JoinError::Gap {
                expected: 2,
                got: 3
            })
        );
        assert_eq!(Strip::join(Vec::new()), Err(JoinError::Empty));
    }
}
