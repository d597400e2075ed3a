//! Serving and forwarding: what this rank does with an activation, a subtree part, a
//! request or a chunk of data once decoded, and what it sends next. A child is
//! activated as soon as this rank is activated and knows its subtree, and with eager
//! push its fetch set is streamed to it right behind the activation (an original
//! child only; an adopted one requests); data that overtakes its activation is kept
//! (`Task::early`) until the activation announces its output's size; requests for
//! outputs whose size is not announced yet (before the activation) are queued, never
//! dropped; an output this rank holds or fetches is streamed to a requesting child
//! from the offset it asks (the prefix it holds already) chunk by chunk as far as this
//! rank's in-order prefix has arrived, and a stream that catches
//! up waits (`Task::parked`) until the next chunk comes (pipelining down the tree).
//! [`Protocol`] is the machine's face: `poll_transmit` encodes queued frames and
//! streams one chunk at a time; `poll_transmit_parts` does the same with each chunk as a
//! shared slice after the encoded head (see the bulk-data section of the
//! [protocol docs](super)). Chunks follow [`Config::chunk_bytes`](super::Config) and
//! never cross the end of a chunk as this rank received it, so forwarding copies
//! nothing; a receiver takes chunks of any length, at any offset, within the output.
use alloc::vec::Vec;
use hashbrown::{HashMap, HashSet};
use smallvec::SmallVec;

use bytes::Bytes;
use ft_core::wire::{self, Context, FrameKind, Header};
use ft_core::{
    BufferTooShort, Filled, FrameError, Instant, Promise, Protocol, Rank, Slot, Transmit,
    TransmitParts,
};

use super::codec::{activation_frames, put_chunk_place, put_request, Activation, Frames, Want};
use super::place::Allocator;
use super::state::{
    absorb_parts, chunk_for, stream_chunk, subtree_sizes, validate_entries, Buffer, Chunk,
    ChunkPlace, Early, Entry, Outgoing, Parked, PerEntry, TreeState, Waiting,
};
use super::{BcastEvent, Broadcaster, TaskId};
use crate::outputs::OutputSet;

/// A child a round of `progress` activates: the size of its subtree (itself
/// included), where its activation frames lie in the round's encoded frames, and the
/// outputs pushed to it, if any.
struct Activating {
    subtree: u32,
    child: Rank,
    frames: core::ops::Range<usize>,
    push: Option<OutputSet>,
}

impl Broadcaster {
    /// Asks `to` for `outputs` of `task` (in `tree`), each from the end of the prefix
    /// this rank holds contiguously (from 0 if it holds none): never past a byte it
    /// lacks, so bytes that arrived ahead of a gap may come again.
    pub(super) fn send_request(&mut self, task: TaskId, to: Rank, tree: u32, outputs: &OutputSet) {
        let buffers = self.tasks.get(&task).map(|t| &t.buffers);
        let wants: Vec<Want> = outputs
            .iter()
            .map(|output| Want {
                output,
                offset: buffers.and_then(|b| b.get(&output)).map_or(0, Buffer::held),
            })
            .collect();
        let mut w = self.header(FrameKind::BcastRequest).start();
        task.put(&mut w);
        put_request(&mut w, tree, &wants);
        self.out.push_back(Outgoing::Frame {
            to,
            bytes: w.finish(),
            tail: Bytes::new(),
        });
    }

    /// The header of a broadcast frame this rank sends (the broadcast itself is named
    /// at the start of the body: [`TaskId`]).
    pub(super) fn header(&self, kind: FrameKind) -> Header {
        Header {
            kind,
            comm: self.cfg.comm,
            epoch: 0,
            sender: self.cfg.me,
        }
    }

