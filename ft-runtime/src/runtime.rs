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
//! (after `validate_global` returns, [`Runtime::view`] shows its `G`).
//!
//! The thread ends on [`Runtime::shutdown`] (after serving its peers for the given
//! time), on a backend error, or when the rank learns it was declared dead (fail-stop);
//! then every waiting command fails with the reason ([`RuntimeError::Stopped`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration as StdDuration;

use ft_bcast::{BcastEvent, OutputSet, PlanSpec, RankStack, StackEvent};
use ft_core::node::NodeEvent;
use ft_core::{Counts, Instant, RankSet};

use crate::shared::{Shared, Stopped, Ticket};
use crate::transport::Wake;

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
}

/// The failure view as the progress thread last published it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSnapshot {
    /// `L_i`: the ranks this rank validated as failed.
    pub local: RankSet,
    /// News not validated yet (`validate_local` folds it into `L_i`).
    pub pending: RankSet,
    /// `G`: the agreed failed set of the last global validation.
    pub global: RankSet,
    /// The number of global validations finished here.
    pub epoch: u32,
}

impl ViewSnapshot {
    /// Before the engine exists: nothing known, in a communicator of no ranks.
    fn unknown() -> Self {
        ViewSnapshot {
            local: RankSet::new(0),
            pending: RankSet::new(0),
            global: RankSet::new(0),
            epoch: 0,
        }
    }

    fn of(stack: &RankStack, epoch: u32) -> Self {
        let view = stack.node().view();
        ViewSnapshot {
            local: view.local(),
            pending: view.pending().clone(),
            global: view.global().clone(),
            epoch,
        }
    }
}

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The stack refused the command (e.g. a global validation already running); the
    /// text is the stack's error.
    Refused(String),
    /// The progress thread has ended (backend error, declared dead, shut down).
    Stopped(String),
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Refused(why) => write!(f, "command refused: {why}"),
            RuntimeError::Stopped(why) => write!(f, "the progress thread has stopped: {why}"),
        }
    }
}

impl std::error::Error for RuntimeError {}

impl From<Stopped> for RuntimeError {
    fn from(e: Stopped) -> Self {
        RuntimeError::Stopped(e.0)
    }
}

enum Command {
    ValidateLocal,
    ValidateGlobal,
    StartBroadcast {
        task: u32,
        spec: PlanSpec,
        payloads: Vec<Vec<u8>>,
    },
    WaitOutputs {
        task: u32,
        outputs: OutputSet,
    },
    Shutdown {
        linger: StdDuration,
    },
}

enum Outcome {
    Local(Counts),
    Global { epoch: u32, agreed: RankSet },
    Started,
    Outputs(Vec<(u32, Vec<u8>)>),
    ShutDown,
    Refused(String),
}

type SharedState = Shared<Command, Outcome, ViewSnapshot>;

