//! The one frame codec every protocol of the library uses.
//!
//! A frame is a fixed header followed by a kind-specific payload:
//!
//! ```text
//! offset 0  u8     format version (= VERSION)
//! offset 1  u8     kind (FrameKind)
//! offset 2  u32le  communicator id
//! offset 6  u32le  epoch (meaning set by the kind: validation epoch, broadcast id, ...)
//! offset 10 u32le  sender rank
//! offset 14 ...    payload, built with Writer and read with Reader
//! ```
//!
//! Frames are written in place: `poll_transmit` starts one with [`Header::write_into`]
//! on the caller's buffer and appends the payload with [`Writer`]; nothing is
//! allocated, and a frame that does not fit comes back as [`BufferTooShort`] with the
//! size it needs (the machine keeps it queued). [`Header::start`] writes into a `Vec`
//! instead, for tests, fuzzing and frames kept for later.
//!
//! Payload fields are LEB128 varints, little-endian fixed integers, byte strings with a
//! varint length, and rank sets. A rank set is written in whichever form is smaller:
//! `0x00, count, first, gap-1, gap-1, ...` (varints, strictly increasing members) or
//! `0x01` followed by `ceil(n/8)` bytes of bits, least significant bit first, with every
//! bit at or past `n` zero.
//!
//! Decoding never panics: every malformed, truncated, out-of-range or foreign frame comes
//! back as a [`FrameError`]. Every reader call checks `rank < n`.

use alloc::vec::Vec;

use crate::error::{BufferTooShort, FrameError};
use crate::rank::Rank;
use crate::rankset::{Members, RankSet};

/// The frame format version this build writes and accepts.
pub const VERSION: u8 = 1;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 14;
/// The default data chunk: broadcast payloads are split into chunks of a configured size
/// (`ft_bcast::Config::chunk_bytes`), this one unless a transport prefers another.
pub const MAX_CHUNK: usize = 64 * 1024;

/// A transmit buffer size that every frame of a communicator of `n` ranks fits when data
/// chunks are at most [`MAX_CHUNK`] bytes: a header, two rank sets, a chunk of data and
/// small fields. A shorter buffer is not a bug: `poll_transmit` then returns
/// [`BufferTooShort`] for a frame that does not fit and keeps it queued.
pub const fn frame_capacity(n: u32) -> usize {
    HEADER_LEN + 2 * (8 + (n as usize).div_ceil(8)) + MAX_CHUNK + 256
}

/// [`frame_capacity`] when data chunks are at most `chunk` bytes: every frame of the
/// library fits it (control frames are bounded by [`frame_capacity`] whatever the
/// chunk), so a receiver whose buffers are this long never truncates one.
pub const fn frame_capacity_for(n: u32, chunk: usize) -> usize {
    frame_capacity(n) + chunk.saturating_sub(MAX_CHUNK)
}

/// Every frame kind of every protocol, in one registry so decoding can reject unknown ones.
///
/// Ranges: 1..=15 failure detector and communicator control, 16..=31 agreement
/// (`validate_global`), 32..=47 broadcast activation protocol, 48..=63 the
/// application's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum FrameKind {
    /// Detector: "I am alive", sent to the observer every period.
    Heartbeat = 1,
    /// Detector: "I now observe you; send me your heartbeats".
    Observe = 2,
    /// Detector: a set of ranks declared failed, propagated over the circulant graph.
    FailureNotice = 3,
    /// Communicator revoked: fail in-flight operations.
    Revoke = 4,
    /// Agreement: a coordinator's new round (ballot and excluded set), down the tree.
    AgreePrepare = 16,
    /// Agreement: a subtree's promise (contributions, accepted/decided value, rejection), up.
    AgreePromise = 17,
    /// Agreement: the coordinator's proposal, down the tree.
    AgreeAccept = 18,
    /// Agreement: a subtree accepted the proposal (or rejects it), up.
    AgreeAccepted = 19,
    /// Agreement: the decided set, down the tree of a decision broadcast.
    AgreeDecide = 20,
    /// Agreement fast path, sweep 1: the union of contributions heard so far, to `i + 2^k`.
    AgreeSweep = 21,
    /// Agreement fast path, sweep 2: "I finished sweep 1", to `i + 2^k`.
    AgreeSweepDone = 22,
    /// Broadcast: activation of a child (its outputs, ancestors and first subtree part).
    BcastActivate = 32,
    /// Broadcast: the rest of an activation's subtree, when it did not fit one frame.
    BcastSubtree = 33,
    /// Broadcast: a child asks its parent (or nearest live ancestor) for outputs.
    BcastRequest = 34,
    /// Broadcast: one chunk (at most `MAX_CHUNK` bytes) of an output.
    BcastData = 35,
    /// Message: one fragment of an application message ([`crate::messages`]).
    Message = 48,
}

