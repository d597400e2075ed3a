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

use ft_core::wire::{FrameKind, Header, Reader};
use ft_core::{Filled, FrameError, Slot};

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

impl Broadcaster {
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
        if size != at.total || len as u64 >= size || t.complete.contains(at.output) {
            return None;
        }
        super::serve::check_chunk(size, at.offset, len as u64).ok()?;
        t.buffers
            .get_or_default(at.output)
            .claim(size, at.offset, len)
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