/// A rank's stack on its own progress thread: see the [module docs](self).
pub struct Runtime {
    shared: Arc<SharedState>,
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

impl Runtime {
    /// Starts the progress thread; `make` builds the engine on it. If `make` fails, the
    /// error is returned here.
    pub fn spawn<E, F>(make: F) -> Result<Runtime, RuntimeError>
    where
        E: Engine,
        F: FnOnce() -> Result<E, String> + Send + 'static,
    {
        let shared: Arc<SharedState> = Arc::new(Shared::new(ViewSnapshot::unknown()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ft-progress".into())
                .spawn(move || match make() {
                    Ok(engine) => {
                        shared.publish(ViewSnapshot::of(engine.stack(), 0));
                        let _ = ready_tx.send(Ok(engine.waker()));
                        let why = progress(engine, &shared);
                        shared.close(why);
                    }
                    Err(e) => {
                        shared.close(e.clone());
                        let _ = ready_tx.send(Err(e));
                    }
                })
                .map_err(|e| RuntimeError::Stopped(format!("cannot start the thread: {e}")))?
        };
        match ready_rx.recv() {
            Ok(Ok(waker)) => Ok(Runtime {
                shared,
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
            Outcome::Refused(why) => Err(RuntimeError::Refused(why)),
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

    /// `validate_local`: folds the detector's news into `L_i`; `|L_i|` and how many were
    /// new.
    pub fn validate_local(&self) -> Result<Counts, RuntimeError> {
        match self.call(Command::ValidateLocal)? {
            Outcome::Local(counts) => Ok(counts),
            _ => unreachable!("validate_local completes with counts"),
        }
    }

    /// `validate_global`, collective over the survivors: blocks until they agree;
    /// returns the epoch and the agreed `G`.
    pub fn validate_global(&self) -> Result<(u32, RankSet), RuntimeError> {
        match self.call(Command::ValidateGlobal)? {
            Outcome::Global { epoch, agreed } => Ok((epoch, agreed)),
            _ => unreachable!("validate_global completes with G"),
        }
    }

    /// Starts broadcast `task` at this rank, the root of `spec` (`payloads[j]` is output
    /// `j`'s bytes); returns once it is started.
    pub fn start_broadcast(
        &self,
        task: u32,
        spec: PlanSpec,
        payloads: Vec<Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        match self.call(Command::StartBroadcast {
            task,
            spec,
            payloads,
        })? {
            Outcome::Started => Ok(()),
            _ => unreachable!("start_broadcast completes with Started"),
        }
    }

    /// Blocks until this rank holds `outputs` of broadcast `task`; returns a copy of
    /// each, by output index.
    pub fn wait_outputs(
        &self,
        task: u32,
        outputs: OutputSet,
    ) -> Result<Vec<(u32, Vec<u8>)>, RuntimeError> {
        match self.call(Command::WaitOutputs { task, outputs })? {
            Outcome::Outputs(data) => Ok(data),
            _ => unreachable!("wait_outputs completes with the outputs"),
        }
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
            if self
                .submit(Command::Shutdown {
                    linger: StdDuration::ZERO,
                })
                .is_ok()
            {
                let _ = thread.join();
            }
        }
    }
}

/// Commands waiting for an event.
#[derive(Default)]
struct Waiting {
    /// Global validations, by epoch.
    global: Vec<(Ticket, u32)>,
    /// Outputs, by task.
    outputs: Vec<(Ticket, u32, OutputSet)>,
    /// Outputs released so far, by task.
    released: HashMap<u32, OutputSet>,
    /// The last global validation epoch finished here.
    epoch: u32,
}

/// The progress loop; returns why it ended.
fn progress<E: Engine>(mut engine: E, shared: &SharedState) -> String {
    let mut waiting = Waiting::default();
    loop {
        let commands = shared.take_commands();
        let idle = commands.is_empty();
        for (ticket, command) in commands {
            match run_command(&mut engine, shared, &mut waiting, ticket, command) {
                Ok(None) => {}
                Ok(Some(linger)) => {
                    let result = engine.linger(linger);
                    shared.complete(ticket, Outcome::ShutDown);
                    return match result {
                        Ok(()) => "shut down".into(),
                        Err(e) => format!("backend error while lingering: {e}"),
                    };
                }
                Err(e) => return format!("backend error: {e}"),
            }
        }
        let busy = match engine.pump() {
            Ok(busy) => busy,
            Err(e) => return format!("backend error: {e}"),
        };
        let mut view_changed = false;
        while let Some(event) = engine.next_event() {
            match event {
                StackEvent::Node(NodeEvent::GlobalValidated { epoch: e, .. }) => {
                    // Published before the waiters return, so they see their G in it.
                    waiting.epoch = waiting.epoch.max(e);
                    shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
                    let agreed = engine.stack().node().view().global().clone();
                    waiting.global.retain(|&(ticket, wanted)| {
                        let done = wanted <= e;
                        if done {
                            shared.complete(
                                ticket,
                                Outcome::Global {
                                    epoch: e,
                                    agreed: agreed.clone(),
                                },
                            );
                        }
                        !done
                    });
                }
                StackEvent::Node(NodeEvent::DeclaredDeadSelf { by }) => {
                    return format!("declared dead by rank {by} (fail-stop)");
                }
                StackEvent::Node(NodeEvent::SelfExcluded { epoch }) => {
                    return format!("excluded by global validation {epoch} (fail-stop)");
                }
                StackEvent::Node(_) => view_changed = true,
                StackEvent::Bcast(BcastEvent::Released { task, outputs, .. }) => {
                    waiting
                        .released
                        .entry(task)
                        .or_default()
                        .union_with(&outputs);
                    serve_outputs(&engine, shared, &mut waiting);
                }
                _ => {}
            }
        }
        if view_changed {
            shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
        }
        if idle && !busy {
            if let Err(e) = engine.wait_idle() {
                return format!("backend error: {e}");
            }
        }
    }
}

/// Runs one command; `Some(linger)` asks the loop to shut down.
fn run_command<E: Engine>(
    engine: &mut E,
    shared: &SharedState,
    waiting: &mut Waiting,
    ticket: Ticket,
    command: Command,
) -> Result<Option<StdDuration>, E::Error> {
    match command {
        Command::ValidateLocal => {
            let mut result = None;
            engine.command(&mut |stack, now| result = Some(stack.validate_local(now)))?;
            let outcome = match result.expect("the command ran") {
                Ok(counts) => {
                    shared.publish(ViewSnapshot::of(engine.stack(), waiting.epoch));
                    Outcome::Local(counts)
                }
                Err(e) => Outcome::Refused(e.to_string()),
            };
            shared.complete(ticket, outcome);
        }
        Command::ValidateGlobal => {
            let mut result = None;
            engine.command(&mut |stack, now| result = Some(stack.validate_global(now)))?;
            match result.expect("the command ran") {
                Ok(epoch) => waiting.global.push((ticket, epoch)),
                Err(e) => shared.complete(ticket, Outcome::Refused(e.to_string())),
            }
        }
        Command::StartBroadcast {
            task,
            spec,
            payloads,
        } => {
            let mut args = Some((spec, payloads));
            let mut result = None;
            engine.command(&mut |stack, now| {
                if let Some((spec, payloads)) = args.take() {
                    result = Some(stack.start_broadcast(now, task, spec, payloads));
                }
            })?;
            let outcome = match result.expect("the command ran") {
                Ok(()) => Outcome::Started,
                Err(e) => Outcome::Refused(e.to_string()),
            };
            shared.complete(ticket, outcome);
        }
        Command::WaitOutputs { task, outputs } => {
            waiting.outputs.push((ticket, task, outputs));
            serve_outputs(engine, shared, waiting);
        }
        Command::Shutdown { linger } => return Ok(Some(linger)),
    }
    Ok(None)
}

/// Completes every output wait whose outputs are all released.
fn serve_outputs<E: Engine>(engine: &E, shared: &SharedState, waiting: &mut Waiting) {
    let released = &waiting.released;
    waiting.outputs.retain(|(ticket, task, outputs)| {
        let held = released.get(task).is_some_and(|r| outputs.is_subset(r));
        if held {
            let bcast = engine.stack().broadcaster();
            let data = outputs
                .iter()
                .map(|j| {
                    let bytes = bcast.and_then(|b| b.output(*task, j)).unwrap_or_default();
                    (j, bytes.to_vec())
                })
                .collect();
            shared.complete(*ticket, Outcome::Outputs(data));
        }
        !held
    });
}
