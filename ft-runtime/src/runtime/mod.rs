//! [`Runtime`]: one progress thread drives a rank's [`RankStack`] over a backend (an
//! [`Engine`]); any number of application threads call the blocking commands
//! ([`Runtime::validate_global`], [`Runtime::wait_outputs`], ...) and read the failure
//! view ([`Runtime::view`]) without touching the network.
//!
//! The progress thread's loop, at every turn:
//! 1. takes the queued commands and runs them on the stack (through
//!    [`Engine::command`], which sends what they produce);
//! 2. pumps the backend once ([`Engine::pump`]: receive, timers, send);
//! 3. reads the stack's events: a finished global validation completes the commands
//!    waiting for its epoch, released outputs complete the commands waiting for them,
//!    and any change of the failure view is published as a new [`ViewSnapshot`];
//! 4. waits if nothing happened ([`Engine::wait_idle`]): until its next timer when the
//!    engine has a waker (then submitting a command wakes it), else briefly.
//!
//! The engine is built on the progress thread itself (by the closure given to
//! [`Runtime::spawn`]), so backends whose handles may not cross threads (an MPI
//! communicator) work; with MPI that needs `MPI_THREAD_SERIALIZED` or more, since the
//! progress thread is not the one that initialized MPI.
//!
//! A command's effect on the failure view is published before the command returns
//! (after `validate_global` returns, [`Runtime::view`] shows its `G`). Published
//! snapshots only move forward: their global epoch never decreases, whichever thread
//! reads them.
//!
//! # Which calls block
//!
//! [`Runtime::view`] never blocks on the network (it clones an `Arc` under a short
//! lock). Every other call queues a command and waits for the progress thread to run
//! it: local commands ([`Runtime::validate_local`], [`Runtime::recognize`],
//! [`Runtime::revoke`], [`Runtime::start_broadcast`], [`Runtime::release`]) for one
//! turn of its loop; [`Runtime::validate_global`] until the survivors agree (it is
//! collective: every live rank calls it); [`Runtime::wait_outputs`] until the outputs
//! are held here, the broadcast fails here, or its timeout passes.
//!
//! # Broadcasts
//!
//! A broadcast is kept (payloads included) until [`Runtime::release`]: see
//! `ft_bcast::stack` on when a task may be released. A wait for outputs fails with
//! [`RuntimeError::Abandoned`] when the rank is left without a live ancestor (the root
//! died), with [`RuntimeError::BroadcastFailed`] when the communicator is revoked, and
//! with [`RuntimeError::TimedOut`] when its timeout passes first (the progress thread
//! checks deadlines at every turn of its loop, so a timeout is late by at most one idle
//! wait: until the next timer, at most 100 ms).
//!
//! # Events
//!
//! What the rank learns is also queued as [`Event`]s, in the order it learned it:
//! arrivals of activations, ready outputs, broadcasts that cannot complete, failed ranks,
//! agreed `G`s, the revoke. Any number of threads take them ([`Runtime::next_event`],
//! [`Runtime::try_next_event`]), each event going to exactly one taker; a runtime that
//! waits in its own poll loop watches [`Runtime::event_fd`]. See [`crate::events`].
//!
//! The thread ends on [`Runtime::shutdown`] (after serving its peers for the given
//! time), on a backend error, or when the rank learns it was declared dead (fail-stop);
//! then every waiting command fails with the reason: [`RuntimeError::DeclaredDead`] or
//! [`RuntimeError::Excluded`] for fail-stop, [`RuntimeError::Stopped`] otherwise.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::{Allocate, OutputSet, PlanSpec, RankStack, StoreStats, TaskId};
use ft_core::shrink::Survivors;
use ft_core::view::FailureView;
use ft_core::{Counts, Instant, Modifier, Rank, RankInfo, RankSet, Scope, StateMask, ViewError};

use crate::copies::Copies;
use crate::driver::DriverStats;
use crate::events::{Event, EventQueue, DEFAULT_EVENT_CAPACITY};
use crate::groups::{GroupEvent, GroupId, Groups};
use crate::shared::{Shared, Stopped, Ticket};
use crate::transport::{Bytes, Wake};

mod error;
mod progress;

pub use error::RuntimeError;
use progress::{progress, Command, Handle, Inspection, Outcome, SharedState};

