//! The broadcast's typed frames and their codec: an activation (`BcastActivate`) and
//! the parts of a subtree that did not fit it (`BcastSubtree`), a request
//! (`BcastRequest`) and a chunk of data (`BcastData`). Output sets travel as a count
//! and gaps (varints), subtree entries as child, parent, needs and fetch set.
//!
//! Every frame's body starts with the broadcast's [`TaskId`] (root, key).
//! `BcastActivate`: tree, flags ([`DATA_FOLLOWS`]: the sender streams the child's fetch
//! set without a request; any other bit is refused), ancestors (count, ranks), needs,
//! fetch set, one size per fetched output, the subtree's entry count, as many entries
//! as fit, then the root's activation header last (its length, its bytes: it can
//! travel as the frame's tail, a slice of the buffer that holds it). `BcastSubtree`: tree, position of its first entry, entries.
//! `BcastRequest`: tree, outputs, then one offset per requested output in the set's
//! order: the bytes the requester holds contiguously from 0 (its in-order prefix), from
//! which it asks the output streamed ([`Want`]). `BcastData`: output, total size,
//! offset, then the chunk (its length, its bytes) last, so a chunk can travel as a
//! separate payload.
//!
//! Decoding checks everything a peer controls before any state changes: counts within
//! the frame, output indices under [`Config::max_outputs`](super::Config), each
//! entry's needs within its fetch set, an activation header within
//! [`Config::max_header_bytes`](super::Config), request offsets within
//! [`Config::max_output_bytes`](super::Config); [`Broadcaster::handle_frame`] then hands the
//! decoded frame to the serving code (`on_activate`, ...), which checks it against the
//! broadcast's state.

use alloc::vec::Vec;

use bytes::Bytes;
use ft_core::wire::{self, FrameKind, Header, Reader, Sink, Writer};
use ft_core::{FrameError, Instant, Rank};

use smallvec::SmallVec;

use super::state::{bytes_of_frame, Chunk, ChunkPlace, Entry, IdMap, TreeState};
use super::{Broadcaster, TaskId};
use crate::outputs::OutputSet;

/// The activation frames of one round of `progress`, every child's in turn: inline for
/// a few children (each frame is its own vector, queued as it is).
pub(super) type Frames = SmallVec<[Vec<u8>; 4]>;

/// Ancestors carried in an activation: the root and the nearest ones. If all the
/// nearest die, the root (which holds everything) is the fallback.
pub(super) const MAX_ANCESTORS: usize = 64;

/// Activation flag: the sender streams the child's whole fetch set from offset 0 right
/// after this activation; the child sends no request unless its sender dies.
pub(super) const DATA_FOLLOWS: u64 = 1;

pub(super) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(super) fn set_len(set: &OutputSet) -> usize {
    let mut len = varint_len(set.len() as u64);
    let mut prev: Option<u32> = None;
    for j in set {
        len += varint_len(u64::from(prev.map_or(j, |p| j - p - 1)));
        prev = Some(j);
    }
    len
}

pub(super) fn put_set(w: &mut Writer, set: &OutputSet) {
    w.put_varint(set.len() as u64);
    let mut prev: Option<u32> = None;
    for j in set {
        w.put_varint(u64::from(prev.map_or(j, |p| j - p - 1)));
        prev = Some(j);
    }
}

pub(super) fn read_set(r: &mut Reader<'_>, max: u32) -> Result<OutputSet, FrameError> {
    let count = r.varint()?;
    if count > r.remaining() as u64 {
        return Err(FrameError::Truncated);
    }
    let mut set = OutputSet::new();
    let mut next_min: u64 = 0;
    for _ in 0..count {
        let j = next_min
            .checked_add(r.varint()?)
            .ok_or(FrameError::Malformed("output index overflow"))?;
        if j >= u64::from(max) {
            return Err(FrameError::Malformed("output index over the limit"));
        }
        set.insert(j as u32);
        next_min = j + 1;
    }
    Ok(set)
}

