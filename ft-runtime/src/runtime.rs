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

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::{
    Allocate, BcastError, BcastEvent, OutputSet, PlanSpec, RankStack, StackError, StackEvent,
    TaskId,
};
use ft_core::messages::Message;
use ft_core::node::{NodeError, NodeEvent};
use ft_core::shrink::Survivors;
use ft_core::view::FailureView;
use ft_core::{Counts, Instant, Modifier, Rank, RankInfo, RankSet, Scope, StateMask, ViewError};

use crate::copies::Copies;
use crate::driver::DriverStats;
use crate::events::{Event, EventQueue, DEFAULT_EVENT_CAPACITY};
use crate::shared::{Shared, Stopped, Ticket};
use crate::transport::{Bytes, Wake};

/// What the progress thread needs from a backend: the backend loop of
/// `ft_core::machine` over one rank's [`RankStack`].
pub trait Engine {
    /// A backend failure (it ends the progress thread).
    type Error: fmt::Display;
    /// The stack.
    fn stack(&self) -> &RankStack;
    /// Runs an application command on the stack at the current time, then sends what
    /// it produced.
    fn command(&mut self, f: &mut dyn FnMut(&mut RankStack, Instant)) -> Result<(), Self::Error>;
    /// One turn of the backend loop (receive, timers, send); whether it did anything.
    fn pump(&mut self) -> Result<bool, Self::Error>;
    /// The next event the stack reported.
    fn next_event(&mut self) -> Option<StackEvent>;
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

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The stack refused the command (this rank was declared dead, a broadcast spec
    /// that cannot be planned, a task id in use, ...); nothing changed.
    Stack(StackError),
    /// A failure-view call was rejected (a rank out of range, a rank not failed, a
    /// buffer too small); nothing changed.
    View(ViewError),
    /// Broadcast `task` cannot complete at this rank: no live ancestor is left (the
    /// root died).
    Abandoned {
        /// The broadcast.
        task: TaskId,
    },
    /// Broadcast `task` failed at this rank (the communicator was revoked).
    BroadcastFailed {
        /// The broadcast.
        task: TaskId,
        /// Why.
        error: BcastError,
    },
    /// The wait's timeout passed before the outputs arrived; the broadcast goes on.
    TimedOut {
        /// The broadcast.
        task: TaskId,
    },
    /// The wait was pending when the application released `task` here.
    Released {
        /// The broadcast.
        task: TaskId,
    },
    /// Rank `by` declared this rank dead, rightly or not, and the progress thread has
    /// stopped for good (fail-stop): the peers go on without this rank, so it must
    /// leave as a dead rank does (exit, or at least never act as a live rank again).
    DeclaredDead {
        /// The observer whose declaration reached this rank.
        by: Rank,
    },
    /// The global validation `epoch` agreed that this rank failed; it has stopped for
    /// good, as under [`DeclaredDead`](RuntimeError::DeclaredDead).
    Excluded {
        /// The validation's epoch.
        epoch: u32,
    },
    /// The progress thread has ended otherwise (shut down, a backend error).
    Stopped(String),
}

impl RuntimeError {
    /// Whether the peers put this rank out of the group (a declaration, or an
    /// exclusion by agreement): the rank must leave as a dead one does.
    pub fn is_fail_stop(&self) -> bool {
        matches!(
            self,
            RuntimeError::DeclaredDead { .. } | RuntimeError::Excluded { .. }
        )
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Stack(e) => write!(f, "command refused: {e}"),
            RuntimeError::View(e) => write!(f, "failure view: {e}"),
            RuntimeError::Abandoned { task } => {
                write!(
                    f,
                    "broadcast {task} abandoned: no live ancestor (the root died)"
                )
            }
            RuntimeError::BroadcastFailed { task, error } => {
                write!(f, "broadcast {task} failed: {error}")
            }
            RuntimeError::TimedOut { task } => {
                write!(f, "timed out waiting for outputs of broadcast {task}")
            }
            RuntimeError::Released { task } => {
                write!(f, "broadcast {task} was released while waited for")
            }
            // The fail-stop reasons read as the progress thread's own.
            RuntimeError::DeclaredDead { by } => Stopped::DeclaredDead { by: *by }.fmt(f),
            RuntimeError::Excluded { epoch } => Stopped::Excluded { epoch: *epoch }.fmt(f),
            RuntimeError::Stopped(why) => write!(f, "the progress thread has stopped: {why}"),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Stack(e) => Some(e),
            RuntimeError::View(e) => Some(e),
            RuntimeError::BroadcastFailed { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<Stopped> for RuntimeError {
    fn from(e: Stopped) -> Self {
        match e {
            Stopped::DeclaredDead { by } => RuntimeError::DeclaredDead { by },
            Stopped::Excluded { epoch } => RuntimeError::Excluded { epoch },
            Stopped::Ended(why) => RuntimeError::Stopped(why),
        }
    }
}

impl From<StackError> for RuntimeError {
    fn from(e: StackError) -> Self {
        RuntimeError::Stack(e)
    }
}

impl From<ViewError> for RuntimeError {
    fn from(e: ViewError) -> Self {
        RuntimeError::View(e)
    }
}

type Inspection = Box<dyn FnOnce(&RankStack) -> Box<dyn Any + Send> + Send>;

enum Command {
    ValidateLocal,
    ValidateGlobal,
    Recognize(Rank),
    Revoke,
    StartBroadcast {
        key: u64,
        header: Bytes,
        spec: PlanSpec,
        payloads: Vec<Bytes>,
    },
    WaitOutputs {
        task: TaskId,
        outputs: OutputSet,
        deadline: Option<WallInstant>,
    },
    Release(TaskId),
    Send {
        to: Rank,
        tag: u64,
        bytes: Bytes,
    },
    Inspect(Inspection),
    Copies,
    SetAllocator(Box<dyn Allocate>),
    Shutdown {
        linger: StdDuration,
    },
}

enum Outcome {
    Local(Counts),
    Global(GlobalValidation),
    Done,
    Outputs(Vec<(u32, Bytes)>),
    Inspected(Box<dyn Any + Send>),
    Copies(Copies),
    ShutDown,
    Failed(RuntimeError),
}

type SharedState = Shared<Command, Outcome, ViewSnapshot>;

/// A rank's stack on its own progress thread: see the [module docs](self). `Send` and
/// `Sync`: share it (by reference or in an `Arc`) between any number of threads.
pub struct Runtime {
    shared: Arc<SharedState>,
    events: Arc<EventQueue>,
    /// Payload bytes a binding copied at its boundary ([`Runtime::count_api_copies`]).
    api_copied: AtomicU64,
    thread: Option<JoinHandle<()>>,
    /// Ends the progress thread's idle wait when a command is submitted.
    waker: Option<Arc<dyn Wake>>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
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
                    let shared = Arc::new(Shared::new(ViewSnapshot::of(engine.stack(), 0)));
                    let _ = ready_tx.send(Ok((Arc::clone(&shared), engine.waker())));
                    let why = progress(engine, &shared, &progress_events);
                    progress_events.close(why.clone());
                    shared.close(why);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| RuntimeError::Stopped(format!("cannot start the thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((shared, waker))) => Ok(Runtime {
                shared,
                events,
                api_copied: AtomicU64::new(0),
                thread: Some(thread),
                waker,
            }),
            Ok(Err(e)) => Err(RuntimeError::Stopped(e)),
            Err(_) => Err(RuntimeError::Stopped(
                "the thread panicked while starting".into(),
            )),
        }
    }

    /// The failure view as last published (cheap: no network, no waiting on it).
    pub fn view(&self) -> Arc<ViewSnapshot> {
        self.shared.snapshot().1
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
    /// with [`StackError::Send`]
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
    /// (as if the process died); does not wait. Calls pending or made later fail with
    /// [`RuntimeError::Stopped`].
    pub fn halt(&self) {
        let _ = self.submit(Command::Shutdown {
            linger: StdDuration::ZERO,
        });
    }

    /// Keeps serving peers for `linger`, then ends the progress thread and waits for it.
    pub fn shutdown(mut self, linger: StdDuration) -> Result<(), RuntimeError> {
        let result = self.call(Command::Shutdown { linger }).map(|_| ());
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .map_err(|_| RuntimeError::Stopped("the progress thread panicked".into()))?;
        }
        result
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            // Already ended (halted, failed) or asked to end now: either way it ends.
            let _ = self.submit(Command::Shutdown {
                linger: StdDuration::ZERO,
            });
            let _ = thread.join();
        }
    }
}

/// One wait for outputs.
struct OutputWait {
    ticket: Ticket,
    task: TaskId,
    outputs: OutputSet,
    deadline: Option<WallInstant>,
}

/// Commands waiting for an event.
#[derive(Default)]
struct Waiting {
    /// Global validations, by epoch.
    global: Vec<(Ticket, u32)>,
    /// Outputs, by task.
    outputs: Vec<OutputWait>,
    /// Outputs released so far, by task (until the application releases the task).
    released: HashMap<TaskId, OutputSet>,
    /// Broadcasts that cannot complete here, and why (until released).
    failed: HashMap<TaskId, RuntimeError>,
    /// The last global validation epoch finished here.
    epoch: u32,
}

/// What the events already told the application, so each fact is told once.
struct Told {
    /// Ranks reported by [`Event::RankFailed`].
    failed: RankSet,
    /// `G` as of the last [`Event::Validated`].
    agreed: RankSet,
}

impl Told {
    fn new(n: u32) -> Self {
        Told {
            failed: RankSet::new(n),
            agreed: RankSet::new(n),
        }
    }