impl FrameKind {
    /// Every kind, for exhaustive tests and fuzzing.
    pub const ALL: &'static [FrameKind] = &[
        FrameKind::Heartbeat,
        FrameKind::Observe,
        FrameKind::FailureNotice,
        FrameKind::Revoke,
        FrameKind::AgreePrepare,
        FrameKind::AgreePromise,
        FrameKind::AgreeAccept,
        FrameKind::AgreeAccepted,
        FrameKind::AgreeDecide,
        FrameKind::AgreeSweep,
        FrameKind::AgreeSweepDone,
        FrameKind::BcastActivate,
        FrameKind::BcastSubtree,
        FrameKind::BcastRequest,
        FrameKind::BcastData,
        FrameKind::Message,
    ];

    /// The protocol family the kind belongs to, by code range: what a layer dispatches
    /// on, and how protocol steps are named (e.g. simulator kill points).
    pub fn family(self) -> Family {
        match self as u8 {
            4 => Family::Revoke,
            1..=15 => Family::Detector,
            16..=31 => Family::Agree,
            32..=47 => Family::Bcast,
            _ => Family::Message,
        }
    }

    /// The kind with code `code`.
    pub fn from_code(code: u8) -> Result<FrameKind, FrameError> {
        FrameKind::ALL
            .iter()
            .copied()
            .find(|k| *k as u8 == code)
            .ok_or(FrameError::UnknownKind(code))
    }
}

/// The protocol a frame kind belongs to ([`FrameKind::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// The failure detector (heartbeats, observe requests, failure notices).
    Detector,
    /// The communicator's revoke flood.
    Revoke,
    /// The agreement of `validate_global`.
    Agree,
    /// The broadcast activation protocol.
    Bcast,
    /// The application's messages.
    Message,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::Detector,
        Family::Agree,
        Family::Bcast,
        Family::Revoke,
        Family::Message,
    ];

    /// The family's name in scenario files and reports: `"detector"`, `"agree"`,
    /// `"bcast"`, `"revoke"` or `"message"`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Detector => "detector",
            Family::Revoke => "revoke",
            Family::Agree => "agree",
            Family::Bcast => "bcast",
            Family::Message => "message",
        }
    }

    /// The family named `name` (see [`Family::name`]).
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// What a receiver checks a header against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// The communicator id frames must carry.
    pub comm: u32,
    /// The communicator size; every rank in a frame must be below it.
    pub n: u32,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The frame kind.
    pub kind: FrameKind,
    /// The communicator id.
    pub comm: u32,
    /// The epoch (its meaning is set by the kind).
    pub epoch: u32,
    /// The sending rank.
    pub sender: Rank,
}

impl Header {
    /// Starts a frame in a fresh `Vec` (tests, fuzzing and frames kept for later); append
    /// the payload with the returned writer.
    pub fn start(self) -> Writer {
        self.start_on(Vec::with_capacity(64))
    }

