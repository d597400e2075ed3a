//! The per-rank solver: iterations from any starting point ([`run_from`], which a
//! recovery resumes with the strip and layout it restored), and the end of a job
//! ([`finish`]: the checksum at the reporting rank).
//!
//! Invariants:
//! - iteration `i` starts with the hooks ([`Hooks::before_iteration`]: checkpoints,
//!   `--kill`), then exchanges the halos of the values after `i` iterations, then
//!   steps; so after `run_from(.., start, end, ..)` returns `Ok` the strip holds the
//!   values after `end` iterations, whatever `start` was, provided the strip held
//!   those after `start`;
//! - a failure anywhere interrupts the loop at the iteration it was seen in
//!   ([`Interrupted`]) with the strip left as it was at that iteration's start or
//!   partly exchanged: a recovery restores a checkpoint rather than trusting it;
//! - [`finish`] moves only row digests: each rank of the layout sends its rows'
//!   digests to the reporter ([`Layout::reporter`]), which combines them in row order
//!   and then tells every other rank (spares included) that the job is over, so no
//!   rank leaves while the reporter still needs it.

use std::fmt;

use ft::Rank;

use crate::checksum::{combine, strip_digests};
use crate::halo::{exchange, HaloError, Kind, Mailbox};
use crate::layout::Layout;
use crate::strip::{Side, Strip};

/// What a rank does as each iteration starts.
pub trait Hooks {
    /// Runs before iteration `iteration`'s halos go out; `strip` holds the values after
    /// `iteration` iterations. An error interrupts the solver.
    fn before_iteration(&mut self, iteration: u32, strip: &Strip) -> Result<(), HaloError>;
}

/// The solver stopped at `iteration` because of `cause`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interrupted {
    /// The iteration under way (the job's iteration count for [`finish`]).
    pub iteration: u32,
    /// Why.
    pub cause: HaloError,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at iteration {}: {}", self.iteration, self.cause)
    }
}

impl std::error::Error for Interrupted {}

/// Runs iterations `start..end` of this rank's strip `strip` under `layout`.
pub fn run_from(
    mailbox: &mut Mailbox<'_>,
    layout: &Layout,
    strip: &mut Strip,
    start: u32,
    end: u32,
    hooks: &mut dyn Hooks,
) -> Result<(), Interrupted> {
    let me = mailbox.me();
    debug_assert_eq!(layout.rows_of(me), Some(strip.rows()), "rank {me}'s strip");
    for iteration in start..end {
        let at = |cause| Interrupted { iteration, cause };
        hooks.before_iteration(iteration, strip).map_err(at)?;
        exchange(mailbox, layout, me, strip, iteration).map_err(at)?;
        strip.step();
    }
    Ok(())
}

/// Ends the job after `iterations`: the checksum at the reporter (`Some`), `None` at
/// every other rank of `layout` once the reporter has it. `idle` are ranks outside the
/// layout (spares) that wait for the end too.
pub fn finish(
    mailbox: &mut Mailbox<'_>,
    layout: &Layout,
    strip: &Strip,
    iterations: u32,
    idle: &[Rank],
) -> Result<Option<String>, Interrupted> {
    let at = |cause| Interrupted {
        iteration: iterations,
        cause,
    };
    let (me, reporter) = (mailbox.me(), layout.reporter());
    let tag = |kind| mailbox.tag(kind, iterations, Side::Above);
    let (digests_tag, done_tag) = (tag(Kind::Digests), tag(Kind::Done));
    if me != reporter {
        let bytes: Vec<u8> = strip_digests(strip)
            .iter()
            .flat_map(|d| d.to_le_bytes())
            .collect();
        mailbox.send(reporter, digests_tag, bytes).map_err(at)?;
        mailbox
            .receive(reporter, done_tag, &[reporter])
            .map_err(at)?;
        return Ok(None);
    }
    let mut digests = Vec::with_capacity(layout.total_rows() as usize);
    for &rank in layout.ranks() {
        if rank == me {
            digests.extend(strip_digests(strip));
            continue;
        }
        let rows = layout.rows_of(rank).expect("a rank of the layout").len();
        let bytes = mailbox.receive(rank, digests_tag, &[rank]).map_err(at)?;
        if bytes.len() != 16 * rows {
            return Err(at(HaloError::Malformed {
                from: rank,
                tag: digests_tag,
                len: bytes.len(),
            }));
        }
        digests.extend(
            bytes
                .chunks_exact(16)
                .map(|d| u128::from_le_bytes(d.try_into().unwrap())),
        );
    }
    let checksum = combine(layout.total_rows(), digests);
    let others = layout.ranks().iter().chain(idle).filter(|&&r| r != me);
    for &rank in others {
        // A rank that died since has nothing left to do.
        let _ = mailbox.send(rank, done_tag, Vec::new());
    }
    Ok(Some(checksum))
}