/// What the progress thread needs from a backend: the backend loop of
/// `ft_core::machine` over one rank's [`Groups`] (its first
/// group's [`RankStack`] and the groups shrunk from it).
pub trait Engine {
    /// A backend failure (it ends the progress thread).
    type Error: fmt::Display;
    /// Group `group`'s stack, if the group is open.
    fn stack(&self, group: GroupId) -> Option<&RankStack>;
    /// Runs an application command on group `group`'s stack at the current time (not at
    /// all if the group is closed), then sends what it produced.
    fn command(
        &mut self,
        group: GroupId,
        f: &mut dyn FnMut(&mut RankStack, Instant),
    ) -> Result<(), Self::Error>;
    /// Runs `f` on the rank's groups (to derive one: a shrink, a split, a rebuild, a
    /// join) at the current time, then sends what it produced.
    fn on_groups(&mut self, f: &mut dyn FnMut(&mut Groups, Instant)) -> Result<(), Self::Error>;
    /// Closes group `group` ([`crate::groups::Groups::remove`]).
    fn remove(&mut self, group: GroupId);
    /// One turn of the backend loop (receive, timers, send); whether it did anything.
    fn pump(&mut self) -> Result<bool, Self::Error>;
    /// The next event a group's stack reported.
    fn next_event(&mut self) -> Option<GroupEvent>;
    /// Waits when a turn found nothing to do: briefly, unless [`Engine::waker`] gives
    /// application threads a way to end the wait when they submit a command.
    fn wait_idle(&mut self) -> Result<(), Self::Error>;
    /// What ends a [`Engine::wait_idle`] from another thread, if anything does.
    fn waker(&self) -> Option<Arc<dyn Wake>> {
        None
    }
    /// Keeps serving peers for `span` before the thread ends.
    fn linger(&mut self, span: StdDuration) -> Result<(), Self::Error>;
    /// The driver's counters (what the transport copied), if the engine has a driver.
    fn driver_stats(&self) -> DriverStats {
        DriverStats::default()
    }
}

/// The failure view as the progress thread last published it: a copy of the rank's
/// [`FailureView`] (so every query of the seed runs on it without the progress
/// thread), the number of global validations finished and the revoke flag.
#[derive(Clone, Debug)]
pub struct ViewSnapshot {
    view: FailureView,
    epoch: u32,
    revoked_by: Option<Rank>,
}

impl ViewSnapshot {
    fn of(stack: &RankStack, epoch: u32) -> Self {
        ViewSnapshot {
            view: stack.node().view().clone(),
            epoch,
            revoked_by: stack.node().revoked_by(),
        }
    }

    /// The whole view (`L_i`, `G`, pending news, queries).
    pub fn view(&self) -> &FailureView {
        &self.view
    }
    /// The communicator's size.
    pub fn size(&self) -> u32 {
        self.view.size()
    }
    /// This rank.
    pub fn rank(&self) -> Rank {
        self.view.rank()
    }
    /// `L_i`: the ranks this rank validated as failed.
    pub fn local(&self) -> RankSet {
        self.view.local()
    }
    /// News not validated yet (`validate_local` folds it into `L_i`).
    pub fn pending(&self) -> &RankSet {
        self.view.pending()
    }
    /// `G`: the agreed failed set of the last global validation.
    pub fn global(&self) -> &RankSet {
        self.view.global()
    }
    /// The number of global validations finished here (0 before the first).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }
    /// The rank that revoked the communicator, once this rank knows it is revoked.
    pub fn revoked_by(&self) -> Option<Rank> {
        self.revoked_by
    }
    /// How many ranks of `scope` match `mask` (an OR of states and modifiers).
    pub fn num_state(&self, scope: Scope, mask: StateMask) -> usize {
        self.view.num_state(scope, mask)
    }
    /// Writes the ranks of `scope` matching `mask` into `out`, in rank order; a buffer
    /// too small is [`ViewError::BufferTooSmall`] naming the entries needed, and
    /// `out` is left untouched.
    pub fn get_state(
        &self,
        scope: Scope,
        mask: StateMask,
        out: &mut [RankInfo],
    ) -> Result<usize, ViewError> {
        self.view.get_state(scope, mask, out)
    }
    /// State, modifier and generation of `rank` in `scope`.
    pub fn rank_info(&self, scope: Scope, rank: Rank) -> Result<(RankInfo, Modifier), ViewError> {
        self.view.rank_info(scope, rank)
    }
    /// The renumbering of a communicator shrunk by `G`: survivors keep their order.
    pub fn survivors(&self) -> Survivors {
        Survivors::new(self.view.global())
    }
}