    /// Releases, activations (with their pushed streams) and queued requests that the
    /// data now held allows.
    pub(super) fn progress(&mut self, task: TaskId) {
        let me = self.cfg.me;
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        // Queued requests: stream every output this rank holds or fetches (its size is
        // announced) from the requested offset, as far as its data has arrived; the
        // stream waits for the rest. An offset out of place (refused on arrival when the
        // size was known then) is dropped. A request for an output already streamed
        // or pushed to that rank merges into that stream: the stream started at 0 or at
        // an offset the rank held then, and what a rank holds only grows, so the
        // stream covers every byte the later request lacks.
        let mut streams: SmallVec<[(Rank, u32, u64); 4]> = SmallVec::new();
        for w in &mut t.waiting {
            let served = t.served.entry(w.child).or_default();
            w.wants.retain(|want| {
                let Some(&size) = t.sizes.get(&want.output) else {
                    return true;
                };
                if offset_in_place(size, want.offset) && served.insert(want.output) {
                    streams.push((w.child, want.output, want.offset));
                }
                false
            });
        }
        t.waiting.retain(|w| !w.wants.is_empty());
        // Releases and activations, tree by tree: each child to activate with the size
        // of its subtree, its activation frames and, if pushed to, its fetch set.
        let mut activations: SmallVec<[Activating; 4]> = SmallVec::new();
        // Every activation frame of the round, children's runs one after another.
        let mut encoded: Frames = SmallVec::new();
        let cap = wire::frame_capacity(self.cfg.n) - 32;
        for (&tree_id, tree) in t.trees.iter_mut() {
            if !tree.released && tree.needs.is_subset(&t.complete) {
                tree.released = true;
                if !tree.needs.is_empty() {
                    self.events.push_back(BcastEvent::Released {
                        task,
                        tree: tree_id,
                        outputs: tree.needs.clone(),
                    });
                }
            }
            if !tree.complete_subtree() {
                continue;
            }
            // Whose subtree each entry lies in, and each subtree's size, once per tree
            // and only if a child is still to activate.
            let mut owned: Option<(PerEntry, PerEntry)> = None;
            for d in 0..tree.direct.len() {
                let i = tree.direct[d];
                let e = &tree.entries[i];
                if tree.activated.contains(&e.child)
                    || self.dead.contains(e.child)
                    || !e.fetch.iter().all(|j| t.sizes.contains_key(&j))
                {
                    continue;
                }
                let child = e.child;
                // Eager push to an original child only: an adopted one (its parent
                // died) may hold part of its fetch set already and requests the rest.
                let push = (self.cfg.eager_push && e.parent == me).then(|| e.fetch.clone());
                let (owners, sizes) = owned.get_or_insert_with(|| {
                    let owners = tree.owners();
                    let sizes = subtree_sizes(&owners);
                    (owners, sizes)
                });
                let first = encoded.len();
                activation_frames(
                    &mut encoded,
                    Header {
                        kind: FrameKind::BcastActivate,
                        comm: self.cfg.comm,
                        epoch: 0,
                        sender: me,
                    },
                    task,
                    t.header.len(),
                    tree_id,
                    tree,
                    i,
                    owners,
                    &t.sizes,
                    cap,
                    push.is_some(),
                );
                tree.activated.insert(child);
                activations.push(Activating {
                    subtree: sizes[i],
                    child,
                    frames: first..encoded.len(),
                    push,
                });
            }
        }
        // The largest subtree first (its path to its deepest rank is the longest, as
        // MPI's binomial broadcast serves it first), and each child's activation
        // followed at once by the data pushed to it: the activation leaves before any of
        // its data, and a transport may send the two as one message
        // (`Transport::send_then_parts`). A pushed output joins the child's served set
        // like a requested one, so a request for it (arriving before or after) starts no
        // second stream.
        activations.sort_by_key(|a| core::cmp::Reverse(a.subtree));
        let (chunk, leaf) = (self.cfg.chunk_bytes, self.cfg.leaf_chunk_bytes);
        for Activating {
            subtree,
            child,
            frames,
            push,
        } in activations
        {
            for (k, bytes) in encoded[frames].iter_mut().enumerate() {
                let bytes = core::mem::take(bytes);
                // The header ends the child's first frame, its activation.
                let tail = if k == 0 {
                    t.header.clone()
                } else {
                    Bytes::new()
                };
                self.out.push_back(Outgoing::Frame {
                    to: child,
                    bytes,
                    tail,
                });
            }
            let Some(fetch) = push else {
                continue;
            };
            // A child whose subtree holds more than itself relays (the whole subtree
            // is known: complete_subtree above).
            let chunk = chunk_for(subtree > 1, chunk, leaf);
            let served = t.served.entry(child).or_default();
            for output in &fetch {
                if served.insert(output) {
                    self.out.push_back(Outgoing::Stream {
                        to: child,
                        task,
                        output,
                        offset: 0,
                        chunk,
                        promise: None,
                    });
                }
            }
        }
        let relays = if streams.is_empty() {
            None
        } else {
            t.relays(chunk, leaf)
        };
        for (to, output, offset) in streams {
            self.out.push_back(Outgoing::Stream {
                to,
                task,
                output,
                offset,
                chunk: stream_chunk(relays.as_ref(), to, chunk, leaf),
                promise: None,
            });
        }
    }

