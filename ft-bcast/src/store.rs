//! [`Store`]: a redundant in-memory store of versioned buffers, after Fenix's data
//! recovery: each rank keeps its own entries and a copy of them on a rank of another
//! node, so that a node failure never takes both; a version counts only once it is
//! committed, and the commit is decided uniformly, so survivors never restore
//! different versions.
//!
//! - **put** `(key, version, bytes)`: the entry is kept here as the pending version of
//!   `key`, and sent to this rank's *holder*, the first rank not known dead from
//!   `me + span` on (`span`: the ranks per node, the detector's), which keeps it as
//!   the pending copy of `(me, key)` and acknowledges it. A group on one node
//!   (`span ≥ n`) keeps its copies on the next rank.
//! - **commit** `version` is collective, in three steps that the runtime makes: wait
//!   until this rank's puts of `version` and before are acknowledged, or their holder
//!   is known dead ([`Store::flushed`]); agree on `G` (`validate_global`); then
//!   [`Store::decide`] with that `G`. The version is committed iff `G` equals the
//!   store's *base*: the empty set, the `G` of a group at its start, until the
//!   survivors [`Store::rebase`] it after a recovery. Then every pending
//!   entry and copy of that version becomes the committed one, everywhere alike.
//!
//! Why that is uniform and safe: every survivor decides on the same `G` (the
//! agreement is uniform), and the base changes only by [`Store::rebase`], which every
//! survivor makes at the same point. If `G` equals the base, no rank failed since the
//! base was set, so every rank took part in the agreement after its own flush: its
//! entries of `version` sit on two live ranks, here and at its holder, and each holder
//! had stored them before it acknowledged. If `G` grew, some rank's copies may be
//! incomplete, and nobody commits. A rank that was put out of the group before the
//! base was set has no entries of later versions; its holder keeps the copies it had.
//!
//! After a failure the copies of a dead rank's committed entries are at its holder
//! ([`Store::holder`], reckoned with the base as the known-dead set, which is what the
//! owner knew at every put of a committed version), read there with
//! [`Store::get`].
//!
//! The store speaks through the stack's messenger: its messages carry tags with
//! [`STORE_TAG`] set (which the application may not use), in order per sender, and a
//! put's data travels as its own message, shared with the caller's buffer (no copy).
//! Malformed store messages from a peer are refused with a typed error and change
//! nothing. Puts are numbered, and only the acknowledgement of a key's last put
//! clears it: a put of a key again (the same version re-put with other bytes) is
//! flushed only once the holder has the last one, which it received after the
//! others (messages are in order per sender).

use alloc::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use ft_core::wire::{Reader, Writer};
use ft_core::{FrameError, Rank, RankSet};

/// The tag bit of the store's messages: application messages may not set it.
pub const STORE_TAG: u64 = 1 << 63;

/// The store's message kinds (the low bits of the tag).
const PUT: u64 = 1;
const PUT_DATA: u64 = 2;
const ACK: u64 = 3;

/// The rank of a group of `n` that keeps `owner`'s copies when the ranks of `dead` are
/// known dead and nodes hold `span` ranks: the first rank not in `dead` from
/// `owner + span` on (the next rank if the group fits one node), or `owner` itself if
/// no other rank is left.
pub fn holder_of(n: u32, span: u32, owner: Rank, dead: &RankSet) -> Rank {
    let step = if span == 0 || span >= n { 1 } else { span };
    (0..n.saturating_sub(1))
        .map(|k| (owner + step + k) % n)
        .find(|&r| r != owner && !dead.contains(r))
        .unwrap_or(owner)
}

/// One version of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    version: u64,
    bytes: Bytes,
}

/// An entry (or a copy of one): its committed and pending versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Entry {
    committed: Option<Version>,
    pending: Option<Version>,
}

impl Entry {
    /// The pending version becomes the committed one if it is `version`; returns
    /// whether it did.
    fn commit(&mut self, version: u64) -> bool {
        if self.pending.as_ref().is_some_and(|p| p.version == version) {
            self.committed = self.pending.take();
            return true;
        }
        false
    }

    fn bytes(&self) -> usize {
        let len = |v: &Option<Version>| v.as_ref().map_or(0, |v| v.bytes.len());
        len(&self.committed) + len(&self.pending)
    }
}