/// What [`Runtime::store_commit`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreCommit {
    /// The version.
    pub version: u64,
    /// Whether it was committed (the same at every survivor).
    pub committed: bool,
    /// The validation the decision was made on.
    pub validation: GlobalValidation,
}

/// What a global validation returned at this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalValidation {
    /// Its epoch (1 for the first).
    pub epoch: u32,
    /// `|G|` and how many ranks this validation added to it (the seed's
    /// `num_failed`, `num_new`).
    pub counts: Counts,
    /// `G`.
    pub agreed: RankSet,
}
/// A rank's stack on its own progress thread: see the [module docs](self). `Send` and
/// `Sync`: share it (by reference or in an `Arc`) between any number of threads.
///
/// A handle names one group of the rank: the group it was started in, or one shrunk
/// from it ([`Runtime::shrink`]); the handles of one rank share its progress thread
/// and its transport.
pub struct Runtime {
    group: GroupId,
    shared: Arc<SharedState>,
    events: Arc<EventQueue>,
    /// Payload bytes a binding copied at its boundary ([`Runtime::count_api_copies`]).
    api_copied: AtomicU64,
    thread: Arc<ProgressThread>,
    /// Ends the progress thread's idle wait when a command is submitted.
    waker: Option<Arc<dyn Wake>>,
    /// Whether this handle was closed ([`Runtime::shutdown`]).
    closed: AtomicBool,
}

/// The progress thread, joined by whichever handle sees it end.
struct ProgressThread(std::sync::Mutex<Option<JoinHandle<()>>>);