    pub(super) fn on_activate(
        &mut self,
        task: TaskId,
        from: Rank,
        a: Activation,
    ) -> Result<(), FrameError> {
        let me = self.cfg.me;
        // Validate everything before changing anything.
        if a.ancestors.last() != Some(&from) || a.ancestors.contains(&me) {
            return Err(FrameError::Malformed(
                "activation's ancestors do not end at its sender",
            ));
        }
        if a.ancestors.first() != Some(&task.root) {
            return Err(FrameError::Malformed(
                "activation's ancestors do not start at its root",
            ));
        }
        if a.fetch.is_empty() || !a.needs.is_subset(&a.fetch) {
            return Err(FrameError::Malformed(
                "activation's needs are not within its fetch set",
            ));
        }
        if a.sizes.iter().any(|&(_, s)| s > self.cfg.max_output_bytes) {
            return Err(FrameError::Malformed(
                "output larger than the configured limit",
            ));
        }
        // The task's total with the newly announced outputs (sizes of outputs already
        // known must match, checked below, so they count once).
        let known = self.tasks.get(&task).map(|t| &t.sizes);
        let total = known
            .into_iter()
            .flat_map(|sizes| sizes.values())
            .chain(
                a.sizes
                    .iter()
                    .filter(|(j, _)| !known.is_some_and(|k| k.contains_key(j)))
                    .map(|(_, s)| s),
            )
            .fold(0u64, |sum, &s| sum.saturating_add(s));
        if total > self.cfg.max_task_bytes {
            return Err(FrameError::Malformed(
                "outputs larger in total than the configured limit",
            ));
        }
        if a.expected > self.cfg.n as usize || a.entries.len() > a.expected {
            return Err(FrameError::Malformed(
                "subtree larger than the communicator",
            ));
        }
        if let Some(t) = self.tasks.get(&task) {
            if a.sizes
                .iter()
                .any(|(j, s)| t.sizes.get(j).is_some_and(|old| old != s))
            {
                return Err(FrameError::Malformed(
                    "output size differs from an earlier one",
                ));
            }
        }
        // The subtree's index, built as its entries are checked (the tree's if the
        // activation is taken).
        let mut index: HashMap<Rank, usize> = HashMap::with_capacity(a.entries.len());
        validate_entries(me, &a.fetch, &a.ancestors, &[], &mut index, &a.entries)?;

        let t = self.tasks.entry(task).or_default();
        for &(j, s) in &a.sizes {
            t.sizes.insert(j, s);
        }
        if t.header.is_empty() {
            t.header = a.header.clone();
        }
        let mut request: Option<OutputSet> = None;
        match t.trees.get_mut(&a.tree) {
            Some(tree) => {
                if tree.parent == from {
                    return Ok(()); // a repeated activation
                }
                // Adoption after a failure: fetch from the new parent.
                tree.parent = from;
                tree.ancestors = a.ancestors;
                if !tree.complete_subtree() {
                    tree.entries.clear();
                    tree.index = index;
                    tree.expected = a.expected;
                    tree.source = from;
                    tree.extend_indexed(a.entries);
                }
                let missing = tree.fetch.difference(&t.complete);
                if !missing.is_empty() && tree.requested_from != Some(from) {
                    tree.requested_from = Some(from);
                    if !a.data_follows {
                        request = Some(missing);
                    }
                }
            }
            None => {
                if !a.needs.is_empty() {
                    self.events.push_back(BcastEvent::Arrived {
                        task,
                        tree: a.tree,
                        outputs: a.needs.clone(),
                        header: a.header.clone(),
                    });
                }
                let mut tree = TreeState {
                    parent: from,
                    ancestors: a.ancestors,
                    needs: a.needs,
                    fetch: a.fetch,
                    entries: a.entries,
                    index,
                    direct: Vec::new(),
                    expected: a.expected,
                    source: from,
                    activated: HashSet::new(),
                    requested_from: None,
                    released: false,
                };
                let missing = tree.fetch.difference(&t.complete);
                if !missing.is_empty() {
                    // The parent is the source: it streams the fetch set unasked if
                    // data follows, else once asked.
                    tree.requested_from = Some(from);
                    if !a.data_follows {
                        request = Some(missing);
                    }
                }
                t.trees.insert(a.tree, tree);
            }
        }
        // Parts of this subtree that overtook the activation (a bad one is dropped: the
        // activation itself was fine).
        let _ = absorb_parts(t, a.tree, me);
        if let Some(tree) = t.trees.get_mut(&a.tree) {
            tree.recompute_direct(me, &self.dead);
        }
        if let Some(outputs) = request {
            self.send_request(task, from, a.tree, &outputs);
        }
        self.progress(task);
        self.absorb_early(task);
        Ok(())
    }

