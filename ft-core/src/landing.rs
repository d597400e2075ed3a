//! [`Landing`]: memory a machine lends a transport to receive bulk data into, so that
//! the bytes land where the machine keeps them (a broadcast output's one buffer) instead
//! of in a transport buffer that is copied again later.
//!
//! The machine owns a [`Landing`] (one buffer of `len` bytes, allocated uninitialised: a
//! large allocation costs physical memory only as its pages are written) and claims
//! disjoint ranges of it as [`Slot`]s ([`Landing::claim`]). A transport writes a slot's
//! bytes through [`Slot::as_mut_ptr`] (an `MPI_Irecv` into it, say) and, once it has
//! written every one of them, turns it into [`Filled`] (`unsafe`: the transport vouches
//! for the write). [`Filled::into_bytes`] is then an ordinary shared [`Bytes`] over
//! exactly that range. A slot that was never filled (its sender died mid-transfer) goes
//! back with [`Landing::unclaim`], and its range can be claimed again.
//! [`Landing::join`] turns views that cover the whole buffer, in order, into one
//! [`Bytes`] of it without copying.
//!
//! Invariants, which make every read sound:
//!
//! - a byte belongs to at most one claimed range; a range stays claimed until its slot
//!   comes back unfilled through [`Landing::unclaim`] (so a filled range is never
//!   claimed, and never written, again);
//! - the only shared views of the memory are [`Bytes`] made from [`Filled`] slots (and
//!   their slices), so every byte anyone can read was written, and nothing writes it
//!   any more;
//! - [`Landing::join`] hands out the whole buffer only when it is given views that lie
//!   each at its own place in this buffer and together cover it from 0 to its end, so
//!   every byte was filled;
//! - the memory lives as long as the landing, any slot or any view of it (each holds an
//!   [`Arc`] of it), so a transport may keep writing into a slot whose machine dropped
//!   the landing (a forgotten broadcast), and a transport that gives up a slot without
//!   filling it (it leaks it) leaves the range claimed: never read, never written twice.
//!
//! **Lent memory.** A task runtime that wants an output in its own memory (its data
//! arena, a registered buffer) lends it: [`Landing::lent`] wraps the application's
//! bytes, and the call it gives is made exactly once, when the last holder of the
//! memory (the landing, a slot, a view) is dropped. Everything above holds for lent
//! memory as for memory allocated here. Bytes that arrived elsewhere (a short output
//! in its frame) are copied in whole ([`Landing::fill_whole`]).
//!
//! This is the one module of the crate with `unsafe` code: the allocation, the raw
//! pointer a transport writes through, and the slices over filled ranges.
#![allow(unsafe_code)]

use alloc::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::ptr::NonNull;

use bytes::Bytes;

/// The allocation behind a landing: `len` bytes at `ptr` (dangling when `len` is 0),
/// allocated here or lent by the application.
struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    /// `None`: allocated in [`Memory::new`], freed on drop. `Some`: lent
    /// ([`Landing::lent`]); the release is called on drop, once, and frees nothing here.
    release: Option<Release>,
}

/// What gives lent memory back to its owner.
type Release = alloc::boxed::Box<dyn FnOnce() + Send>;

// SAFETY: `Memory` is a plain heap allocation. Threads reach its bytes only through a
// `Slot` (one writer per claimed range, claimed ranges disjoint) or a view of filled
// ranges (read-only, never written again): no byte is ever written by one thread while
// another reads or writes it. The release of lent memory is `Send` and only called
// from `drop`, by the one thread that drops the last holder.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared access only reads filled ranges (never the release).
unsafe impl Sync for Memory {}

impl Memory {
    fn new(len: usize) -> Self {
        if len == 0 {
            return Memory {
                ptr: NonNull::dangling(),
                len,
                release: None,
            };
        }
        let layout = Layout::array::<u8>(len).unwrap_or_else(|_| {
            handle_alloc_error(
                // Larger than `isize::MAX`: report it as the allocation it is.
                Layout::new::<u8>(),
            )
        });
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc(layout) };
        match NonNull::new(ptr) {
            Some(ptr) => Memory {
                ptr,
                len,
                release: None,
            },
            None => handle_alloc_error(layout),
        }
    }

    /// The address of byte `at` (no more than `len`).
    fn at(&self, at: usize) -> *mut u8 {
        debug_assert!(at <= self.len);
        // SAFETY: `at <= len`: within the allocation or one past its end.
        unsafe { self.ptr.as_ptr().add(at) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        } else if self.len > 0 {
            // SAFETY: allocated in `Memory::new` with this very layout.
            unsafe { dealloc(self.ptr.as_ptr(), Layout::array::<u8>(self.len).unwrap()) };
        }
    }
}

