//! The per-rank activation protocol: one [`Broadcaster`] per rank runs every broadcast
//! that rank takes part in, with the library's one state-machine face
//! ([`ft_core::Protocol`]).
//!
//! A broadcast (`task`, carried in the header's epoch field) follows a [`Plan`]:
//!
//! 1. The root calls [`Broadcaster::start_broadcast`] with the plan and the output
//!    payloads (opaque bytes). It activates each of its children in every tree. From
//!    its third start from one plan on, it starts from what the second left behind
//!    (module `template`): the same frames, derived once.
//! 2. **Activation** (`BcastActivate`, continued by `BcastSubtree` when it does not fit
//!    one frame) tells a child: the tree, its ancestors (root first, the sender last),
//!    the outputs it needs for itself, the outputs it fetches (its needs plus what its
//!    subtree needs), their sizes, and its subtree (every descendant with its parent,
//!    needs and fetch set), so the child can activate its own children and re-attach
//!    orphans after a failure.
//! 3. **Data.** With [`Config::eager_push`] (the default), a parent that activates an
//!    original child (its parent in the plan) says so in the activation (*data
//!    follows*) and streams the child's fetch set to it right behind the activation,
//!    unasked: one message delay per tree level. The child records that its parent
//!    pushes and sends no request. Without push (or for a child adopted after a failure,
//!    see below), the child **requests** (`BcastRequest`) its fetch set from its
//!    parent, which then streams it: the pull path, kept for repair and as a mode. A
//!    request names, per output, the **offset** the requester holds contiguously from
//!    0 (its in-order prefix; 0 when it holds nothing), and the stream starts there.
//!    An offset is only ever that prefix, never past a byte the requester lacks (bytes
//!    it holds ahead of a gap may come again); an offset out of place in its output is
//!    refused (or, queued before the output's size was known, dropped).
//!    Either way the data is `BcastData` chunks of at most [`Config::chunk_bytes`]
//!    bytes, in order. **Heads ahead** ([`Config::early_heads`], set by a driver whose
//!    transport receives payloads in place): a stream of an output that goes in one
//!    chunk, at a relay that holds none of it yet, sends that chunk's head at once
//!    (behind the child's activation) and the payload, the whole output, when it
//!    holds it ([`ft_core::Promise`]); the child's transport posts the payload's
//!    receive on the head, before the data has reached the relay. The receiver sees
//!    the same frame. A task forgotten (or revoked) with such a payload still owed
//!    withdraws it, so the child's receive ends. **Pipelining:** a relay sends chunk `c` on as soon as it holds
//!    the output's bytes up to the end of `c` (its in-order prefix); a stream that
//!    catches up with the data waits for the next chunk, never sends what has not
//!    arrived. A request arriving before the activation (which announces the outputs'
//!    sizes) is queued: never dropped, never answered with missing data.
//!    **One stream per child and output:** a pushed output joins the child's served
//!    set like a requested one, so a request for an output already pushed or streamed
//!    to that child (a re-activated child, an older peer) starts no second stream: the
//!    stream under way runs to the end from 0 (a push) or from an earlier request's
//!    offset, which the child held then and so holds now (what a rank holds only
//!    grows), so it covers every byte the later request lacks.
//!    **Data before its activation:** the protocol does not rely on a transport keeping
//!    a pair's frames in order (MPI does, libfabric's `tcp;ofi_rxm` does, the
//!    simulator does; `backend-ofi` does not promise it, and the in-crate test network
//!    reorders freely). A chunk whose output's size is not announced yet is kept as
//!    it came (at most [`Config::max_task_bytes`] of such chunks per broadcast) and
//!    checked and added when the activation arrives; a chunk of one of the last tasks
//!    forgotten here is late, not early, and is dropped.
//! 4. A rank activates its children as soon as it is activated itself and knows its
//!    whole subtree (it need not hold their data yet: they fetch it as it arrives),
//!    the child with the largest subtree first (its path down is the longest, as MPI's
//!    binomial broadcast serves it first), each child's activation followed at once by
//!    the data pushed to it, so a transport may send the two as one message. A rank
//!    activated as a destination reports its arrival ([`BcastEvent::Arrived`]: the
//!    root, the tree and the outputs it needs). When a rank holds every output it
//!    needs in a tree, it **releases** them locally ([`BcastEvent::Released`]).
//!
//! **Repair.** [`Broadcaster::on_rank_failed`] tells the machine a rank died. In every
//! tree, a rank whose parent died re-requests its missing outputs from its nearest live
//! ancestor (the root in the worst case), and a rank whose descendant died adopts that
//! descendant's children, activating them itself *without* push: an adopted child may
//! hold part of its fetch set, so it requests what it lacks (each output it has not
//! completed, from the end of the prefix it holds). Every ancestor fetches a superset
//! of what its descendants fetch, so the new source holds or will hold what is asked
//! (a stream past what the source holds waits for its data). A push cut by its
//! sender's death loses nothing and is not sent again: the child's repair request names
//! every output it has not completed with the prefix it holds, the new source streams
//! from there, and whatever still overlaps (chunks of the old source in flight, chunks
//! held past a gap) is trimmed on arrival (any chunking, any overlap); correctness does
//! not rest on the offset, which only saves bandwidth on the degraded path
//! ([`BcastStats::received_bytes_duplicate`] counts what still came twice). Every
//! surviving destination releases exactly its outputs, once per tree.
//!
//! **Invariants.** Failure-free, each destination receives each payload byte of its
//! fetch set exactly once, and with push nobody sends a request. A child's data comes
//! from one stream per output and server. A rank never streams an output to a rank it
//! knows dead, and drops a stream when its destination dies.
//!
//! **Call order** (see [`ft_core::machine`]): feed frames with `handle_message`, failures
//! with `on_rank_failed`, commands with `start_broadcast`; after each, drain
//! `poll_transmit` then `poll_event`. The machine has no timer (failure detection is the
//! detector's job): `poll_timeout` is always `None`.
//!
//! Peer input never panics: malformed frames, out-of-range ranks or output indices,
//! sizes over [`Config::max_output_bytes`] (or, for all outputs of a broadcast together,
//! over [`Config::max_task_bytes`]), inconsistent subtrees and data that does not match
//! its announced size are rejected with a [`FrameError`](ft_core::FrameError) and change nothing.
//!
//! **Memory.** An announced size costs nothing by itself: an output's buffer grows with
//! the data that actually arrives (its in-order prefix, plus chunks that overtook it),
//! never past the announced size, so a peer can make this rank hold at most what it
//! really sent, and at most [`Config::max_task_bytes`] per broadcast. One exception,
//! on transports that receive payloads in place: the first chunk placed for an output
//! allocates the output's one buffer at its announced size (within the same limits),
//! uninitialised, so the system commits its pages only as data is written into them.
//!
//! **Bulk data, and where it is copied.** The root's payloads are handed over once as
//! shared buffers ([`Bytes`]). A data frame goes out through
//! [`Protocol::poll_transmit_parts`](ft_core::Protocol::poll_transmit_parts) as its
//! head (header, output, total, offset, chunk length: a few dozen bytes written into
//! the caller's buffer) plus the chunk as a slice of the buffer that holds it: the
//! root's payload, or at a relay the chunk as it arrived (see `state::Buffer`). So the
//! machine copies no payload byte when it sends or forwards; only the contiguous
//! [`Protocol::poll_transmit`](ft_core::Protocol::poll_transmit) writes the chunk into
//! the caller's buffer, and [`Broadcaster::stats`] counts those bytes. On the wire both
//! give the same frame: `BcastData` is its fields then the chunk's bytes at the end.
//! Copies left on the receiving side, per received payload byte: the transport's
//! delivery into its receive buffer (outside this crate); one copy out of that buffer
//! when the frame is lent ([`Protocol::handle_message`](ft_core::Protocol::handle_message)),
//! none when the transport hands the frame over
//! ([`Protocol::handle_message_owned`](ft_core::Protocol::handle_message_owned)): the
//! chunk is then kept, and forwarded, as a slice of the frame (its whole buffer stays
//! alive while the chunk is held); and one when a multi-chunk output is complete and
//! assembled into one buffer for [`Broadcaster::output`] (none for an output that came
//! in one chunk). A transport that receives a head before its payload (MPI) asks
//! where the payload goes ([`Protocol::place_payload`](ft_core::Protocol::place_payload),
//! module `place`): a chunk of a multi-chunk output is then received straight into the
//! output's one buffer at its offset, and the output needs no join at all.
//! [`BcastStats`] counts the received bytes kept in place, landed, copied and joined.
//!
//! **Layout.** `codec`: the typed frames (activation with its flags, subtree part,
//! request, data) and their encoding and decoding; `state`: a broadcast's state at this
//! rank (its trees, output buffers, chunks that overtook their activation, queued
//! requests and outgoing frames); `place`: data chunks received into the output's
//! buffer; `serve`: answering activations, requests and data,
//! pushing to and forwarding to children, and the
//! [`ft_core::Protocol`] face; `repair`: failures and revocation; `template`: the
//! root's start from a plan it started from before.

