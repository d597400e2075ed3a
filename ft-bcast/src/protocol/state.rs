//! A broadcast's state at one rank: its place in each tree ([`TreeState`]: parent,
//! ancestors, what it needs and fetches, its subtree), the outputs' bytes as they
//! arrive ([`Buffer`]), requests waiting for data ([`Waiting`]), all of it per task
//! ([`Task`]), and the frames waiting to go out ([`Outgoing`]).
//!
//! Invariants: a subtree is complete when it holds as many entries as its activation
//! announced, parent-first, each fetching within its parent's fetch set
//! ([`validate_entries`]); a buffer never holds more than its output's announced size,
//! and only what arrived.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use bytes::{Bytes, BytesMut};
use hashbrown::{HashMap, HashSet};
use smallvec::SmallVec;

use ft_core::{FrameError, Landing, Rank, RankSet, Slot};

use super::codec::Want;
use super::{BcastStats, TaskId};
use crate::outputs::OutputSet;

/// Lent memory for an output of the given length, when the application gives it (an
/// allocation hook, [`super::Allocate`]).
pub(super) type Lend<'a> = &'a mut dyn FnMut(usize) -> Option<Landing>;

/// A descendant in a rank's subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) child: Rank,
    pub(super) parent: Rank,
    pub(super) needs: OutputSet,
    pub(super) fetch: OutputSet,
}

/// This rank's place in one tree of one broadcast.
#[derive(Clone, Debug)]
pub(super) struct TreeState {
    /// Where this rank fetches from (itself at the root).
    pub(super) parent: Rank,
    /// Root first; the last is the original parent.
    pub(super) ancestors: Vec<Rank>,
    pub(super) needs: OutputSet,
    pub(super) fetch: OutputSet,
    /// Descendants, parent-first, as the activation announced them (dead ones
    /// included: their children's effective parent is their nearest live ancestor).
    pub(super) entries: Vec<Entry>,
    /// Position of each descendant in `entries`.
    pub(super) index: HashMap<Rank, usize>,
    /// Live descendants whose nearest live ancestor is this rank, by entry position.
    pub(super) direct: Vec<usize>,
    /// Entries announced by the activation (the subtree is complete when all are here).
    pub(super) expected: usize,
    /// The sender of the activation whose subtree `entries` holds.
    pub(super) source: Rank,
    /// Direct children already activated.
    pub(super) activated: HashSet<Rank>,
    /// The rank the fetch set was last requested from, or that pushes it (its
    /// activation said data follows).
    pub(super) requested_from: Option<Rank>,
    pub(super) released: bool,
}

impl TreeState {
    pub(super) fn complete_subtree(&self) -> bool {
        self.entries.len() == self.expected
    }

    /// Appends `part`, whose children [`validate_entries`] has put in the index.
    pub(super) fn extend_indexed(&mut self, part: Vec<Entry>) {
        if self.entries.is_empty() {
            self.entries = part;
        } else {
            self.entries.extend(part);
        }
    }

    /// For each entry (by position), the position of the entry of `direct` whose subtree
    /// it lies in (itself for an entry of `direct`), or `u32::MAX` for none (a dead
    /// entry between this rank and its direct descendants). One pass, parent-first: an
    /// entry's parent comes before it.
    pub(super) fn owners(&self) -> PerEntry {
        let mut owner: PerEntry = smallvec::smallvec![u32::MAX; self.entries.len()];
        for &k in &self.direct {
            owner[k] = k as u32;
        }
        for (k, e) in self.entries.iter().enumerate() {
            if owner[k] == u32::MAX {
                if let Some(&p) = self.index.get(&e.parent) {
                    if p < k {
                        owner[k] = owner[p];
                    }
                }
            }
        }
        owner
    }

