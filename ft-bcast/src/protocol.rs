//! The per-rank activation protocol: one [`Broadcaster`] per rank runs every broadcast
//! that rank takes part in, with the library's one state-machine face
//! ([`ft_core::Protocol`]).
//!
//! A broadcast (`task`, carried in the header's epoch field) follows a [`Plan`]:
//!
//! 1. The root calls [`Broadcaster::start_broadcast`] with the plan and the output
//!    payloads (opaque bytes). It activates each of its children in every tree.
//! 2. **Activation** (`BcastActivate`, continued by `BcastSubtree` when it does not fit
//!    one frame) tells a child: the tree, its ancestors (root first, the sender last),
//!    the outputs it needs for itself, the outputs it fetches (its needs plus what its
//!    subtree needs), their sizes, and its subtree (every descendant with its parent,
//!    needs and fetch set), so the child can activate its own children and re-attach
//!    orphans after a failure.
//! 3. The child **requests** (`BcastRequest`) its fetch set from its parent. The parent
//!    answers with **data** (`BcastData`, chunks of at most [`wire::MAX_CHUNK`] bytes)
//!    for every requested output it holds completely. A request for an output not held
//!    yet, or arriving before the activation, is queued: never dropped, never answered
//!    with missing data.
//! 4. When a rank holds every output it needs in a tree, it **releases** them locally
//!    ([`BcastEvent::Released`]). It activates a child only once it holds everything that
//!    child fetches, so the child's request is normally answered at once.
//!
//! **Repair.** [`Broadcaster::on_rank_failed`] tells the machine a rank died. In every
//! tree, a rank whose parent died re-requests its missing outputs from its nearest live
//! ancestor (the root in the worst case), and a rank whose descendant died adopts that
//! descendant's children (activating them itself). Every ancestor fetches a superset of
//! what its descendants fetch, so the new source holds or will hold what is asked.
//! Duplicate data (from the old and the new source) is recognised per chunk and ignored:
//! every surviving destination releases exactly its outputs, once per tree.
//!
//! **Call order** (see [`ft_core::machine`]): feed frames with `handle_message`, failures
//! with `on_rank_failed`, commands with `start_broadcast`; after each, drain
//! `poll_transmit` then `poll_event`. The machine has no timer (failure detection is the
//! detector's job): `poll_timeout` is always `None`.
//!
//! Peer input never panics: malformed frames, out-of-range ranks or output indices,
//! sizes over [`Config::max_output_bytes`] (or, for all outputs of a broadcast together,
//! over [`Config::max_task_bytes`]), inconsistent subtrees and data that does not match
//! its announced size are rejected with a [`FrameError`] and change nothing.
//!
//! **Memory.** An announced size costs nothing by itself: an output's buffer grows with
//! the data that actually arrives (its in-order prefix, plus chunks that overtook it),
//! never past the announced size, so a peer can make this rank hold at most what it
//! really sent, and at most [`Config::max_task_bytes`] per broadcast.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::fmt;
use hashbrown::{HashMap, HashSet};

use ft_core::wire::{self, Context, FrameKind, Header, Reader, Writer, MAX_CHUNK};
use ft_core::{FrameError, Instant, Protocol, Rank, RankSet, Transmit};

use crate::outputs::OutputSet;
use crate::plan::Plan;
use crate::spec::Strategy;

/// Ancestors carried in an activation: the root and the nearest ones. If all the
/// nearest die, the root (which holds everything) is the fallback.
const MAX_ANCESTORS: usize = 64;

/// Settings of one rank's broadcaster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Communicator id carried by every frame.
    pub comm: u32,
    /// Communicator size.
    pub n: u32,
    /// This rank.
    pub me: Rank,
    /// Largest output a peer may announce (bounds the memory a frame can make us take).
    pub max_output_bytes: u64,
    /// Largest total of the output sizes announced for one broadcast (bounds the memory
    /// one broadcast can make us take, however many outputs it has).
    pub max_task_bytes: u64,
    /// Output indices a peer may name are below this.
    pub max_outputs: u32,
}

impl Config {
    /// Rank `me` of communicator `comm` of `n` ranks; outputs up to 1 GiB, 4 GiB per
    /// broadcast, 4096 outputs.
    pub fn new(comm: u32, n: u32, me: Rank) -> Self {
        Config {
            comm,
            n,
            me,
            max_output_bytes: 1 << 30,
            max_task_bytes: 1 << 32,
            max_outputs: 4096,
        }
    }
}

/// What the broadcaster reports to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BcastEvent {
    /// This rank holds every output it needs in tree `tree` of `task`: read them with
    /// [`Broadcaster::output`]. Reported once per tree the rank is a destination in.
    Released {
        /// The broadcast.
        task: u32,
        /// The tree.
        tree: u32,
        /// The outputs released.
        outputs: OutputSet,
    },
    /// No live ancestor is left (the root died): `task` cannot complete at this rank.
    Abandoned {
        /// The broadcast.
        task: u32,
    },
    /// The communicator was revoked while `task` was in flight at this rank: it fails
    /// here with [`BcastError::Revoked`] and its state is dropped.
    Failed {
        /// The broadcast.
        task: u32,
        /// Why it failed.
        error: BcastError,
    },
}

/// A `start_broadcast` call was rejected; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BcastError {
    /// This rank is not the plan's root.
    NotRoot {
        /// The plan's root.
        root: Rank,
    },
    /// The plan is for a communicator of another size.
    WrongSize {
        /// The plan's communicator size.
        plan: u32,
    },
    /// `task` is already running here.
    TaskInUse(u32),
    /// The number of payloads differs from the number of outputs.
    PayloadCount {
        /// Outputs in the plan.
        expected: usize,
        /// Payloads given.
        got: usize,
    },
    /// A payload's length differs from its output's size in the plan.
    PayloadSize {
        /// The output index.
        output: usize,
        /// Its size in the plan.
        expected: u64,
        /// The payload's length.
        got: usize,
    },
    /// The plan has more outputs than [`Config::max_outputs`].
    TooManyOutputs,
    /// An output is larger than [`Config::max_output_bytes`], or all outputs together
    /// are larger than [`Config::max_task_bytes`]: the receivers would refuse it.
    TooLarge {
        /// The output's size, or the total.
        bytes: u64,
        /// The limit it exceeds.
        limit: u64,
    },
    /// The communicator was revoked: no broadcast runs on it any more.
    Revoked,
}

impl fmt::Display for BcastError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BcastError::NotRoot { root } => write!(f, "only the root ({root}) starts a broadcast"),
            BcastError::WrongSize { plan } => {
                write!(f, "plan is for a communicator of {plan} ranks")
            }
            BcastError::TaskInUse(t) => write!(f, "task {t} is already running"),
            BcastError::PayloadCount { expected, got } => {
                write!(f, "{got} payloads for {expected} outputs")
            }
            BcastError::PayloadSize {
                output,
                expected,
                got,
            } => write!(
                f,
                "output #{output}: payload of {got} bytes, plan says {expected}"
            ),
            BcastError::TooManyOutputs => f.write_str("more outputs than the configured limit"),
            BcastError::TooLarge { bytes, limit } => {
                write!(
                    f,
                    "{bytes} bytes of outputs, over the configured limit of {limit}"
                )
            }
            BcastError::Revoked => f.write_str("the communicator was revoked"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for BcastError {}

/// A descendant in a rank's subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    child: Rank,
    parent: Rank,
    needs: OutputSet,
    fetch: OutputSet,
}