mod codec;
mod place;
mod repair;
mod serve;
mod state;
mod task_id;
mod template;
#[cfg(test)]
mod tests;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::fmt;
use hashbrown::{HashMap, HashSet};

use bytes::Bytes;
use ft_core::wire::{FrameKind, MAX_CHUNK};
use ft_core::{Instant, Rank, RankSet};

use crate::outputs::OutputSet;
use crate::plan::Plan;
use crate::spec::Strategy;
pub use place::Allocate;
use state::{index_of, Buffer, Entry, Outgoing, Task, TreeState};
pub use task_id::TaskId;
use template::RootTemplate;

/// The longest activation header a broadcaster sends or accepts by default (1 KiB).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 1024;

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
    /// The longest data chunk this rank sends (positive): a transport's preferred size
    /// (`Transport::chunk_bytes` in `ft-runtime`), [`MAX_CHUNK`] by default. A relay
    /// never sends a chunk longer than the one it received it in. Receivers accept
    /// chunks of any length that their transport delivers (at most the frame size:
    /// [`frame_capacity_for`](ft_core::wire::frame_capacity_for)).
    pub chunk_bytes: usize,
    /// The longest data chunk this rank sends to a child with no descendant in any of
    /// the broadcast's trees here (a leaf: there is nothing to pipeline to), if set
    /// (else [`Config::chunk_bytes`], the default). A transport whose receivers take a
    /// frame of any length and whose cost is per message (MPI: one message per chunk)
    /// sends an output to a leaf in one piece, so the leaf joins no chunks for
    /// [`Broadcaster::output`]. A relay's chunks are still at most those it received.
    pub leaf_chunk_bytes: Option<usize>,
    /// Whether a parent streams a child's fetch set right after activating it (eager
    /// push, the default: one message delay per tree level) instead of waiting for the
    /// child's request (pull only: activation, request, then data). Only the sender's
    /// setting matters: the activation says which it is, and a child that is not told
    /// "data follows" requests as before, so ranks of both settings work together.
    pub eager_push: bool,
    /// Whether a stream that has nothing to send yet may send its frame's head ahead
    /// of the payload ([`ft_core::Promise`]): a relay whose child's output comes in one
    /// chunk of at most [`Config::chunk_bytes`], and which holds none of it yet, sends
    /// the head right behind the child's activation and the payload, whole, as soon as
    /// it holds it. A transport that receives payloads in place (MPI) then posts the
    /// child's receive before the data reaches the relay, so no head travels between
    /// the data's arrival and its departure. Off by default; a driver turns it on for
    /// a transport that sends heads early (`Transport::sends_heads_early` in
    /// `ft-runtime`). The receiver needs no setting: it sees the same frames.
    pub early_heads: bool,
    /// The longest activation header ([`Broadcaster::start_with_header`]) this rank
    /// sends or accepts: a longer one is refused at the root
    /// ([`BcastError::HeaderTooLarge`]) and in a peer's frame.
    pub max_header_bytes: usize,
}