    /// Starts a frame in place at the start of `buf`: what `poll_transmit` does. Nothing
    /// is allocated; [`Writer::finish`] says whether the frame fit.
    pub fn write_into(self, buf: &mut [u8]) -> Writer<Slice<'_>> {
        self.start_on(Slice { buf, len: 0 })
    }

    fn start_on<S: Sink>(self, sink: S) -> Writer<S> {
        let mut w = Writer { sink };
        w.put_u8(VERSION).put_u8(self.kind as u8);
        w.put_u32(self.comm)
            .put_u32(self.epoch)
            .put_u32(self.sender);
        w
    }

    /// Decodes and checks the header of a frame that the transport says came from `from`.
    /// Returns the header and a reader positioned on the payload.
    pub fn decode(
        bytes: &[u8],
        ctx: Context,
        from: Rank,
    ) -> Result<(Header, Reader<'_>), FrameError> {
        let mut r = Reader {
            bytes,
            pos: 0,
            n: ctx.n,
        };
        let version = r.u8()?;
        if version != VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let kind = FrameKind::from_code(r.u8()?)?;
        let comm = r.u32()?;
        if comm != ctx.comm {
            return Err(FrameError::WrongCommunicator {
                expected: ctx.comm,
                got: comm,
            });
        }
        let epoch = r.u32()?;
        let sender = r.u32()?;
        if sender >= ctx.n {
            return Err(FrameError::RankOutOfRange {
                rank: sender.into(),
                n: ctx.n,
            });
        }
        if sender != from {
            return Err(FrameError::SenderMismatch {
                transport: from,
                header: sender,
            });
        }
        Ok((
            Header {
                kind,
                comm,
                epoch,
                sender,
            },
            r,
        ))
    }
}

/// Where a [`Writer`] puts its bytes: a growing `Vec`, or a caller's buffer ([`Slice`]).
pub trait Sink {
    /// Appends `bytes`.
    fn put_slice(&mut self, bytes: &[u8]);
    /// Appends one byte (most varints are one: a rank, an output index or a count
    /// below 128), without the call a copy of a slice of unknown length makes.
    fn put_byte(&mut self, byte: u8) {
        self.put_slice(&[byte]);
    }
}

impl Sink for Vec<u8> {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn put_byte(&mut self, byte: u8) {
        self.push(byte);
    }
}

/// A caller's buffer being filled in place. Writing past its end writes nothing but
/// still counts the length, so a too-short buffer reports the size the frame needs.
#[derive(Debug)]
pub struct Slice<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Sink for Slice<'_> {
    fn put_slice(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            dst.copy_from_slice(bytes);
        }
        self.len = end;
    }
    fn put_byte(&mut self, byte: u8) {
        if let Some(dst) = self.buf.get_mut(self.len) {
            *dst = byte;
        }
        self.len += 1;
    }
}

/// Appends payload fields to a frame started by [`Header::start`] (into a `Vec`) or
/// [`Header::write_into`] (in place into a caller's buffer).
#[derive(Debug)]
pub struct Writer<S: Sink = Vec<u8>> {
    sink: S,
}

impl<S: Sink> Writer<S> {
    /// Appends a byte.
    pub fn put_u8(&mut self, v: u8) -> &mut Self {
        self.sink.put_byte(v);
        self
    }
    /// Appends a little-endian `u32`.
    pub fn put_u32(&mut self, v: u32) -> &mut Self {
        self.sink.put_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian `u64`.
    pub fn put_u64(&mut self, v: u64) -> &mut Self {
        self.sink.put_slice(&v.to_le_bytes());
        self
    }
    /// Appends a LEB128 varint.
    pub fn put_varint(&mut self, mut v: u64) -> &mut Self {
        if v < 0x80 {
            self.sink.put_byte(v as u8);
            return self;
        }
        let mut bytes = [0u8; 10];
        let mut len = 0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                bytes[len] = byte;
                len += 1;
                break;
            }
            bytes[len] = byte | 0x80;
            len += 1;
        }
        self.sink.put_slice(&bytes[..len]);
        self
    }
    /// Appends a rank (as a varint).
    pub fn put_rank(&mut self, r: Rank) -> &mut Self {
        self.put_varint(r.into())
    }
    /// Appends `bytes` as they are: fields encoded before (a run kept from an earlier
    /// frame, written again behind new leading fields).
    pub fn put_raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.sink.put_slice(bytes);
        self
    }
    /// Appends a length-prefixed byte string.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.put_varint(bytes.len() as u64);
        self.sink.put_slice(bytes);
        self
    }
    /// Appends a rank set in its smaller encoding.
    pub fn put_rankset(&mut self, set: &RankSet) -> &mut Self {
        let dense_len = (set.universe() as usize).div_ceil(8);
        if set.len() < dense_len && sparse_len(set) <= dense_len {
            self.put_u8(0);
            self.put_varint(set.len() as u64);
            let mut prev: Option<Rank> = None;
            for r in set {
                let v = match prev {
                    None => r,
                    Some(p) => r - p - 1,
                };
                self.put_varint(v.into());
                prev = Some(r);
            }
        } else {
            // Streamed byte by byte in rank order: no scratch buffer.
            self.put_u8(1);
            let (mut at, mut byte) = (0usize, 0u8);
            for r in set {
                let index = (r / 8) as usize;
                while at < index {
                    self.put_u8(byte);
                    byte = 0;
                    at += 1;
                }
                byte |= 1 << (r % 8);
            }
            while at < dense_len {
                self.put_u8(byte);
                byte = 0;
                at += 1;
            }
        }
        self
    }
}