    /// Recomputes `direct`: live descendants whose chain of parents up to this rank
    /// passes only through dead ranks (re-attachment after failures).
    pub(super) fn recompute_direct(&mut self, me: Rank, dead: &RankSet) {
        self.direct.clear();
        for (k, e) in self.entries.iter().enumerate() {
            if dead.contains(e.child) {
                continue;
            }
            let mut p = e.parent;
            while p != me && dead.contains(p) {
                match self.index.get(&p) {
                    Some(&i) => p = self.entries[i].parent,
                    None => break,
                }
            }
            if p == me {
                self.direct.push(k);
            }
        }
    }
}

/// One output's bytes, filled chunk by chunk as they arrive.
///
/// At the root, and anywhere once the output is complete, the bytes are one shared
/// buffer (`whole`). Before that, the in-order prefix is the list of chunks that made it
/// (`prefix`, each its own [`Bytes`] with its start offset): forwarding a chunk to a
/// child sends a slice of what arrived ([`Buffer::piece`]), never a copy. Chunks that
/// arrive ahead of the prefix wait in `ahead`, keyed by offset, until the gap before
/// them fills (only their bytes that no other chunk holds). When the last byte arrives the prefix is assembled once into `whole` (one
/// copy of the output; none when it came in one chunk), so the application reads one
/// slice.
///
/// Invariants: the prefix is contiguous from offset 0; `ahead` chunks lie past the
/// prefix and overlap neither each other nor it (a chunk that overlaps is cut to the
/// bytes nobody holds yet, zero-copy: chunks from an old and a new source after a
/// repair may be cut differently); so a buffer never holds more than its output's
/// announced size, and only what arrived.
///
/// **Landing.** When the transport receives chunks in place
/// ([`ft_core::Protocol::place_payload`]), the output gets one buffer of its announced
/// size (`landing`, allocated at the first chunk placed; a large allocation takes
/// physical memory only as it is written) and each placed chunk is received at its
/// offset there; it then enters the prefix or `ahead` as any chunk, as a view of that
/// buffer. When the prefix is all views of it, each at its own offset, assembling is
/// free: the whole output is the landing buffer itself. Ranges are placed only past the
/// prefix and clear of `ahead` and of every range already placed, so a chunk is never
/// received twice into the same bytes.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    whole: Option<Bytes>,
    prefix: Vec<(u64, Bytes)>,
    /// Length of the prefix.
    held: u64,
    pub(super) ahead: BTreeMap<u64, Bytes>,
    /// Bytes in `ahead`.
    ahead_bytes: u64,
    /// The output's one buffer that placed chunks are received into, once one was.
    landing: Option<Landing>,
}

impl Buffer {
    /// A complete output (the root's payload).
    pub(super) fn complete(data: Bytes) -> Self {
        Buffer {
            held: data.len() as u64,
            whole: Some(data),
            prefix: Vec::new(),
            ahead: BTreeMap::new(),
            ahead_bytes: 0,
            landing: None,
        }
    }

    /// The whole output, once complete.
    pub(super) fn whole(&self) -> Option<&Bytes> {
        self.whole.as_ref()
    }

    /// Length of the in-order prefix held.
    pub(super) fn held(&self) -> u64 {
        self.held
    }

    /// Payload bytes kept (prefix and chunks ahead of it).
    pub(super) fn bytes_kept(&self) -> usize {
        (self.held + self.ahead_bytes) as usize
    }

    /// Up to `max` bytes of the prefix from `offset`, shared, not copied, and never across
    /// the end of a chunk as it arrived (so a relay's chunks are at most its source's);
    /// `None` if the prefix does not reach past `offset` (an empty output has its one
    /// empty piece at 0).
    pub(super) fn piece(&self, offset: u64, max: usize) -> Option<Bytes> {
        let max = max as u64;
        if let Some(whole) = &self.whole {
            let len = whole.len() as u64;
            if offset > len || (offset == len && len != 0) {
                return None;
            }
            let end = (offset + max).min(len);
            return Some(whole.slice(offset as usize..end as usize));
        }
        if offset >= self.held {
            return None;
        }
        let k = self.prefix.partition_point(|(start, _)| *start <= offset) - 1;
        let (start, chunk) = &self.prefix[k];
        let from = (offset - start) as usize;
        let to = chunk.len().min(from + max as usize);
        Some(chunk.slice(from..to))
    }