impl ProgressThread {
    /// Waits for the thread to end (at once if it has, or was joined already).
    fn join(&self) -> Result<(), RuntimeError> {
        let thread = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        match thread.map(JoinHandle::join) {
            Some(Err(_)) => Err(RuntimeError::Stopped("the progress thread panicked".into())),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("group", &self.group)
            .field("view", &self.view())
            .finish()
    }
}

type Ready = (Arc<SharedState>, Option<Arc<dyn Wake>>);

impl Runtime {
    /// Starts the progress thread; `make` builds the engine on it. If `make` fails, the
    /// error is returned here.
    pub fn spawn<E, F>(make: F) -> Result<Runtime, RuntimeError>
    where
        E: Engine,
        F: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Ready, String>>();
        let events = Arc::new(EventQueue::new(DEFAULT_EVENT_CAPACITY));
        let progress_events = Arc::clone(&events);
        let thread = std::thread::Builder::new()
            .name("ft-progress".into())
            .spawn(move || match make() {
                Ok(engine) => {
                    let stack = engine.stack(0).expect("an engine starts with group 0");
                    let shared = Arc::new(Shared::new(ViewSnapshot::of(stack, 0)));
                    let _ = ready_tx.send(Ok((Arc::clone(&shared), engine.waker())));
                    let first = Handle::new(stack, shared, progress_events);
                    progress(engine, first);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| RuntimeError::Stopped(format!("cannot start the thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((shared, waker))) => Ok(Runtime {
                group: 0,
                shared,
                events,
                api_copied: AtomicU64::new(0),
                thread: Arc::new(ProgressThread(std::sync::Mutex::new(Some(thread)))),
                waker,
                closed: AtomicBool::new(false),
            }),
            Ok(Err(e)) => Err(RuntimeError::Stopped(e)),
            Err(_) => Err(RuntimeError::Stopped(
                "the thread panicked while starting".into(),
            )),
        }
    }

    /// The group this handle names: 0 for the group the rank started in, then one per
    /// [`Runtime::shrink`] in the order they were made.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Keeps `bytes` as version `version` of this rank's `key` in the group's
    /// redundant store (after Fenix's): one copy here, one sent to a rank of another
    /// node (`span` ranks ahead: [`ft_bcast::store`]); returns once it is queued. The
    /// version counts only once committed ([`Runtime::store_commit`]). The bytes are
    /// handed over once ([`Bytes`]): the copy sent is a slice of them.
    pub fn store_put(
        &self,
        key: u64,
        version: u64,
        bytes: impl Into<Bytes>,
    ) -> Result<(), RuntimeError> {
        self.done(Command::StorePut {
            key,
            version,
            bytes: bytes.into(),
        })
    }

    /// Commits `version` of every rank's entries, collective over the survivors: waits
    /// until this rank's copies of `version` are acknowledged (or their holder is
    /// known dead), agrees on `G` ([`Runtime::validate_global`]), and commits iff `G`
    /// is the store's base (no rank failed since the group started or since the last
    /// [`Runtime::store_rebase`]). The decision is the same at every survivor; a
    /// version not committed is dropped everywhere, and the last committed one stays.
    pub fn store_commit(&self, version: u64) -> Result<StoreCommit, RuntimeError> {
        self.done(Command::StoreFlush(version))?;
        let validation = self.validate_global()?;
        match self.call(Command::StoreDecide(version))? {
            Outcome::Committed(committed) => Ok(StoreCommit {
                version,
                committed,
                validation,
            }),
            _ => unreachable!("a store decision completes with its result"),
        }
    }

    /// Makes the `G` of the last global validation the store's base, once the
    /// survivors have recovered from the failures it holds; pending versions are
    /// dropped. Every survivor calls it at the same point (after the same
    /// validation).
    pub fn store_rebase(&self) -> Result<(), RuntimeError> {
        self.done(Command::StoreRebase)
    }

    /// The committed version of `owner`'s `key` that this rank keeps (its own entry,
    /// or the copy it holds for `owner`), with its version; `None` if it keeps none.
    pub fn store_get(&self, owner: Rank, key: u64) -> Result<Option<(u64, Bytes)>, RuntimeError> {
        self.inspect(move |stack| stack.store().and_then(|s| s.get(owner, key)))
    }

    /// The rank that keeps `owner`'s committed copies (reckoned over the store's base),
    /// where a survivor finds a dead rank's entries.
    pub fn store_holder(&self, owner: Rank) -> Result<Rank, RuntimeError> {
        let n = self.view().size();
        if owner >= n {
            return Err(RuntimeError::View(ViewError::RankOutOfRange {
                rank: owner,
                n,
            }));
        }
        self.inspect(move |stack| stack.store_holder(owner))
    }

    /// What this rank's store holds and moved.
    pub fn store_stats(&self) -> Result<StoreStats, RuntimeError> {
        self.inspect(|stack| stack.store().map(|s| s.stats()).unwrap_or_default())
    }

    /// Shrinks this handle's group by its last agreed `G` (after FT-MPI's *shrink*
    /// mode and ULFM's `MPIX_Comm_shrink`): a new handle on a new group of the
    /// survivors, renumbered in their order ([`ViewSnapshot::survivors`]), with an
    /// empty view (`G` empty, epochs from 0) and its own detector ring, over the same
    /// transport and its connections (no connection is set up). Collective over the
    /// survivors: each calls it after the same [`Runtime::validate_global`], and the
    /// new group's first collective call completes once every survivor has shrunk.
    /// Frames of the new group that reach this rank before it shrinks are kept for it.
    ///
    /// This handle keeps working: its view, its validations and its broadcasts go on
    /// over the old numbering, and its detector keeps watching until this handle is
    /// shut down or dropped. The new handle has its own events, and no allocation hook
    /// ([`Runtime::set_allocator`]) until it is given one.
    pub fn shrink(&self) -> Result<Runtime, RuntimeError> {
        self.opened(Command::Shrink)?
            .ok_or_else(|| RuntimeError::Stopped("the shrink opened no group".into()))
    }

    /// Splits this handle's last `spares` ranks off as spares (before any failure,
    /// collective over the group): at a working rank, a handle on the group of the
    /// first ranks, numbered as here; at a spare, `None`. The working group keeps its
    /// size through failures: [`Runtime::rebuild`] gives a failed rank's number to the
    /// next spare. A spare stays on this handle, waiting for an [`Event::Admitted`]
    /// ([`Runtime::admitted`]); keep this handle open at every rank (admissions travel
    /// over it).
    pub fn split_spares(&self, spares: u32) -> Result<Option<Runtime>, RuntimeError> {
        self.opened(Command::SplitSpares(spares))
    }

    /// Rebuilds this handle's group after its last agreed `G` (after FT-MPI's
    /// *rebuild* mode), collective over the survivors: a new handle on a group of the
    /// same size and numbering in which each rank of `G` runs on the next spare, in its
    /// next incarnation (`RankInfo::generation`), with an empty view and its own
    /// detector ring, over the same transport. The spares learn it over the handle
    /// they wait on; the new handle's first events are an [`Event::Replaced`] per rank
    /// replaced. Every survivor calls it after the same [`Runtime::validate_global`].
    /// A spare taken dead is a failure of the new group, replaced by the next rebuild;
    /// with no spare left, [`GroupError::NoSpares`](crate::GroupError::NoSpares).
    pub fn rebuild(&self) -> Result<Runtime, RuntimeError> {
        self.opened(Command::Rebuild)?
            .ok_or_else(|| RuntimeError::Stopped("the rebuild opened no group".into()))
    }

    /// The handle of rebuilt group `group`, which this rank (a spare) was admitted
    /// into ([`Event::Admitted`] on this handle); `None` if it was taken already.
    pub fn admitted(&self, group: GroupId) -> Result<Option<Runtime>, RuntimeError> {
        self.opened(Command::TakeAdmitted(group))
    }

    /// Runs a command that opens a group, and makes its handle.
    fn opened(&self, command: Command) -> Result<Option<Runtime>, RuntimeError> {
        match self.call(command)? {
            Outcome::Opened(opened) => Ok(opened.map(|opened| Runtime {
                group: opened.group,
                shared: opened.shared,
                events: opened.events,
                api_copied: AtomicU64::new(0),
                thread: Arc::clone(&self.thread),
                waker: self.waker.clone(),
                closed: AtomicBool::new(false),
            })),
            _ => unreachable!("a command that opens a group completes with its handle"),
        }
    }

    /// The failure view as last published (cheap: no network, no waiting on it).
    pub fn view(&self) -> Arc<ViewSnapshot> {
        self.shared.snapshot().1
    }

    /// Why this rank's progress thread stopped (declared dead, excluded, a backend
    /// error), once it has; `None` while it runs. Cheap: no call, no waiting. A loop
    /// that only reads [`Runtime::view`] checks it, since a stopped thread publishes
    /// no view again.
    pub fn stopped(&self) -> Option<RuntimeError> {
        self.shared.closed().map(RuntimeError::from)
    }

    fn call(&self, command: Command) -> Result<Outcome, RuntimeError> {
        let ticket = self.submit(command)?;
        match self.shared.wait(ticket)? {
            Outcome::Failed(e) => Err(e),
            outcome => Ok(outcome),
        }
    }

    /// Queues `command` for the progress thread and wakes it.
    fn submit(&self, command: Command) -> Result<Ticket, Stopped> {
        let ticket = self.shared.submit(command)?;
        if let Some(waker) = &self.waker {
            waker.wake();
        }
        Ok(ticket)
    }

    fn done(&self, command: Command) -> Result<(), RuntimeError> {
        match self.call(command)? {
            Outcome::Done => Ok(()),
            _ => unreachable!("this command completes with Done"),
        }
    }

    /// `validate_local`: folds the detector's news into `L_i`; `|L_i|` and how many were
    /// new (the seed's `num_failed`, `num_new`).
    pub fn validate_local(&self) -> Result<Counts, RuntimeError> {
        match self.call(Command::ValidateLocal)? {
            Outcome::Local(counts) => Ok(counts),
            _ => unreachable!("validate_local completes with counts"),
        }
    }

    /// `validate_global`, collective over the survivors: blocks until they agree. A
    /// second thread of this rank whose call reaches the progress thread while a
    /// validation runs here joins that validation (and gets its result); a call that
    /// arrives after it finished starts the next one, which the other ranks must join
    /// too. So let one thread per rank (the comm thread) own the collective calls.
    pub fn validate_global(&self) -> Result<GlobalValidation, RuntimeError> {
        match self.call(Command::ValidateGlobal)? {
            Outcome::Global(result) => Ok(result),
            _ => unreachable!("validate_global completes with G"),
        }
    }

    /// The application has dealt with failed `rank` (in `L_i`): it becomes `NULL`. The
    /// published view shows it when this returns.
    pub fn recognize(&self, rank: Rank) -> Result<(), RuntimeError> {
        self.done(Command::Recognize(rank))
    }

    /// Revokes the communicator: every survivor learns it, and broadcasts in flight fail
    /// ([`RuntimeError::BroadcastFailed`]). Validations keep working.
    pub fn revoke(&self) -> Result<(), RuntimeError> {
        self.done(Command::Revoke)
    }

    /// Starts broadcast `key` at this rank, the root of `spec`, with no activation
    /// header: [`Runtime::start_with_header`].
    pub fn start_broadcast<P: Into<Bytes>>(
        &self,
        key: u64,
        spec: PlanSpec,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), RuntimeError> {
        self.start_with_header(key, Bytes::new(), spec, payloads)
    }

    /// Starts broadcast [`TaskId`] (this rank, `key`) at this rank, the root of `spec`:
    /// every destination receives `header` (a task runtime's task class and parameters;
    /// at most [`ft_bcast::Config::max_header_bytes`], 1 KiB by default) in its
    /// [`Event::Arrived`], and the `j`-th payload is output `j`'s bytes. Returns once it
    /// is started. Keys are this rank's own: another root's key 7 is another broadcast.
    ///
    /// Each payload (and the header) is handed over once as a shared buffer ([`Bytes`];
    /// a `Vec<u8>` converts without a copy): the chunks sent from it are slices of it,
    /// so the sending side copies none of it when the transport sends from two places
    /// ([`crate::Transport::copies_payload`]).
    pub fn start_with_header<P: Into<Bytes>>(
        &self,
        key: u64,
        header: impl Into<Bytes>,
        spec: PlanSpec,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), RuntimeError> {
        self.done(Command::StartBroadcast {
            key,
            header: header.into(),
            spec,
            payloads: payloads.into_iter().map(Into::into).collect(),
        })
    }

    /// Blocks until this rank holds `outputs` of broadcast `task` (by output index),
    /// the broadcast fails here, or `timeout` (if any) passes.
    ///
    /// Each output comes as the buffer the broadcaster holds, shared, not copied: the
    /// frame it arrived in (an output of one chunk), the landing buffer the transport
    /// received it into, or the buffer its chunks were joined into. It stays valid
    /// after [`Runtime::release`], for as long as the caller keeps it.
    pub fn wait_outputs(
        &self,
        task: TaskId,
        outputs: OutputSet,
        timeout: Option<StdDuration>,
    ) -> Result<Vec<(u32, Bytes)>, RuntimeError> {
        let deadline = timeout.map(|t| WallInstant::now() + t);
        match self.call(Command::WaitOutputs {
            task,
            outputs,
            deadline,
        })? {
            Outcome::Outputs(data) => Ok(data),
            _ => unreachable!("wait_outputs completes with the outputs"),
        }
    }

    /// Sends `bytes` to rank `to` under `tag`; returns once it is queued. It arrives as
    /// an [`Event::Message`], after every message this rank sent `to` before. The bytes
    /// are handed over once ([`Bytes`]; a `Vec<u8>` converts without a copy): every
    /// fragment sent is a slice of them. A send to a rank this rank knows dead fails
    /// with [`StackError::Send`](ft_bcast::StackError::Send)
    /// ([`SendError::DeadRank`](ft_core::SendError::DeadRank)); once a rank is known
    /// dead, nothing more from it is delivered.
    pub fn send(&self, to: Rank, tag: u64, bytes: impl Into<Bytes>) -> Result<(), RuntimeError> {
        self.done(Command::Send {
            to,
            tag,
            bytes: bytes.into(),
        })
    }

    /// Makes `hook` give the memory in which this rank's broadcast outputs land, from
    /// the next output whose first byte arrives: a task runtime's own buffers (its data
    /// arena, registered memory), lent with [`ft_core::Landing::lent`] or
    /// [`ft_core::Landing::lent_vec`] and given back once no rank needs them from this
    /// rank any more (after [`Runtime::release`] and the last [`Bytes`] of them is
    /// dropped). The hook runs on the progress thread, once per output of 1 byte or
    /// more (again only after a source died mid-transfer), and may decline with `None`.
    /// Over MPI and libfabric a large output is received straight into it; an output
    /// that came in frames is copied into it once ([`Copies::received_copied`]).
    pub fn set_allocator(&self, hook: impl Allocate + 'static) -> Result<(), RuntimeError> {
        self.done(Command::SetAllocator(Box::new(hook)))
    }

    /// Frees everything this rank keeps for broadcast `task` (its payloads included);
    /// waits still pending for it fail with [`RuntimeError::Released`].
    pub fn release(&self, task: TaskId) -> Result<(), RuntimeError> {
        self.done(Command::Release(task))
    }

    /// The oldest queued [`Event`], waiting up to `timeout` for one (forever with
    /// `None`); `Ok(None)` when the timeout passed first. Any number of threads may
    /// take events: each goes to exactly one of them. Events queued before the progress
    /// thread ended are still handed out; after the last,
    /// [`RuntimeError::Stopped`].
    pub fn next_event(&self, timeout: Option<StdDuration>) -> Result<Option<Event>, RuntimeError> {
        Ok(self.events.next(timeout)?)
    }

    /// The oldest queued [`Event`], if any, without waiting (as [`Runtime::next_event`]).
    pub fn try_next_event(&self) -> Result<Option<Event>, RuntimeError> {
        Ok(self.events.try_next()?)
    }

    /// A descriptor that polls readable while events are queued (an eventfd), for a
    /// runtime that waits in its own `poll`/`epoll` loop; take the events with
    /// [`Runtime::try_next_event`] until it returns `None`. `None` where the platform
    /// has no eventfd.
    #[cfg(unix)]
    pub fn event_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.events.fd()
    }

