//! [`Mailbox`]: a handle's events as the solver takes them, the messages that came
//! early kept until they are asked for (see the [halo module docs](super)).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use ft::ft_bcast::Bytes;
use ft::ft_core::SendError;
use ft::{Event, Rank, Runtime, RuntimeError, StackError};

use super::{HaloError, Kind, Tag};
use crate::strip::Side;

/// The handle a rank works through: the one it started with, or one shrunk from it
/// (shared: a recovery keeps the group of the last checkpoint open beside the one it
/// works in). Cloning it is cheap.
#[derive(Clone)]
pub enum Handle<'h> {
    /// The handle the rank was started with.
    Started(&'h Runtime),
    /// A handle of a group derived from it (shrunk, split off, rebuilt).
    Derived(Arc<Runtime>),
}

impl std::ops::Deref for Handle<'_> {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        match self {
            Handle::Started(h) => h,
            Handle::Derived(h) => h,
        }
    }
}

/// A handle's messages, as the solver takes them: see the [module docs](super).
pub struct Mailbox<'h> {
    handle: Handle<'h>,
    early: HashMap<(Rank, u64), Bytes>,
    failed: Vec<Rank>,
    /// Events the solver does not act on (validations, broadcasts), for the recovery.
    others: VecDeque<Event>,
    deadline: Instant,
    dropped: u64,
}

impl<'h> Mailbox<'h> {
    /// The mailbox of `handle`, whose waits give up at `deadline`.
    pub fn new(handle: &'h Runtime, deadline: Instant) -> Self {
        Mailbox::over(Handle::Started(handle), deadline)
    }

    /// The mailbox of a handle shared with others (a derived group's).
    pub fn shared(handle: Arc<Runtime>, deadline: Instant) -> Self {
        Mailbox::over(Handle::Derived(handle), deadline)
    }

    fn over(handle: Handle<'h>, deadline: Instant) -> Self {
        Mailbox {
            handle,
            early: HashMap::new(),
            failed: Vec::new(),
            others: VecDeque::new(),
            deadline,
            dropped: 0,
        }
    }

    /// The handle.
    pub fn handle(&self) -> &Runtime {
        &self.handle
    }

    /// The handle, to keep beside the mailbox.
    pub fn shared_handle(&self) -> Handle<'h> {
        self.handle.clone()
    }

    /// This rank's number in the handle's group.
    pub fn me(&self) -> Rank {
        self.handle.view().rank()
    }

    /// Goes on over `shrunk`, a handle shrunk from this one's: a new numbering, so the
    /// messages kept and the failures reported so far are dropped.
    pub fn switch_to(&mut self, shrunk: Arc<Runtime>) {
        self.handle = Handle::Derived(shrunk);
        self.dropped += self.early.len() as u64;
        self.early.clear();
        self.failed.clear();
        self.others.clear();
    }

    /// Every rank reported failed on this handle so far, in the order reported.
    pub fn failed(&self) -> &[Rank] {
        &self.failed
    }

    /// The events taken while waiting that were neither messages nor failures
    /// (validations, broadcast events), oldest first; each is handed out once.
    pub fn take_others(&mut self) -> Vec<Event> {
        self.others.drain(..).collect()
    }

    /// Messages dropped so far: not ours, or repeated.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The tag of a message of `kind`, for `iteration` and the receiver's `side`.
    pub fn tag(&self, kind: Kind, iteration: u32, side: Side) -> Tag {
        Tag {
            kind,
            iteration,
            side,
        }
    }

    /// Sends `bytes` to `to` under `tag`.
    pub fn send(&self, to: Rank, tag: Tag, bytes: impl Into<Bytes>) -> Result<(), HaloError> {
        match self.handle.send(to, tag.encode(), bytes) {
            Ok(()) => Ok(()),
            Err(RuntimeError::Stack(StackError::Send(SendError::DeadRank(r)))) => {
                Err(HaloError::NeighbourFailed(r))
            }
            Err(e) => Err(HaloError::Runtime(e)),
        }
    }

    /// The first message of `kind` from any rank, waiting for one if
    /// none has come yet; failures end the wait as in [`Mailbox::receive`] (as
    /// [`HaloError::PeerFailed`]).
    pub fn receive_any(&mut self, kind: Kind) -> Result<(Rank, Tag, Bytes), HaloError> {
        let early = self
            .early
            .keys()
            .copied()
            .find(|&(_, raw)| Tag::decode(raw).is_some_and(|t| t.kind == kind));
        if let Some(key) = early {
            let bytes = self.early.remove(&key).expect("a key just found");
            return Ok((key.0, Tag::decode(key.1).expect("kept tags decode"), bytes));
        }
        loop {
            let (from, raw, bytes) = self.next(None, self.tag(kind, 0, Side::Above), &[])?;
            match Tag::decode(raw) {
                Some(tag) if tag.kind == kind => return Ok((from, tag, bytes)),
                _ => self.keep(from, raw, bytes),
            }
        }
    }

    /// The message `from` sent under `tag`, waiting for it if it has not come yet.
    /// A failure of `from` or of a rank in `neighbours` is a
    /// [`HaloError::NeighbourFailed`]; of any other rank, a [`HaloError::PeerFailed`].
    pub fn receive(
        &mut self,
        from: Rank,
        tag: Tag,
        neighbours: &[Rank],
    ) -> Result<Bytes, HaloError> {
        let want = (from, tag.encode());
        if let Some(bytes) = self.early.remove(&want) {
            return Ok(bytes);
        }
        loop {
            let (f, t, bytes) = self.next(Some(from), tag, neighbours)?;
            if (f, t) == want {
                return Ok(bytes);
            }
            self.keep(f, t, bytes);
        }
    }

    /// The next message of the handle's events; a failure or revocation first ends the
    /// wait. `from` (if one sender is awaited) and `tag` say what the wait is for.
    fn next(
        &mut self,
        from: Option<Rank>,
        tag: Tag,
        neighbours: &[Rank],
    ) -> Result<(Rank, u64, Bytes), HaloError> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            let event = self
                .handle
                .next_event(Some(left))
                .map_err(HaloError::Runtime)?;
            match event {
                None => return Err(HaloError::TimedOut { from, tag }),
                Some(Event::Message { from, tag, bytes }) => return Ok((from, tag, bytes)),
                Some(Event::RankFailed { rank }) => {
                    self.failed.push(rank);
                    return Err(if from == Some(rank) || neighbours.contains(&rank) {
                        HaloError::NeighbourFailed(rank)
                    } else {
                        HaloError::PeerFailed(rank)
                    });
                }
                Some(Event::Revoked { by }) => return Err(HaloError::Revoked { by }),
                Some(Event::Overflowed { dropped }) => return Err(HaloError::Overflowed(dropped)),
                // Validations and broadcast events are the recovery's business.
                Some(other) => self.others.push_back(other),
            }
        }
    }

    /// Keeps a message that came before it was asked for, unless it is not ours or
    /// one with its tag is kept already.
    fn keep(&mut self, from: Rank, raw: u64, bytes: Bytes) {
        if Tag::decode(raw).is_some() && !self.early.contains_key(&(from, raw)) {
            self.early.insert((from, raw), bytes);
        } else {
            self.dropped += 1;
        }
    }
}
