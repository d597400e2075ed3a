//! The progress thread's side of a [`Runtime`](super::Runtime): the commands
//! application threads queue, the outcomes they wait for, and the loop that runs them
//! on the rank's groups, pumps the engine and turns each group's stack events into its
//! handle's completed waits, published views and [`Event`]s.
//!
//! Invariants: a handle is open for exactly as long as its group is (a closing handle
//! removes its group when its linger ends); every ticket is completed once, or failed
//! by the close; a handle's published view changes only on the progress thread, after
//! the stack event that changed it, and before any wait it completes returns.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use ft_bcast::{
    Allocate, BcastEvent, OutputSet, PlanSpec, RankStack, StackError, StackEvent, TaskId,
};
use ft_core::messages::Message;
use ft_core::node::{NodeError, NodeEvent};
use ft_core::{Counts, Instant, Rank, RankSet};

use crate::copies::Copies;
use crate::events::{Event, EventQueue, DEFAULT_EVENT_CAPACITY};
use crate::groups::{Admission, GroupEvent, GroupId, Groups, Rebuilt};
use crate::shared::{Shared, Stopped, Ticket};
use crate::transport::Bytes;

use super::{Engine, GlobalValidation, RuntimeError, ViewSnapshot};

pub(super) type Inspection = Box<dyn FnOnce(&RankStack) -> Box<dyn Any + Send> + Send>;

pub(super) enum Command {
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
    StorePut {
        key: u64,
        version: u64,
        bytes: Bytes,
    },
    StoreFlush(u64),
    StoreDecide(u64),
    StoreRebase,
    Shrink,
    /// Splits the group's last ranks off as spares.
    SplitSpares(u32),
    /// Rebuilds the group from its spares after its last agreed `G`.
    Rebuild,
    /// Takes the handle of the group this rank, a spare, was admitted into.
    TakeAdmitted(GroupId),
    /// Closes this handle's group after serving its peers for `linger`; the last
    /// handle's ends the thread.
    Shutdown {
        linger: StdDuration,
    },
    /// Ends the thread now, every handle of it (as if the process died).
    Halt,
}

pub(super) enum Outcome {
    Local(Counts),
    Global(GlobalValidation),
    Done,
    Outputs(Vec<(u32, Bytes)>),
    Inspected(Box<dyn Any + Send>),
    Copies(Copies),
    Committed(bool),
    /// A new handle (shrink, split, rebuild, admission); `None` at a spare or for an
    /// admission not (or no longer) held.
    Opened(Option<Box<Opened>>),
    /// The handle is closed; `ended`: the progress thread has ended too.
    ShutDown {
        ended: bool,
    },
    Failed(RuntimeError),
}

/// What a new handle of the progress thread is made of.
pub(super) struct Opened {
    pub(super) group: GroupId,
    pub(super) shared: Arc<SharedState>,
    pub(super) events: Arc<EventQueue>,
}

pub(super) type SharedState = Shared<Command, Outcome, ViewSnapshot>;

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
    /// Store flushes, by version.
    flushes: Vec<(Ticket, u64)>,
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

/// What the progress thread keeps for one handle (one group).
pub(super) struct Handle {
    shared: Arc<SharedState>,
    events: Arc<EventQueue>,
    waiting: Waiting,
    told: Told,
    /// A shutdown in progress: the group closes at the deadline, and the ticket
    /// completes then.
    closing: Option<(WallInstant, Ticket)>,
}

impl Handle {
    pub(super) fn new(
        stack: &RankStack,
        shared: Arc<SharedState>,
        events: Arc<EventQueue>,
    ) -> Self {
        Handle {
            shared,
            events,
            waiting: Waiting::default(),
            told: Told::new(stack.node().view().size()),
            closing: None,
        }
    }

    /// Publishes the group's view as of now.
    fn publish(&self, stack: &RankStack) {
        self.shared
            .publish(ViewSnapshot::of(stack, self.waiting.epoch));
    }

    /// Closes the handle for good, with `why`.
    fn close(&self, why: Stopped) {
        self.events.close(why.clone());
        self.shared.close(why);
    }
}

