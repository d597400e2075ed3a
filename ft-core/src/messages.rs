//! [`Messenger`]: the application's own messages between the ranks of a communicator,
//! over the same transport as the library's protocols and aware of its failures: what a
//! task runtime sends besides broadcasts (control traffic), or an SPMD code's halos.
//!
//! A message is `(tag, bytes)` from one rank to another. It travels as `Message`
//! frames, one per fragment of at most the configured fragment length: its sequence
//! number (per sender and destination), its tag, its total length, the fragment's
//! offset, then the fragment (its length, its bytes) last, so a fragment goes out as a
//! shared slice of the sender's buffer ([`Messenger::poll_transmit_parts`]) and a
//! transport that receives a payload in place puts it straight into the message's one
//! buffer ([`Messenger::place_frame`], a [`Landing`]).
//!
//! Invariants:
//! - **order**: messages from one sender are delivered in the order it sent them,
//!   whatever order the transport delivers frames in: a message is delivered when it
//!   is complete and every earlier one from that sender was delivered;
//! - **failures**: a send to a rank this rank knows dead is refused
//!   ([`SendError::DeadRank`]); once a rank is known dead ([`Messenger::on_rank_failed`])
//!   nothing more from it is delivered (what it had sent but was not delivered yet is
//!   dropped) and nothing more is sent to it;
//! - **copies**: a message of one fragment is kept as a slice of the frame it came in
//!   when the transport hands frames over; a message of several fragments is received
//!   into one buffer when the transport places payloads (nothing is joined), and joined
//!   by a copy otherwise ([`MessageStats`] counts both);
//! - **memory**: peer input never makes this rank hold more than
//!   [`MessengerConfig::max_message_bytes`] per message nor
//!   [`MessengerConfig::max_pending_bytes`] of undelivered messages; frames past those
//!   limits are refused with a [`FrameError`] and change nothing.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::fmt;

use crate::error::{BufferTooShort, FrameError};
use crate::landing::{Filled, Landing, Slot};
use crate::machine::{slice_of_frame, Bytes, TransmitParts};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::wire::{FrameKind, Header, Reader, Sink, Writer, MAX_CHUNK};

/// A messenger's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessengerConfig {
    /// Communicator id carried by every frame.
    pub comm: u32,
    /// Communicator size.
    pub n: u32,
    /// This rank.
    pub me: Rank,
    /// The longest fragment this rank sends (positive): the transport's chunk.
    pub fragment_bytes: usize,
    /// The longest message this rank sends or accepts.
    pub max_message_bytes: u64,
    /// The most bytes of messages received but not delivered yet (incomplete, or
    /// waiting for an earlier one from their sender) this rank holds.
    pub max_pending_bytes: u64,
}

impl MessengerConfig {
    /// Rank `me` of communicator `comm` of `n` ranks: fragments of [`MAX_CHUNK`],
    /// messages up to 1 GiB, 4 GiB pending.
    pub fn new(comm: u32, n: u32, me: Rank) -> Self {
        MessengerConfig {
            comm,
            n,
            me,
            fragment_bytes: MAX_CHUNK,
            max_message_bytes: 1 << 30,
            max_pending_bytes: 1 << 32,
        }
    }
}

/// A message delivered to this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The sending rank.
    pub from: Rank,
    /// The sender's tag.
    pub tag: u64,
    /// The message (a slice of the frame it came in, or its one buffer).
    pub bytes: Bytes,
}