pub(super) fn entry_len(e: &Entry) -> usize {
    varint_len(e.child.into()) + varint_len(e.parent.into()) + set_len(&e.needs) + set_len(&e.fetch)
}

pub(super) fn put_entry(w: &mut Writer, e: &Entry) {
    w.put_rank(e.child).put_rank(e.parent);
    put_set(w, &e.needs);
    put_set(w, &e.fetch);
}

pub(super) fn read_entries(r: &mut Reader<'_>, max: u32) -> Result<Vec<Entry>, FrameError> {
    let count = r.varint()?;
    if count > r.remaining() as u64 {
        return Err(FrameError::Truncated);
    }
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let child = r.rank()?;
        let parent = r.rank()?;
        let needs = read_set(r, max)?;
        let fetch = read_set(r, max)?;
        if !needs.is_subset(&fetch) {
            return Err(FrameError::Malformed(
                "subtree entry needs more than it fetches",
            ));
        }
        entries.push(Entry {
            child,
            parent,
            needs,
            fetch,
        });
    }
    Ok(entries)
}

/// One output a request asks for, and where its stream starts: the length of the
/// prefix the requester holds contiguously from 0 (0 for the whole output). Within an
/// output of `size` bytes it is a place a chunk can start: below `size`, or 0 for an
/// empty output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Want {
    pub(super) output: u32,
    pub(super) offset: u64,
}

/// Writes where a data chunk belongs after its header (output, total size, offset):
/// the fields `place::data_head` reads back, then the chunk (its length, its bytes).
pub(super) fn put_chunk_place<S: Sink>(w: &mut Writer<S>, at: ChunkPlace) {
    w.put_varint(at.output.into())
        .put_varint(at.total)
        .put_varint(at.offset);
}

/// Writes a request's fields after its header: tree, outputs (`wants` in increasing
/// output order, each once), then their offsets in that order.
pub(super) fn put_request(w: &mut Writer, tree: u32, wants: &[Want]) {
    w.put_varint(tree.into());
    let outputs: OutputSet = wants.iter().map(|want| want.output).collect();
    debug_assert_eq!(outputs.len(), wants.len(), "outputs in order, each once");
    put_set(w, &outputs);
    for want in wants {
        w.put_varint(want.offset);
    }
}

/// Reads a request's fields (as [`put_request`] writes them) up to the end of the
/// frame: its tree and what it wants. An offset over `max_offset` (the largest output a
/// peer may announce) is refused here; one past its output's announced size, by the
/// serving code.
pub(super) fn read_request(
    mut r: Reader<'_>,
    max_outputs: u32,
    max_offset: u64,
) -> Result<(u32, Vec<Want>), FrameError> {
    let tree = r.varint_u32()?;
    let outputs = read_set(&mut r, max_outputs)?;
    let mut wants = Vec::with_capacity(outputs.len());
    for output in &outputs {
        let offset = r.varint()?;
        if offset > max_offset {
            return Err(FrameError::Malformed(
                "request offset over the output size limit",
            ));
        }
        wants.push(Want { output, offset });
    }
    r.finish()?;
    Ok((tree, wants))
}

/// A decoded activation.
pub(super) struct Activation {
    pub(super) tree: u32,
    /// The root's activation header (a slice of the frame when it was handed over).
    pub(super) header: Bytes,
    /// The sender pushes the fetch set ([`DATA_FOLLOWS`]).
    pub(super) data_follows: bool,
    pub(super) ancestors: Vec<Rank>,
    pub(super) needs: OutputSet,
    pub(super) fetch: OutputSet,
    pub(super) sizes: Vec<(u32, u64)>,
    pub(super) expected: usize,
    pub(super) entries: Vec<Entry>,
}