/// One buffer that transports receive bulk data into, range by range: see the
/// [module docs](self).
pub struct Landing {
    memory: Arc<Memory>,
    /// Claimed ranges `(start, end)`, disjoint, sorted by start.
    claimed: Vec<(usize, usize)>,
}

impl fmt::Debug for Landing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Landing")
            .field("len", &self.memory.len)
            .field("claimed", &self.claimed)
            .finish()
    }
}

impl Landing {
    /// A buffer of `len` bytes, nothing claimed.
    pub fn new(len: usize) -> Self {
        Landing {
            memory: Arc::new(Memory::new(len)),
            claimed: Vec::new(),
        }
    }

    /// A buffer over `len` bytes of the application's memory at `ptr`, nothing claimed:
    /// what a task runtime's allocation hook returns, so an output lands where the
    /// runtime keeps it. `release` is called exactly once, on whichever thread drops the
    /// last of the landing, its slots and its views: from then on the library neither
    /// reads nor writes the memory.
    ///
    /// # Safety
    /// Until `release` is called, the `len` bytes at `ptr` stay allocated, and nobody
    /// but this library writes them; nobody reads a byte before it is filled (the
    /// library reports an output complete only once every byte of it is). With `len`
    /// 0, `ptr` is never read nor written.
    pub unsafe fn lent(
        ptr: NonNull<u8>,
        len: usize,
        release: impl FnOnce() + Send + 'static,
    ) -> Self {
        Landing {
            memory: Arc::new(Memory {
                ptr,
                len,
                release: Some(alloc::boxed::Box::new(release)),
            }),
            claimed: Vec::new(),
        }
    }

    /// A buffer over `vec`'s bytes (its length, not its capacity), nothing claimed, lent
    /// as [`Landing::lent`] lends memory: `give_back` gets the vector back, once, when
    /// the last holder is dropped (a runtime's pool of buffers takes it back).
    pub fn lent_vec(vec: Vec<u8>, give_back: impl FnOnce(Vec<u8>) + Send + 'static) -> Self {
        let mut vec = core::mem::ManuallyDrop::new(vec);
        let (len, capacity) = (vec.len(), vec.capacity());
        let ptr = RawVec(NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling()));
        // SAFETY: the vector is not dropped (`ManuallyDrop`) and nothing else can reach
        // its buffer until the release rebuilds it from its own parts, once.
        unsafe {
            Landing::lent(ptr.0, len, move || {
                let whole: RawVec = ptr; // (the whole wrapper, which is `Send`)
                give_back(Vec::from_raw_parts(whole.0.as_ptr(), len, capacity))
            })
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// Whether it is the application's memory ([`Landing::lent`]).
    pub fn is_lent(&self) -> bool {
        self.memory.release.is_some()
    }

    /// Whether no range of it was ever claimed, or all came back unfilled.
    pub fn is_untouched(&self) -> bool {
        self.claimed.is_empty()
    }

    /// The whole buffer written with `pieces`, in order, which must together be exactly
    /// as long (a copy: for bytes that arrived elsewhere, in a frame, and must end up
    /// here); `None`, nothing written, if they are not, or if a range of it is claimed.
    pub fn fill_whole<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]> + Clone,
    ) -> Option<Bytes> {
        let total: usize = pieces.clone().into_iter().map(<[u8]>::len).sum();
        if total != self.memory.len || !self.claimed.is_empty() {
            return None;
        }
        if total == 0 {
            return Some(view(&self.memory, 0, 0));
        }
        let mut slot = self.claim(0, total)?;
        let mut at = 0;
        for piece in pieces {
            // SAFETY: the slot covers the whole buffer, which is its own to write (it
            // was claimed just now); the pieces sum to its length, so each lands within
            // it, and being readable views they cannot overlap unfilled memory.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    slot.as_mut_ptr().add(at),
                    piece.len(),
                );
            }
            at += piece.len();
        }
        // SAFETY: every byte was written above.
        Some(unsafe { slot.filled() }.into_bytes())
    }

    /// The `len` bytes from `start` to receive into, if they lie within the buffer, are
    /// not empty, and overlap no claimed range (one being received into, or filled).
    pub fn claim(&mut self, start: usize, len: usize) -> Option<Slot> {
        let end = start.checked_add(len)?;
        if len == 0 || end > self.memory.len {
            return None;
        }
        // The first claimed range that ends after `start` must begin at or after `end`.
        let k = self.claimed.partition_point(|&(_, e)| e <= start);
        if self.claimed.get(k).is_some_and(|&(s, _)| s < end) {
            return None;
        }
        self.claimed.insert(k, (start, end));
        Some(Slot {
            memory: Arc::clone(&self.memory),
            start,
            len,
        })
    }

    /// Takes back a slot of this buffer that was not filled: its range may be claimed
    /// again. False (and the slot dropped, its range still claimed) if it is another
    /// buffer's.
    pub fn unclaim(&mut self, slot: Slot) -> bool {
        if !Arc::ptr_eq(&slot.memory, &self.memory) {
            return false;
        }
        let range = (slot.start, slot.start + slot.len);
        match self.claimed.binary_search(&range) {
            Ok(k) => {
                self.claimed.remove(k);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `slot` was claimed from this buffer.
    pub fn holds(&self, slot: &Slot) -> bool {
        Arc::ptr_eq(&slot.memory, &self.memory)
    }

    /// Whether `bytes` lies at offset `start` of this buffer (so it is a view of a
    /// filled range of it).
    pub fn is_at(&self, start: usize, bytes: &[u8]) -> bool {
        start <= self.memory.len
            && core::ptr::eq(bytes.as_ptr(), self.memory.at(start).cast_const())
            && bytes.len() <= self.memory.len - start
    }

    /// The whole buffer as one shared [`Bytes`], without a copy, if `pieces` (offset and
    /// bytes, in order) lie each at its own offset in this buffer and together cover it
    /// from 0 to its end; else `None`. Views of this buffer are only ever made of filled
    /// ranges, so such pieces prove every byte was written.
    pub fn join<'a>(&self, pieces: impl IntoIterator<Item = (u64, &'a Bytes)>) -> Option<Bytes> {
        let mut covered = 0usize;
        for (start, piece) in pieces {
            let start = usize::try_from(start).ok()?;
            if start != covered || piece.is_empty() || !self.is_at(start, piece) {
                return None;
            }
            covered += piece.len();
        }
        if covered != self.memory.len {
            return None;
        }
        Some(view(&self.memory, 0, covered))
    }
}