/// What one command asks of the loop beyond its outcome.
enum Flow {
    Continue,
    /// Close the handle after serving its peers for this long.
    Close(StdDuration),
    /// End the thread now.
    Halt,
    /// A group was opened (or, `None`, not for this rank): make its handle, queue
    /// `initial` on it, and complete the ticket with it.
    Opened {
        id: Option<GroupId>,
        initial: Vec<Event>,
    },
}

/// The progress loop over every handle of the rank (`first`, and those shrunk from
/// it); it ends when the last handle closes, on a backend error or when the rank is
/// declared dead (every handle then closes with the reason).
pub(super) fn progress<E: Engine>(mut engine: E, first: Handle) {
    let mut handles: Vec<Option<Handle>> = vec![Some(first)];
    let why = turns(&mut engine, &mut handles);
    for handle in handles.iter().flatten() {
        handle.close(why.clone());
    }
}

/// The loop's turns; returns why it ended (see [`progress`]).
fn turns<E: Engine>(engine: &mut E, handles: &mut Vec<Option<Handle>>) -> Stopped {
    let mut learned: Vec<Event> = Vec::new();
    // Handles of groups this rank was admitted into, until the application takes them.
    let mut admitted: HashMap<GroupId, Box<Opened>> = HashMap::new();
    loop {
        let mut idle = true;
        for group in 0..handles.len() {
            let Some(handle) = handles[group].as_mut() else {
                continue;
            };
            let commands = handle.shared.take_commands();
            idle &= commands.is_empty();
            for (ticket, command) in commands {
                let handle = handles[group].as_mut().expect("open while it has commands");
                let flow = match run_command(engine, group, handle, ticket, command, &mut admitted)
                {
                    Ok(flow) => flow,
                    Err(e) => return Stopped::Ended(format!("backend error: {e}")),
                };
                match flow {
                    Flow::Continue => {}
                    Flow::Halt => return Stopped::Ended("halted".into()),
                    Flow::Close(linger) => {
                        let open = handles.iter().flatten().count();
                        let handle = handles[group].as_mut().expect("open");
                        if open > 1 {
                            handle.closing = Some((WallInstant::now() + linger, ticket));
                            continue;
                        }
                        let result = if linger.is_zero() {
                            Ok(())
                        } else {
                            engine.linger(linger)
                        };
                        handle
                            .shared
                            .complete(ticket, Outcome::ShutDown { ended: true });
                        return Stopped::Ended(match result {
                            Ok(()) => "shut down".into(),
                            Err(e) => format!("backend error while lingering: {e}"),
                        });
                    }
                    Flow::Opened { id, initial } => {
                        let opened = id.map(|id| open_handle(engine, handles, id, initial));
                        handles[group]
                            .as_ref()
                            .expect("open")
                            .shared
                            .complete(ticket, Outcome::Opened(opened));
                    }
                }
            }
        }
        let busy = match engine.pump() {
            Ok(busy) => busy,
            Err(e) => return Stopped::Ended(format!("backend error: {e}")),
        };
        let mut changed = vec![false; handles.len()];
        while let Some(GroupEvent { group, event, .. }) = engine.next_event() {
            match event {
                StackEvent::Node(NodeEvent::DeclaredDeadSelf { by }) => {
                    return Stopped::DeclaredDead { by };
                }
                StackEvent::Node(NodeEvent::SelfExcluded { epoch }) => {
                    return Stopped::Excluded { epoch };
                }
                _ => {}
            }
            if let StackEvent::Control(message) = event {
                if let Some((id, opened)) = admit(engine, handles, group, &message) {
                    admitted.insert(id, opened);
                }
                continue;
            }
            let (Some(Some(handle)), Some(stack)) = (handles.get_mut(group), engine.stack(group))
            else {
                continue;
            };
            if changed.len() <= group {
                changed.resize(group + 1, false);
            }
            changed[group] |= take_event(handle, stack, event, &mut learned);
            if !learned.is_empty() {
                handle.events.push_all(learned.drain(..));
            }
        }
        let now = WallInstant::now();
        for (group, slot) in handles.iter_mut().enumerate() {
            let Some(handle) = slot.as_mut() else {
                continue;
            };
            let Some(stack) = engine.stack(group) else {
                continue;
            };
            serve_outputs(stack, handle);
            serve_flushes(stack, &handle.shared, &mut handle.waiting);
            if changed.get(group).copied().unwrap_or(false) {
                handle.publish(stack);
            }
            if let Some((deadline, ticket)) = handle.closing.filter(|(d, _)| *d <= now) {
                let _ = deadline;
                engine.remove(group);
                let handle = slot.take().expect("open");
                handle
                    .shared
                    .complete(ticket, Outcome::ShutDown { ended: false });
                handle.close(Stopped::Ended("this handle was shut down".into()));
                idle = false;
            }
        }
        if idle && !busy {
            if let Err(e) = engine.wait_idle() {
                return Stopped::Ended(format!("backend error: {e}"));
            }
        }
    }
}