impl Writer<Vec<u8>> {
    /// A writer of a bare payload (no header), for a layer that sends its fields
    /// inside another's frames (the store inside messages).
    pub fn bare() -> Self {
        Writer { sink: Vec::new() }
    }

    /// The finished frame.
    pub fn finish(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.sink)
    }
}

impl Writer<Slice<'_>> {
    /// The frame's length, or the size it needs if it did not fit the buffer (whose
    /// content is then unspecified: the caller sends nothing).
    pub fn finish(&self) -> Result<usize, BufferTooShort> {
        if self.sink.len <= self.sink.buf.len() {
            Ok(self.sink.len)
        } else {
            Err(BufferTooShort {
                needed: self.sink.len,
                available: self.sink.buf.len(),
            })
        }
    }
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn sparse_len(set: &RankSet) -> usize {
    let mut len = varint_len(set.len() as u64);
    let mut prev: Option<Rank> = None;
    for r in set {
        len += varint_len(match prev {
            None => r.into(),
            Some(p) => (r - p - 1).into(),
        });
        prev = Some(r);
    }
    len
}

/// Reads payload fields; every method fails with a [`FrameError`] instead of panicking.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    n: u32,
}

impl<'a> Reader<'a> {
    /// A reader over a bare payload (no header) for a communicator of `n` ranks.
    pub fn new(bytes: &'a [u8], n: u32) -> Self {
        Reader { bytes, pos: 0, n }
    }
    /// The communicator size ranks are checked against.
    pub fn universe(&self) -> u32 {
        self.n
    }
    fn take(&mut self, len: usize) -> Result<&'a [u8], FrameError> {
        let end = self.pos.checked_add(len).ok_or(FrameError::Truncated)?;
        let out = self.bytes.get(self.pos..end).ok_or(FrameError::Truncated)?;
        self.pos = end;
        Ok(out)
    }
    /// Reads a byte.
    pub fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// Reads a LEB128 varint of at most 64 bits.
    pub fn varint(&mut self) -> Result<u64, FrameError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(FrameError::Malformed("varint overflows 64 bits"));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FrameError::Malformed("varint overflows 64 bits"))
    }
    /// Reads a varint that must fit a `u32`.
    pub fn varint_u32(&mut self) -> Result<u32, FrameError> {
        u32::try_from(self.varint()?).map_err(|_| FrameError::Malformed("value exceeds 32 bits"))
    }
    /// Reads a rank and checks it is `< n`.
    pub fn rank(&mut self) -> Result<Rank, FrameError> {
        let v = self.varint()?;
        if v >= u64::from(self.n) {
            return Err(FrameError::RankOutOfRange { rank: v, n: self.n });
        }
        Ok(v as Rank)
    }
    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| FrameError::Truncated)?;
        self.take(len)
    }
    /// Reads a rank set; members must be strictly increasing and `< n`.
    pub fn rankset(&mut self) -> Result<RankSet, FrameError> {
        self.rankset_ref().map(|set| set.to_set())
    }
    /// Reads a rank set as it lies in the frame, checked as [`Reader::rankset`] checks
    /// it but not copied out: nothing is allocated ([`RankSetRef`]).
    pub fn rankset_ref(&mut self) -> Result<RankSetRef<'a>, FrameError> {
        let n = self.n;
        match self.u8()? {
            0 => {
                let count = self.varint()?;
                // Each member takes at least one byte: a larger count is a lie.
                if count > (self.bytes.len() - self.pos) as u64 {
                    return Err(FrameError::Truncated);
                }
                let start = self.pos;
                let mut next_min: u64 = 0;
                for _ in 0..count {
                    let v = next_min
                        .checked_add(self.varint()?)
                        .ok_or(FrameError::Malformed("rank set overflow"))?;
                    if v >= u64::from(n) {
                        return Err(FrameError::RankOutOfRange { rank: v, n });
                    }
                    next_min = v + 1;
                }
                Ok(RankSetRef {
                    n,
                    len: count as usize,
                    form: RefForm::Sparse(&self.bytes[start..self.pos]),
                })
            }
            1 => {
                let bytes = self.take((n as usize).div_ceil(8))?;
                if n % 8 != 0 {
                    if let Some(&last) = bytes.last() {
                        if last >> (n % 8) != 0 {
                            return Err(FrameError::Malformed("dense rank set has bits past n"));
                        }
                    }
                }
                let len = bytes.iter().map(|b| b.count_ones() as usize).sum();
                Ok(RankSetRef {
                    n,
                    len,
                    form: RefForm::Dense(bytes),
                })
            }
            _ => Err(FrameError::Malformed("unknown rank set form")),
        }
    }
    /// Bytes left unread.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    /// Checks the whole frame was read.
    pub fn finish(self) -> Result<(), FrameError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(FrameError::TrailingBytes)
        }
    }
}

