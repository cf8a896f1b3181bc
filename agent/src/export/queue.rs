//! The retry queue: encoded requests waiting to be sent, oldest first.
//!
//! The exporter only talks to the [`Spool`] trait, so the in-memory [`MemoryQueue`] can be
//! swapped for a disk spool (`--buffer-dir`) without touching the exporter.

use std::collections::VecDeque;

/// Requests kept in memory by default while the endpoint is down (about 20 minutes of 5 s
/// ticks).
pub const DEFAULT_QUEUE_CAPACITY: usize = 256;

/// One export request, encoded (protobuf, then gzip) and ready to POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Increasing number given by the exporter, to recognise a request in the queue.
    pub seq: u64,
    /// The gzip-compressed protobuf body.
    pub body: Vec<u8>,
}

/// A FIFO of encoded requests with a bound; the oldest is dropped when it is full.
pub trait Spool: Send {
    /// Append `item`. When the spool is full the oldest request is dropped, counted, and
    /// returned.
    fn push(&mut self, item: Encoded) -> Option<Encoded>;
    /// The oldest request, the next one to send.
    fn front(&self) -> Option<&Encoded>;
    /// The oldest requests, in order: at least the front (when there is one), then more while
    /// there are fewer than `max_items` and their bodies add up to at most `max_bytes`. The
    /// exporter sends them as one batch; they stay queued until popped.
    fn peek(&self, max_items: usize, max_bytes: u64) -> Vec<Encoded> {
        let _ = (max_items, max_bytes);
        self.front().cloned().into_iter().collect()
    }
    /// Remove and return the oldest request (after it was sent or rejected for good).
    fn pop_front(&mut self) -> Option<Encoded>;
    /// Requests waiting.
    fn len(&self) -> usize;
    /// Whether nothing is waiting.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Requests dropped because the spool was full, since it was created.
    fn dropped(&self) -> u64;
    /// Bytes of the requests waiting.
    fn bytes(&self) -> u64;
    /// The highest `seq` held, so that a new exporter numbers its requests after it.
    fn last_seq(&self) -> Option<u64> {
        None
    }
}

/// A [`Spool`] in memory: lost when the agent stops.
#[derive(Debug)]
pub struct MemoryQueue {
    items: VecDeque<Encoded>,
    capacity: usize,
    dropped: u64,
    bytes: u64,
}

impl MemoryQueue {
    /// A queue holding at most `capacity` requests (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        MemoryQueue {
            items: VecDeque::with_capacity(capacity.min(64)),
            capacity,
            dropped: 0,
            bytes: 0,
        }
    }
}

impl Default for MemoryQueue {
    fn default() -> Self {
        MemoryQueue::new(DEFAULT_QUEUE_CAPACITY)
    }
}

impl Spool for MemoryQueue {
    fn push(&mut self, item: Encoded) -> Option<Encoded> {
        let evicted = if self.items.len() >= self.capacity {
            self.dropped += 1;
            self.pop_front()
        } else {
            None
        };
        self.bytes += item.body.len() as u64;
        self.items.push_back(item);
        debug_assert!(self.items.len() <= self.capacity);
        evicted
    }

    fn front(&self) -> Option<&Encoded> {
        self.items.front()
    }

    fn peek(&self, max_items: usize, max_bytes: u64) -> Vec<Encoded> {
        let mut out: Vec<Encoded> = Vec::new();
        let mut bytes = 0u64;
        for item in &self.items {
            let size = item.body.len() as u64;
            if !out.is_empty() && (out.len() >= max_items || bytes + size > max_bytes) {
                break;
            }
            bytes += size;
            out.push(item.clone());
        }
        out
    }

    fn pop_front(&mut self) -> Option<Encoded> {
        let item = self.items.pop_front()?;
        self.bytes -= item.body.len() as u64;
        Some(item)
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn dropped(&self) -> u64 {
        self.dropped
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(seq: u64) -> Encoded {
        Encoded {
            seq,
            body: vec![seq as u8],
        }
    }

    #[test]
    fn fifo_order() {
        let mut q = MemoryQueue::new(4);
        for i in 0..3 {
            assert!(q.push(item(i)).is_none());
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.front().map(|e| e.seq), Some(0));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_front().map(|e| e.seq)).collect();
        assert_eq!(order, vec![0, 1, 2]);
        assert!(q.is_empty());
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn bounded_drops_oldest_and_counts() {
        let mut q = MemoryQueue::new(3);
        let mut evicted = Vec::new();
        for i in 0..7 {
            if let Some(e) = q.push(item(i)) {
                evicted.push(e.seq);
            }
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(), 4);
        assert_eq!(evicted, vec![0, 1, 2, 3]);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_front().map(|e| e.seq)).collect();
        assert_eq!(order, vec![4, 5, 6]);
    }

    #[test]
    fn peek_takes_the_oldest_within_bounds() {
        let mut q = MemoryQueue::new(8);
        assert!(q.peek(4, 100).is_empty());
        for i in 0..5 {
            q.push(item(i));
        }
        let seqs = |v: Vec<Encoded>| v.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(seqs(q.peek(3, 100)), vec![0, 1, 2]);
        assert_eq!(seqs(q.peek(10, 2)), vec![0, 1]);
        // The front always comes, even over the byte bound.
        assert_eq!(seqs(q.peek(10, 0)), vec![0]);
        assert_eq!(q.len(), 5, "peek leaves the queue as it was");
    }

    #[test]
    fn capacity_at_least_one() {
        let mut q = MemoryQueue::new(0);
        q.push(item(1));
        q.push(item(2));
        assert_eq!(q.len(), 1);
        assert_eq!(q.front().map(|e| e.seq), Some(2));
    }
}