/// This rank's place in one tree of one broadcast.
#[derive(Debug)]
struct TreeState {
    /// Where this rank fetches from (itself at the root).
    parent: Rank,
    /// Root first; the last is the original parent.
    ancestors: Vec<Rank>,
    needs: OutputSet,
    fetch: OutputSet,
    /// Descendants, parent-first, as the activation announced them (dead ones
    /// included: their children's effective parent is their nearest live ancestor).
    entries: Vec<Entry>,
    /// Position of each descendant in `entries`.
    index: HashMap<Rank, usize>,
    /// Live descendants whose nearest live ancestor is this rank, by entry position.
    direct: Vec<usize>,
    /// Entries announced by the activation (the subtree is complete when all are here).
    expected: usize,
    /// The sender of the activation whose subtree `entries` holds.
    source: Rank,
    /// Direct children already activated.
    activated: HashSet<Rank>,
    /// The rank the fetch set was last requested from.
    requested_from: Option<Rank>,
    released: bool,
}

impl TreeState {
    fn complete_subtree(&self) -> bool {
        self.entries.len() == self.expected
    }

    fn append(&mut self, part: Vec<Entry>) {
        let room = self.expected.saturating_sub(self.entries.len());
        for e in part.into_iter().take(room) {
            self.index.insert(e.child, self.entries.len());
            self.entries.push(e);
        }
    }