impl Config {
    /// Rank `me` of communicator `comm` of `n` ranks; outputs up to 1 GiB, 4 GiB per
    /// broadcast, 4096 outputs, chunks of [`MAX_CHUNK`], eager push, activation
    /// headers up to [`DEFAULT_MAX_HEADER_BYTES`].
    pub fn new(comm: u32, n: u32, me: Rank) -> Self {
        Config {
            comm,
            n,
            me,
            max_output_bytes: 1 << 30,
            max_task_bytes: 1 << 32,
            max_outputs: 4096,
            chunk_bytes: MAX_CHUNK,
            leaf_chunk_bytes: None,
            eager_push: true,
            early_heads: false,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }
}

/// What a broadcaster sent and kept of the payloads, to count its copies on the sending
/// and the receiving side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BcastStats {
    /// Payload bytes of the data chunks this rank sent (as root or relay).
    pub payload_bytes_sent: u64,
    /// Of those, the bytes the machine copied into a caller's buffer: the chunks that
    /// went out through [`Protocol::poll_transmit`](ft_core::Protocol::poll_transmit)
    /// rather than as a shared slice through
    /// [`Protocol::poll_transmit_parts`](ft_core::Protocol::poll_transmit_parts).
    pub payload_bytes_copied: u64,
    /// Payload bytes of the data chunks this rank received and kept as slices of the
    /// frame they came in: frames handed over with
    /// [`Protocol::handle_message_owned`](ft_core::Protocol::handle_message_owned)
    /// (no copy by the machine). Chunks dropped as duplicates count in neither field.
    pub received_bytes_in_place: u64,
    /// Payload bytes of the data chunks this rank received and kept by copying them
    /// out of a frame lent with
    /// [`Protocol::handle_message`](ft_core::Protocol::handle_message).
    pub received_bytes_copied: u64,
    /// Payload bytes of the data chunks this rank received (its output's size
    /// announced) that it held already: a repair stream overlapping what the old source
    /// sent, or a whole chunk of an output already complete. Failure-free, 0.
    pub received_bytes_duplicate: u64,
    /// Payload bytes of the data chunks the transport received straight into the
    /// output's one buffer ([`Protocol::place_payload`](ft_core::Protocol::place_payload),
    /// `handle_message_placed`): kept where they landed, and joined with no copy.
    pub received_bytes_landed: u64,
    /// Payload bytes copied to join an output that came in several chunks into one
    /// buffer, when they had not all landed in place.
    pub joined_bytes: u64,
    /// Data frames whose head this rank sent ahead of their payload
    /// ([`Config::early_heads`]); their payloads count in
    /// [`BcastStats::payload_bytes_sent`] when they go.
    pub heads_sent_early: u64,
}