    /// Room in the output's landing buffer (made at `size` bytes if need be, by `lend`
    /// if it gives one) for the `len` bytes at `offset` of the output (the caller
    /// checked they lie within it), if none of them is held, ahead or placed already.
    pub(super) fn claim(
        &mut self,
        size: u64,
        offset: u64,
        len: usize,
        lend: Lend<'_>,
    ) -> Option<Slot> {
        let end = offset.checked_add(len as u64)?;
        if self.whole.is_some() || offset < self.held {
            return None;
        }
        let before = self.ahead.range(..end).next_back();
        if before.is_some_and(|(&o, c)| o + c.len() as u64 > offset) {
            return None;
        }
        let size = usize::try_from(size).ok()?;
        let landing = self
            .landing
            .get_or_insert_with(|| lend(size).unwrap_or_else(|| Landing::new(size)));
        landing.claim(usize::try_from(offset).ok()?, len)
    }

    /// Whether `slot` was claimed from this output's landing buffer.
    pub(super) fn holds(&self, slot: &Slot) -> bool {
        self.landing.as_ref().is_some_and(|l| l.holds(slot))
    }

    /// Takes back a slot of this output's landing buffer that was not filled.
    pub(super) fn unclaim(&mut self, slot: Slot) {
        if let Some(landing) = &mut self.landing {
            landing.unclaim(slot);
        }
    }

    /// Adds the chunk at `offset` of an output of `size` bytes (the caller checked
    /// `offset + chunk.len() <= size`); true once the output is complete. Bytes already
    /// held (from an old and a new source) are ignored. `stats` counts the bytes a
    /// join copies.
    pub(super) fn add(
        &mut self,
        size: u64,
        offset: u64,
        chunk: Bytes,
        stats: &mut BcastStats,
        lend: Lend<'_>,
    ) -> bool {
        if self.whole.is_some() {
            return true;
        }
        let end = offset + chunk.len() as u64;
        if offset <= self.held {
            if end > self.held {
                let skip = (self.held - offset) as usize;
                self.append(chunk.slice(skip..));
                self.absorb_ahead();
            }
        } else {
            self.insert_ahead(offset, chunk);
        }
        if self.held == size {
            stats.joined_bytes += self.assemble(size, lend);
            return true;
        }
        false
    }

