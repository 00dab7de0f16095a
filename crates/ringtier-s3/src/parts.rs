//! [`PartPool`]: the part buffers of a tier's uploads, reused.
//!
//! A part is `part_size` bytes (8 MiB by default) gathered from the writer's `write_at` calls
//! and handed to the HTTP client as `Bytes`. A fresh allocation per part costs a page fault per
//! 4 KiB the first time it is written (on the project's VMs first touch runs at about 1.6 GiB/s,
//! slower than the copy itself: it was a sixth of the drain's CPU, `bench/results/s3/`). The
//! pool keeps buffers whose pages are already mapped: a part's buffer goes back to the pool when
//! the request that sent it drops its body.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Writers at once whose part buffers a tier's pool keeps for reuse: the DCP writer's default
/// `save_parallelism` (parts of a checkpoint saved at once), so that its parts reuse mapped pages.
pub(crate) const WRITERS_KEPT: usize = 4;

/// Reusable part buffers of one tier (shared by its writers).
#[derive(Debug)]
pub(crate) struct PartPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers kept at most (more are freed on return).
    keep: usize,
    /// Capacity of a new buffer.
    capacity: usize,
}

impl PartPool {
    /// A pool keeping at most `keep` buffers of `capacity` bytes.
    pub(crate) fn new(keep: usize, capacity: usize) -> Arc<Self> {
        Arc::new(PartPool { free: Mutex::new(Vec::new()), keep, capacity })
    }

    /// An empty buffer (with `capacity` bytes reserved): a returned one when there is one.
    pub(crate) fn take(&self) -> Vec<u8> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        reused.unwrap_or_else(|| {
            tracing::debug!(bytes = self.capacity, "s3: a new part buffer");
            Vec::with_capacity(self.capacity)
        })
    }

    /// Gives `buf` back (kept when the pool has room and it is not oversized).
    pub(crate) fn put(&self, mut buf: Vec<u8>) {
        if buf.capacity() < self.capacity || buf.capacity() > 2 * self.capacity {
            if buf.capacity() > 0 {
                tracing::debug!(bytes = buf.capacity(), "s3: a part buffer of an odd size freed");
            }
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.keep {
            free.push(buf);
        }
    }

    /// `buf` as `Bytes` without a copy; the buffer comes back to the pool when the last
    /// `Bytes` of it is dropped.
    pub(crate) fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled { buf, pool: Arc::downgrade(self) })
    }

    /// Buffers held for reuse (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A part buffer lent out as `Bytes`.
struct Pooled {
    buf: Vec<u8>,
    pool: Weak<PartPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_buffer_comes_back_when_its_last_bytes_is_dropped() {
        let pool = PartPool::new(2, 64);
        let mut b = pool.take();
        b.extend_from_slice(&[7u8; 64]);
        let ptr = b.as_ptr();
        let bytes = pool.freeze(b);
        let clone = bytes.slice(8..16);
        assert_eq!(&bytes[..], &[7u8; 64][..]);
        drop(bytes);
        assert_eq!(pool.held(), 0, "a slice still holds it");
        assert_eq!(&clone[..], &[7u8; 8][..]);
        drop(clone);
        assert_eq!(pool.held(), 1);
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), ptr, "the same allocation is reused");
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit_and_skips_odd_sizes() {
        let pool = PartPool::new(1, 64);
        pool.put(Vec::with_capacity(64));
        pool.put(Vec::with_capacity(64));
        assert_eq!(pool.held(), 1);
        let pool = PartPool::new(4, 64);
        pool.put(Vec::with_capacity(8));
        pool.put(Vec::with_capacity(1024));
        assert_eq!(pool.held(), 0);
        let b = pool.take();
        drop(pool);
        // A buffer outliving its pool is simply freed.
        let p2 = PartPool::new(1, 64);
        let bytes = p2.freeze(b);
        drop(p2);
        drop(bytes);
    }
}