impl Broadcaster {
    /// Feeds a frame whose header was already decoded and checked against this
    /// broadcaster's communicator (by a layer that dispatches on
    /// [`FrameKind::family`]); `r` is positioned after the header. The same as
    /// [`Protocol::handle_message`](ft_core::Protocol::handle_message) without decoding the header a second time.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        h: &Header,
        r: Reader<'_>,
    ) -> Result<(), FrameError> {
        self.decode_frame(now, h, r, None)
    }

    /// [`Broadcaster::handle_frame`] for a frame handed over whole: `r` reads `frame`
    /// (positioned after the header), and a data chunk is kept as a slice of `frame`,
    /// not copied ([`BcastStats::received_bytes_in_place`](super::BcastStats)). The
    /// outcome is the same as `handle_frame` on the same bytes. If `r` does not read
    /// `frame` (a caller's mistake), the chunk is copied as from a borrowed frame.
    pub fn handle_frame_owned(
        &mut self,
        now: Instant,
        h: &Header,
        r: Reader<'_>,
        frame: &Bytes,
    ) -> Result<(), FrameError> {
        self.decode_frame(now, h, r, Some(frame))
    }

    /// Whether a frame of `from` may be served: not a rank known dead, not this rank, and
    /// the communicator not revoked.
    pub(super) fn check_sender(&self, from: Rank) -> Result<(), FrameError> {
        if self.dead.contains(from) {
            return Err(FrameError::FromFailedRank(from));
        }
        // No correct peer is this rank: answering would make it send frames to itself.
        if from == self.cfg.me {
            return Err(FrameError::Malformed("frame from self"));
        }
        if self.revoked {
            return Err(FrameError::Revoked);
        }
        Ok(())
    }

    /// Decodes and serves one frame; a data chunk is kept from `frame` when it lies
    /// within it, else copied.
    pub(super) fn decode_frame(
        &mut self,
        _now: Instant,
        h: &Header,
        mut r: Reader<'_>,
        frame: Option<&Bytes>,
    ) -> Result<(), FrameError> {
        let from = h.sender;
        self.check_sender(from)?;
        let max = self.cfg.max_outputs;
        let task = TaskId::read(&mut r)?;
        match h.kind {
            FrameKind::BcastActivate => {
                let tree = r.varint_u32()?;
                let flags = r.varint()?;
                if flags & !DATA_FOLLOWS != 0 {
                    return Err(FrameError::Malformed("unknown activation flags"));
                }
                let count = r.varint()?;
                if count == 0 || count > r.remaining() as u64 || count > MAX_ANCESTORS as u64 + 1 {
                    return Err(FrameError::Malformed("bad ancestor count"));
                }
                let mut ancestors = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    ancestors.push(r.rank()?);
                }
                let needs = read_set(&mut r, max)?;
                let fetch = read_set(&mut r, max)?;
                let mut sizes = Vec::with_capacity(fetch.len());
                for j in &fetch {
                    sizes.push((j, r.varint()?));
                }
                let expected = usize::try_from(r.varint()?)
                    .map_err(|_| FrameError::Malformed("subtree size overflows"))?;
                let entries = read_entries(&mut r, max)?;
                let header = r.bytes()?;
                r.finish()?;
                if header.len() > self.cfg.max_header_bytes {
                    return Err(FrameError::Malformed(
                        "activation header over the configured limit",
                    ));
                }
                self.on_activate(
                    task,
                    from,
                    Activation {
                        tree,
                        header: bytes_of_frame(frame, header),
                        data_follows: flags & DATA_FOLLOWS != 0,
                        ancestors,
                        needs,
                        fetch,
                        sizes,
                        expected,
                        entries,
                    },
                )
            }
            FrameKind::BcastSubtree => {
                let tree = r.varint_u32()?;
                let first = usize::try_from(r.varint()?)
                    .map_err(|_| FrameError::Malformed("subtree position overflows"))?;
                let entries = read_entries(&mut r, max)?;
                r.finish()?;
                self.on_subtree(task, from, tree, first, entries)
            }
            FrameKind::BcastRequest => {
                let (_tree, wants) = read_request(r, max, self.cfg.max_output_bytes)?;
                self.on_request(task, from, wants)
            }
            FrameKind::BcastData => {
                let output = r.varint_u32()?;
                let total = r.varint()?;
                let offset = r.varint()?;
                let chunk = r.bytes()?;
                r.finish()?;
                let at = ChunkPlace {
                    output,
                    total,
                    offset,
                };
                self.on_data(task, at, Chunk::of_frame(frame, chunk))
            }
            other => Err(FrameError::UnexpectedKind(other as u8)),
        }
    }
}