/// A vector's buffer, held by the release of [`Landing::lent_vec`].
struct RawVec(NonNull<u8>);

// SAFETY: the pointer is the buffer of a vector that only the release rebuilds, on
// whichever thread calls it; `Vec<u8>` is `Send`.
unsafe impl Send for RawVec {}

/// A claimed range of a [`Landing`], for a transport to write: see the
/// [module docs](self).
pub struct Slot {
    memory: Arc<Memory>,
    start: usize,
    len: usize,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl Slot {
    /// Its length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a slot is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the transport writes the slot's `len()` bytes. Nobody else reads or writes
    /// them until the slot is filled ([`Slot::filled`]) or comes back
    /// ([`Landing::unclaim`]); the memory stays allocated while the slot lives.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.memory.at(self.start)
    }

    /// The slot written with a copy of `src`, which must be exactly as long (else the
    /// slot comes back untouched): for a transport that has the payload in its own
    /// memory already (a simulator's delivery, a test).
    pub fn fill_from(mut self, src: &[u8]) -> Result<Filled, Slot> {
        if src.len() != self.len {
            return Err(self);
        }
        // SAFETY: the slot's `len` bytes are its own to write (claimed ranges are
        // disjoint, module invariants), `src` is as long and cannot overlap them (no
        // shared view of an unfilled range exists); after the copy every byte is
        // written.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.as_mut_ptr(), self.len);
            Ok(self.filled())
        }
    }

    /// The slot, written.
    ///
    /// # Safety
    /// Every one of its `len()` bytes at [`Slot::as_mut_ptr`] was written, and no write
    /// to them is still in progress (the receive into it completed).
    pub unsafe fn filled(self) -> Filled {
        Filled { slot: self }
    }
}

/// A written [`Slot`]: its bytes may be read.
pub struct Filled {
    slot: Slot,
}

impl fmt::Debug for Filled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Filled").field(&self.slot).finish()
    }
}

impl Filled {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.slot.len
    }

    /// Always false: a slot is never empty.
    pub fn is_empty(&self) -> bool {
        self.slot.len == 0
    }

    /// The whole frame as one new buffer: `head`, then these bytes (a copy, for a
    /// reader that wants the frame contiguous rather than where it landed).
    pub fn behind(self, head: &[u8]) -> Vec<u8> {
        let payload = self.into_bytes();
        let mut frame = Vec::with_capacity(head.len() + payload.len());
        frame.extend_from_slice(head);
        frame.extend_from_slice(&payload);
        frame
    }

    /// Its bytes, shared (the buffer stays alive while any view of it does).
    pub fn into_bytes(self) -> Bytes {
        let Slot { memory, start, len } = self.slot;
        view(&memory, start, len)
    }
}

