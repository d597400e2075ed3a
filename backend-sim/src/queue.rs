//! The simulator's event queue: a calendar queue ordered by `(time, insertion order)`.
//!
//! Time (integer nanoseconds) is cut into buckets of `2^WIDTH_SHIFT` ns; a ring of
//! `BUCKETS` buckets covers the near future (about 67 ms), a binary heap holds what lies
//! beyond. Pushing into a future bucket is an append; a bucket is sorted once when the
//! clock reaches it; pushes into the bucket being drained go to a small side heap that
//! is merged on pop. So the cost per event is an append plus a share of a sort of a
//! cache-sized bucket, instead of `O(log len)` cache misses in one big heap — it matters
//! when tens of millions of heartbeats and notices are in flight.
//!
//! Order is total and deterministic: equal times pop in insertion order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const WIDTH_SHIFT: u32 = 10;
const BUCKETS: u64 = 1 << 16;
const MASK: u64 = BUCKETS - 1;
/// A drained bucket keeps at most this many slots of capacity.
const KEEP_CAPACITY: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Entry<T> {
    time: u64,
    seq: u64,
    item: T,
}

impl<T> Entry<T> {
    fn key(&self) -> (u64, u64) {
        (self.time, self.seq)
    }
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// A min-queue of `(time, item)`, FIFO among equal times.
#[derive(Debug)]
pub struct EventQueue<T> {
    buckets: Vec<Vec<Entry<T>>>,
    /// Absolute index (`time >> WIDTH_SHIFT`) of the bucket being drained.
    current: u64,
    /// The current bucket, sorted, and how far it is drained.
    run: Vec<Entry<T>>,
    run_pos: usize,
    side: BinaryHeap<Reverse<Entry<T>>>,
    overflow: BinaryHeap<Reverse<Entry<T>>>,
    in_ring: usize,
    len: usize,
    seq: u64,
}

impl<T: Copy> Default for EventQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> EventQueue<T> {
    /// An empty queue whose clock starts at 0.
    pub fn new() -> Self {
        EventQueue {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            current: 0,
            run: Vec::new(),
            run_pos: 0,
            side: BinaryHeap::new(),
            overflow: BinaryHeap::new(),
            in_ring: 0,
            len: 0,
            seq: 0,
        }
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item` at `time`. A time before the last popped one is treated as that
    /// one (the clock never goes back).
    pub fn push(&mut self, time: u64, item: T) {
        let entry = Entry {
            time,
            seq: self.seq,
            item,
        };
        self.seq += 1;
        self.len += 1;
        let bucket = time >> WIDTH_SHIFT;
        if bucket <= self.current {
            self.side.push(Reverse(entry));
        } else if bucket < self.current + BUCKETS {
            self.buckets[(bucket & MASK) as usize].push(entry);
            self.in_ring += 1;
        } else {
            self.overflow.push(Reverse(entry));
        }
    }

    /// The time of the next item, without removing it.
    pub fn peek_time(&mut self) -> Option<u64> {
        self.fill()?;
        let run = self.run.get(self.run_pos).map(|e| e.time);
        let side = self.side.peek().map(|e| e.0.time);
        match (run, side) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An item `ahead` places after the next one in the current bucket's sorted run, if
    /// there is one: a hint of what comes soon (items pushed meanwhile may come first).
    pub fn upcoming(&self, ahead: usize) -> Option<&T> {
        self.run.get(self.run_pos + ahead).map(|e| &e.item)
    }

    /// Removes and returns the next `(time, item)`.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        self.fill()?;
        let from_run = match (self.run.get(self.run_pos), self.side.peek()) {
            (Some(r), Some(s)) => r.key() < s.0.key(),
            (Some(_), None) => true,
            (None, _) => false,
        };
        let entry = if from_run {
            self.run_pos += 1;
            self.run[self.run_pos - 1]
        } else {
            self.side.pop()?.0
        };
        self.len -= 1;
        Some((entry.time, entry.item))
    }

    /// Makes sure the current bucket (run or side heap) holds the next item, advancing
    /// the ring as needed. `None` when the queue is empty.
    fn fill(&mut self) -> Option<()> {
        loop {
            if self.run_pos < self.run.len() || !self.side.is_empty() {
                return Some(());
            }
            if self.len == 0 {
                return None;
            }
            if self.in_ring == 0 {
                // Nothing in the near future: jump to the earliest far event.
                let next = self.overflow.peek()?.0.time >> WIDTH_SHIFT;
                self.current = next.max(self.current + 1);
            } else {
                self.current += 1;
            }
            while let Some(top) = self.overflow.peek() {
                let bucket = top.0.time >> WIDTH_SHIFT;
                if bucket >= self.current + BUCKETS {
                    break;
                }
                let Some(Reverse(entry)) = self.overflow.pop() else {
                    break;
                };
                if bucket <= self.current {
                    self.side.push(Reverse(entry));
                } else {
                    self.buckets[(bucket & MASK) as usize].push(entry);
                    self.in_ring += 1;
                }
            }
            let slot = (self.current & MASK) as usize;
            std::mem::swap(&mut self.run, &mut self.buckets[slot]);
            let old = &mut self.buckets[slot];
            old.clear();
            if old.capacity() > KEEP_CAPACITY {
                old.shrink_to(KEEP_CAPACITY);
            }
            self.in_ring -= self.run.len();
            self.run_pos = 0;
            self.run.sort_unstable_by_key(Entry::key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order_like_a_heap() {
        let mut rng: u64 = 12345;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut q = EventQueue::new();
        let mut reference = BinaryHeap::new();
        let mut seq = 0u64;
        let mut now = 0u64;
        for round in 0..20_000u64 {
            let pushes = next() % 3;
            for _ in 0..pushes {
                let delay = match next() % 4 {
                    0 => 0,
                    1 => next() % 2_000,
                    2 => next() % 200_000_000,
                    _ => next() % 5_000_000,
                };
                q.push(now + delay, round);
                reference.push(Reverse((now + delay, seq, round)));
                seq += 1;
            }
            if next() % 2 == 0 {
                let got = q.pop();
                let want = reference.pop().map(|Reverse((t, _, r))| (t, r));
                assert_eq!(got, want);
                if let Some((t, _)) = got {
                    now = t;
                }
            }
            assert_eq!(q.len(), reference.len());
        }
        while let Some(Reverse((t, _, r))) = reference.pop() {
            assert_eq!(q.pop(), Some((t, r)));
        }
        assert!(q.pop().is_none());
    }
}