    fn append(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            let start = self.held;
            self.held += piece.len() as u64;
            self.prefix.push((start, piece));
        }
    }

    /// Moves the chunks the prefix has reached from `ahead` into it.
    fn absorb_ahead(&mut self) {
        while let Some(entry) = self.ahead.first_entry() {
            if *entry.key() > self.held {
                break;
            }
            let (offset, chunk) = entry.remove_entry();
            self.ahead_bytes -= chunk.len() as u64;
            let end = offset + chunk.len() as u64;
            if end > self.held {
                let skip = (self.held - offset) as usize;
                self.append(chunk.slice(skip..));
            }
        }
    }

    /// Keeps the parts of a chunk past the prefix that no chunk ahead holds yet, as
    /// slices of it. (Dropping an overlapping chunk whole would lose bytes for good when
    /// the chunk it overlaps came from a source that died before filling the rest.)
    fn insert_ahead(&mut self, offset: u64, chunk: Bytes) {
        let end = offset + chunk.len() as u64;
        let mut at = offset;
        if let Some((&o, c)) = self.ahead.range(..=offset).next_back() {
            at = at.max(o + c.len() as u64);
        }
        let covered: Vec<(u64, u64)> = self
            .ahead
            .range(offset..end)
            .map(|(&o, c)| (o, o + c.len() as u64))
            .collect();
        for (from, to) in covered {
            if from > at {
                let piece = chunk.slice((at - offset) as usize..(from - offset) as usize);
                self.ahead_bytes += piece.len() as u64;
                self.ahead.insert(at, piece);
            }
            at = at.max(to);
        }
        if at < end {
            self.ahead_bytes += end - at;
            self.ahead.insert(at, chunk.slice((at - offset) as usize..));
        }
    }

    /// Joins the prefix into one buffer: the output's one copy on the receiving side
    /// after the transport's (none if it came in one chunk, or landed in place, see
    /// `landing`). Returns the bytes copied.
    ///
    /// When `lend` gives memory (an allocation hook), the output ends in lent memory:
    /// its landing, when every chunk was received in place there; else the landing
    /// if nothing was placed in it, or new memory from `lend` (the landing may still
    /// be written by a dead source's receive), written with a copy of the chunks.
    fn assemble(&mut self, size: u64, lend: Lend<'_>) -> u64 {
        let pieces = self.prefix.iter().map(|(start, chunk)| (*start, chunk));
        let landed = self.landing.as_ref().and_then(|l| l.join(pieces));
        let landing = self.landing.take();
        let (whole, copied) = if let Some(whole) = landed {
            (whole, 0)
        } else if let Some(whole) = self.fill_lent(size, landing, lend) {
            (whole, size)
        } else {
            match self.prefix.as_slice() {
                [] => (Bytes::new(), 0),
                [(_, only)] => (only.clone(), 0),
                chunks => {
                    let mut all = BytesMut::with_capacity(size as usize);
                    for (_, chunk) in chunks {
                        all.extend_from_slice(chunk);
                    }
                    (all.freeze(), size)
                }
            }
        };
        self.prefix = Vec::new();
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.whole = Some(whole);
        copied
    }

    /// The complete prefix copied into lent memory, if `lend` gives any: `landing` when
    /// it is lent and nothing was placed in it, else new memory (a landing written in
    /// part may still be written by a dead source's receive).
    fn fill_lent(&self, size: u64, landing: Option<Landing>, lend: Lend<'_>) -> Option<Bytes> {
        if size == 0 {
            return None;
        }
        let mut lent = match landing {
            Some(landing) if landing.is_lent() && landing.is_untouched() => landing,
            _ => lend(usize::try_from(size).ok()?)?,
        };
        lent.fill_whole(self.prefix.iter().map(|(_, chunk)| &chunk[..]))
    }
}

/// A request waiting for outputs whose size is not announced here yet: each output
/// with the offset its stream starts at.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) child: Rank,
    pub(super) wants: Vec<Want>,
}

#[derive(Debug, Default)]
pub(super) struct Task {
    pub(super) sizes: IdMap<u64>,
    pub(super) buffers: IdMap<Buffer>,
    pub(super) complete: OutputSet,
    pub(super) trees: IdMap<TreeState>,
    pub(super) waiting: Vec<Waiting>,
    /// Outputs already streamed (or being streamed) to each rank.
    pub(super) served: HashMap<Rank, OutputSet>,
    /// Subtree parts not yet absorbed (out of order, or before their activation):
    /// (tree, sender, position of the first entry, entries).
    pub(super) parts: Vec<(u32, Rank, usize, Vec<Entry>)>,
    /// Streams that caught up with the data this rank holds, waiting for more (woken
    /// by the next chunk of their output).
    pub(super) parked: Vec<Parked>,
    /// Chunks that overtook the activation announcing their output's size (a pushed
    /// stream over a transport that does not keep a pair's frames in order), checked
    /// and added once the size is announced.
    pub(super) early: Vec<Early>,
    /// Payload bytes in `early` (at most [`Config::max_task_bytes`](super::Config)).
    pub(super) early_bytes: u64,
    pub(super) abandoned: bool,
    /// The root's activation header (empty until the activation that carries it),
    /// forwarded as it is in every activation this rank sends for the task.
    pub(super) header: Bytes,
}

/// A number per entry of a subtree, inline up to 16 entries (a relay's subtree in a
/// task runtime's typical broadcast): what `progress` derives once per round.
pub(super) type PerEntry = SmallVec<[u32; 16]>;