    /// Adds the chunks kept in `Task::early` whose output's size is now announced (each
    /// checked as if it arrived now; a bad one is dropped: the activation that
    /// announced the size was fine).
    fn absorb_early(&mut self, task: TaskId) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.early.is_empty() {
            return;
        }
        let (ready, kept): (Vec<Early>, Vec<Early>) = core::mem::take(&mut t.early)
            .into_iter()
            .partition(|e| t.sizes.contains_key(&e.at.output));
        t.early_bytes = kept.iter().map(|e| e.chunk.len() as u64).sum();
        t.early = kept;
        for e in ready {
            let _ = self.on_data(task, e.at, Chunk::Held(e.chunk));
        }
    }

    /// Keeps a chunk whose output's size is not announced yet (its activation was
    /// overtaken): checked against the limits alone, and at most
    /// [`Config::max_task_bytes`](super::Config) of such chunks per broadcast.
    fn keep_early(
        &mut self,
        task: TaskId,
        at: ChunkPlace,
        chunk: Chunk<'_>,
    ) -> Result<(), FrameError> {
        let (output, total, len) = (at.output, at.total, chunk.len());
        if output >= self.cfg.max_outputs {
            return Err(FrameError::Malformed("output index over the limit"));
        }
        if total > self.cfg.max_output_bytes {
            return Err(FrameError::Malformed(
                "output larger than the configured limit",
            ));
        }
        check_chunk(total, at.offset, len as u64)?;
        if !self.tasks.contains_key(&task) && self.forgotten.contains(&Some(task)) {
            return Ok(()); // late data of a task this rank is done with
        }
        let t = self.tasks.entry(task).or_default();
        // An empty output's one chunk is kept once (it costs no bytes).
        if len == 0 && t.early.iter().any(|e| e.at.output == output) {
            return Ok(());
        }
        if t.early_bytes + len as u64 > self.cfg.max_task_bytes {
            return Err(FrameError::Malformed(
                "more data before its activation than the configured limit",
            ));
        }
        t.early_bytes += len as u64;
        let chunk = chunk.keep(&mut self.stats);
        t.early.push(Early { at, chunk });
        Ok(())
    }

    pub(super) fn on_subtree(
        &mut self,
        task: TaskId,
        from: Rank,
        tree_id: u32,
        first: usize,
        entries: Vec<Entry>,
    ) -> Result<(), FrameError> {
        let me = self.cfg.me;
        if first.saturating_add(entries.len()) > self.cfg.n as usize {
            return Err(FrameError::Malformed(
                "subtree part past the communicator size",
            ));
        }
        let t = self.tasks.entry(task).or_default();
        if t.parts.len() >= self.cfg.n as usize {
            return Err(FrameError::Malformed("too many subtree parts"));
        }
        t.parts.push((tree_id, from, first, entries));
        let absorbed = absorb_parts(t, tree_id, me);
        if let Some(tree) = t.trees.get_mut(&tree_id) {
            tree.recompute_direct(me, &self.dead);
        }
        self.progress(task);
        absorbed
    }

    /// A request from `from` for `wants` (decoded: outputs in order, offsets within
    /// the size limit): refused if an offset is out of place in an output whose size is
    /// announced here, else queued and served as far as [`Broadcaster::progress`] can.
    pub(super) fn on_request(
        &mut self,
        task: TaskId,
        from: Rank,
        wants: Vec<Want>,
    ) -> Result<(), FrameError> {
        if wants.is_empty() {
            return Err(FrameError::Malformed("empty request"));
        }
        if let Some(t) = self.tasks.get(&task) {
            let out_of_place = |want: &Want| {
                t.sizes
                    .get(&want.output)
                    .is_some_and(|&size| !offset_in_place(size, want.offset))
            };
            if wants.iter().any(out_of_place) {
                return Err(FrameError::Malformed("request offset out of place"));
            }
        }
        let t = self.tasks.entry(task).or_default();
        if t.waiting.len() >= 4 * self.cfg.n as usize {
            return Err(FrameError::Malformed("too many queued requests"));
        }
        t.waiting.push(Waiting { child: from, wants });
        self.progress(task);
        Ok(())
    }

    /// A data chunk `at` its place in output `at.output` of `task`: checked, then kept
    /// (as [`Chunk::keep`] says) if this rank lacks it; the streams it unblocks go on.
    pub(super) fn on_data(
        &mut self,
        task: TaskId,
        at: ChunkPlace,
        chunk: Chunk<'_>,
    ) -> Result<(), FrameError> {
        let len = chunk.len();
        let ChunkPlace {
            output,
            total,
            offset,
        } = at;
        let announced = self.tasks.get(&task).and_then(|t| t.sizes.get(&output));
        let Some(&size) = announced else {
            // Its activation (sent before it) was overtaken: keep it until then.
            return self.keep_early(task, at, chunk);
        };
        let Some(t) = self.tasks.get_mut(&task) else {
            return Ok(()); // (announced above)
        };
        if total != size {
            return Err(FrameError::Malformed(
                "data size differs from the announced size",
            ));
        }
        check_chunk(size, offset, len as u64)?;
        if t.complete.contains(output) {
            self.stats.received_bytes_duplicate += len as u64;
            return Ok(());
        }
        let buffer = t.buffers.get_or_default(output);
        let (before, kept_before) = (buffer.held(), buffer.bytes_kept());
        let chunk = chunk.keep(&mut self.stats);
        let mut lend = Allocator::lender(&mut self.allocator, task, output);
        let complete = buffer.add(size, offset, chunk, &mut self.stats, &mut lend);
        // (`lend` borrows the hook; it ends here, before `progress` borrows `self`.)
        drop(lend);
        let added = buffer.bytes_kept().saturating_sub(kept_before);
        self.stats.received_bytes_duplicate += len.saturating_sub(added) as u64;
        // (An empty output's one chunk grows nothing but completes it.)
        if buffer.held() > before || complete {
            // Streams of this output waiting for data go on from where they stopped.
            let mut k = 0;
            while k < t.parked.len() {
                if t.parked[k].output == output {
                    let Parked {
                        to,
                        output,
                        offset,
                        chunk,
                        promise,
                    } = t.parked.swap_remove(k);
                    self.out.push_back(Outgoing::Stream {
                        to,
                        task,
                        output,
                        offset,
                        chunk,
                        promise,
                    });
                } else {
                    k += 1;
                }
            }
        }
        if complete {
            t.complete.insert(output);
            self.progress(task);
        }
        Ok(())
    }
}