/// The activation of the child at `tree.entries[at]` in `task`, split into frames of
/// at most `cap` bytes and appended to `frames`: a `BcastActivate` (saying
/// [`DATA_FOLLOWS`] if `data_follows`) and as many `BcastSubtree` as the subtree needs.
/// The activation ends with the length of the root's header (`header_len` bytes),
/// whose bytes the caller sends after it as the frame's tail.
#[allow(clippy::too_many_arguments)]
pub(super) fn activation_frames(
    frames: &mut Frames,
    head: Header,
    task: TaskId,
    header_len: usize,
    tree_id: u32,
    tree: &TreeState,
    at: usize,
    owners: &[u32],
    sizes: &IdMap<u64>,
    cap: usize,
    data_follows: bool,
) {
    let e = &tree.entries[at];
    // The child's descendants, parent-first (`owners`: `TreeState::owners`), walked
    // twice (to count them, then to write them) rather than collected.
    let subtree = tree.entries[at + 1..]
        .iter()
        .zip(&owners[at + 1..])
        .filter(move |&(_, &owner)| owner == at as u32)
        .map(|(d, _)| d);
    let count = subtree.clone().count();
    // The child's ancestors: this rank's, then this rank. A chain longer than
    // MAX_ANCESTORS keeps the root and the nearest ones.
    let (root, nearest) = if tree.ancestors.len() + 1 > MAX_ANCESTORS {
        let skip = tree.ancestors.len() + 1 - (MAX_ANCESTORS - 1);
        (tree.ancestors.first().copied(), &tree.ancestors[skip..])
    } else {
        (None, &tree.ancestors[..])
    };
    let ancestors = root
        .into_iter()
        .chain(nearest.iter().copied())
        .chain(core::iter::once(head.sender));

    let mut w = head.start();
    task.put(&mut w);
    w.put_varint(tree_id.into());
    w.put_varint(if data_follows { DATA_FOLLOWS } else { 0 });
    w.put_varint((usize::from(root.is_some()) + nearest.len() + 1) as u64);
    let mut used = wire::HEADER_LEN + task.wire_len() + 5 + 1 + 5;
    for a in ancestors {
        w.put_rank(a);
        used += varint_len(a.into());
    }
    put_set(&mut w, &e.needs);
    put_set(&mut w, &e.fetch);
    used += set_len(&e.needs) + set_len(&e.fetch);
    for j in &e.fetch {
        let s = sizes.get(&j).copied().unwrap_or(0);
        w.put_varint(s);
        used += varint_len(s);
    }
    w.put_varint(count as u64);
    used += 10 + varint_len(header_len as u64) + header_len;
    let mut rest = subtree;
    let mut left = count;
    let mut sent = 0usize;
    let mut batch_start = used;
    loop {
        let mut take = 0;
        let mut size = batch_start + 5;
        for d in rest.clone() {
            size += entry_len(d);
            if size > cap {
                break;
            }
            take += 1;
        }
        // An entry always fits an empty frame (a few dozen bytes per output).
        let take = take.max(usize::from(left > 0));
        w.put_varint(take as u64);
        for d in rest.by_ref().take(take) {
            put_entry(&mut w, d);
        }
        if sent == 0 {
            w.put_varint(header_len as u64);
        }
        frames.push(w.finish());
        left -= take;
        sent += take;
        if left == 0 {
            return;
        }
        w = Header {
            kind: FrameKind::BcastSubtree,
            ..head
        }
        .start();
        task.put(&mut w);
        w.put_varint(tree_id.into());
        w.put_varint(sent as u64);
        batch_start = wire::HEADER_LEN + task.wire_len() + 5 + 10;
    }
}