/// A rank set read from a frame and checked ([`Reader::rankset_ref`]), still in the
/// frame's bytes: a machine compares it with, or merges it into, a [`RankSet`] of its
/// own without allocating ([`Members`]).
///
/// Invariant: the bytes passed [`Reader::rankset_ref`]'s checks (members strictly
/// increasing and `< n`, no bit at or past `n`), and `len` is the member count.
#[derive(Clone, Copy, Debug)]
pub struct RankSetRef<'a> {
    n: u32,
    len: usize,
    form: RefForm<'a>,
}

#[derive(Clone, Copy, Debug)]
enum RefForm<'a> {
    /// The member varints (first, then gap - 1 each), after the count.
    Sparse(&'a [u8]),
    /// `ceil(n/8)` bytes of bits, least significant first.
    Dense(&'a [u8]),
}

impl RankSetRef<'_> {
    /// The members, in increasing order.
    pub fn iter(&self) -> RefIter<'_> {
        RefIter {
            set: *self,
            pos: 0,
            next_min: 0,
            left: self.len,
        }
    }
}

impl Members for RankSetRef<'_> {
    fn universe(&self) -> u32 {
        self.n
    }
    fn count(&self) -> usize {
        self.len
    }
    fn members(&self) -> impl Iterator<Item = Rank> + '_ {
        self.iter()
    }
}

/// The members of a [`RankSetRef`], in increasing order.
pub struct RefIter<'a> {
    set: RankSetRef<'a>,
    /// Sparse: offset of the next varint; dense: the next bit.
    pos: usize,
    next_min: u64,
    left: usize,
}