/// The chunk length an output of `total` bytes is sent in, given the longest chunk
/// `chunk`: as many chunks as `chunk` makes, of equal length (the last one up to that
/// length shorter). So no chunk of a multi-chunk output is shorter than half of
/// `chunk`: a transport that moves payloads from a threshold on by RMA into the
/// receiver's buffer (libfabric) moves every chunk of such an output that way when the
/// threshold is at most half the chunk, and the output needs no join.
pub(super) fn even_chunk(total: u64, chunk: usize) -> usize {
    let c = chunk as u64;
    if total <= c {
        return chunk;
    }
    total.div_ceil(total.div_ceil(c)) as usize
}

/// Queued frames and streams whose room the outgoing queue keeps once drained.
const OUT_KEPT: usize = 32;

/// Whether a chunk can start at `offset` of an output of `size` bytes: below its end,
/// or at 0 (the one chunk of an empty output).
fn offset_in_place(size: u64, offset: u64) -> bool {
    offset < size || offset == 0
}

/// Any chunking the sender chose: a non-empty chunk within an output of `size` bytes
/// (the one chunk of an empty output is empty, at 0).
pub(super) fn check_chunk(size: u64, offset: u64, len: u64) -> Result<(), FrameError> {
    if !offset_in_place(size, offset) {
        return Err(FrameError::Malformed("data offset out of place"));
    }
    if len > size - offset || (len == 0 && size != 0) {
        return Err(FrameError::Malformed("data chunk of the wrong length"));
    }
    Ok(())
}

