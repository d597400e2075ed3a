//! [`ReceivePool`]: the buffers payload receives land in, kept for the next receives
//! once the protocol lets go of them.
//!
//! A received payload is handed to the protocol as a [`Bytes`] (the broadcaster keeps
//! and forwards slices of it), so the transport cannot reuse its buffer at once. The
//! pool's [`Bytes`] own their buffer through a `Pooled` owner that puts it back on the
//! pool's shelf when the last clone drops, on whichever thread that happens. Without
//! it every payload would be a fresh allocation: glibc gives large freed blocks back to
//! the system, so each repetition of a multi-MiB broadcast would fault its pages in
//! again.
//!
//! Invariants: the shelf holds at most [`KEEP_BUFFERS`] buffers of at most
//! [`KEEP_BYTES`] capacity in all, every one empty (length 0); a buffer handed out by
//! [`ReceivePool::take`] is empty with at least the capacity asked for. A buffer that
//! comes back when the shelf is full, or after the pool itself is gone, is freed.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;

/// The most capacity the shelf keeps idle, in bytes.
pub const KEEP_BYTES: usize = 128 << 20;
/// The most buffers the shelf keeps idle.
pub const KEEP_BUFFERS: usize = 512;

/// Idle receive buffers: see the [module docs](self).
#[derive(Debug, Default)]
pub struct ReceivePool {
    shelf: Arc<Mutex<Shelf>>,
}

#[derive(Debug, Default)]
struct Shelf {
    buffers: Vec<Vec<u8>>,
    /// The capacities of `buffers`, summed.
    bytes: usize,
}

impl ReceivePool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer of at least `capacity` bytes: the smallest idle one that fits,
    /// else a new one. The second value says whether it was reused.
    pub fn take(&self, capacity: usize) -> (Vec<u8>, bool) {
        let mut shelf = self.shelf.lock().unwrap_or_else(PoisonError::into_inner);
        let best = shelf
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buffer = shelf.buffers.swap_remove(i);
                shelf.bytes -= buffer.capacity();
                (buffer, true)
            }
            None => (Vec::with_capacity(capacity), false),
        }
    }

    /// `frame` as a shared buffer whose allocation comes back to this pool when the
    /// last clone of it drops.
    pub fn share(&self, frame: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            frame,
            shelf: Arc::downgrade(&self.shelf),
        })
    }

    /// Idle buffers and their capacity in bytes.
    pub fn idle(&self) -> (usize, usize) {
        let shelf = self.shelf.lock().unwrap_or_else(PoisonError::into_inner);
        (shelf.buffers.len(), shelf.bytes)
    }
}

/// A received frame lent to [`Bytes`]; back to the shelf on drop.
struct Pooled {
    frame: Vec<u8>,
    shelf: Weak<Mutex<Shelf>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(shelf) = self.shelf.upgrade() else {
            return;
        };
        let mut shelf = shelf.lock().unwrap_or_else(PoisonError::into_inner);
        let capacity = self.frame.capacity();
        if shelf.buffers.len() < KEEP_BUFFERS && shelf.bytes + capacity <= KEEP_BYTES {
            let mut frame = std::mem::take(&mut self.frame);
            frame.clear();
            shelf.bytes += capacity;
            shelf.buffers.push(frame);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_clone_drops() {
        let pool = ReceivePool::new();
        let (mut buffer, reused) = pool.take(1000);
        assert!(!reused);
        buffer.extend_from_slice(&[7; 600]);
        let bytes = pool.share(buffer);
        let slice = bytes.slice(100..200);
        drop(bytes);
        assert_eq!(pool.idle().0, 0, "a slice still holds it");
        assert_eq!(&slice[..], &[7; 100]);
        drop(slice);
        let (count, idle) = pool.idle();
        assert_eq!(count, 1);
        assert!(idle >= 1000);
        let (again, reused) = pool.take(800);
        assert!(reused && again.is_empty() && again.capacity() >= 1000);
        assert_eq!(pool.idle(), (0, 0));
    }

    #[test]
    fn take_picks_the_smallest_that_fits() {
        let pool = ReceivePool::new();
        for size in [4096, 1 << 20, 64 << 10] {
            drop(pool.share(Vec::with_capacity(size)));
        }
        let (buffer, reused) = pool.take(60 << 10);
        assert!(reused);
        assert!(buffer.capacity() >= 64 << 10 && buffer.capacity() < 1 << 20);
        let (buffer, reused) = pool.take(2 << 20);
        assert!(!reused && buffer.capacity() >= 2 << 20);
    }

    #[test]
    fn the_shelf_keeps_no_more_than_its_budget() {
        let pool = ReceivePool::new();
        let big = KEEP_BYTES / 2 + 1;
        drop(pool.share(Vec::with_capacity(big)));
        drop(pool.share(Vec::with_capacity(big)));
        let (count, bytes) = pool.idle();
        assert_eq!(count, 1);
        assert!(bytes <= KEEP_BYTES);
        for _ in 0..KEEP_BUFFERS + 10 {
            drop(pool.share(Vec::with_capacity(16)));
        }
        assert!(pool.idle().0 <= KEEP_BUFFERS);
    }

    #[test]
    fn a_buffer_outliving_its_pool_is_freed() {
        let pool = ReceivePool::new();
        let bytes = pool.share(vec![1, 2, 3]);
        drop(pool);
        assert_eq!(&bytes[..], &[1, 2, 3]);
        drop(bytes);
    }

    #[test]
    fn buffers_come_back_from_other_threads() {
        let pool = ReceivePool::new();
        let bytes = pool.share(Vec::with_capacity(4096));
        std::thread::spawn(move || drop(bytes)).join().unwrap();
        assert_eq!(pool.idle().0, 1);
    }
}