impl Iterator for RefIter<'_> {
    type Item = Rank;
    fn next(&mut self) -> Option<Rank> {
        if self.left == 0 {
            return None;
        }
        match self.set.form {
            RefForm::Sparse(bytes) => {
                // The varints were checked when the set was read; a failure here cannot
                // happen and ends the iteration rather than panic.
                let mut reader = Reader::new(&bytes[self.pos..], self.set.n);
                let gap = reader.varint().ok()?;
                self.pos += reader.pos;
                let rank = self.next_min.checked_add(gap)?;
                self.next_min = rank + 1;
                self.left -= 1;
                Rank::try_from(rank).ok()
            }
            RefForm::Dense(bytes) => {
                while self.pos < bytes.len() * 8 {
                    let bit = self.pos;
                    self.pos += 1;
                    if bytes[bit / 8] >> (bit % 8) & 1 == 1 {
                        self.left -= 1;
                        return Rank::try_from(bit).ok();
                    }
                }
                None
            }
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// Where a frame's epoch lies in its header (see the module documentation).
pub const EPOCH_AT: usize = 6;

/// Rewrites the epoch of an encoded frame (a frame kept as a template and sent again
/// for another broadcast or epoch). A buffer shorter than a header is left alone.
pub fn set_epoch(frame: &mut [u8], epoch: u32) {
    if let Some(field) = frame.get_mut(EPOCH_AT..EPOCH_AT + 4) {
        field.copy_from_slice(&epoch.to_le_bytes());
    }
}

/// Copies an already encoded frame into the caller's transmit buffer, or says how many
/// bytes it needs (the buffer is then left alone).
pub fn copy_out(frame: &[u8], buf: &mut [u8]) -> Result<usize, BufferTooShort> {
    let available = buf.len();
    let dst = buf.get_mut(..frame.len()).ok_or(BufferTooShort {
        needed: frame.len(),
        available,
    })?;
    dst.copy_from_slice(frame);
    Ok(frame.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    const CTX: Context = Context { comm: 7, n: 100 };

    fn header(kind: FrameKind) -> Header {
        Header {
            kind,
            comm: 7,
            epoch: 3,
            sender: 5,
        }
    }

    #[test]
    fn set_epoch_rewrites_the_epoch_and_nothing_else() {
        let frame = header(FrameKind::Heartbeat).start().put_rank(42).finish();
        let mut again = frame.clone();
        set_epoch(&mut again, 0xdead_beef);
        let (h, mut r) = Header::decode(&again, CTX, 5).unwrap();
        assert_eq!(
            h,
            Header {
                epoch: 0xdead_beef,
                ..header(FrameKind::Heartbeat)
            }
        );
        assert_eq!(r.rank().unwrap(), 42);
        set_epoch(&mut again, header(FrameKind::Heartbeat).epoch);
        assert_eq!(again, frame);
        let mut short = frame[..EPOCH_AT + 3].to_vec();
        set_epoch(&mut short, 1);
        assert_eq!(short, frame[..EPOCH_AT + 3]);
    }

    #[test]
    fn header_round_trips_and_checks_its_context() {
        let frame = header(FrameKind::Heartbeat).start().put_rank(42).finish();
        let (h, mut r) = Header::decode(&frame, CTX, 5).unwrap();
        assert_eq!(h, header(FrameKind::Heartbeat));
        assert_eq!(r.rank().unwrap(), 42);
        r.finish().unwrap();
        assert_eq!(
            Header::decode(&frame, Context { comm: 8, n: 100 }, 5).unwrap_err(),
            FrameError::WrongCommunicator {
                expected: 8,
                got: 7
            }
        );
        assert_eq!(
            Header::decode(&frame, Context { comm: 7, n: 5 }, 5).unwrap_err(),
            FrameError::RankOutOfRange { rank: 5, n: 5 }
        );
        assert_eq!(
            Header::decode(&frame, CTX, 4).unwrap_err(),
            FrameError::SenderMismatch {
                transport: 4,
                header: 5
            }
        );
        assert_eq!(
            Header::decode(&frame[..10], CTX, 5).unwrap_err(),
            FrameError::Truncated
        );
        let mut bad = frame.clone();
        bad[1] = 200;
        assert_eq!(
            Header::decode(&bad, CTX, 5).unwrap_err(),
            FrameError::UnknownKind(200)
        );
        bad[0] = 9;
        assert_eq!(
            Header::decode(&bad, CTX, 5).unwrap_err(),
            FrameError::BadVersion(9)
        );
    }

    #[test]
    fn rankset_picks_the_smaller_form() {
        let sparse = RankSet::from_ranks(1000, [3, 500]);
        let dense = RankSet::from_ranks(1000, 0..600);
        let a = header(FrameKind::FailureNotice)
            .start()
            .put_rankset(&sparse)
            .finish();
        let b = header(FrameKind::FailureNotice)
            .start()
            .put_rankset(&dense)
            .finish();
        assert_eq!(a[HEADER_LEN], 0);
        assert_eq!(b[HEADER_LEN], 1);
        assert_eq!(b.len(), HEADER_LEN + 1 + 125);
    }

    #[test]
    fn rankset_rejects_bits_past_n_and_lying_counts() {
        let mut r = Reader::new(&[1, 0xff, 0x1f], 12);
        assert_eq!(
            r.rankset().unwrap_err(),
            FrameError::Malformed("dense rank set has bits past n")
        );
        let mut r = Reader::new(&[0, 0x7f, 1], 12);
        assert_eq!(r.rankset().unwrap_err(), FrameError::Truncated);
        let mut r = Reader::new(&[0, 2, 11, 0], 12);
        assert_eq!(
            r.rankset().unwrap_err(),
            FrameError::RankOutOfRange { rank: 12, n: 12 }
        );
    }

    #[test]
    fn varint_rejects_overflow() {
        let mut r = Reader::new(&[0xff; 11], 12);
        assert!(matches!(r.varint(), Err(FrameError::Malformed(_))));
    }

    proptest! {
        #[test]
        fn payload_round_trips(n in 1u32..5000, ranks in prop::collection::vec(0u32..5000, 0..700), v in any::<u64>(), data in prop::collection::vec(any::<u8>(), 0..64)) {
            let set = RankSet::from_ranks(n, ranks.into_iter().filter(|r| *r < n));
            let frame = Header { kind: FrameKind::FailureNotice, comm: 1, epoch: 2, sender: 0 }
                .start().put_rankset(&set).put_varint(v).put_bytes(&data).put_u64(v).finish();
            prop_assert!(frame.len() <= frame_capacity(n));
            // In place: the same bytes, and a buffer one byte short is a typed error.
            let in_place = |buf: &mut [u8]| {
                Header { kind: FrameKind::FailureNotice, comm: 1, epoch: 2, sender: 0 }
                    .write_into(buf).put_rankset(&set).put_varint(v).put_bytes(&data).put_u64(v).finish()
            };
            let mut buf = vec![0u8; frame.len() + 3];
            prop_assert_eq!(in_place(&mut buf), Ok(frame.len()));
            prop_assert_eq!(&buf[..frame.len()], &frame[..]);
            let mut short = vec![0u8; frame.len() - 1];
            prop_assert_eq!(in_place(&mut short), Err(BufferTooShort { needed: frame.len(), available: frame.len() - 1 }));
            let (_, mut r) = Header::decode(&frame, Context { comm: 1, n }, 0).unwrap();
            prop_assert_eq!(r.rankset().unwrap(), set);
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert_eq!(r.bytes().unwrap(), &data[..]);
            prop_assert_eq!(r.u64().unwrap(), v);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn a_borrowed_rank_set_reads_as_the_decoded_one(
            n in 1u32..3000,
            a in prop::collection::vec(0u32..3000, 0..500),
            b in prop::collection::vec(0u32..3000, 0..500),
        ) {
            let a = RankSet::from_ranks(n, a.into_iter().filter(|r| *r < n));
            let b = RankSet::from_ranks(n, b.into_iter().filter(|r| *r < n));
            let frame = Header { kind: FrameKind::FailureNotice, comm: 1, epoch: 2, sender: 0 }
                .start().put_rankset(&a).finish();
            let (_, mut r) = Header::decode(&frame, Context { comm: 1, n }, 0).unwrap();
            let view = r.rankset_ref().unwrap();
            prop_assert!(r.finish().is_ok());
            // Both forms (sparse and dense) come through: members, count, conversion.
            prop_assert_eq!(view.count(), a.len());
            prop_assert!(view.iter().eq(a.iter()));
            prop_assert_eq!(view.to_set(), a.clone());
            prop_assert!(a.same_members(&view));
            prop_assert_eq!(b.same_members(&view), b == a);
            prop_assert_eq!(b.contains_all(&view), a.is_subset(&b));
            let mut merged = b.clone();
            let added = merged.union_with_members(&view);
            let mut expected = b.clone();
            prop_assert_eq!(added, expected.union_with(&a));
            prop_assert_eq!(merged, expected);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64), n in 1u32..300) {
            let mut r = Reader::new(&bytes, n);
            if let Ok(view) = r.rankset_ref() {
                prop_assert_eq!(view.iter().count(), view.count());
            }
            let mut r = Reader::new(&bytes, n);
            let _ = r.rankset();
            let _ = Header::decode(&bytes, Context { comm: 0, n }, 0);
        }
    }
}