/// The filled range `start..start + len` of `memory` as [`Bytes`].
fn view(memory: &Arc<Memory>, start: usize, len: usize) -> Bytes {
    Bytes::from_owner(View {
        memory: Arc::clone(memory),
        start,
        len,
    })
}

/// A filled range, owned by the [`Bytes`] that shows it.
struct View {
    memory: Arc<Memory>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: a view is only made of a filled range (`Filled`, or `Landing::join`
        // over views that cover the buffer), inside the allocation, which this view keeps
        // alive; filled bytes are never written again (module invariants).
        unsafe { core::slice::from_raw_parts(self.memory.at(self.start), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// Writes `byte` into every byte of `slot`, as a transport's receive would.
    fn fill(mut slot: Slot, byte: u8) -> Bytes {
        let len = slot.len();
        // SAFETY: the slot's `len` bytes are ours to write; then all are written.
        unsafe {
            core::ptr::write_bytes(slot.as_mut_ptr(), byte, len);
            slot.filled().into_bytes()
        }
    }

    #[test]
    fn claims_are_disjoint_and_within_the_buffer() {
        let mut l = Landing::new(100);
        let a = l.claim(10, 20).expect("free");
        assert!(l.claim(0, 11).is_none(), "overlaps the start");
        assert!(l.claim(29, 5).is_none(), "overlaps the end");
        assert!(l.claim(15, 2).is_none(), "inside");
        assert!(l.claim(0, 100).is_none(), "around");
        assert!(l.claim(90, 11).is_none(), "past the end");
        assert!(l.claim(5, 0).is_none(), "empty");
        assert!(l.claim(usize::MAX, 2).is_none(), "overflow");
        let b = l.claim(0, 10).expect("just before");
        let c = l.claim(30, 70).expect("just after");
        assert!(l.holds(&a) && l.holds(&b) && l.holds(&c));
        assert!(l.claim(0, 1).is_none());
        // An unfilled slot comes back, and its range is free again.
        assert!(l.unclaim(a));
        assert!(l.claim(12, 3).is_some());
        drop((b, c));
    }

    #[test]
    fn a_slot_of_another_buffer_is_refused() {
        let mut l = Landing::new(10);
        let mut other = Landing::new(10);
        let s = other.claim(0, 10).unwrap();
        assert!(!l.holds(&s));
        assert!(!l.unclaim(s));
        assert!(other.claim(0, 1).is_none(), "still claimed there");
    }

    #[test]
    fn filled_pieces_in_order_join_without_a_copy() {
        let mut l = Landing::new(96);
        let a = fill(l.claim(0, 32).unwrap(), 1);
        let c = fill(l.claim(64, 32).unwrap(), 3);
        let b = fill(l.claim(32, 32).unwrap(), 2);
        // A gap, a piece out of place and a foreign buffer are all refused.
        assert!(l.join([(0, &a), (64, &c)]).is_none());
        assert!(l.join([(0, &a), (32, &c), (64, &c)]).is_none());
        let foreign = Bytes::from(vec![2u8; 32]);
        assert!(l.join([(0, &a), (32, &foreign), (64, &c)]).is_none());
        assert!(l.join([(0, &a), (32, &b)]).is_none(), "short of the end");
        let whole = l.join([(0, &a), (32, &b), (64, &c)]).expect("covers it");
        assert_eq!(whole.as_ptr(), a.as_ptr(), "the same memory, not a copy");
        let mut want = vec![1u8; 32];
        want.extend([2u8; 32]);
        want.extend([3u8; 32]);
        assert_eq!(&whole[..], &want[..]);
        // Slices of the views join too (a chunk trimmed on arrival).
        let (b1, b2) = (b.slice(..10), b.slice(10..));
        assert!(l.join([(0, &a), (32, &b1), (42, &b2), (64, &c)]).is_some());
    }

    #[test]
    fn the_memory_outlives_the_landing_while_a_slot_or_view_lives() {
        let mut l = Landing::new(64);
        let slot = l.claim(0, 32).unwrap();
        let view = fill(l.claim(32, 32).unwrap(), 7);
        drop(l);
        // The transport finishes its receive after the machine dropped the buffer.
        let early = fill(slot, 9);
        assert_eq!(&early[..], &[9u8; 32][..]);
        assert_eq!(&view[..], &[7u8; 32][..]);
    }

    #[test]
    fn views_cross_threads() {
        let mut l = Landing::new(1 << 16);
        let slot = l.claim(0, 1 << 16).unwrap();
        // A receive completing on another thread, read back here.
        let bytes = std::thread::spawn(move || fill(slot, 5)).join().unwrap();
        assert!(bytes.iter().all(|&b| b == 5));
        assert_eq!(l.join([(0, &bytes)]).unwrap().len(), 1 << 16);
    }

    #[test]
    fn fill_from_copies_a_payload_of_the_slots_length() {
        let mut l = Landing::new(8);
        let slot = l.claim(2, 4).unwrap();
        let slot = slot.fill_from(&[1, 2, 3]).expect_err("too short");
        let filled = slot.fill_from(&[4, 5, 6, 7]).expect("fits");
        assert_eq!(&filled.into_bytes()[..], &[4, 5, 6, 7]);
    }

    #[test]
    fn a_filled_slot_behind_its_head_is_the_whole_frame() {
        let mut l = Landing::new(4);
        let filled = l.claim(0, 4).unwrap().fill_from(&[5, 6, 7, 8]).unwrap();
        assert_eq!(filled.behind(&[1, 2]), [1, 2, 5, 6, 7, 8]);
    }

    #[test]
    fn lent_memory_is_released_once_after_the_last_view() {
        use core::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc as StdArc;
        let mut owned = vec![0u8; 64];
        let releases = StdArc::new(AtomicUsize::new(0));
        let counted = StdArc::clone(&releases);
        let ptr = NonNull::new(owned.as_mut_ptr()).unwrap();
        // SAFETY: `owned` outlives the landing and its views (checked by the count
        // below before it is read), and nothing else writes it meanwhile.
        let mut l = unsafe {
            Landing::lent(ptr, 64, move || {
                counted.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert!(l.is_lent() && l.is_untouched());
        let a = fill(l.claim(0, 32).unwrap(), 1);
        let b = fill(l.claim(32, 32).unwrap(), 2);
        assert!(!l.is_untouched());
        let whole = l.join([(0, &a), (32, &b)]).unwrap();
        assert_eq!(whole.as_ptr(), owned.as_ptr(), "landed in the lent memory");
        drop((l, a, b));
        assert_eq!(releases.load(Ordering::SeqCst), 0, "a view still holds it");
        drop(whole);
        assert_eq!(releases.load(Ordering::SeqCst), 1);
        assert_eq!(&owned[..32], &[1u8; 32][..]);
        assert_eq!(&owned[32..], &[2u8; 32][..]);
    }

    #[test]
    fn a_lent_vector_comes_back_whole_after_the_last_view() {
        use std::sync::{Arc as StdArc, Mutex};
        let back = StdArc::new(Mutex::new(None));
        let slot = StdArc::clone(&back);
        let mut vec = Vec::with_capacity(40);
        vec.resize(32, 0u8);
        let mut l = Landing::lent_vec(vec, move |v| *slot.lock().unwrap() = Some(v));
        assert_eq!(l.len(), 32);
        let whole = l.fill_whole([&[7u8; 32][..]]).unwrap();
        drop(l);
        assert!(back.lock().unwrap().is_none(), "the view holds it");
        drop(whole);
        let v = back.lock().unwrap().take().expect("given back");
        assert_eq!((v.len(), v.capacity()), (32, 40));
        assert!(v.iter().all(|&b| b == 7));
    }

    #[test]
    fn fill_whole_copies_pieces_that_cover_an_untouched_buffer() {
        let mut l = Landing::new(6);
        assert!(
            l.fill_whole([&[1u8, 2][..], &[3][..]]).is_none(),
            "too short"
        );
        let whole = l.fill_whole([&[1u8, 2][..], &[3, 4, 5, 6][..]]).unwrap();
        assert_eq!(&whole[..], &[1, 2, 3, 4, 5, 6]);
        assert!(l.fill_whole([&[0u8; 6][..]]).is_none(), "filled already");
        let mut m = Landing::new(4);
        let _slot = m.claim(1, 1).unwrap();
        assert!(
            m.fill_whole([&[0u8; 4][..]]).is_none(),
            "a range is claimed"
        );
        assert_eq!(Landing::new(0).fill_whole([]).unwrap().len(), 0);
    }

    #[test]
    fn an_empty_landing_joins_to_nothing() {
        let mut l = Landing::new(0);
        assert!(l.is_empty());
        assert!(l.claim(0, 0).is_none());
        assert_eq!(l.join([]).unwrap().len(), 0);
    }
}