/// What the broadcaster reports to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BcastEvent {
    /// An activation made this rank a destination of `outputs` in tree `tree` of
    /// `task`. Reported once per tree the rank is a destination in, before that tree's
    /// [`BcastEvent::Released`].
    Arrived {
        /// The broadcast.
        task: TaskId,
        /// The tree.
        tree: u32,
        /// The outputs this rank needs from the tree.
        outputs: OutputSet,
        /// The root's activation header, as the frame it came in holds it (no copy
        /// when the transport handed the frame over).
        header: Bytes,
    },
    /// This rank holds every output it needs in tree `tree` of `task`: read them with
    /// [`Broadcaster::output`]. Reported once per tree the rank is a destination in.
    Released {
        /// The broadcast.
        task: TaskId,
        /// The tree.
        tree: u32,
        /// The outputs released.
        outputs: OutputSet,
    },
    /// No live ancestor is left (the root died): `task` cannot complete at this rank.
    Abandoned {
        /// The broadcast.
        task: TaskId,
    },
    /// The communicator was revoked while `task` was in flight at this rank: it fails
    /// here with [`BcastError::Revoked`] and its state is dropped.
    Failed {
        /// The broadcast.
        task: TaskId,
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
    /// This rank's broadcast of this key is still kept here (not forgotten).
    TaskInUse(u64),
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
    /// The activation header is longer than [`Config::max_header_bytes`].
    HeaderTooLarge {
        /// The header's length.
        bytes: usize,
        /// The limit.
        limit: usize,
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
            BcastError::TaskInUse(key) => write!(f, "broadcast {key} of this rank is still kept"),
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
            BcastError::HeaderTooLarge { bytes, limit } => write!(
                f,
                "activation header of {bytes} bytes, over the configured limit of {limit}"
            ),
            BcastError::Revoked => f.write_str("the communicator was revoked"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for BcastError {}

/// One rank's activation protocol machine for every broadcast it takes part in.
#[derive(Debug)]
pub struct Broadcaster {
    cfg: Config,
    dead: RankSet,
    /// Boxed: a task's state is a few hundred bytes, which the map's nodes would
    /// otherwise hold inline and move as tasks come and go.
    tasks: BTreeMap<TaskId, Box<Task>>,
    out: VecDeque<Outgoing>,
    events: VecDeque<BcastEvent>,
    revoked: bool,
    stats: BcastStats,
    /// The last [`FORGOTTEN`] tasks forgotten, oldest overwritten first: a chunk of
    /// one of them that arrives late (the rest of a repair stream after the output
    /// completed) is dropped, not kept as if its activation were still to come.
    forgotten: [Option<TaskId>; FORGOTTEN],
    next_forgotten: usize,
    /// The root's start from the plan it last started from twice in a row, for the
    /// next start from that plan (module `template`).
    root_template: Option<Box<RootTemplate>>,
    /// The id of the plan of the root's last start (0: none).
    last_root_plan: usize,
    /// The id of the next head sent ahead of its payload ([`Config::early_heads`]).
    next_promise: u64,
    /// The runtime's allocation hook, if it set one (module `place`).
    allocator: Option<place::Allocator>,
}

/// How many forgotten task ids a broadcaster remembers.
const FORGOTTEN: usize = 32;

impl Broadcaster {
    /// The machine of rank `cfg.me`.
    ///
    /// # Panics
    /// If `cfg.me >= cfg.n` or `cfg.chunk_bytes` is 0.
    pub fn new(cfg: Config) -> Self {
        assert!(
            cfg.me < cfg.n,
            "rank {} out of range for {} ranks",
            cfg.me,
            cfg.n
        );
        assert!(cfg.chunk_bytes > 0, "chunks of 0 bytes");
        Broadcaster {
            cfg,
            dead: RankSet::new(cfg.n),
            tasks: BTreeMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            revoked: false,
            stats: BcastStats::default(),
            forgotten: [None; FORGOTTEN],
            next_forgotten: 0,
            root_template: None,
            last_root_plan: 0,
            next_promise: 0,
            allocator: None,
        }
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
    pub fn output(&self, task: TaskId, index: u32) -> Option<&[u8]> {
        self.output_bytes(task, index).map(|b| &b[..])
    }

    /// [`Broadcaster::output`] as the shared buffer itself: a clone costs a reference
    /// count, not a copy, and keeps the bytes alive after [`Broadcaster::forget`].
    pub fn output_bytes(&self, task: TaskId, index: u32) -> Option<&Bytes> {
        let t = self.tasks.get(&task)?;
        if !t.complete.contains(index) {
            return None;
        }
        t.buffers.get(&index)?.whole()
    }

    /// What this rank sent, and kept of what it received, of the payloads so far.
    pub fn stats(&self) -> BcastStats {
        self.stats
    }

    /// Sets [`Config::chunk_bytes`] for the chunks sent from now on.
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_chunk_bytes(&mut self, bytes: usize) {
        assert!(bytes > 0, "chunks of 0 bytes");
        self.cfg.chunk_bytes = bytes;
        self.root_template = None;
    }

    /// Sets [`Config::leaf_chunk_bytes`] for the streams started from now on.
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_leaf_chunk_bytes(&mut self, bytes: usize) {
        assert!(bytes > 0, "chunks of 0 bytes");
        self.cfg.leaf_chunk_bytes = Some(bytes);
        self.root_template = None;
    }

    /// Sets [`Config::early_heads`] for the streams started from now on.
    pub fn set_early_heads(&mut self, on: bool) {
        self.cfg.early_heads = on;
    }

    /// Drops everything kept for `task` (its payloads included). Chunks of it that
    /// arrive later are dropped while it is among the last 32 tasks forgotten here, so
    /// on a transport that reorders a pair's frames, do not reuse a task id before 32
    /// others were forgotten (its new chunks could overtake its new activation and be
    /// taken for late ones). A payload whose head went ahead of it
    /// ([`Config::early_heads`]) is withdrawn ([`ft_core::Promise::Withdrawn`]).
    pub fn forget(&mut self, task: TaskId) {
        let mut withdrawn: Vec<(Rank, u64)> = Vec::new();
        if let Some(t) = self.tasks.remove(&task) {
            withdrawn.extend(t.parked.iter().filter_map(|p| Some((p.to, p.promise?))));
            if !self.forgotten.contains(&Some(task)) {
                self.forgotten[self.next_forgotten] = Some(task);
                self.next_forgotten = (self.next_forgotten + 1) % FORGOTTEN;
            }
        }
        self.out.retain(|o| match *o {
            Outgoing::Stream {
                task: t,
                to,
                promise,
                ..
            } if t == task => {
                withdrawn.extend(promise.map(|id| (to, id)));
                false
            }
            _ => true,
        });
        for (to, promise) in withdrawn {
            self.out.push_back(Outgoing::Withdrawn { to, promise });
        }
    }

    /// The payload bytes kept for every task not forgotten yet (outputs held or being
    /// received, chunks that overtook the prefix included).
    pub fn held_bytes(&self) -> usize {
        let buffers = self.tasks.values().flat_map(|t| t.buffers.values());
        let early: u64 = self.tasks.values().map(|t| t.early_bytes).sum();
        buffers.map(Buffer::bytes_kept).sum::<usize>() + early as usize
    }

    /// Starts broadcasting `key` at the root, with no activation header: see
    /// [`Broadcaster::start_with_header`].
    pub fn start_broadcast<P: Into<Bytes>>(
        &mut self,
        now: Instant,
        key: u64,
        plan: &Plan,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), BcastError> {
        self.start_with_header(now, key, plan, Bytes::new(), payloads)
    }

    /// Starts broadcasting [`TaskId`] (this rank, `key`) at the root: every destination
    /// receives `header` (at most [`Config::max_header_bytes`]) with its
    /// [`BcastEvent::Arrived`], and the `j`-th payload is output `j`'s bytes (its
    /// length must be the plan's size for it). A key is this rank's to choose: other
    /// roots' keys never collide with it.
    ///
    /// The application hands each payload over once, as a shared buffer ([`Bytes`]; a
    /// `Vec<u8>` converts without a copy): every chunk the root sends is a slice of it,
    /// and the caller may keep clones (they share the bytes). The header is handed over
    /// the same way and goes out, from every rank that forwards it, as the trailing
    /// part of each activation frame (a slice, not a copy).
    ///
    /// Keep the plan of a task class and start each of its tasks from it: after two
    /// starts from one plan ([`Plan::id`]), the broadcaster keeps the root's trees and
    /// its children's encoded activations, and later starts from that plan clone them
    /// instead of deriving them again (the `small_tasks` bench times both), until a rank
    /// dies or the chunk settings change.
    pub fn start_with_header<P: Into<Bytes>>(
        &mut self,
        _now: Instant,
        key: u64,
        plan: &Plan,
        header: impl Into<Bytes>,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), BcastError> {
        let task = TaskId::new(self.cfg.me, key);
        let header: Bytes = header.into();
        if header.len() > self.cfg.max_header_bytes {
            return Err(BcastError::HeaderTooLarge {
                bytes: header.len(),
                limit: self.cfg.max_header_bytes,
            });
        }
        let payloads: Vec<Bytes> = payloads.into_iter().map(Into::into).collect();
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
            return Err(BcastError::TaskInUse(key));
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
        let mut t = Task {
            header,
            ..Task::default()
        };
        t.sizes.reserve_exact(payloads.len());
        t.buffers.reserve_exact(payloads.len());
        t.trees.reserve_exact(plan.trees().len());
        for (j, data) in payloads.into_iter().enumerate() {
            let j = j as u32;
            t.sizes.insert(j, data.len() as u64);
            t.buffers.insert(j, Buffer::complete(data));
            t.complete.insert(j);
        }
        if let Some(template) = self.root_template.as_deref().filter(|tpl| tpl.serves(plan)) {
            template.start(task, &mut t, &mut self.out);
            self.tasks.insert(task, Box::new(t));
            return Ok(());
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
                index: index_of(&entries),
                entries,
                direct: Vec::new(),
                activated: HashSet::new(),
                requested_from: None,
                released: true,
            };
            tree.recompute_direct(self.cfg.me, &self.dead);
            t.trees.insert(k as u32, tree);
        }
        self.tasks.insert(task, Box::new(t));
        let queued = self.out.len();
        self.progress(task);
        // A second start from one plan: the next ones start from its template.
        if plan.id() == self.last_root_plan {
            self.root_template = self.tasks.get(&task).and_then(|t| {
                let head = self.header(FrameKind::BcastActivate);
                RootTemplate::capture(plan, task, t, head, self.out.range(queued..))
            });
        }
        self.last_root_plan = plan.id();
        Ok(())
    }
}