/// What a store holds and moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes of this rank's own entries (committed and pending versions).
    pub own_bytes: u64,
    /// Bytes of the copies kept for other ranks.
    pub held_bytes: u64,
    /// Bytes of entries sent to holders so far.
    pub bytes_sent: u64,
    /// Bytes of copies received so far.
    pub bytes_received: u64,
    /// Versions committed here.
    pub commits: u64,
    /// Commits that failed (`G` had grown).
    pub failed_commits: u64,
}

/// A message the store asks the stack to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination.
    pub to: Rank,
    /// The tag ([`STORE_TAG`] set).
    pub tag: u64,
    /// The bytes.
    pub bytes: Bytes,
}

/// One rank's store. See the [module docs](self).
#[derive(Debug)]
pub struct Store {
    n: u32,
    me: Rank,
    span: u32,
    base: RankSet,
    own: BTreeMap<u64, Entry>,
    held: BTreeMap<(Rank, u64), Entry>,
    /// The last put of each key sent and not acknowledged: key → (version, holder,
    /// put number). Only the acknowledgement of that very put clears it.
    unacked: BTreeMap<u64, (u64, Rank, u64)>,
    /// Puts sent so far: numbers them.
    puts: u64,
    /// A put whose data message is expected next, per sender: (key, version, len,
    /// put number).
    expecting: BTreeMap<Rank, (u64, u64, u64, u64)>,
    dead: RankSet,
    out: VecDeque<Outgoing>,
    stats: StoreStats,
}

impl Store {
    /// The store of rank `me` of `n`, copies going `span` ranks ahead, the ranks of
    /// `dead` known dead; its base is the empty set, the `G` every group starts from.
    pub fn new(n: u32, me: Rank, span: u32, dead: RankSet) -> Self {
        Store {
            n,
            me,
            span,
            base: RankSet::new(n),
            own: BTreeMap::new(),
            held: BTreeMap::new(),
            unacked: BTreeMap::new(),
            puts: 0,
            expecting: BTreeMap::new(),
            dead,
            out: VecDeque::new(),
            stats: StoreStats::default(),
        }
    }

    /// The rank that keeps `owner`'s copies when the ranks of `dead` are known dead
    /// ([`holder_of`]).
    pub fn holder_given(&self, owner: Rank, dead: &RankSet) -> Rank {
        holder_of(self.n, self.span, owner, dead)
    }

    /// The rank that keeps `owner`'s committed copies: [`Store::holder_given`] the base.
    pub fn holder(&self, owner: Rank) -> Rank {
        self.holder_given(owner, &self.base)
    }

    /// The `G` the store started from.
    pub fn base(&self) -> &RankSet {
        &self.base
    }

