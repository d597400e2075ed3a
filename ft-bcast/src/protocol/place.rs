//! Data chunks received in place ([`ft_core::Protocol::place_payload`]): a transport
//! that receives a frame's head before its payload asks where the payload goes, and a
//! data chunk of an output that comes in several chunks goes straight into the output's
//! one buffer (`state::Buffer`'s landing), so the output needs no join when it is
//! complete, and relays forward views of that buffer as they do any chunk.
//!
//! What is placed: a `BcastData` chunk of a broadcast this rank knows, whose output's
//! size is announced and matches, that is not the whole output (a one-chunk output is
//! kept as the frame it came in, with no copy and no new buffer), and whose bytes this
//! rank neither holds nor has placed already. Everything else gets `None`: the
//! transport receives it into its own buffer and hands the frame over as before. A
//! placed chunk comes back ([`Broadcaster::handle_frame_placed`]) with every check a
//! data frame gets; a slot that was not filled comes back
//! ([`Broadcaster::slot_lost`]) and its bytes may be placed again.
//!
//! **Allocation hook.** A task runtime that keeps its data in its own memory sets an
//! [`Allocate`] ([`Broadcaster::set_allocator`]), whose docs say when it is asked: the
//! output's one buffer is then the memory it gives.

use alloc::boxed::Box;
use core::fmt;

use ft_core::wire::{FrameKind, Header, Reader};
use ft_core::{Filled, FrameError, Landing, Slot};

use super::state::{Chunk, ChunkPlace};
use super::{Broadcaster, TaskId};

/// A data frame's fields, its payload aside: its broadcast, where the chunk goes and
/// its length.
fn data_head(r: &mut Reader<'_>) -> Result<(TaskId, ChunkPlace, u64), FrameError> {
    let task = TaskId::read(r)?;
    let output = r.varint_u32()?;
    let total = r.varint()?;
    let offset = r.varint()?;
    let len = r.varint()?;
    Ok((
        task,
        ChunkPlace {
            output,
            total,
            offset,
        },
        len,
    ))
}

/// Memory a task runtime gives for outputs to land in ([`Broadcaster::set_allocator`]).
///
/// The output's one buffer is the memory the hook gives (a [`Landing::lent`]), asked
/// for once per output of 1 byte or more, when its first chunk is placed or, for an
/// output that arrived in frames, when it is complete (its chunks are then copied in,
/// and counted in [`BcastStats::joined_bytes`](super::BcastStats::joined_bytes)). With
/// a hook, an output of one chunk is placed too. The hook is asked again for an output
/// only when the memory it gave was written in part by a source that died and the rest
/// came in frames from the new one; every buffer it gave is released once.
pub trait Allocate: Send {
    /// Memory of exactly `len` bytes (never 0) for output `output` of broadcast `task`
    /// at this rank, a destination or relay of it, or `None` for memory of the
    /// library's own. A landing of another length is not used (and so released).
    fn allocate(&mut self, task: TaskId, output: u32, len: usize) -> Option<Landing>;
}

impl<F> Allocate for F
where
    F: FnMut(TaskId, u32, usize) -> Option<Landing> + Send,
{
    fn allocate(&mut self, task: TaskId, output: u32, len: usize) -> Option<Landing> {
        self(task, output, len)
    }
}

/// The hook a broadcaster holds.
pub(super) struct Allocator(pub(super) Box<dyn Allocate>);

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Allocator")
    }
}

impl Allocator {
    /// What an output buffer asks for its memory: the hook's, if any, for output
    /// `output` of `task`, of the length asked (a landing of another length is refused).
    pub(super) fn lender(
        hook: &mut Option<Allocator>,
        task: TaskId,
        output: u32,
    ) -> impl FnMut(usize) -> Option<Landing> + '_ {
        move |len| {
            let landing = hook.as_mut()?.0.allocate(task, output, len)?;
            (landing.len() == len).then_some(landing)
        }
    }
}

impl Broadcaster {
    /// Makes `hook` give the memory outputs land in at this rank, for the outputs whose
    /// first byte arrives from now on (see [`Allocate`]).
    pub fn set_allocator(&mut self, hook: Box<dyn Allocate>) {
        self.allocator = Some(Allocator(hook));
    }

    /// Where the `len` payload bytes of the frame whose head `h`, `r` (positioned after
    /// the header, reading the head alone) is should be received: for a chunk of a
    /// multi-chunk output that this rank neither holds nor has placed, a slot of the
    /// output's landing buffer; else `None` (see
    /// [`Protocol::place_payload`](ft_core::Protocol::place_payload)).
    pub fn place_frame(&mut self, h: &Header, mut r: Reader<'_>, len: usize) -> Option<Slot> {
        if h.kind != FrameKind::BcastData || self.check_sender(h.sender).is_err() {
            return None;
        }
        let (task, at, announced) = data_head(&mut r).ok()?;
        r.finish().ok()?;
        if announced != len as u64 || len == 0 {
            return None;
        }
        let t = self.tasks.get_mut(&task)?;
        let &size = t.sizes.get(&at.output)?;
        let whole = len as u64 >= size && self.allocator.is_none();
        if size != at.total || whole || t.complete.contains(at.output) {
            return None;
        }
        super::serve::check_chunk(size, at.offset, len as u64).ok()?;
        let mut lend = Allocator::lender(&mut self.allocator, task, at.output);
        t.buffers
            .get_or_default(at.output)
            .claim(size, at.offset, len, &mut lend)
    }

    /// A data frame whose payload was received into a slot [`Broadcaster::place_frame`]
    /// gave: `h`, `r` read its head (positioned after the header), `payload` is the
    /// chunk. Checked and kept as any data frame ([`Broadcaster::handle_frame`]), the
    /// chunk as the view of the landing buffer it is.
    pub fn handle_frame_placed(
        &mut self,
        h: &Header,
        mut r: Reader<'_>,
        payload: Filled,
    ) -> Result<(), FrameError> {
        if h.kind != FrameKind::BcastData {
            return Err(FrameError::Malformed(
                "a placed payload on a frame without data",
            ));
        }
        self.check_sender(h.sender)?;
        let (task, at, len) = data_head(&mut r)?;
        r.finish()?;
        if len != payload.len() as u64 {
            return Err(FrameError::Malformed(
                "placed payload differs from its announced length",
            ));
        }
        self.on_data(task, at, Chunk::Landed(payload.into_bytes()))
    }

    /// Whether `slot` is one [`Broadcaster::place_frame`] gave (of a broadcast still
    /// kept here).
    pub fn holds(&self, slot: &Slot) -> bool {
        self.tasks
            .values()
            .flat_map(|t| t.buffers.values())
            .any(|buffer| buffer.holds(slot))
    }

    /// A slot [`Broadcaster::place_frame`] gave came back unfilled: its bytes may be
    /// placed again (a broadcast forgotten since keeps nothing of it).
    pub fn slot_lost(&mut self, slot: Slot) {
        let owner = self
            .tasks
            .values_mut()
            .flat_map(|t| t.buffers.values_mut())
            .find(|buffer| buffer.holds(&slot));
        if let Some(buffer) = owner {
            buffer.unclaim(slot);
        }
    }
}