    /// What this rank copied of broadcast payloads so far: see [`Copies`].
    pub fn copies(&self) -> Result<Copies, RuntimeError> {
        match self.call(Command::Copies)? {
            Outcome::Copies(copies) => Ok(Copies {
                api_copied: self.api_copied.load(Ordering::Relaxed),
                ..copies
            }),
            _ => unreachable!("copies completes with the counts"),
        }
    }

    /// Counts `bytes` of payload a language binding copied at its boundary (the C
    /// API's copying calls), reported in [`Copies::api_copied`].
    pub fn count_api_copies(&self, bytes: u64) {
        self.api_copied.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Runs `f` on the stack, on the progress thread, between two turns of its loop
    /// (for diagnostics and tests: what the machines themselves hold).
    pub fn inspect<R, F>(&self, f: F) -> Result<R, RuntimeError>
    where
        R: Send + 'static,
        F: FnOnce(&RankStack) -> R + Send + 'static,
    {
        let inspection: Inspection = Box::new(move |stack| Box::new(f(stack)));
        match self.call(Command::Inspect(inspection))? {
            Outcome::Inspected(value) => Ok(*value
                .downcast::<R>()
                .expect("an inspection returns its own type")),
            _ => unreachable!("inspect completes with its value"),
        }
    }

    /// Ends the progress thread at its next turn, without serving peers any longer
    /// (as if the process died): every handle of this rank stops; does not wait. Calls
    /// pending or made later fail with [`RuntimeError::Stopped`].
    pub fn halt(&self) {
        let _ = self.submit(Command::Halt);
    }

    /// Keeps serving this handle's peers for `linger`, then closes the handle: its
    /// group's stack stops (its detector too), and the other handles of this rank go
    /// on. The last handle's shutdown ends the progress thread and waits for it.
    pub fn shutdown(self, linger: StdDuration) -> Result<(), RuntimeError> {
        self.close(linger)
    }

    /// Closes the handle ([`Runtime::shutdown`]); joins the thread if it ended.
    fn close(&self, linger: StdDuration) -> Result<(), RuntimeError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match self.call(Command::Shutdown { linger }) {
            Ok(Outcome::ShutDown { ended: false }) => Ok(()),
            Ok(_) => self.thread.join(),
            // Ended before: join what is left of it.
            Err(RuntimeError::Stopped(_)) => self.thread.join(),
            Err(e) if e.is_fail_stop() => self.thread.join(),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.close(StdDuration::ZERO);
    }
}