    /// Recomputes `direct`: live descendants whose chain of parents up to this rank
    /// passes only through dead ranks (re-attachment after failures).
    fn recompute_direct(&mut self, me: Rank, dead: &RankSet) {
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
/// `data` is the received prefix and grows with it (never reserved at the announced
/// size, never past it); chunks that arrive ahead of the prefix wait in `ahead`, keyed
/// by offset, until the gap before them fills. So the memory held is what arrived.
#[derive(Debug, Default)]
struct Buffer {
    data: Vec<u8>,
    ahead: BTreeMap<u64, Vec<u8>>,
}

impl Buffer {
    /// Adds the chunk at `offset` of an output of `size` bytes; true once the output is
    /// complete. A chunk already held (from an old and a new source) is ignored.
    fn add(&mut self, size: u64, offset: u64, chunk: &[u8]) -> bool {
        let held = self.data.len() as u64;
        if offset > held {
            self.ahead.entry(offset).or_insert_with(|| chunk.to_vec());
        } else if offset == held {
            self.append(size, chunk);
            while let Some(next) = self.ahead.remove(&(self.data.len() as u64)) {
                self.append(size, &next);
            }
        }
        self.data.len() as u64 == size
    }

    /// Appends to the prefix, growing it geometrically but never past `size`.
    fn append(&mut self, size: u64, chunk: &[u8]) {
        let len = self.data.len();
        if self.data.capacity() - len < chunk.len() {
            let need = len + chunk.len();
            let most = usize::try_from(size).unwrap_or(usize::MAX).max(need);
            let want = len.saturating_mul(2).max(need).min(most);
            self.data.reserve_exact(want - len);
        }
        self.data.extend_from_slice(chunk);
    }
}

/// A request waiting for outputs this rank does not hold yet.
#[derive(Debug)]
struct Waiting {
    child: Rank,
    outputs: OutputSet,
}

#[derive(Debug, Default)]
struct Task {
    sizes: HashMap<u32, u64>,
    buffers: HashMap<u32, Buffer>,
    complete: OutputSet,
    trees: BTreeMap<u32, TreeState>,
    waiting: Vec<Waiting>,
    /// Outputs already streamed (or being streamed) to each rank.
    served: HashMap<Rank, OutputSet>,
    /// Subtree parts not yet absorbed (out of order, or before their activation):
    /// (tree, sender, position of the first entry, entries).
    parts: Vec<(u32, Rank, usize, Vec<Entry>)>,
    abandoned: bool,
}

#[derive(Debug)]
enum Outgoing {
    Frame {
        to: Rank,
        bytes: Vec<u8>,
    },
    Stream {
        to: Rank,
        task: u32,
        output: u32,
        offset: u64,
    },
}

/// One rank's activation protocol machine for every broadcast it takes part in.
#[derive(Debug)]
pub struct Broadcaster {
    cfg: Config,
    dead: RankSet,
    tasks: BTreeMap<u32, Task>,
    out: VecDeque<Outgoing>,
    events: VecDeque<BcastEvent>,
    revoked: bool,
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn set_len(set: &OutputSet) -> usize {
    let mut len = varint_len(set.len() as u64);
    let mut prev: Option<u32> = None;
    for j in set {
        len += varint_len(u64::from(prev.map_or(j, |p| j - p - 1)));
        prev = Some(j);
    }
    len
}

fn put_set(w: &mut Writer, set: &OutputSet) {
    w.put_varint(set.len() as u64);
    let mut prev: Option<u32> = None;
    for j in set {
        w.put_varint(u64::from(prev.map_or(j, |p| j - p - 1)));
        prev = Some(j);
    }
}

fn read_set(r: &mut Reader<'_>, max: u32) -> Result<OutputSet, FrameError> {
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

fn entry_len(e: &Entry) -> usize {
    varint_len(e.child.into()) + varint_len(e.parent.into()) + set_len(&e.needs) + set_len(&e.fetch)
}

fn put_entry(w: &mut Writer, e: &Entry) {
    w.put_rank(e.child).put_rank(e.parent);
    put_set(w, &e.needs);
    put_set(w, &e.fetch);
}

fn read_entries(r: &mut Reader<'_>, max: u32) -> Result<Vec<Entry>, FrameError> {
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

/// A decoded activation.
struct Activation {
    tree: u32,
    ancestors: Vec<Rank>,
    needs: OutputSet,
    fetch: OutputSet,
    sizes: Vec<(u32, u64)>,
    expected: usize,
    entries: Vec<Entry>,
}

impl Broadcaster {
    /// Feeds a frame whose header was already decoded and checked against this
    /// broadcaster's communicator (by a layer that dispatches on
    /// [`FrameKind::family`]); `r` is positioned after the header. The same as
    /// [`Protocol::handle_message`] without decoding the header a second time.
    pub fn handle_frame(
        &mut self,
        _now: Instant,
        h: &Header,
        mut r: Reader<'_>,
    ) -> Result<(), FrameError> {
        let from = h.sender;
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
        let max = self.cfg.max_outputs;
        match h.kind {
            FrameKind::BcastActivate => {
                let tree = r.varint_u32()?;
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
                r.finish()?;
                self.on_activate(
                    h.epoch,
                    from,
                    Activation {
                        tree,
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
                self.on_subtree(h.epoch, from, tree, first, entries)
            }
            FrameKind::BcastRequest => {
                let _tree = r.varint_u32()?;
                let outputs = read_set(&mut r, max)?;
                r.finish()?;
                self.on_request(h.epoch, from, outputs)
            }
            FrameKind::BcastData => {
                let output = r.varint_u32()?;
                let total = r.varint()?;
                let offset = r.varint()?;
                let chunk = r.bytes()?;
                r.finish()?;
                self.on_data(h.epoch, output, total, offset, chunk)
            }
            other => Err(FrameError::UnexpectedKind(other as u8)),
        }
    }

    /// The machine of rank `cfg.me`.
    ///
    /// # Panics
    /// If `cfg.me >= cfg.n`.
    pub fn new(cfg: Config) -> Self {
        assert!(
            cfg.me < cfg.n,
            "rank {} out of range for {} ranks",
            cfg.me,
            cfg.n
        );
        Broadcaster {
            cfg,
            dead: RankSet::new(cfg.n),
            tasks: BTreeMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            revoked: false,
        }
    }

    /// The communicator was revoked: every task still in flight here (this rank lacks
    /// some of what it fetches, or still owes data to a child) fails with
    /// [`BcastEvent::Failed`]; later `start_broadcast` calls are refused and broadcast
    /// frames are dropped with [`FrameError::Revoked`]. Finished tasks keep their data.
    pub fn revoke(&mut self, _now: Instant) {
        if self.revoked {
            return;
        }
        self.revoked = true;
        let streaming: Vec<u32> = self
            .out
            .iter()
            .filter_map(|o| match o {
                Outgoing::Stream { task, .. } => Some(*task),
                Outgoing::Frame { .. } => None,
            })
            .collect();
        let in_flight: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(id, t)| {
                !t.abandoned
                    && (streaming.contains(id)
                        || !t.waiting.is_empty()
                        || t.trees
                            .values()
                            .any(|tree| !tree.fetch.is_subset(&t.complete)))
            })
            .map(|(id, _)| *id)
            .collect();
        for task in in_flight {
            self.forget(task);
            self.events.push_back(BcastEvent::Failed {
                task,
                error: BcastError::Revoked,
            });
        }
        self.out.clear();
    }

    /// Whether [`Broadcaster::revoke`] was called.
    pub fn is_revoked(&self) -> bool {
        self.revoked
    }

    /// This machine's settings.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// The bytes of output `index` of `task`, once this rank holds all of them.
    pub fn output(&self, task: u32, index: u32) -> Option<&[u8]> {
        let t = self.tasks.get(&task)?;
        if !t.complete.contains(index) {
            return None;
        }
        t.buffers.get(&index).map(|b| &b.data[..])
    }

    /// Drops everything kept for `task` (its payloads included).
    pub fn forget(&mut self, task: u32) {
        self.tasks.remove(&task);
        self.out
            .retain(|o| !matches!(o, Outgoing::Stream { task: t, .. } if *t == task));
    }

    /// The payload bytes kept for every task not forgotten yet (outputs held or being
    /// received, chunks that overtook the prefix included).
    pub fn held_bytes(&self) -> usize {
        let buffers = self.tasks.values().flat_map(|t| t.buffers.values());
        buffers
            .map(|b| b.data.len() + b.ahead.values().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// Starts broadcasting `task` at the root: `payloads[j]` is output `j`'s bytes (its
    /// length must be the plan's size for it).
    pub fn start_broadcast(
        &mut self,
        _now: Instant,
        task: u32,
        plan: &Plan,
        payloads: Vec<Vec<u8>>,
    ) -> Result<(), BcastError> {
        if self.revoked {
            return Err(BcastError::Revoked);
        }
        let spec = plan.spec();
        if spec.ranks != self.cfg.n {
            return Err(BcastError::WrongSize { plan: spec.ranks });
        }
        if spec.root != self.cfg.me {
            return Err(BcastError::NotRoot { root: spec.root });
        }
        if self.tasks.contains_key(&task) {
            return Err(BcastError::TaskInUse(task));
        }
        if spec.outputs.len() > self.cfg.max_outputs as usize {
            return Err(BcastError::TooManyOutputs);
        }
        let mut total = 0u64;
        for o in &spec.outputs {
            if o.bytes > self.cfg.max_output_bytes {
                return Err(BcastError::TooLarge {
                    bytes: o.bytes,
                    limit: self.cfg.max_output_bytes,
                });
            }
            total = total.saturating_add(o.bytes);
        }
        if total > self.cfg.max_task_bytes {
            return Err(BcastError::TooLarge {
                bytes: total,
                limit: self.cfg.max_task_bytes,
            });
        }
        if payloads.len() != spec.outputs.len() {
            return Err(BcastError::PayloadCount {
                expected: spec.outputs.len(),
                got: payloads.len(),
            });
        }
        for (j, (o, p)) in spec.outputs.iter().zip(&payloads).enumerate() {
            if o.bytes != p.len() as u64 {
                return Err(BcastError::PayloadSize {
                    output: j,
                    expected: o.bytes,
                    got: p.len(),
                });
            }
        }
        let mut t = Task::default();
        for (j, data) in payloads.into_iter().enumerate() {
            let j = j as u32;
            t.sizes.insert(j, data.len() as u64);
            t.buffers.insert(
                j,
                Buffer {
                    data,
                    ahead: BTreeMap::new(),
                },
            );
            t.complete.insert(j);
        }
        // What each destination needs for itself: its class's outputs (they differ from
        // the fetch set only when fetching for descendants).
        let class_needs: HashMap<Rank, &OutputSet> =
            if spec.strategy == Strategy::FetchForDescendants {
                plan.classes()
                    .iter()
                    .flat_map(|c| c.members.iter().map(move |&r| (r, c.outputs)))
                    .collect()
            } else {
                HashMap::new()
            };
        let everything = t.complete.clone();
        for (k, _) in plan.trees().iter().enumerate() {
            let entries: Vec<Entry> = plan
                .tree_edges(k)
                .map(|e| Entry {
                    child: e.child,
                    parent: e.parent,
                    needs: class_needs
                        .get(&e.child)
                        .map_or_else(|| e.outputs.clone(), |s| (*s).clone()),
                    fetch: e.outputs.clone(),
                })
                .collect();
            let mut tree = TreeState {
                parent: self.cfg.me,
                ancestors: Vec::new(),
                needs: OutputSet::new(),
                fetch: everything.clone(),
                expected: entries.len(),
                source: self.cfg.me,
                entries: Vec::new(),
                index: HashMap::new(),
                direct: Vec::new(),
                activated: HashSet::new(),
                requested_from: None,
                released: true,
            };
            tree.append(entries);
            tree.recompute_direct(self.cfg.me, &self.dead);
            t.trees.insert(k as u32, tree);
        }
        self.tasks.insert(task, t);
        self.progress(task);
        Ok(())
    }

    /// The failure view reports `rank` dead: re-attach what depended on it.
    pub fn on_rank_failed(&mut self, _now: Instant, rank: Rank) {
        if rank >= self.cfg.n || rank == self.cfg.me || !self.dead.insert(rank) {
            return;
        }
        self.out.retain(|o| match o {
            Outgoing::Frame { to, .. } | Outgoing::Stream { to, .. } => *to != rank,
        });
        let me = self.cfg.me;
        let task_ids: Vec<u32> = self.tasks.keys().copied().collect();
        for id in task_ids {
            let mut requests: Vec<(Rank, u32, OutputSet)> = Vec::new();
            let mut abandoned = false;
            if let Some(t) = self.tasks.get_mut(&id) {
                t.waiting.retain(|w| w.child != rank);
                t.served.remove(&rank);
                for (&tree_id, tree) in t.trees.iter_mut() {
                    tree.recompute_direct(me, &self.dead);
                    if tree.parent != me && self.dead.contains(tree.parent) {
                        match tree.ancestors.iter().rposition(|a| !self.dead.contains(*a)) {
                            Some(k) => {
                                tree.parent = tree.ancestors[k];
                                tree.ancestors.truncate(k + 1);
                                let missing = missing_from(&tree.fetch, &t.complete);
                                if !missing.is_empty() {
                                    tree.requested_from = Some(tree.parent);
                                    requests.push((tree.parent, tree_id, missing));
                                }
                            }
                            None => abandoned = true,
                        }
                    }
                }
                if abandoned && !t.abandoned {
                    t.abandoned = true;
                    self.events.push_back(BcastEvent::Abandoned { task: id });
                }
            }
            for (to, tree, outputs) in requests {
                self.send_request(id, to, tree, &outputs);
            }
            self.progress(id);
        }
    }

    fn send_request(&mut self, task: u32, to: Rank, tree: u32, outputs: &OutputSet) {
        let mut w = self.header(FrameKind::BcastRequest, task).start();
        w.put_varint(tree.into());
        put_set(&mut w, outputs);
        self.out.push_back(Outgoing::Frame {
            to,
            bytes: w.finish(),
        });
    }

    fn header(&self, kind: FrameKind, task: u32) -> Header {
        Header {
            kind,
            comm: self.cfg.comm,
            epoch: task,
            sender: self.cfg.me,
        }
    }

    /// Releases, activations and queued requests that the data now held allows.
    fn progress(&mut self, task: u32) {
        let me = self.cfg.me;
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        // Queued requests: stream every output now held.
        let mut streams: Vec<(Rank, u32)> = Vec::new();
        for w in &mut t.waiting {
            let ready: Vec<u32> = w
                .outputs
                .iter()
                .filter(|&j| t.complete.contains(j))
                .collect();
            let mut left = OutputSet::new();
            for j in w.outputs.iter().filter(|&j| !t.complete.contains(j)) {
                left.insert(j);
            }
            for j in ready {
                let served = t.served.entry(w.child).or_default();
                if served.insert(j) {
                    streams.push((w.child, j));
                }
            }
            w.outputs = left;
        }
        t.waiting.retain(|w| !w.outputs.is_empty());
        // Releases and activations, tree by tree.
        let mut activations: Vec<(Rank, Vec<u8>)> = Vec::new();
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
            for d in 0..tree.direct.len() {
                let i = tree.direct[d];
                let e = &tree.entries[i];
                if tree.activated.contains(&e.child)
                    || self.dead.contains(e.child)
                    || !e.fetch.is_subset(&t.complete)
                {
                    continue;
                }
                let child = e.child;
                let frames = activation_frames(
                    Header {
                        kind: FrameKind::BcastActivate,
                        comm: self.cfg.comm,
                        epoch: task,
                        sender: me,
                    },
                    tree_id,
                    tree,
                    i,
                    &t.sizes,
                    cap,
                );
                tree.activated.insert(child);
                activations.extend(frames.into_iter().map(|f| (child, f)));
            }
        }
        for (to, output) in streams {
            self.out.push_back(Outgoing::Stream {
                to,
                task,
                output,
                offset: 0,
            });
        }
        for (to, bytes) in activations {
            self.out.push_back(Outgoing::Frame { to, bytes });
        }
    }

    fn on_activate(&mut self, task: u32, from: Rank, a: Activation) -> Result<(), FrameError> {
        let me = self.cfg.me;
        // Validate everything before changing anything.
        if a.ancestors.last() != Some(&from) || a.ancestors.contains(&me) {
            return Err(FrameError::Malformed(
                "activation's ancestors do not end at its sender",
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
        let mut known: HashMap<Rank, OutputSet> = HashMap::new();
        validate_entries(me, &a.fetch, &a.ancestors, &mut known, &a.entries)?;

        let t = self.tasks.entry(task).or_default();
        for &(j, s) in &a.sizes {
            t.sizes.insert(j, s);
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
                    tree.index.clear();
                    tree.expected = a.expected;
                    tree.source = from;
                    tree.append(a.entries);
                }
                let missing = missing_from(&tree.fetch, &t.complete);
                if !missing.is_empty() && tree.requested_from != Some(from) {
                    tree.requested_from = Some(from);
                    request = Some(missing);
                }
            }
            None => {
                let mut tree = TreeState {
                    parent: from,
                    ancestors: a.ancestors,
                    needs: a.needs,
                    fetch: a.fetch,
                    entries: Vec::new(),
                    index: HashMap::new(),
                    direct: Vec::new(),
                    expected: a.expected,
                    source: from,
                    activated: HashSet::new(),
                    requested_from: None,
                    released: false,
                };
                tree.append(a.entries);
                let missing = missing_from(&tree.fetch, &t.complete);
                if !missing.is_empty() {
                    tree.requested_from = Some(from);
                    request = Some(missing);
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
        Ok(())
    }

    fn on_subtree(
        &mut self,
        task: u32,
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

    fn on_request(&mut self, task: u32, from: Rank, outputs: OutputSet) -> Result<(), FrameError> {
        if outputs.is_empty() {
            return Err(FrameError::Malformed("empty request"));
        }
        let t = self.tasks.entry(task).or_default();
        if t.waiting.len() >= 4 * self.cfg.n as usize {
            return Err(FrameError::Malformed("too many queued requests"));
        }
        t.waiting.push(Waiting {
            child: from,
            outputs,
        });
        self.progress(task);
        Ok(())
    }

    fn on_data(
        &mut self,
        task: u32,
        output: u32,
        total: u64,
        offset: u64,
        chunk: &[u8],
    ) -> Result<(), FrameError> {
        let t = self.tasks.get_mut(&task).ok_or(FrameError::Malformed(
            "data for a broadcast never activated",
        ))?;
        let size = *t
            .sizes
            .get(&output)
            .ok_or(FrameError::Malformed("data for an output never announced"))?;
        if total != size {
            return Err(FrameError::Malformed(
                "data size differs from the announced size",
            ));
        }
        let chunk_len = MAX_CHUNK as u64;
        if offset % chunk_len != 0 || (offset >= size && !(size == 0 && offset == 0)) {
            return Err(FrameError::Malformed("data offset out of place"));
        }
        if chunk.len() as u64 != chunk_len.min(size - offset) {
            return Err(FrameError::Malformed("data chunk of the wrong length"));
        }
        if t.complete.contains(output) {
            return Ok(());
        }
        if t.buffers
            .entry(output)
            .or_default()
            .add(size, offset, chunk)
        {
            t.complete.insert(output);
            self.progress(task);
        }
        Ok(())
    }
}

/// `want \ held`.
fn missing_from(want: &OutputSet, held: &OutputSet) -> OutputSet {
    want.iter().filter(|&j| !held.contains(j)).collect()
}

/// Appends the buffered parts of tree `tree_id` that continue its subtree, in order;
/// drops parts that can no longer fit. A part that fails validation is dropped and
/// reported.
fn absorb_parts(t: &mut Task, tree_id: u32, me: Rank) -> Result<(), FrameError> {
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
        let mut known: HashMap<Rank, OutputSet> = tree
            .entries
            .iter()
            .map(|e| (e.child, e.fetch.clone()))
            .collect();
        match validate_entries(me, &tree.fetch, &tree.ancestors, &mut known, &entries) {
            Ok(()) => tree.append(entries),
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

/// Checks subtree entries: parent-first (each parent is this rank or an earlier
/// child), no rank twice, none of this rank's ancestors, and each fetch set within its
/// parent's.
fn validate_entries(
    me: Rank,
    my_fetch: &OutputSet,
    ancestors: &[Rank],
    known: &mut HashMap<Rank, OutputSet>,
    entries: &[Entry],
) -> Result<(), FrameError> {
    for e in entries {
        if e.child == me || ancestors.contains(&e.child) || known.contains_key(&e.child) {
            return Err(FrameError::Malformed("subtree names a rank twice"));
        }
        let parent_fetch = if e.parent == me {
            my_fetch
        } else {
            known
                .get(&e.parent)
                .ok_or(FrameError::Malformed("subtree entry before its parent"))?
        };
        if !e.fetch.is_subset(parent_fetch) {
            return Err(FrameError::Malformed(
                "subtree entry fetches more than its parent",
            ));
        }
        known.insert(e.child, e.fetch.clone());
    }
    Ok(())
}

/// The activation of the child at `tree.entries[at]`, split into frames of at most
/// `cap` bytes: a `BcastActivate` and as many `BcastSubtree` as the subtree needs.
fn activation_frames(
    head: Header,
    tree_id: u32,
    tree: &TreeState,
    at: usize,
    sizes: &HashMap<u32, u64>,
    cap: usize,
) -> Vec<Vec<u8>> {
    let e = &tree.entries[at];
    let child = e.child;
    // The child's descendants, parent-first.
    let mut inside: HashSet<Rank> = HashSet::new();
    inside.insert(child);
    let mut subtree: Vec<&Entry> = Vec::new();
    for d in &tree.entries[at + 1..] {
        if inside.contains(&d.parent) {
            inside.insert(d.child);
            subtree.push(d);
        }
    }
    let mut ancestors: Vec<Rank> = Vec::with_capacity(MAX_ANCESTORS + 1);
    if tree.ancestors.len() + 1 > MAX_ANCESTORS {
        ancestors.push(tree.ancestors[0]);
        let skip = tree.ancestors.len() + 1 - (MAX_ANCESTORS - 1);
        ancestors.extend_from_slice(&tree.ancestors[skip..]);
    } else {
        ancestors.extend_from_slice(&tree.ancestors);
    }
    ancestors.push(head.sender);

    let mut frames = Vec::new();
    let mut w = head.start();
    w.put_varint(tree_id.into());
    w.put_varint(ancestors.len() as u64);
    let mut used = wire::HEADER_LEN + 5 + 5;
    for &a in &ancestors {
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
    w.put_varint(subtree.len() as u64);
    used += 10;
    let mut rest: &[&Entry] = &subtree;
    let mut sent = 0usize;
    let mut batch_start = used;
    loop {
        let mut take = 0;
        let mut size = batch_start + 5;
        while take < rest.len() && size + entry_len(rest[take]) <= cap {
            size += entry_len(rest[take]);
            take += 1;
        }
        // An entry always fits an empty frame (a few dozen bytes per output).
        let take = take.max(usize::from(!rest.is_empty()));
        w.put_varint(take as u64);
        for d in &rest[..take] {
            put_entry(&mut w, d);
        }
        frames.push(w.finish());
        rest = &rest[take..];
        sent += take;
        if rest.is_empty() {
            return frames;
        }
        w = Header {
            kind: FrameKind::BcastSubtree,
            ..head
        }
        .start();
        w.put_varint(tree_id.into());
        w.put_varint(sent as u64);
        batch_start = wire::HEADER_LEN + 5 + 10;
    }
}

impl Protocol for Broadcaster {
    type Event = BcastEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        let ctx = Context {
            comm: self.cfg.comm,
            n: self.cfg.n,
        };
        let (header, reader) = Header::decode(bytes, ctx, from)?;
        self.handle_frame(now, &header, reader)
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        loop {
            match self.out.pop_front()? {
                Outgoing::Frame { to, bytes } => {
                    let len = wire::copy_out(&bytes, buf);
                    return Some(Transmit { to, len });
                }
                Outgoing::Stream {
                    to,
                    task,
                    output,
                    offset,
                } => {
                    let Some(data) = self.output(task, output) else {
                        continue;
                    };
                    let total = data.len() as u64;
                    let end = (offset + MAX_CHUNK as u64).min(total);
                    let mut w = Header {
                        kind: FrameKind::BcastData,
                        comm: self.cfg.comm,
                        epoch: task,
                        sender: self.cfg.me,
                    }
                    .start();
                    w.put_varint(output.into())
                        .put_varint(total)
                        .put_varint(offset)
                        .put_bytes(&data[offset as usize..end as usize]);
                    let frame = w.finish();
                    if end < total {
                        self.out.push_back(Outgoing::Stream {
                            to,
                            task,
                            output,
                            offset: end,
                        });
                    }
                    let len = wire::copy_out(&frame, buf);
                    return Some(Transmit { to, len });
                }
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_event(&mut self) -> Option<BcastEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{OutputSpec, PlanSpec};
    use crate::topology::Topology;
    use alloc::collections::BTreeSet;
    use alloc::format;
    use alloc::string::String;
    use alloc::vec;
    use core::num::NonZeroU32;
    use ft_core::SplitMix;
    use proptest::prelude::{any, prop, proptest, ProptestConfig, TestCaseError};

    fn payload(j: usize, len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| (i as usize * 31 + j * 7 + (i as usize >> 16)) as u8)
            .collect()
    }

    /// An in-test network: frames are delivered in random order, failures are notified
    /// to each survivor at a random later step.
    struct Net {
        n: u32,
        ranks: Vec<Option<Broadcaster>>,
        frames: Vec<(Rank, Rank, Vec<u8>)>,
        notices: Vec<(Rank, Rank)>,
        events: Vec<Vec<BcastEvent>>,
        rng: SplitMix,
        buf: Vec<u8>,
        delivered: usize,
        subtree_frames: usize,
    }

    impl Net {
        fn new(n: u32, seed: u64) -> Self {
            Net {
                n,
                ranks: (0..n)
                    .map(|me| Some(Broadcaster::new(Config::new(9, n, me))))
                    .collect(),
                frames: Vec::new(),
                notices: Vec::new(),
                events: (0..n).map(|_| Vec::new()).collect(),
                rng: SplitMix::new(seed),
                buf: vec![0; wire::frame_capacity(n)],
                delivered: 0,
                subtree_frames: 0,
            }
        }

        fn drain(&mut self, r: Rank) {
            let Some(m) = self.ranks[r as usize].as_mut() else {
                return;
            };
            while let Some(t) = m.poll_transmit(Instant::ZERO, &mut self.buf) {
                self.subtree_frames += usize::from(self.buf[1] == FrameKind::BcastSubtree as u8);
                self.frames.push((r, t.to, self.buf[..t.len].to_vec()));
            }
            while let Some(e) = m.poll_event() {
                self.events[r as usize].push(e);
            }
        }

        fn kill(&mut self, r: Rank) {
            self.ranks[r as usize] = None;
            for s in 0..self.n {
                if self.ranks[s as usize].is_some() {
                    self.notices.push((s, r));
                }
            }
        }

        /// Delivers frame `k` of `frames`; a rejected frame fails the test.
        fn deliver(&mut self, k: usize) {
            let (from, to, bytes) = self.frames.swap_remove(k);
            self.delivered += 1;
            if let Some(m) = self.ranks[to as usize].as_mut() {
                match m.handle_message(Instant::ZERO, from, &bytes) {
                    Ok(()) | Err(FrameError::FromFailedRank(_)) => {}
                    Err(e) => panic!("rank {to} rejected a frame from {from}: {e}"),
                }
                self.drain(to);
            }
        }

        /// Delivers one frame or one failure notice; false when nothing is left.
        fn step(&mut self) -> bool {
            let total = self.frames.len() + self.notices.len();
            if total == 0 {
                return false;
            }
            let k = self.rng.below(total as u64) as usize;
            if k < self.frames.len() {
                self.deliver(k);
            } else {
                let (s, dead) = self.notices.swap_remove(k - self.frames.len());
                if let Some(m) = self.ranks[s as usize].as_mut() {
                    m.on_rank_failed(Instant::ZERO, dead);
                    self.drain(s);
                }
            }
            true
        }
    }

    /// Runs `spec` over the network, killing `kills` (rank, after how many deliveries),
    /// and checks every surviving destination released exactly its outputs, once per
    /// tree, byte-identical to the root's payloads.
    fn run(spec: PlanSpec, kills: &[(Rank, usize)], seed: u64) -> Result<usize, String> {
        let n = spec.ranks;
        let root = spec.root;
        let plan = Plan::build(spec).map_err(|e| format!("{e}"))?;
        let payloads: Vec<Vec<u8>> = plan
            .spec()
            .outputs
            .iter()
            .enumerate()
            .map(|(j, o)| payload(j, o.bytes))
            .collect();
        let mut net = Net::new(n, seed);
        net.ranks[root as usize]
            .as_mut()
            .unwrap()
            .start_broadcast(Instant::ZERO, 5, &plan, payloads.clone())
            .map_err(|e| format!("{e}"))?;
        net.drain(root);
        let mut kills = kills.to_vec();
        let mut steps = 0;
        loop {
            kills.retain(|&(r, at)| {
                if at <= net.delivered && net.ranks[r as usize].is_some() {
                    net.kill(r);
                    false
                } else {
                    true
                }
            });
            if !net.step() {
                if kills.is_empty() {
                    break;
                }
                let (r, _) = kills.remove(0);
                net.kill(r);
            }
            steps += 1;
            if steps > 1_000_000 {
                return Err(String::from("did not settle"));
            }
        }
        let mut needs: BTreeMap<Rank, BTreeSet<u32>> = BTreeMap::new();
        for (j, o) in plan.spec().outputs.iter().enumerate() {
            for &r in &o.dests {
                needs.entry(r).or_default().insert(j as u32);
            }
        }
        for r in 0..n {
            let Some(m) = net.ranks[r as usize].as_ref() else {
                continue;
            };
            if plan.spec().failed.contains(r) || r == root {
                continue;
            }
            let mut got: BTreeSet<u32> = BTreeSet::new();
            let mut trees: BTreeSet<u32> = BTreeSet::new();
            for e in &net.events[r as usize] {
                match e {
                    BcastEvent::Released {
                        task,
                        tree,
                        outputs,
                    } => {
                        if *task != 5 || !trees.insert(*tree) {
                            return Err(format!("rank {r}: released tree {tree} twice"));
                        }
                        for j in outputs {
                            if !got.insert(j) {
                                return Err(format!("rank {r}: output {j} released twice"));
                            }
                        }
                    }
                    BcastEvent::Abandoned { .. } => return Err(format!("rank {r} abandoned")),
                    BcastEvent::Failed { error, .. } => {
                        return Err(format!("rank {r} failed: {error}"))
                    }
                }
            }
            let want = needs.get(&r).cloned().unwrap_or_default();
            if got != want {
                return Err(format!("rank {r}: released {got:?}, needs {want:?}"));
            }
            for &j in &want {
                if m.output(5, j) != Some(&payloads[j as usize][..]) {
                    return Err(format!("rank {r}: output {j} differs from the root's"));
                }
            }
        }
        Ok(net.subtree_frames)
    }

    fn topologies() -> [Topology; 4] {
        [
            Topology::Star,
            Topology::Chain,
            Topology::Binomial,
            Topology::Kary(NonZeroU32::new(2).unwrap()),
        ]
    }

    #[test]
    fn issue_624_every_rank_gets_its_outputs_under_every_strategy() {
        for strategy in Strategy::ALL {
            for topology in topologies() {
                for seed in 0..20 {
                    let spec = PlanSpec::new(3, 0)
                        .with_strategy(strategy)
                        .with_topology(topology)
                        .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
                        .with_output(OutputSpec::new("B", 4096, vec![2]));
                    run(spec, &[], seed).unwrap_or_else(|e| panic!("{strategy} {topology}: {e}"));
                }
            }
        }
    }

    #[test]
    fn chunked_outputs_survive_a_relay_dying_mid_transfer() {
        // Chain 0 -> 1 -> 2 -> 3; rank 1 dies after a few frames: 2 re-requests from 0
        // (or is adopted by it), 3 still gets everything from 2.
        for strategy in Strategy::ALL {
            for at in 0..12 {
                let spec = PlanSpec::new(4, 0)
                    .with_strategy(strategy)
                    .with_topology(Topology::Chain)
                    .with_output(OutputSpec::new(
                        "big",
                        3 * MAX_CHUNK as u64 + 17,
                        vec![1, 2, 3],
                    ))
                    .with_output(OutputSpec::new("small", 10, vec![3]));
                run(spec, &[(1, at)], at as u64)
                    .unwrap_or_else(|e| panic!("{strategy} at {at}: {e}"));
            }
        }
    }

    #[test]
    fn a_request_before_the_activation_is_queued_not_dropped() {
        let spec = PlanSpec::new(3, 0)
            .with_topology(Topology::Chain)
            .with_output(OutputSpec::new("A", 100, vec![1, 2]));
        let plan = Plan::build(spec).unwrap();
        let mut net = Net::new(3, 1);
        // Rank 2 asks rank 1 before rank 1 knows anything about task 5.
        let m1 = net.ranks[1].as_mut().unwrap();
        m1.handle_message(Instant::ZERO, 2, &request_frame(2))
            .unwrap();
        assert!(
            m1.poll_transmit(Instant::ZERO, &mut net.buf).is_none(),
            "nothing to answer with yet"
        );
        net.ranks[0]
            .as_mut()
            .unwrap()
            .start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
            .unwrap();
        net.drain(0);
        // Rank 1 answers the queued request as soon as it holds the data. Rank 2 really
        // asks only once activated, so its data is delivered after everything else.
        let is_data_to_2 =
            |f: &(Rank, Rank, Vec<u8>)| f.1 == 2 && f.2[1] == FrameKind::BcastData as u8;
        while let Some(k) = net.frames.iter().position(|f| !is_data_to_2(f)) {
            net.deliver(k);
        }
        assert!(
            net.frames.iter().any(|f| f.0 == 1 && is_data_to_2(f)),
            "the queued request is answered"
        );
        while net.step() {}
        assert_eq!(
            net.ranks[2].as_ref().unwrap().output(5, 0),
            Some(&payload(0, 100)[..])
        );
    }

    #[test]
    fn a_frame_from_this_rank_itself_is_refused() {
        // Found by the bcast_frames fuzz target: the root answered a request that claimed
        // to come from itself, queueing data frames addressed to itself.
        let spec = PlanSpec::new(3, 1)
            .with_topology(Topology::Star)
            .with_output(OutputSpec::new("A", 100, vec![0, 2]));
        let plan = Plan::build(spec).unwrap();
        let mut net = Net::new(3, 1);
        let root = net.ranks[1].as_mut().unwrap();
        root.start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
            .unwrap();
        while root.poll_transmit(Instant::ZERO, &mut net.buf).is_some() {}
        assert_eq!(
            root.handle_message(Instant::ZERO, 1, &request_frame(1)),
            Err(FrameError::Malformed("frame from self"))
        );
        assert!(root.poll_transmit(Instant::ZERO, &mut net.buf).is_none());
    }

    /// The header of a frame of task 5 (communicator 9) from `sender`.
    fn task5(kind: FrameKind, sender: Rank) -> Writer {
        Header {
            kind,
            comm: 9,
            epoch: 5,
            sender,
        }
        .start()
    }

    /// A request of task 5 from `sender` for output 0 of tree 0.
    fn request_frame(sender: Rank) -> Vec<u8> {
        let mut w = task5(FrameKind::BcastRequest, sender);
        w.put_varint(0);
        put_set(&mut w, &OutputSet::single(0));
        w.finish()
    }

    /// An activation of `tree` of task 5 from `from` (whose only ancestor it is) that
    /// fetches outputs `0..sizes.len()` of the given sizes, with an empty subtree.
    fn activation_frame(from: Rank, tree: u32, sizes: &[u64]) -> Vec<u8> {
        let fetch: OutputSet = (0..sizes.len() as u32).collect();
        let mut w = task5(FrameKind::BcastActivate, from);
        w.put_varint(tree.into()).put_varint(1).put_rank(from);
        put_set(&mut w, &fetch);
        put_set(&mut w, &fetch);
        for &size in sizes {
            w.put_varint(size);
        }
        w.put_varint(0).put_varint(0);
        w.finish()
    }

    /// A data frame of task 5 from `from`: output `output` of `total` bytes, the chunk
    /// at `offset`.
    fn data_frame(from: Rank, output: u32, total: u64, offset: u64) -> Vec<u8> {
        let len = (MAX_CHUNK as u64).min(total - offset) as usize;
        let mut w = task5(FrameKind::BcastData, from);
        w.put_varint(output.into())
            .put_varint(total)
            .put_varint(offset)
            .put_bytes(&vec![7; len]);
        w.finish()
    }

    /// Bytes of output data `m` holds for task 5 (capacity, not length).
    fn held_bytes(m: &Broadcaster) -> usize {
        m.tasks.get(&5).map_or(0, |t| {
            t.buffers
                .values()
                .map(|b| b.data.capacity() + b.ahead.values().map(Vec::capacity).sum::<usize>())
                .sum()
        })
    }

    #[test]
    fn a_huge_announcement_costs_no_memory_until_data_arrives() {
        let gib = 1u64 << 30;
        let mut cfg = Config::new(9, 3, 1);
        cfg.max_task_bytes = 8 * gib;
        let mut m = Broadcaster::new(cfg);
        // Four outputs of 1 GiB each, 4 GiB in all: accepted, and nothing reserved.
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 4]))
            .unwrap();
        assert_eq!(held_bytes(&m), 0);
        let mut buf = vec![0; wire::frame_capacity(3)];
        let request = m.poll_transmit(Instant::ZERO, &mut buf).unwrap();
        assert_eq!((request.to, buf[1]), (0, FrameKind::BcastRequest as u8));
        // Data grows the buffer by what arrives: the first chunk, then one far ahead.
        m.handle_message(Instant::ZERO, 0, &data_frame(0, 0, gib, 0))
            .unwrap();
        assert!(held_bytes(&m) <= 2 * MAX_CHUNK, "{}", held_bytes(&m));
        m.handle_message(
            Instant::ZERO,
            0,
            &data_frame(0, 3, gib, 1000 * MAX_CHUNK as u64),
        )
        .unwrap();
        assert!(held_bytes(&m) <= 3 * MAX_CHUNK, "{}", held_bytes(&m));
        assert_eq!(m.output(5, 0), None, "incomplete outputs are not readable");
    }

    #[test]
    fn out_of_order_chunks_complete_an_output_within_its_size() {
        let size = 3 * MAX_CHUNK as u64 + 5;
        let mut m = Broadcaster::new(Config::new(9, 3, 1));
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[size]))
            .unwrap();
        for offset in [3, 1, 1, 0, 2, 0].map(|k| k * MAX_CHUNK as u64) {
            m.handle_message(Instant::ZERO, 0, &data_frame(0, 0, size, offset))
                .unwrap();
        }
        assert_eq!(m.output(5, 0).map(<[u8]>::len), Some(size as usize));
        assert!(held_bytes(&m) <= size as usize, "{}", held_bytes(&m));
        assert!(m.tasks[&5].buffers[&0].ahead.is_empty());
    }

    #[test]
    fn announced_totals_over_the_limit_are_refused() {
        let gib = 1u64 << 30;
        let mut m = Broadcaster::new(Config::new(9, 3, 1));
        let too_big = Err(FrameError::Malformed(
            "outputs larger in total than the configured limit",
        ));
        // Eight outputs of 1 GiB: each within its limit, 8 GiB in all over 4 GiB.
        assert_eq!(
            m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 8])),
            too_big
        );
        assert!(m.tasks.is_empty(), "a refused activation changes nothing");
        assert_eq!(
            m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib + 1])),
            Err(FrameError::Malformed(
                "output larger than the configured limit"
            ))
        );
        // The total counts every tree of the task: 3 GiB, then 2 GiB more is refused.
        m.handle_message(Instant::ZERO, 0, &activation_frame(0, 0, &[gib; 3]))
            .unwrap();
        assert_eq!(
            m.handle_message(Instant::ZERO, 0, &activation_frame(0, 1, &[gib; 5])),
            too_big
        );
        assert_eq!(m.tasks[&5].trees.len(), 1);
        assert!(m
            .poll_transmit(Instant::ZERO, &mut vec![0; wire::frame_capacity(3)])
            .is_some());
        assert_eq!(held_bytes(&m), 0);

        // The root refuses to start what its receivers would refuse.
        let mut cfg = Config::new(9, 3, 0);
        (cfg.max_output_bytes, cfg.max_task_bytes) = (100, 150);
        let mut root = Broadcaster::new(cfg);
        let plan = |sizes: &[u64]| {
            let mut spec = PlanSpec::new(3, 0);
            for (j, &b) in sizes.iter().enumerate() {
                spec.outputs
                    .push(OutputSpec::new(format!("o{j}"), b, vec![1, 2]));
            }
            Plan::build(spec).unwrap()
        };
        assert_eq!(
            root.start_broadcast(Instant::ZERO, 1, &plan(&[101]), vec![payload(0, 101)]),
            Err(BcastError::TooLarge {
                bytes: 101,
                limit: 100
            })
        );
        assert_eq!(
            root.start_broadcast(
                Instant::ZERO,
                1,
                &plan(&[100, 100]),
                vec![payload(0, 100), payload(1, 100)]
            ),
            Err(BcastError::TooLarge {
                bytes: 200,
                limit: 150
            })
        );
    }

    #[test]
    fn root_death_abandons_and_bad_starts_are_rejected() {
        let spec = PlanSpec::new(3, 0)
            .with_topology(Topology::Chain)
            .with_output(OutputSpec::new("A", 100, vec![1, 2]));
        let plan = Plan::build(spec).unwrap();
        let mut m = Broadcaster::new(Config::new(9, 3, 1));
        assert_eq!(
            m.start_broadcast(Instant::ZERO, 1, &plan, vec![payload(0, 100)]),
            Err(BcastError::NotRoot { root: 0 })
        );
        let mut root = Broadcaster::new(Config::new(9, 3, 0));
        assert_eq!(
            root.start_broadcast(Instant::ZERO, 1, &plan, vec![payload(0, 99)]),
            Err(BcastError::PayloadSize {
                output: 0,
                expected: 100,
                got: 99
            })
        );
        let mut net = Net::new(3, 3);
        net.ranks[0]
            .as_mut()
            .unwrap()
            .start_broadcast(Instant::ZERO, 5, &plan, vec![payload(0, 100)])
            .unwrap();
        net.drain(0);
        net.step(); // rank 1 gets its activation
        net.kill(0);
        while net.step() {}
        assert!(net.events[1].contains(&BcastEvent::Abandoned { task: 5 }));
    }

    #[test]
    fn big_subtrees_are_split_over_several_frames() {
        // 1024 ranks, binomial, 150 outputs to everyone: an entry takes about 300 bytes,
        // so the root's first child's 511-entry subtree needs 3 frames; frames arrive in
        // random order and a relay dies midway.
        let n = 1024;
        let mut spec = PlanSpec::new(n, 0).with_topology(Topology::Binomial);
        for j in 0..150 {
            spec.outputs.push(OutputSpec::new(
                format!("o{j}"),
                1,
                (1..n).collect::<Vec<_>>(),
            ));
        }
        let continuation_frames = run(spec, &[(2, 300)], 7).unwrap();
        assert!(continuation_frames >= 2, "{continuation_frames}");
    }

    fn random_spec(n: u32, m: usize, seed: u64) -> PlanSpec {
        let mut rng = SplitMix::new(seed);
        let root = rng.below(n.into()) as Rank;
        let mut spec = PlanSpec::new(n, root);
        for j in 0..m {
            let p = [10, 40, 80][rng.below(3) as usize];
            let dests: Vec<Rank> = (0..n)
                .filter(|&r| r != root && rng.chance(p, 100))
                .collect();
            let bytes = [0, 1, 1000, MAX_CHUNK as u64 + 5][rng.below(4) as usize];
            spec.outputs
                .push(OutputSpec::new(format!("o{j}"), bytes, dests));
        }
        let failed: Vec<Rank> = (0..n)
            .filter(|&r| r != root && rng.chance(5, 100))
            .collect();
        spec.with_failed(&failed).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 48 } else { 2000 }, ..ProptestConfig::default() })]
        /// Random plans, random delivery order, up to 3 ranks killed at random steps:
        /// every surviving destination releases exactly its outputs, byte-identical.
        #[test]
        fn random_kills_leave_every_survivor_with_exactly_its_outputs(
            n in 2u32..24,
            m in 1usize..5,
            strategy in 0usize..3,
            topology in 0usize..4,
            kills in prop::collection::vec((0u32..24, 0usize..100), 0..4),
            seed in any::<u64>(),
        ) {
            let spec = random_spec(n, m, seed)
                .with_strategy(Strategy::ALL[strategy])
                .with_topology(topologies()[topology]);
            let root = spec.root;
            let kills: Vec<(Rank, usize)> = kills.into_iter().map(|(r, at)| (r % n, at)).filter(|&(r, _)| r != root).collect();
            if let Err(e) = run(spec, &kills, seed) {
                return Err(TestCaseError::fail(e));
            }
        }

        /// Arbitrary bytes, alone or behind a valid header of every broadcast kind, never
        /// panic the machine.
        #[test]
        fn arbitrary_frames_never_panic(kind in 0usize..4, body in prop::collection::vec(any::<u8>(), 0..200), raw in any::<bool>()) {
            let mut m = Broadcaster::new(Config::new(9, 50, 3));
            let kinds = [FrameKind::BcastActivate, FrameKind::BcastSubtree, FrameKind::BcastRequest, FrameKind::BcastData];
            let mut frame = if raw { Vec::new() } else {
                Header { kind: kinds[kind], comm: 9, epoch: 1, sender: 7 }.start().finish()
            };
            frame.extend_from_slice(&body);
            let _ = m.handle_message(Instant::ZERO, 7, &frame);
            let mut buf = vec![0; wire::frame_capacity(50)];
            while m.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
            while m.poll_event().is_some() {}
        }
    }
}