impl Broadcaster {
    /// Decodes the header of `bytes` from `from` and serves the frame; with `frame`
    /// (the same bytes, handed over) a data chunk is kept as a slice of it.
    fn receive(
        &mut self,
        now: Instant,
        from: Rank,
        bytes: &[u8],
        frame: Option<&Bytes>,
    ) -> Result<(), FrameError> {
        let (header, reader) = Header::decode(bytes, self.context(), from)?;
        self.decode_frame(now, &header, reader, frame)
    }

    /// The communicator frames are checked against.
    fn context(&self) -> Context {
        Context {
            comm: self.cfg.comm,
            n: self.cfg.n,
        }
    }
}

impl Protocol for Broadcaster {
    type Event = BcastEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        self.receive(now, from, bytes, None)
    }

    /// A data chunk is kept as a slice of `frame` ([`Broadcaster::handle_frame_owned`]).
    fn handle_message_owned(
        &mut self,
        now: Instant,
        from: Rank,
        frame: Bytes,
    ) -> Result<(), FrameError> {
        self.receive(now, from, &frame, Some(&frame))
    }

    /// A data chunk of an output that comes in several chunks goes straight into the
    /// output's one buffer ([`Broadcaster::place_frame`]).
    fn place_payload(
        &mut self,
        _now: Instant,
        from: Rank,
        head: &[u8],
        len: usize,
    ) -> Option<Slot> {
        let (header, reader) = Header::decode(head, self.context(), from).ok()?;
        self.place_frame(&header, reader, len)
    }

    fn handle_message_placed(
        &mut self,
        _now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        let (header, reader) = Header::decode(head, self.context(), from)?;
        self.handle_frame_placed(&header, reader, payload)
    }

    fn placement_lost(&mut self, _now: Instant, slot: Slot) {
        self.slot_lost(slot);
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_transmit(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        Ok(self.next_frame(buf, false)?.map(|t| Transmit {
            to: t.to,
            len: t.head,
        }))
    }

    fn poll_transmit_parts(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        self.next_frame(buf, true)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_event(&mut self) -> Option<BcastEvent> {
        self.events.pop_front()
    }
}

impl Broadcaster {
    /// The next queued frame, its head written into `buf`; a data chunk follows as the
    /// payload if `split`, else is written after the head too (a copy, counted). A frame
    /// leaves the queue only once it is written: a short buffer keeps it.
    fn next_frame(
        &mut self,
        buf: &mut [u8],
        split: bool,
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        loop {
            let Some(next) = self.out.front() else {
                // A burst (a root pushing to many children at once queues a stream per
                // child and output) leaves no lasting capacity behind.
                if self.out.capacity() > OUT_KEPT {
                    self.out.shrink_to(OUT_KEPT);
                }
                return Ok(None);
            };
            let (to, task, output, offset, chunk, promise) = match next {
                Outgoing::Frame { to, bytes, tail } => {
                    let to = *to;
                    // The tail follows as the payload if `split`, else is written
                    // after the frame (a header of at most 1 KiB or so).
                    let (head, payload) = if split || tail.is_empty() {
                        (
                            wire::copy_out(bytes, buf)?,
                            (!tail.is_empty()).then(|| tail.clone()),
                        )
                    } else {
                        let needed = bytes.len() + tail.len();
                        if buf.len() < needed {
                            return Err(BufferTooShort {
                                needed,
                                available: buf.len(),
                            });
                        }
                        buf[..bytes.len()].copy_from_slice(bytes);
                        buf[bytes.len()..needed].copy_from_slice(tail);
                        (needed, None)
                    };
                    self.out.pop_front();
                    return Ok(Some(TransmitParts {
                        to,
                        head,
                        payload,
                        promise: None,
                    }));
                }
                &Outgoing::Withdrawn { to, promise } => {
                    self.out.pop_front();
                    return Ok(Some(TransmitParts {
                        to,
                        head: 0,
                        payload: None,
                        promise: Some(Promise::Withdrawn { id: promise }),
                    }));
                }
                &Outgoing::Stream {
                    to,
                    task,
                    output,
                    offset,
                    chunk,
                    promise,
                } => (to, task, output, offset, chunk, promise),
            };
            let header = self.header(FrameKind::BcastData);
            let Some(t) = self.tasks.get_mut(&task) else {
                self.out.pop_front();
                continue;
            };
            let Some(&total) = t.sizes.get(&output) else {
                self.out.pop_front();
                continue;
            };
            let parked = Parked {
                to,
                output,
                offset,
                chunk,
                promise,
            };
            let at = ChunkPlace {
                output,
                total,
                offset,
            };
            if let Some(id) = promise {
                // Its head went ahead: the output goes whole, in one payload, once held.
                let Some(whole) = t.buffers.get(&output).and_then(Buffer::whole) else {
                    t.parked.push(parked);
                    self.out.pop_front();
                    continue;
                };
                let payload = whole.clone();
                self.out.pop_front();
                self.stats.payload_bytes_sent += total;
                return Ok(Some(TransmitParts {
                    to,
                    head: 0,
                    payload: Some(payload),
                    promise: Some(Promise::Payload { id }),
                }));
            }
            // The next chunk from the in-order prefix held so far: it goes as soon as it
            // is there (pipelining), else the stream waits for it.
            let piece = t
                .buffers
                .get(&output)
                .and_then(|b| b.piece(offset, even_chunk(total, chunk)));
            let Some(piece) = piece else {
                // Nothing of an output that goes in one chunk (and came in one to this
                // rank, so waiting for all of it delays nothing): its head may go now.
                let one_chunk = total <= chunk.min(self.cfg.chunk_bytes) as u64;
                if split && self.cfg.early_heads && offset == 0 && one_chunk {
                    let id = self.next_promise;
                    let mut w = header.write_into(buf);
                    task.put(&mut w);
                    put_chunk_place(&mut w, at);
                    w.put_varint(total);
                    let head = w.finish()?;
                    self.next_promise += 1;
                    self.stats.heads_sent_early += 1;
                    t.parked.push(Parked {
                        promise: Some(id),
                        ..parked
                    });
                    self.out.pop_front();
                    return Ok(Some(TransmitParts {
                        to,
                        head,
                        payload: None,
                        promise: Some(Promise::Head {
                            id,
                            len: total as usize,
                        }),
                    }));
                }
                t.parked.push(parked);
                self.out.pop_front();
                continue;
            };
            let mut w = header.write_into(buf);
            task.put(&mut w);
            put_chunk_place(&mut w, at);
            let len = piece.len() as u64;
            let payload = if split {
                // `put_bytes` is the length then the bytes: the length goes in the head,
                // the bytes follow as the payload.
                w.put_varint(len);
                Some(piece)
            } else {
                w.put_bytes(&piece);
                None
            };
            let head = w.finish()?;
            self.out.pop_front();
            let end = offset + len;
            if end < total {
                self.out.push_back(Outgoing::Stream {
                    to,
                    task,
                    output,
                    offset: end,
                    chunk,
                    promise: None,
                });
            }
            self.stats.payload_bytes_sent += len;
            if !split {
                self.stats.payload_bytes_copied += len;
            }
            return Ok(Some(TransmitParts {
                to,
                head,
                payload,
                promise: None,
            }));
        }
    }
}