    /// [`Event::RankFailed`] for `rank`, the first time.
    fn rank_failed(&mut self, rank: Rank, out: &mut Vec<Event>) {
        if self.failed.insert(rank) {
            out.push(Event::RankFailed { rank });
        }
    }
}

/// The progress loop; returns why it ended.
fn progress<E: Engine>(mut engine: E, shared: &SharedState, events: &EventQueue) -> Stopped {
    let mut waiting = Waiting::default();
    let mut told = Told::new(engine.stack().node().view().size());
    let mut learned: Vec<Event> = Vec::new();
    loop {
        let commands = shared.take_commands();
        let idle = commands.is_empty();
        for (ticket, command) in commands {
            match run_command(&mut engine, shared, &mut waiting, ticket, command) {
                Ok(None) => {}
                Ok(Some(linger)) => {
                    let result = if linger.is_zero() {
                        Ok(())
                    } else {
                        engine.linger(linger)
                    };
                    shared.complete(ticket, Outcome::ShutDown);
                    return Stopped::Ended(match result {
                        Ok(()) => "shut down".into(),
                        Err(e) => format!("backend error while lingering: {e}"),
                    });
                }
                Err(e) => return Stopped::Ended(format!("backend error: {e}")),
            }
        }
        let busy = match engine.pump() {
            Ok(busy) => busy,
            Err(e) => return Stopped::Ended(format!("backend error: {e}")),
        };
        let mut view_changed = false;
        while let Some(event) = engine.next_event() {
            match event {
                StackEvent::Node(NodeEvent::GlobalValidated { epoch: e, counts }) => {
                    // Published before the waiters return, so they see their G in it.
                    waiting.epoch = waiting.epoch.max(e);
                    shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
                    let result = GlobalValidation {
                        epoch: e,
                        counts,
                        agreed: engine.stack().node().view().global().clone(),
                    };
                    for rank in result.agreed.iter() {
                        told.rank_failed(rank, &mut learned);
                    }
                    let mut new = result.agreed.clone();
                    new.difference_with(&told.agreed);
                    told.agreed = result.agreed.clone();
                    learned.push(Event::Validated {
                        epoch: e,
                        failed: result.agreed.clone(),
                        new,
                    });
                    waiting.global.retain(|&(ticket, wanted)| {
                        let done = wanted <= e;
                        if done {
                            shared.complete(ticket, Outcome::Global(result.clone()));
                        }
                        !done
                    });
                }
                StackEvent::Node(NodeEvent::DeclaredDeadSelf { by }) => {
                    return Stopped::DeclaredDead { by };
                }
                StackEvent::Node(NodeEvent::SelfExcluded { epoch }) => {
                    return Stopped::Excluded { epoch };
                }
                StackEvent::Node(event) => {
                    match event {
                        NodeEvent::Suspected { rank } | NodeEvent::Learned { rank, .. } => {
                            told.rank_failed(rank, &mut learned);
                        }
                        NodeEvent::Revoked { by } => learned.push(Event::Revoked { by }),
                        _ => {}
                    }
                    view_changed = true;
                }
                StackEvent::Bcast(BcastEvent::Arrived {
                    task,
                    tree,
                    outputs,
                    header,
                }) => learned.push(Event::Arrived {
                    task,
                    header,
                    tree,
                    outputs,
                }),
                StackEvent::Bcast(BcastEvent::Released { task, outputs, .. }) => {
                    let released = waiting.released.entry(task).or_default();
                    for output in outputs.difference(released).iter() {
                        learned.push(Event::OutputReady { task, output });
                    }
                    released.union_with(&outputs);
                }
                StackEvent::Bcast(BcastEvent::Abandoned { task }) => {
                    if let Entry::Vacant(slot) = waiting.failed.entry(task) {
                        slot.insert(RuntimeError::Abandoned { task });
                        learned.push(Event::Abandoned { task });
                    }
                }
                StackEvent::Bcast(BcastEvent::Failed { task, error }) => {
                    if let Entry::Vacant(slot) = waiting.failed.entry(task) {
                        slot.insert(RuntimeError::BroadcastFailed {
                            task,
                            error: error.clone(),
                        });
                        learned.push(Event::Failed { task, error });
                    }
                }
                StackEvent::Message(Message { from, tag, bytes }) => {
                    learned.push(Event::Message { from, tag, bytes });
                }
                _ => {}
            }
        }
        if !learned.is_empty() {
            events.push_all(learned.drain(..));
        }
        serve_outputs(&engine, shared, &mut waiting);
        if view_changed {
            shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
        }
        if idle && !busy {
            if let Err(e) = engine.wait_idle() {
                return Stopped::Ended(format!("backend error: {e}"));
            }
        }
    }
}

/// Runs `f` on the stack through the engine; its result.
fn on_stack<E: Engine, R>(
    engine: &mut E,
    mut f: impl FnMut(&mut RankStack, Instant) -> R,
) -> Result<R, E::Error> {
    let mut result = None;
    engine.command(&mut |stack, now| result = Some(f(stack, now)))?;
    Ok(result.expect("the engine runs every command"))
}

/// Runs one command; `Some(linger)` asks the loop to shut down.
fn run_command<E: Engine>(
    engine: &mut E,
    shared: &SharedState,
    waiting: &mut Waiting,
    ticket: Ticket,
    command: Command,
) -> Result<Option<StdDuration>, E::Error> {
    let publish = |engine: &E, waiting: &Waiting| {
        shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
    };
    let outcome = match command {
        Command::ValidateLocal => match on_stack(engine, |stack, now| stack.validate_local(now))? {
            Ok(counts) => {
                publish(engine, waiting);
                Outcome::Local(counts)
            }
            Err(e) => Outcome::Failed(e.into()),
        },
        Command::ValidateGlobal => {
            match on_stack(engine, |stack, now| stack.validate_global(now))? {
                Ok(epoch) | Err(StackError::Node(NodeError::ValidationRunning { epoch })) => {
                    waiting.global.push((ticket, epoch));
                    return Ok(None);
                }
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::Recognize(rank) => match on_stack(engine, |stack, _| stack.recognize(rank))? {
            Ok(()) => {
                publish(engine, waiting);
                Outcome::Done
            }
            Err(e) => Outcome::Failed(e.into()),
        },
        Command::Revoke => match on_stack(engine, |stack, now| stack.revoke(now))? {
            Ok(()) => {
                publish(engine, waiting);
                Outcome::Done
            }
            Err(e) => Outcome::Failed(e.into()),
        },
        Command::StartBroadcast {
            key,
            header,
            spec,
            payloads,
        } => {
            let mut args = Some((header, spec, payloads));
            let result = on_stack(engine, |stack, now| {
                let (header, spec, payloads) = args.take().expect("the engine runs a command once");
                stack.start_broadcast(now, key, header, spec, payloads)
            })?;
            match result {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::WaitOutputs {
            task,
            outputs,
            deadline,
        } => {
            waiting.outputs.push(OutputWait {
                ticket,
                task,
                outputs,
                deadline,
            });
            serve_outputs(engine, shared, waiting);
            return Ok(None);
        }
        Command::Send { to, tag, bytes } => {
            let mut bytes = Some(bytes);
            let result = on_stack(engine, |stack, _| {
                let bytes = bytes.take().expect("the engine runs a command once");
                stack.send(to, tag, bytes)
            })?;
            match result {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::SetAllocator(hook) => {
            let mut hook = Some(hook);
            on_stack(engine, |stack, now| {
                let hook = hook.take().expect("the engine runs a command once");
                stack.set_allocator(now, hook);
            })?;
            Outcome::Done
        }
        Command::Release(task) => {
            on_stack(engine, |stack, _| stack.release(task))?;
            waiting.released.remove(&task);
            waiting.failed.remove(&task);
            waiting.outputs.retain(|wait| {
                let released = wait.task == task;
                if released {
                    shared.complete(
                        wait.ticket,
                        Outcome::Failed(RuntimeError::Released { task }),
                    );
                }
                !released
            });
            Outcome::Done
        }
        Command::Inspect(f) => Outcome::Inspected(f(engine.stack())),
        Command::Copies => Outcome::Copies(Copies::of(
            engine.stack().bcast_stats(),
            engine.driver_stats(),
            0,
        )),
        Command::Shutdown { linger } => return Ok(Some(linger)),
    };
    shared.complete(ticket, outcome);
    Ok(None)
}

/// Completes every output wait whose outputs are all released (each the buffer the
/// broadcaster holds, shared: no copy), whose
/// broadcast failed here, or whose deadline passed.
fn serve_outputs<E: Engine>(engine: &E, shared: &SharedState, waiting: &mut Waiting) {
    if waiting.outputs.is_empty() {
        return;
    }
    let now = WallInstant::now();
    let (released, failed) = (&waiting.released, &waiting.failed);
    waiting.outputs.retain(|wait| {
        let task = wait.task;
        let outcome = if released
            .get(&task)
            .is_some_and(|r| wait.outputs.is_subset(r))
        {
            let bcast = engine.stack().broadcaster();
            let data = wait
                .outputs
                .iter()
                .map(|j| {
                    let bytes = bcast.and_then(|b| b.output_bytes(task, j));
                    (j, bytes.cloned().unwrap_or_default())
                })
                .collect();
            Outcome::Outputs(data)
        } else if let Some(error) = failed.get(&task) {
            Outcome::Failed(error.clone())
        } else if wait.deadline.is_some_and(|d| now >= d) {
            Outcome::Failed(RuntimeError::TimedOut { task })
        } else {
            return true;
        };
        shared.complete(wait.ticket, outcome);
        false
    });
}