/// Values by a small id (an output's index, a tree's id), in a vector kept sorted by
/// id: a task's output sizes, its output buffers and its trees. A rank takes part in
/// few trees of a task (one per class it is in; the root in all of them, which it
/// inserts in id order) and a task has few outputs, so a lookup is a binary search over
/// a short vector. The first entry sits inline (in the task's own allocation): a task
/// of one output and one tree, the common case, allocates nothing for its sizes,
/// buffers and trees, and a larger one one vector each. (A hash table allocated its
/// buckets, a few hundred bytes for one buffer, and a B-tree map a node of eleven tree
/// states, about 2.6 KB, for a task of one tree.)
#[derive(Clone, Debug)]
pub(super) struct IdMap<V>(SmallVec<[(u32, V); 1]>);

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap(SmallVec::new())
    }
}

impl<V> IdMap<V> {
    fn find(&self, id: u32) -> Result<usize, usize> {
        self.0.binary_search_by_key(&id, |(k, _)| *k)
    }
    /// Puts `value` at `at`.
    fn put(&mut self, at: usize, id: u32, value: V) {
        self.0.insert(at, (id, value));
    }
    pub(super) fn get(&self, id: &u32) -> Option<&V> {
        let at = self.find(*id).ok()?;
        Some(&self.0[at].1)
    }
    pub(super) fn get_mut(&mut self, id: &u32) -> Option<&mut V> {
        let at = self.find(*id).ok()?;
        Some(&mut self.0[at].1)
    }
    pub(super) fn contains_key(&self, id: &u32) -> bool {
        self.find(*id).is_ok()
    }
    /// Sets `id`'s value, replacing one already there.
    pub(super) fn insert(&mut self, id: u32, value: V) {
        match self.find(id) {
            Ok(at) => self.0[at].1 = value,
            Err(at) => self.put(at, id, value),
        }
    }
    /// `id`'s value, a default one inserted first if it has none.
    pub(super) fn get_or_default(&mut self, id: u32) -> &mut V
    where
        V: Default,
    {
        let at = match self.find(id) {
            Ok(at) => at,
            Err(at) => {
                self.put(at, id, V::default());
                at
            }
        };
        &mut self.0[at].1
    }
    /// Room for `more` entries (the root, which knows its trees' count).
    pub(super) fn reserve_exact(&mut self, more: usize) {
        self.0.reserve_exact(more);
    }
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, v)| v)
    }
    /// The entries in id order.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&u32, &mut V)> {
        self.0.iter_mut().map(|(id, v)| (&*id, v))
    }
}

/// Where a data chunk says it belongs: its output, the output's size, its offset.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkPlace {
    pub(super) output: u32,
    pub(super) total: u64,
    pub(super) offset: u64,
}

/// A received data chunk's bytes, and so how this rank keeps them.
#[derive(Debug)]
pub(super) enum Chunk<'a> {
    /// Lent by a frame that stays the caller's: kept as a copy.
    Borrowed(&'a [u8]),
    /// A slice of a frame handed over ([`ft_core::Protocol::handle_message_owned`]):
    /// kept as it is, sharing the frame's buffer.
    InFrame(Bytes),
    /// Kept here already (a chunk that overtook its activation), and counted then.
    Held(Bytes),
    /// Received straight into the output's landing buffer: a view of it.
    Landed(Bytes),
}

/// `part` of a received frame as a buffer this rank keeps: a slice of `frame` when it
/// lies within it (no copy), else a copy.
pub(super) fn bytes_of_frame(frame: Option<&Bytes>, part: &[u8]) -> Bytes {
    match Chunk::of_frame(frame, part) {
        Chunk::InFrame(bytes) => bytes,
        _ => Bytes::copy_from_slice(part),
    }
}

impl<'a> Chunk<'a> {
    /// `chunk` as a slice of `frame` if it lies within it, else borrowed (no frame, or
    /// a reader over other bytes than `frame`).
    pub(super) fn of_frame(frame: Option<&Bytes>, chunk: &'a [u8]) -> Self {
        match frame.and_then(|frame| ft_core::slice_of_frame(frame, chunk)) {
            Some(bytes) => Chunk::InFrame(bytes),
            None => Chunk::Borrowed(chunk),
        }
    }