/// What one event of a group's stack tells its handle: the waits it completes, and
/// the application's [`Event`]s (into `learned`); whether the published view must be
/// renewed.
fn take_event(
    handle: &mut Handle,
    stack: &RankStack,
    event: StackEvent,
    learned: &mut Vec<Event>,
) -> bool {
    let Handle {
        shared,
        waiting,
        told,
        ..
    } = handle;
    match event {
        StackEvent::Node(NodeEvent::GlobalValidated { epoch: e, counts }) => {
            // Published before the waiters return, so they see their G in it.
            waiting.epoch = waiting.epoch.max(e);
            shared.publish(ViewSnapshot::of(stack, waiting.epoch));
            let result = GlobalValidation {
                epoch: e,
                counts,
                agreed: stack.node().view().global().clone(),
            };
            for rank in result.agreed.iter() {
                told.rank_failed(rank, learned);
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
            false
        }
        StackEvent::Node(event) => {
            match event {
                NodeEvent::Suspected { rank } | NodeEvent::Learned { rank, .. } => {
                    told.rank_failed(rank, learned);
                }
                NodeEvent::Revoked { by } => learned.push(Event::Revoked { by }),
                _ => {}
            }
            true
        }
        StackEvent::Bcast(BcastEvent::Arrived {
            task,
            tree,
            outputs,
            header,
        }) => {
            learned.push(Event::Arrived {
                task,
                header,
                tree,
                outputs,
            });
            false
        }
        StackEvent::Bcast(BcastEvent::Released { task, outputs, .. }) => {
            let released = waiting.released.entry(task).or_default();
            for output in outputs.difference(released).iter() {
                learned.push(Event::OutputReady { task, output });
            }
            released.union_with(&outputs);
            false
        }
        StackEvent::Bcast(BcastEvent::Abandoned { task }) => {
            if let Entry::Vacant(slot) = waiting.failed.entry(task) {
                slot.insert(RuntimeError::Abandoned { task });
                learned.push(Event::Abandoned { task });
            }
            false
        }
        StackEvent::Bcast(BcastEvent::Failed { task, error }) => {
            if let Entry::Vacant(slot) = waiting.failed.entry(task) {
                slot.insert(RuntimeError::BroadcastFailed {
                    task,
                    error: error.clone(),
                });
                learned.push(Event::Failed { task, error });
            }
            false
        }
        StackEvent::Message(Message { from, tag, bytes }) => {
            learned.push(Event::Message { from, tag, bytes });
            false
        }
        _ => false,
    }
}

/// Runs `f` on group `group`'s stack through the engine; its result. A handle's group
/// is open for as long as the handle is, so its commands always run.
fn on_stack<E: Engine, R>(
    engine: &mut E,
    group: GroupId,
    mut f: impl FnMut(&mut RankStack, Instant) -> R,
) -> Result<R, E::Error> {
    let mut result = None;
    engine.command(group, &mut |stack, now| result = Some(f(stack, now)))?;
    Ok(result.expect("the engine runs every command"))
}

/// Runs one command of group `group`'s handle; what else it asks of the loop.
fn run_command<E: Engine>(
    engine: &mut E,
    group: GroupId,
    handle: &mut Handle,
    ticket: Ticket,
    command: Command,
    admitted: &mut HashMap<GroupId, Box<Opened>>,
) -> Result<Flow, E::Error> {
    let Handle {
        shared, waiting, ..
    } = handle;
    let shared: &SharedState = shared;
    let publish = |engine: &E, waiting: &Waiting| {
        if let Some(stack) = engine.stack(group) {
            shared.publish(ViewSnapshot::of(stack, waiting.epoch));
        }
    };
    let outcome = match command {
        Command::ValidateLocal => {
            match on_stack(engine, group, |stack, now| stack.validate_local(now))? {
                Ok(counts) => {
                    publish(engine, waiting);
                    Outcome::Local(counts)
                }
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::ValidateGlobal => {
            match on_stack(engine, group, |stack, now| stack.validate_global(now))? {
                Ok(epoch) | Err(StackError::Node(NodeError::ValidationRunning { epoch })) => {
                    waiting.global.push((ticket, epoch));
                    return Ok(Flow::Continue);
                }
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::Recognize(rank) => {
            match on_stack(engine, group, |stack, _| stack.recognize(rank))? {
                Ok(()) => {
                    publish(engine, waiting);
                    Outcome::Done
                }
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::Revoke => match on_stack(engine, group, |stack, now| stack.revoke(now))? {
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
            let result = on_stack(engine, group, |stack, now| {
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
            if let Some(stack) = engine.stack(group) {
                serve_outputs(stack, handle);
            }
            return Ok(Flow::Continue);
        }
        Command::Send { to, tag, bytes } => {
            let mut bytes = Some(bytes);
            let result = on_stack(engine, group, |stack, _| {
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
            on_stack(engine, group, |stack, now| {
                let hook = hook.take().expect("the engine runs a command once");
                stack.set_allocator(now, hook);
            })?;
            Outcome::Done
        }
        Command::Release(task) => {
            on_stack(engine, group, |stack, _| stack.release(task))?;
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
        Command::Inspect(f) => {
            Outcome::Inspected(f(engine.stack(group).expect("a handle's group is open")))
        }
        Command::Copies => Outcome::Copies(Copies::of(
            engine
                .stack(group)
                .map(RankStack::bcast_stats)
                .unwrap_or_default(),
            engine.driver_stats(),
            0,
        )),
        Command::StorePut {
            key,
            version,
            bytes,
        } => {
            let mut bytes = Some(bytes);
            let result = on_stack(engine, group, |stack, _| {
                let bytes = bytes.take().expect("the engine runs a command once");
                stack.store_put(key, version, bytes)
            })?;
            match result {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Failed(e.into()),
            }
        }
        Command::StoreFlush(version) => {
            waiting.flushes.push((ticket, version));
            if let Some(stack) = engine.stack(group) {
                serve_flushes(stack, shared, waiting);
            }
            return Ok(Flow::Continue);
        }
        Command::StoreDecide(version) => {
            Outcome::Committed(on_stack(engine, group, |stack, _| {
                stack.store_decide(version)
            })?)
        }
        Command::StoreRebase => {
            on_stack(engine, group, |stack, _| stack.store_rebase())?;
            Outcome::Done
        }
        Command::Shrink => match derive(engine, |g, now| g.shrink(group, now))? {
            Ok(id) => {
                return Ok(Flow::Opened {
                    id: Some(id),
                    initial: Vec::new(),
                })
            }
            Err(e) => Outcome::Failed(RuntimeError::Group(e)),
        },
        Command::SplitSpares(spares) => {
            match derive(engine, |g, now| g.split_spares(group, spares, now))? {
                Ok(id) => {
                    return Ok(Flow::Opened {
                        id,
                        initial: Vec::new(),
                    })
                }
                Err(e) => Outcome::Failed(RuntimeError::Group(e)),
            }
        }
        Command::Rebuild => match derive(engine, |g, now| g.rebuild(group, now))? {
            Ok(Rebuilt {
                group: id,
                admission,
                replaced,
            }) => {
                // Every survivor tells every spare it takes, over the group every rank
                // started in (a dead spare's copy is dropped).
                let bytes = Bytes::from(admission.encode());
                for &(rank, _) in &replaced {
                    let spare = admission.ranks[rank as usize];
                    engine.command(0, &mut |stack, _| {
                        let _ = stack.send_control(spare, bytes.clone());
                    })?;
                }
                let initial = replaced
                    .into_iter()
                    .map(|(rank, generation)| Event::Replaced { rank, generation })
                    .collect();
                return Ok(Flow::Opened {
                    id: Some(id),
                    initial,
                });
            }
            Err(e) => Outcome::Failed(RuntimeError::Group(e)),
        },
        Command::TakeAdmitted(id) => Outcome::Opened(admitted.remove(&id)),
        Command::Shutdown { linger } => return Ok(Flow::Close(linger)),
        Command::Halt => return Ok(Flow::Halt),
    };
    shared.complete(ticket, outcome);
    Ok(Flow::Continue)
}

/// Completes every store flush whose puts are all acknowledged (or cannot be).
fn serve_flushes(stack: &RankStack, shared: &SharedState, waiting: &mut Waiting) {
    waiting.flushes.retain(|&(ticket, version)| {
        let done = stack.store_flushed(version);
        if done {
            shared.complete(ticket, Outcome::Done);
        }
        !done
    });
}

/// Completes every output wait whose outputs are all released (each the buffer the
/// broadcaster holds, shared: no copy), whose
/// broadcast failed here, or whose deadline passed.
fn serve_outputs(stack: &RankStack, handle: &mut Handle) {
    let Handle {
        shared, waiting, ..
    } = handle;
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
            let bcast = stack.broadcaster();
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

/// Runs `f` on the rank's groups through the engine; its result.
fn derive<E: Engine, R>(
    engine: &mut E,
    mut f: impl FnMut(&mut Groups, ft_core::Instant) -> R,
) -> Result<R, E::Error> {
    let mut result = None;
    engine.on_groups(&mut |groups, now| result = Some(f(groups, now)))?;
    Ok(result.expect("the engine runs every command"))
}

/// Makes the handle of just-opened group `id`, `initial` its first events.
fn open_handle<E: Engine>(
    engine: &E,
    handles: &mut Vec<Option<Handle>>,
    id: GroupId,
    initial: Vec<Event>,
) -> Box<Opened> {
    let stack = engine.stack(id).expect("just opened");
    let opened = Opened {
        group: id,
        shared: Arc::new(Shared::new(ViewSnapshot::of(stack, 0))),
        events: Arc::new(EventQueue::new(DEFAULT_EVENT_CAPACITY)),
    };
    if !initial.is_empty() {
        opened.events.push_all(initial);
    }
    let handle = Handle::new(
        stack,
        Arc::clone(&opened.shared),
        Arc::clone(&opened.events),
    );
    if handles.len() <= id {
        handles.resize_with(id + 1, || None);
    }
    handles[id] = Some(handle);
    Box::new(opened)
}

/// A control message that reached group `from`: an [`Admission`] into a rebuilt group
/// joins it (once: every survivor sends it), and tells `from`'s handle with an
/// [`Event::Admitted`]; the new handle, to be taken. Anything else a peer sent there is
/// dropped.
fn admit<E: Engine>(
    engine: &mut E,
    handles: &mut Vec<Option<Handle>>,
    from: GroupId,
    message: &Message,
) -> Option<(GroupId, Box<Opened>)> {
    let size = engine.stack(0).map_or(0, |s| s.node().view().size());
    let admission = Admission::decode(&message.bytes, size).ok()?;
    let id = derive(engine, |g, now| g.join(from, &admission, now))
        .ok()?
        .ok()??;
    let stack = engine.stack(id)?;
    let (rank, generation) = (stack.node().view().rank(), 0);
    let generation = admission
        .generations
        .get(rank as usize)
        .copied()
        .unwrap_or(generation);
    let event = Event::Admitted {
        group: id,
        rank,
        generation,
    };
    let opened = open_handle(engine, handles, id, vec![event.clone()]);
    if let Some(Some(handle)) = handles.get(from) {
        handle.events.push_all(std::iter::once(event));
    }
    Some((id, opened))
}