    /// What the store holds and moved.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            own_bytes: self.own.values().map(|e| e.bytes() as u64).sum(),
            held_bytes: self.held.values().map(|e| e.bytes() as u64).sum(),
            ..self.stats
        }
    }

    /// Keeps `bytes` as version `version` of this rank's `key` (replacing a pending
    /// version) and sends it to this rank's holder.
    pub fn put(&mut self, key: u64, version: u64, bytes: Bytes) {
        let holder = self.holder_given(self.me, &self.dead);
        self.own.entry(key).or_default().pending = Some(Version {
            version,
            bytes: bytes.clone(),
        });
        if holder == self.me {
            return;
        }
        self.puts += 1;
        let mut head = Writer::bare();
        head.put_varint(key)
            .put_varint(version)
            .put_varint(bytes.len() as u64)
            .put_varint(self.puts);
        self.stats.bytes_sent += bytes.len() as u64;
        self.send(holder, PUT, Bytes::from(head.finish()));
        self.send(holder, PUT_DATA, bytes);
        self.unacked.insert(key, (version, holder, self.puts));
    }

    fn send(&mut self, to: Rank, kind: u64, bytes: Bytes) {
        self.out.push_back(Outgoing {
            to,
            tag: STORE_TAG | kind,
            bytes,
        });
    }

    /// The next message to send.
    pub fn poll_outgoing(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// Whether every put of `version` or before was acknowledged, or its holder is
    /// known dead (then the commit fails: `G` grows).
    pub fn flushed(&self, version: u64) -> bool {
        self.unacked
            .values()
            .all(|&(v, holder, _)| v > version || self.dead.contains(holder))
    }

    /// Commits `version` if `agreed` (the `G` of the commit's validation) equals the
    /// base: see the [module docs](self). Pending versions other than `version` stay
    /// pending. Returns whether it committed.
    pub fn decide(&mut self, version: u64, agreed: &RankSet) -> bool {
        if *agreed != self.base {
            for entry in self.own.values_mut().chain(self.held.values_mut()) {
                if entry.pending.as_ref().is_some_and(|p| p.version == version) {
                    entry.pending = None;
                }
            }
            self.unacked.retain(|_, (v, _, _)| *v != version);
            self.stats.failed_commits += 1;
            return false;
        }
        for entry in self.own.values_mut().chain(self.held.values_mut()) {
            entry.commit(version);
        }
        self.unacked.retain(|_, (v, _, _)| *v > version);
        self.stats.commits += 1;
        true
    }

    /// Makes `agreed` (a `G` every survivor agreed on, after recovering from the
    /// failures it added) the base of later commits; pending versions are dropped.
    /// Every survivor rebases at the same point.
    pub fn rebase(&mut self, agreed: RankSet) {
        self.base = agreed;
        for entry in self.own.values_mut().chain(self.held.values_mut()) {
            entry.pending = None;
        }
        self.unacked.clear();
    }

    /// The committed version of `owner`'s `key` kept here (this rank's own entry, or
    /// the copy it holds for `owner`): its version and bytes.
    pub fn get(&self, owner: Rank, key: u64) -> Option<(u64, Bytes)> {
        let entry = if owner == self.me {
            self.own.get(&key)
        } else {
            self.held.get(&(owner, key))
        };
        let committed = entry?.committed.as_ref()?;
        Some((committed.version, committed.bytes.clone()))
    }

    /// The owners whose copies this rank holds.
    pub fn owners_held(&self) -> impl Iterator<Item = Rank> + '_ {
        let mut last = None;
        self.held.keys().filter_map(move |&(owner, _)| {
            let new = last != Some(owner);
            last = Some(owner);
            new.then_some(owner)
        })
    }

    /// `rank` is dead: its unacknowledged puts will not be acknowledged.
    pub fn on_rank_failed(&mut self, rank: Rank) {
        if rank < self.n {
            self.dead.insert(rank);
            self.expecting.remove(&rank);
        }
    }

    /// A store message from `from` (its tag has [`STORE_TAG`] set).
    pub fn handle_message(&mut self, from: Rank, tag: u64, bytes: Bytes) -> Result<(), FrameError> {
        match tag & !STORE_TAG {
            PUT => {
                let mut r = Reader::new(&bytes, self.n);
                let key = r.varint()?;
                let version = r.varint()?;
                let len = r.varint()?;
                let put = r.varint()?;
                r.finish()?;
                self.expecting.insert(from, (key, version, len, put));
                Ok(())
            }
            PUT_DATA => {
                let (key, version, len, put) = self
                    .expecting
                    .remove(&from)
                    .ok_or(FrameError::Malformed("store data without its put"))?;
                if len != bytes.len() as u64 {
                    return Err(FrameError::Malformed("store data of another length"));
                }
                self.stats.bytes_received += len;
                self.held.entry((from, key)).or_default().pending =
                    Some(Version { version, bytes });
                let mut ack = Writer::bare();
                ack.put_varint(key).put_varint(put);
                self.send(from, ACK, Bytes::from(ack.finish()));
                Ok(())
            }
            ACK => {
                let mut r = Reader::new(&bytes, self.n);
                let key = r.varint()?;
                let put = r.varint()?;
                r.finish()?;
                if self
                    .unacked
                    .get(&key)
                    .is_some_and(|&(_, holder, last)| (holder, last) == (from, put))
                {
                    self.unacked.remove(&key);
                }
                Ok(())
            }
            _ => Err(FrameError::Malformed("a store message of unknown kind")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    /// `n` stores, messages delivered at once in order.
    fn stores(n: u32, span: u32) -> Vec<Store> {
        (0..n)
            .map(|me| Store::new(n, me, span, RankSet::new(n)))
            .collect()
    }

    fn deliver(stores: &mut [Store], alive: &[bool]) {
        loop {
            let mut moved = false;
            for from in 0..stores.len() {
                while let Some(m) = stores[from].poll_outgoing() {
                    moved = true;
                    if alive[m.to as usize] && alive[from] {
                        stores[m.to as usize]
                            .handle_message(from as Rank, m.tag, m.bytes)
                            .unwrap();
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn copies_go_to_another_node_and_count_once_committed() {
        let mut s = stores(8, 4);
        for (me, store) in s.iter_mut().enumerate() {
            store.put(1, 5, Bytes::from(vec![me as u8; 100]));
        }
        assert!(!s[0].flushed(5), "not acknowledged yet");
        deliver(&mut s, &[true; 8]);
        assert!(s.iter().all(|st| st.flushed(5)));
        assert_eq!(s[0].holder(0), 4);
        assert_eq!(s[6].holder(6), 2, "wraps around");
        assert_eq!(s[4].get(0, 1), None, "pending only");
        let g = RankSet::new(8);
        assert!(s.iter_mut().all(|st| st.decide(5, &g)));
        assert_eq!(s[4].get(0, 1), Some((5, Bytes::from(vec![0u8; 100]))));
        assert_eq!(s[0].get(0, 1).unwrap().0, 5);
        let stats = s[4].stats();
        assert_eq!(
            (stats.own_bytes, stats.held_bytes, stats.bytes_sent),
            (100, 100, 100)
        );
    }

    #[test]
    fn a_commit_fails_everywhere_when_g_grew_and_the_last_committed_version_stays() {
        let mut s = stores(4, 2);
        let mut alive = [true; 4];
        for store in &mut s {
            store.put(7, 1, Bytes::from(vec![1u8; 10]));
        }
        deliver(&mut s, &alive);
        assert!(s.iter_mut().all(|st| st.decide(1, &RankSet::new(4))));
        // Version 2: rank 3 dies before its holder (rank 1) got its copy.
        alive[3] = false;
        for store in &mut s[..3] {
            store.put(7, 2, Bytes::from(vec![2u8; 10]));
        }
        deliver(&mut s, &alive);
        // Rank 1's holder is rank 3: unacknowledged until it is known dead.
        assert!(!s[1].flushed(2));
        for st in &mut s[..3] {
            st.on_rank_failed(3);
        }
        assert!(s[1].flushed(2));
        let g = RankSet::from_ranks(4, [3]);
        for st in &mut s[..3] {
            assert!(!st.decide(2, &g), "G grew: nobody commits");
        }
        // Every survivor restores version 1, rank 3's from its holder, rank 1.
        assert_eq!(s[0].holder(3), 1);
        assert_eq!(s[1].get(3, 7), Some((1, Bytes::from(vec![1u8; 10]))));
        assert_eq!(s[2].get(2, 7).unwrap().0, 1);
        // After the recovery the base moves, and commits succeed again.
        for st in &mut s[..3] {
            st.rebase(g.clone());
            st.put(7, 3, Bytes::from(vec![3u8; 10]));
        }
        deliver(&mut s, &alive);
        assert!(s[..3].iter().all(|st| st.flushed(3)));
        assert_eq!(s[1].holder_given(1, &g), 0, "rank 3 skipped");
        for st in &mut s[..3] {
            assert!(st.decide(3, &g));
        }
        assert_eq!(s[0].get(1, 7).unwrap().0, 3);
    }

    #[test]
    fn malformed_store_messages_are_refused() {
        let mut s = stores(2, 1);
        assert!(s[0]
            .handle_message(1, STORE_TAG | PUT_DATA, Bytes::from_static(b"x"))
            .is_err());
        assert!(s[0]
            .handle_message(1, STORE_TAG | PUT, Bytes::from_static(b"\xff"))
            .is_err());
        assert!(s[0].handle_message(1, STORE_TAG | 9, Bytes::new()).is_err());
        let mut head = Writer::bare();
        head.put_varint(1).put_varint(1).put_varint(5).put_varint(1);
        s[0].handle_message(1, STORE_TAG | PUT, Bytes::from(head.finish()))
            .unwrap();
        assert!(
            s[0].handle_message(1, STORE_TAG | PUT_DATA, Bytes::from_static(b"abc"))
                .is_err(),
            "another length"
        );
        assert_eq!(s[0].stats().held_bytes, 0);
    }

    #[test]
    fn a_group_of_one_node_keeps_copies_on_the_next_rank() {
        let s = stores(3, 64);
        assert_eq!(s[0].holder(0), 1);
        assert_eq!(s[2].holder(2), 0);
        let one = stores(1, 1);
        assert_eq!(one[0].holder(0), 0);
    }
}