    /// Its length in bytes.
    pub(super) fn len(&self) -> usize {
        match self {
            Chunk::Borrowed(bytes) => bytes.len(),
            Chunk::InFrame(bytes) | Chunk::Held(bytes) | Chunk::Landed(bytes) => bytes.len(),
        }
    }

    /// The chunk as a buffer this rank keeps: a copy of a borrowed one, the shared
    /// slice otherwise; `stats` counts the bytes received in place or copied.
    pub(super) fn keep(self, stats: &mut BcastStats) -> Bytes {
        match self {
            Chunk::Borrowed(bytes) => {
                stats.received_bytes_copied += bytes.len() as u64;
                Bytes::copy_from_slice(bytes)
            }
            Chunk::InFrame(bytes) => {
                stats.received_bytes_in_place += bytes.len() as u64;
                bytes
            }
            Chunk::Landed(bytes) => {
                stats.received_bytes_landed += bytes.len() as u64;
                bytes
            }
            Chunk::Held(bytes) => bytes,
        }
    }
}

/// A data chunk received before its output's size was announced, as it came.
#[derive(Debug)]
pub(super) struct Early {
    pub(super) at: ChunkPlace,
    pub(super) chunk: Bytes,
}

/// A stream of an output to a child, stopped at `offset` until the data past it
/// arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Parked {
    pub(super) to: Rank,
    pub(super) output: u32,
    pub(super) offset: u64,
    /// The stream's longest chunk.
    pub(super) chunk: usize,
    /// The promise under which its head went ahead ([`Config::early_heads`](super::Config)):
    /// the output goes whole, in one payload, once held.
    pub(super) promise: Option<u64>,
}

#[derive(Clone, Debug)]
pub(super) enum Outgoing {
    /// An encoded frame; `tail` (an activation's header, else empty) follows `bytes`
    /// on the wire, sent as a slice of the buffer that holds it.
    Frame {
        to: Rank,
        bytes: Vec<u8>,
        tail: Bytes,
    },
    Stream {
        to: Rank,
        task: TaskId,
        output: u32,
        offset: u64,
        /// Its longest chunk ([`Config::chunk_bytes`](super::Config), or
        /// [`Config::leaf_chunk_bytes`](super::Config) to a leaf).
        chunk: usize,
        /// As [`Parked::promise`].
        promise: Option<u64>,
    },
    /// A payload promised to `to` that will not come (its task was forgotten).
    Withdrawn { to: Rank, promise: u64 },
}

impl Task {
    /// The ranks with a descendant in some tree of this task here (relays), if chunks
    /// to leaves differ from other chunks (`leaf` set and not `chunk`); `None`
    /// otherwise.
    pub(super) fn relays(&self, chunk: usize, leaf: Option<usize>) -> Option<HashSet<Rank>> {
        leaf.is_some_and(|leaf| leaf != chunk).then(|| {
            self.trees
                .values()
                .flat_map(|tree| tree.entries.iter().map(|e| e.parent))
                .collect()
        })
    }
}

/// Per entry, the size of the subtree it heads among `owners` ([`TreeState::owners`]):
/// the entries it owns, itself included (0 for an entry no direct child owns).
pub(super) fn subtree_sizes(owners: &[u32]) -> PerEntry {
    let mut sizes: PerEntry = smallvec::smallvec![0; owners.len()];
    for &owner in owners {
        if let Some(size) = sizes.get_mut(owner as usize) {
            *size += 1;
        }
    }
    sizes
}

/// The longest chunk of a stream to `to`, as [`chunk_for`] says, `to` relaying if
/// `relays` (as [`Task::relays`] gives it: none when every stream takes `chunk`) holds
/// it.
pub(super) fn stream_chunk(
    relays: Option<&HashSet<Rank>>,
    to: Rank,
    chunk: usize,
    leaf: Option<usize>,
) -> usize {
    chunk_for(relays.is_none_or(|r| r.contains(&to)), chunk, leaf)
}