/// A send was refused; nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// The destination is not a rank of the communicator.
    RankOutOfRange {
        /// The destination.
        rank: Rank,
        /// The communicator size.
        n: u32,
    },
    /// The destination is known dead.
    DeadRank(Rank),
    /// The tag is one the library reserves for its own messages (the store's).
    ReservedTag(u64),
    /// The message is longer than [`MessengerConfig::max_message_bytes`].
    TooLarge {
        /// Its length.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::RankOutOfRange { rank, n } => {
                write!(f, "rank {rank} is out of range for {n} ranks")
            }
            SendError::DeadRank(rank) => write!(f, "rank {rank} is known dead"),
            SendError::ReservedTag(tag) => {
                write!(f, "tag {tag:#x} is reserved for the library's own messages")
            }
            SendError::TooLarge { bytes, limit } => {
                write!(f, "a message of {bytes} bytes, over the limit of {limit}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SendError {}

/// What a messenger sent and received, and what it copied of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageStats {
    /// Messages delivered.
    pub delivered: u64,
    /// Bytes of the fragments sent.
    pub bytes_sent: u64,
    /// Of those, bytes written into a caller's buffer (`poll_transmit`).
    pub bytes_sent_copied: u64,
    /// Bytes received and kept.
    pub bytes_received: u64,
    /// Of those, bytes copied: out of a lent frame, or to join fragments.
    pub bytes_received_copied: u64,
}

/// A fragment to send: `bytes[offset..offset + len]` of message `seq` to `to`.
#[derive(Debug)]
struct Outgoing {
    to: Rank,
    seq: u64,
    tag: u64,
    bytes: Bytes,
    offset: usize,
}

/// A message being received from one sender: its fragments so far.
#[derive(Debug)]
struct Incoming {
    tag: u64,
    total: u64,
    /// Fragments by offset.
    pieces: BTreeMap<u64, Bytes>,
    received: u64,
    /// The message's one buffer, once a fragment was placed in it.
    landing: Option<Landing>,
}

impl Incoming {
    fn complete(&self) -> bool {
        self.received == self.total
    }

    /// The whole message: the landing buffer itself when every fragment landed in it,
    /// else a join (a copy, returned as the second value).
    fn assemble(self) -> (Bytes, u64) {
        if self.pieces.len() == 1 {
            let (_, whole) = self.pieces.into_iter().next().expect("one piece");
            return (whole, 0);
        }
        if let Some(whole) = self
            .landing
            .as_ref()
            .and_then(|l| l.join(self.pieces.iter().map(|(&at, b)| (at, b))))
        {
            return (whole, 0);
        }
        let mut joined = Vec::with_capacity(self.total as usize);
        for piece in self.pieces.values() {
            joined.extend_from_slice(piece);
        }
        (Bytes::from(joined), self.total)
    }
}

/// One sender's messages to this rank: the next sequence number to deliver and those
/// received but not delivered.
#[derive(Debug, Default)]
struct FromPeer {
    next: u64,
    pending: BTreeMap<u64, Incoming>,
}

/// A decoded fragment's fields, its bytes aside.
struct Fragment {
    seq: u64,
    tag: u64,
    total: u64,
    offset: u64,
}

/// One rank's messages: see the [module docs](self).
#[derive(Debug)]
pub struct Messenger {
    cfg: MessengerConfig,
    dead: RankSet,
    /// The next sequence number to each destination.
    next_seq: BTreeMap<Rank, u64>,
    peers: BTreeMap<Rank, FromPeer>,
    pending_bytes: u64,
    out: VecDeque<Outgoing>,
    delivered: VecDeque<Message>,
    stats: MessageStats,
}

impl Messenger {
    /// The messenger of rank `cfg.me`.
    ///
    /// # Panics
    /// If `cfg.me >= cfg.n` or `cfg.fragment_bytes` is 0.
    pub fn new(cfg: MessengerConfig) -> Self {
        assert!(
            cfg.me < cfg.n,
            "rank {} out of range for {} ranks",
            cfg.me,
            cfg.n
        );
        assert!(cfg.fragment_bytes > 0, "fragments of 0 bytes");
        Messenger {
            cfg,
            dead: RankSet::new(cfg.n),
            next_seq: BTreeMap::new(),
            peers: BTreeMap::new(),
            pending_bytes: 0,
            out: VecDeque::new(),
            delivered: VecDeque::new(),
            stats: MessageStats::default(),
        }
    }

    /// Sets the longest fragment sent from now on (a transport's chunk).
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_fragment_bytes(&mut self, bytes: usize) {
        assert!(bytes > 0, "fragments of 0 bytes");
        self.cfg.fragment_bytes = bytes;
    }

    /// What was sent, received and copied so far.
    pub fn stats(&self) -> MessageStats {
        self.stats
    }

    /// Queues `bytes` for rank `to` under `tag` (handed over once: every fragment sent
    /// is a slice of it). A message to this rank itself is delivered at once.
    pub fn send(&mut self, to: Rank, tag: u64, bytes: Bytes) -> Result<(), SendError> {
        let n = self.cfg.n;
        if to >= n {
            return Err(SendError::RankOutOfRange { rank: to, n });
        }
        if self.dead.contains(to) {
            return Err(SendError::DeadRank(to));
        }
        if bytes.len() as u64 > self.cfg.max_message_bytes {
            return Err(SendError::TooLarge {
                bytes: bytes.len() as u64,
                limit: self.cfg.max_message_bytes,
            });
        }
        if to == self.cfg.me {
            self.stats.delivered += 1;
            self.delivered.push_back(Message {
                from: to,
                tag,
                bytes,
            });
            return Ok(());
        }
        let seq = self.next_seq.entry(to).or_insert(0);
        self.out.push_back(Outgoing {
            to,
            seq: *seq,
            tag,
            bytes,
            offset: 0,
        });
        *seq += 1;
        Ok(())
    }

    /// Rank `rank` is dead: nothing more goes to it, and nothing more from it is
    /// delivered (its undelivered messages are dropped).
    pub fn on_rank_failed(&mut self, rank: Rank) {
        if rank >= self.cfg.n || !self.dead.insert(rank) {
            return;
        }
        self.out.retain(|o| o.to != rank);
        if let Some(peer) = self.peers.remove(&rank) {
            let held: u64 = peer.pending.values().map(|m| m.received).sum();
            self.pending_bytes -= held;
        }
    }

    /// The next message delivered to this rank.
    pub fn poll_message(&mut self) -> Option<Message> {
        self.delivered.pop_front()
    }

    /// Whether there is a fragment to send.
    pub fn wants_to_send(&self) -> bool {
        !self.out.is_empty()
    }

    /// The next fragment: its head written into `buf` and its bytes as the payload if
    /// `split`, else written after the head (a copy, counted).
    pub fn poll_transmit_parts(
        &mut self,
        buf: &mut [u8],
        split: bool,
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        let Some(o) = self.out.front() else {
            return Ok(None);
        };
        let len = (o.bytes.len() - o.offset).min(self.cfg.fragment_bytes);
        let piece = o.bytes.slice(o.offset..o.offset + len);
        let header = Header {
            kind: FrameKind::Message,
            comm: self.cfg.comm,
            epoch: 0,
            sender: self.cfg.me,
        };
        let mut w = header.write_into(buf);
        put_fields(&mut w, o.seq, o.tag, o.bytes.len() as u64, o.offset as u64);
        let payload = if split && !piece.is_empty() {
            w.put_varint(len as u64);
            Some(piece)
        } else {
            w.put_bytes(&piece);
            self.stats.bytes_sent_copied += len as u64;
            None
        };
        let head = w.finish()?;
        let to = o.to;
        self.stats.bytes_sent += len as u64;
        let o = self.out.front_mut().expect("looked at above");
        o.offset += len;
        if o.offset >= o.bytes.len() {
            self.out.pop_front();
        }
        Ok(Some(TransmitParts {
            to,
            head,
            payload,
            promise: None,
        }))
    }

    /// Feeds a `Message` frame whose header `h` was decoded and checked; `r` reads what
    /// follows it, and a fragment is kept as a slice of `frame` (no copy) when `r`
    /// reads it.
    pub fn handle_frame(
        &mut self,
        h: &Header,
        mut r: Reader<'_>,
        frame: Option<&Bytes>,
    ) -> Result<(), FrameError> {
        self.check_sender(h)?;
        let fragment = read_fields(&mut r)?;
        let piece = r.bytes()?;
        r.finish()?;
        let kept = frame.and_then(|f| slice_of_frame(f, piece));
        self.check_fragment(h.sender, &fragment, piece.len() as u64)?;
        let copied = if kept.is_none() {
            piece.len() as u64
        } else {
            0
        };
        let bytes = kept.unwrap_or_else(|| Bytes::copy_from_slice(piece));
        self.stats.bytes_received_copied += copied;
        self.add(h.sender, fragment, bytes);
        Ok(())
    }

    /// Where the `len` payload bytes of the `Message` frame whose head `h`, `r` is
    /// should be received: a slot of the message's one buffer for a fragment of a
    /// message of several, else `None` (the transport's own buffer).
    pub fn place_frame(&mut self, h: &Header, mut r: Reader<'_>, len: usize) -> Option<Slot> {
        self.check_sender(h).ok()?;
        let fragment = read_fields(&mut r).ok()?;
        let announced = r.varint().ok()?;
        r.finish().ok()?;
        if announced != len as u64 || len == 0 || len as u64 >= fragment.total {
            return None;
        }
        self.check_fragment(h.sender, &fragment, len as u64).ok()?;
        let total = usize::try_from(fragment.total).ok()?;
        let incoming = self.incoming(h.sender, &fragment);
        let landing = incoming.landing.get_or_insert_with(|| Landing::new(total));
        landing.claim(usize::try_from(fragment.offset).ok()?, len)
    }

    /// A `Message` frame whose payload was received into a slot
    /// [`Messenger::place_frame`] gave.
    pub fn handle_frame_placed(
        &mut self,
        h: &Header,
        mut r: Reader<'_>,
        payload: Filled,
    ) -> Result<(), FrameError> {
        self.check_sender(h)?;
        let fragment = read_fields(&mut r)?;
        let len = r.varint()?;
        r.finish()?;
        if len != payload.len() as u64 {
            return Err(FrameError::Malformed(
                "placed payload differs from its announced length",
            ));
        }
        self.check_fragment(h.sender, &fragment, len)?;
        self.add(h.sender, fragment, payload.into_bytes());
        Ok(())
    }

    /// A slot [`Messenger::place_frame`] gave came back unfilled.
    pub fn slot_lost(&mut self, slot: Slot) -> bool {
        let landing = self
            .peers
            .values_mut()
            .flat_map(|p| p.pending.values_mut())
            .filter_map(|m| m.landing.as_mut())
            .find(|l| l.holds(&slot));
        match landing {
            Some(l) => {
                l.unclaim(slot);
                true
            }
            None => false,
        }
    }

    /// Whether `slot` is one of this messenger's.
    pub fn holds(&self, slot: &Slot) -> bool {
        self.peers
            .values()
            .flat_map(|p| p.pending.values())
            .filter_map(|m| m.landing.as_ref())
            .any(|l| l.holds(slot))
    }

    fn check_sender(&self, h: &Header) -> Result<(), FrameError> {
        if h.kind != FrameKind::Message {
            return Err(FrameError::UnexpectedKind(h.kind as u8));
        }
        if self.dead.contains(h.sender) {
            return Err(FrameError::FromFailedRank(h.sender));
        }
        if h.sender == self.cfg.me {
            return Err(FrameError::Malformed("frame from self"));
        }
        Ok(())
    }

    /// Checks a fragment of `len` bytes from `from` against the limits and what this
    /// rank holds of its message, before anything changes.
    fn check_fragment(&self, from: Rank, f: &Fragment, len: u64) -> Result<(), FrameError> {
        if f.total > self.cfg.max_message_bytes {
            return Err(FrameError::Malformed("message over the size limit"));
        }
        let in_place = f.offset < f.total || (f.offset == 0 && f.total == 0);
        if !in_place || len > f.total - f.offset || (len == 0 && f.total != 0) {
            return Err(FrameError::Malformed("message fragment out of place"));
        }
        let peer = self.peers.get(&from);
        if f.seq < peer.map_or(0, |p| p.next) {
            return Ok(()); // delivered already: a duplicate, dropped in `add`
        }
        if let Some(m) = peer.and_then(|p| p.pending.get(&f.seq)) {
            if m.total != f.total || m.tag != f.tag {
                return Err(FrameError::Malformed(
                    "message fragment disagrees with its message",
                ));
            }
            if m.pieces.contains_key(&f.offset) {
                return Ok(()); // a duplicate fragment
            }
        }
        if self.pending_bytes + len > self.cfg.max_pending_bytes {
            return Err(FrameError::Malformed(
                "more undelivered messages than the limit",
            ));
        }
        Ok(())
    }

    /// The message a fragment belongs to, made if need be.
    fn incoming(&mut self, from: Rank, f: &Fragment) -> &mut Incoming {
        let peer = self.peers.entry(from).or_default();
        peer.pending.entry(f.seq).or_insert_with(|| Incoming {
            tag: f.tag,
            total: f.total,
            pieces: BTreeMap::new(),
            received: 0,
            landing: None,
        })
    }

    /// Adds a checked fragment, then delivers what is complete and in order.
    fn add(&mut self, from: Rank, f: Fragment, bytes: Bytes) {
        if f.seq < self.peers.get(&from).map_or(0, |p| p.next) {
            return;
        }
        let len = bytes.len() as u64;
        let offset = f.offset;
        let incoming = self.incoming(from, &f);
        if incoming.pieces.contains_key(&offset) {
            return;
        }
        incoming.pieces.insert(offset, bytes);
        incoming.received += len;
        self.pending_bytes += len;
        self.stats.bytes_received += len;
        let peer = self.peers.get_mut(&from).expect("made above");
        while peer.pending.get(&peer.next).is_some_and(Incoming::complete) {
            let m = peer.pending.remove(&peer.next).expect("looked at");
            peer.next += 1;
            self.pending_bytes -= m.received;
            let tag = m.tag;
            let (bytes, copied) = m.assemble();
            self.stats.bytes_received_copied += copied;
            self.stats.delivered += 1;
            self.delivered.push_back(Message { from, tag, bytes });
        }
    }
}

fn put_fields<S: Sink>(w: &mut Writer<S>, seq: u64, tag: u64, total: u64, offset: u64) {
    w.put_varint(seq)
        .put_varint(tag)
        .put_varint(total)
        .put_varint(offset);
}

fn read_fields(r: &mut Reader<'_>) -> Result<Fragment, FrameError> {
    Ok(Fragment {
        seq: r.varint()?,
        tag: r.varint()?,
        total: r.varint()?,
        offset: r.varint()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix;
    use crate::wire::Context;
    use alloc::vec;

    fn messenger(n: u32, me: Rank, fragment: usize) -> Messenger {
        let mut cfg = MessengerConfig::new(7, n, me);
        cfg.fragment_bytes = fragment;
        cfg.max_message_bytes = 1 << 20;
        cfg.max_pending_bytes = 4 << 20;
        Messenger::new(cfg)
    }

    /// Every frame `m` has queued, as a network carries them (head and payload joined),
    /// split or contiguous at random.
    fn frames(m: &mut Messenger, rng: &mut SplitMix) -> Vec<(Rank, Vec<u8>)> {
        let mut buf = vec![0u8; 4096];
        let mut out = Vec::new();
        while let Some(t) = m.poll_transmit_parts(&mut buf, rng.chance(1, 2)).unwrap() {
            let mut frame = buf[..t.head].to_vec();
            frame.extend_from_slice(t.payload.as_deref().unwrap_or_default());
            out.push((t.to, frame));
        }
        out
    }

    fn deliver(m: &mut Messenger, from: Rank, frame: &[u8], owned: bool) -> Result<(), FrameError> {
        let ctx = Context {
            comm: 7,
            n: m.cfg.n,
        };
        let (h, r) = Header::decode(frame, ctx, from)?;
        if owned {
            let frame = Bytes::copy_from_slice(frame);
            let (h, r) = Header::decode(&frame, ctx, from)?;
            return m.handle_frame(&h, r, Some(&frame));
        }
        m.handle_frame(&h, r, None)
    }

    fn message(k: usize) -> Vec<u8> {
        let len = [0, 1, 100, 1000, 2500][k % 5];
        (0..len).map(|i| (i * 7 + k) as u8).collect()
    }

    #[test]
    fn messages_arrive_whole_and_in_order_whatever_the_frame_order() {
        for seed in 0..50 {
            let mut rng = SplitMix::new(seed);
            let (mut a, mut b) = (messenger(3, 0, 1000), messenger(3, 1, 1000));
            let mut c = messenger(3, 2, 700);
            for k in 0..20 {
                a.send(1, k as u64, message(k).into()).unwrap();
                c.send(1, 100 + k as u64, message(k + 1).into()).unwrap();
            }
            let mut wire: Vec<(Rank, Vec<u8>)> = frames(&mut a, &mut rng)
                .into_iter()
                .map(|(_, f)| (0, f))
                .chain(frames(&mut c, &mut rng).into_iter().map(|(_, f)| (2, f)))
                .collect();
            // Reordered, and some frames twice.
            for k in (1..wire.len()).rev() {
                wire.swap(k, rng.below(k as u64 + 1) as usize);
            }
            let again = wire[..wire.len() / 4].to_vec();
            for (from, frame) in wire.iter().chain(&again) {
                deliver(&mut b, *from, frame, rng.chance(1, 2)).unwrap();
            }
            let mut next = [0u64, 0, 0];
            while let Some(m) = b.poll_message() {
                let k = next[m.from as usize] as usize;
                next[m.from as usize] += 1;
                let (tag, bytes) = if m.from == 0 {
                    (k as u64, message(k))
                } else {
                    (100 + k as u64, message(k + 1))
                };
                assert_eq!((m.tag, &m.bytes[..]), (tag, &bytes[..]), "seed {seed}");
            }
            assert_eq!(next, [20, 0, 20], "seed {seed}: each message once");
        }
    }

    #[test]
    fn a_dead_rank_is_refused_and_nothing_more_of_it_is_delivered() {
        let mut rng = SplitMix::new(1);
        let (mut a, mut b) = (messenger(3, 0, 1000), messenger(3, 1, 1000));
        a.send(1, 1, message(3).into()).unwrap();
        a.send(1, 2, message(4).into()).unwrap();
        let wire = frames(&mut a, &mut rng);
        // The first fragment of the second message arrives, then rank 0 is found dead.
        deliver(&mut b, 0, &wire[0].1, false).unwrap();
        deliver(&mut b, 0, &wire[1].1, false).unwrap();
        b.on_rank_failed(0);
        for (_, frame) in &wire[2..] {
            assert_eq!(
                deliver(&mut b, 0, frame, false),
                Err(FrameError::FromFailedRank(0))
            );
        }
        assert_eq!(b.poll_message().map(|m| m.tag), Some(1));
        assert_eq!(
            b.poll_message(),
            None,
            "the half-received message is dropped"
        );
        assert_eq!(b.pending_bytes, 0);
        assert_eq!(b.send(0, 3, Bytes::new()), Err(SendError::DeadRank(0)));
        assert_eq!(
            b.send(3, 3, Bytes::new()),
            Err(SendError::RankOutOfRange { rank: 3, n: 3 })
        );
        // Queued fragments to a rank that dies are not sent.
        a.send(1, 9, message(4).into()).unwrap();
        a.on_rank_failed(1);
        assert!(frames(&mut a, &mut rng).is_empty());
    }

    #[test]
    fn bad_fragments_are_refused_and_change_nothing() {
        let mut b = messenger(2, 1, 1000);
        let frame = |seq: u64, total: u64, offset: u64, piece: &[u8]| {
            let mut w = Header {
                kind: FrameKind::Message,
                comm: 7,
                epoch: 0,
                sender: 0,
            }
            .start();
            put_fields(&mut w, seq, 5, total, offset);
            w.put_bytes(piece);
            w.finish()
        };
        for (total, offset, len) in [(10, 10, 1), (10, 5, 6), (10, 0, 0), (2 << 20, 0, 4)] {
            let bad = frame(0, total, offset, &vec![1; len]);
            assert!(
                deliver(&mut b, 0, &bad, false).is_err(),
                "{total} {offset} {len}"
            );
        }
        assert!(b.peers.is_empty() && b.pending_bytes == 0);
        // A fragment disagreeing with its message's first one.
        deliver(&mut b, 0, &frame(0, 10, 0, &[1; 4]), false).unwrap();
        assert!(deliver(&mut b, 0, &frame(0, 11, 4, &[1; 6]), false).is_err());
        deliver(&mut b, 0, &frame(0, 10, 4, &[2; 6]), false).unwrap();
        let m = b.poll_message().expect("complete");
        assert_eq!(&m.bytes[..], &[1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert_eq!(
            b.stats().bytes_received_copied,
            10 + 10,
            "lent, then joined"
        );
    }

    #[test]
    fn one_fragment_of_an_owned_frame_is_kept_without_a_copy() {
        let mut rng = SplitMix::new(2);
        let (mut a, mut b) = (messenger(2, 0, 4000), messenger(2, 1, 4000));
        a.send(1, 3, message(4).into()).unwrap();
        let wire = frames(&mut a, &mut rng);
        deliver(&mut b, 0, &wire[0].1, true).unwrap();
        assert_eq!(b.poll_message().map(|m| m.bytes.len()), Some(2500));
        assert_eq!(b.stats().bytes_received_copied, 0);
    }
}