/// The longest chunk of a stream to a rank that `relays` (forwards the data) or not:
/// `leaf` if set and it relays nothing, else `chunk`.
pub(super) fn chunk_for(relays: bool, chunk: usize, leaf: Option<usize>) -> usize {
    match leaf {
        Some(leaf) if !relays => leaf,
        _ => chunk,
    }
}

/// Appends the buffered parts of tree `tree_id` that continue its subtree, in order;
/// drops parts that can no longer fit. A part that fails validation is dropped and
/// reported.
pub(super) fn absorb_parts(t: &mut Task, tree_id: u32, me: Rank) -> Result<(), FrameError> {
    let Some(tree) = t.trees.get_mut(&tree_id) else {
        return Ok(());
    };
    let mut result = Ok(());
    loop {
        let next = t
            .parts
            .iter()
            .position(|p| p.0 == tree_id && p.1 == tree.source && p.2 == tree.entries.len());
        let Some(k) = next else { break };
        let (_, _, _, entries) = t.parts.swap_remove(k);
        if tree.entries.len() + entries.len() > tree.expected {
            result = Err(FrameError::Malformed("more subtree entries than announced"));
            continue;
        }
        let checked = validate_entries(
            me,
            &tree.fetch,
            &tree.ancestors,
            &tree.entries,
            &mut tree.index,
            &entries,
        );
        match checked {
            Ok(()) => tree.extend_indexed(entries),
            Err(e) => result = Err(e),
        }
    }
    // Parts that start before the current end, or come from another sender once the
    // subtree is complete, are stale.
    let (len, source, complete) = (tree.entries.len(), tree.source, tree.complete_subtree());
    t.parts
        .retain(|p| p.0 != tree_id || (p.2 > len && p.1 == source && !complete));
    result
}

/// Each entry's child and its position: the index of trusted entries (the root's,
/// from its plan); peers' entries are indexed as they are checked
/// ([`validate_entries`]).
pub(super) fn index_of(entries: &[Entry]) -> HashMap<Rank, usize> {
    entries
        .iter()
        .enumerate()
        .map(|(k, e)| (e.child, k))
        .collect()
}

/// Checks `part`, the subtree entries that follow `entries` (accepted before, their
/// children indexed in `index` by position): parent-first (each parent is this rank
/// or an earlier child), no rank twice, none of this rank's ancestors, and each fetch
/// set within its parent's. On success `index` holds `part`'s children too (at the
/// positions they take after `entries`), so the tree's index is built as the entries
/// are checked; on error it is as it was.
pub(super) fn validate_entries(
    me: Rank,
    my_fetch: &OutputSet,
    ancestors: &[Rank],
    entries: &[Entry],
    index: &mut HashMap<Rank, usize>,
    part: &[Entry],
) -> Result<(), FrameError> {
    let base = entries.len();
    for (k, e) in part.iter().enumerate() {
        if let Err(error) = check_entry(me, my_fetch, ancestors, entries, index, part, e) {
            for earlier in &part[..k] {
                index.remove(&earlier.child);
            }
            return Err(error);
        }
        index.insert(e.child, base + k);
    }
    Ok(())
}

/// One entry of [`validate_entries`]: `e` against the entries indexed so far.
fn check_entry(
    me: Rank,
    my_fetch: &OutputSet,
    ancestors: &[Rank],
    entries: &[Entry],
    index: &HashMap<Rank, usize>,
    part: &[Entry],
    e: &Entry,
) -> Result<(), FrameError> {
    if e.child == me || ancestors.contains(&e.child) || index.contains_key(&e.child) {
        return Err(FrameError::Malformed("subtree names a rank twice"));
    }
    let parent_fetch = if e.parent == me {
        my_fetch
    } else {
        let &at = index
            .get(&e.parent)
            .ok_or(FrameError::Malformed("subtree entry before its parent"))?;
        match at.checked_sub(entries.len()) {
            Some(in_part) => &part[in_part].fetch,
            None => &entries[at].fetch,
        }
    };
    if !e.fetch.is_subset(parent_fetch) {
        return Err(FrameError::Malformed(
            "subtree entry fetches more than its parent",
        ));
    }
    Ok(())
}
