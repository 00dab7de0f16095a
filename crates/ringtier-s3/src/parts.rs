//! [`PartPool`]: the part buffers of a tier's uploads, reused.
//!
//! A part is `part_size` bytes (8 MiB by default) gathered from the writer's `write_at` calls
//! and handed to the HTTP client as `Bytes`. A fresh allocation per part costs a page fault per
//! 4 KiB the first time it is written (on the project's VMs first touch runs at about 1.6 GiB/s,
//! slower than the copy itself: it was a sixth of the drain's CPU, `bench/results/s3/`). The
//! pool keeps buffers whose pages are already mapped: a part's buffer goes back to the pool when
//! the request that sent it drops its body.
//!
//! Part buffers are [`PartBuf`]s: page-aligned memory (ringtier-core's [`AlignedBuf`]), not a
//! `Vec`. glibc serves an 8 MiB `Vec` from `mmap` 16 bytes past a page boundary, and a copy
//! into a destination that far off a page (from page-aligned tensors, or out of it into a
//! socket) runs on a slow path of `rep movsb` (docs/MEASURING.md's slow-copy trap): it was 19%
//! of a DCP save's client CPU (`bench/results/python-dcp-s3-tmpfs.md`).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use ringtier_core::buf::MIN_BUFFER_ALIGN;
use ringtier_core::AlignedBuf;

/// A growable byte buffer on page-aligned memory, with the subset of `Vec<u8>`'s API the
/// writer uses. Empty ones (`Default`) hold no memory.
#[derive(Debug, Default)]
pub(crate) struct PartBuf {
    buf: Option<AlignedBuf>,
}

impl PartBuf {
    /// An empty buffer with room for `capacity` bytes, page-aligned.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut b = PartBuf::default();
        b.reserve(capacity);
        b
    }

    /// Bytes of memory held.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, AlignedBuf::capacity)
    }

    /// Makes room for `additional` more bytes (a larger aligned buffer, the data copied, when
    /// needed; at least doubling, as a `Vec` grows).
    fn reserve(&mut self, additional: usize) {
        let len = self.len();
        let need = len.saturating_add(additional);
        if need <= self.capacity() {
            return;
        }
        let cap = need.max(self.capacity().saturating_mul(2));
        let mut fresh = match AlignedBuf::new(cap, MIN_BUFFER_ALIGN) {
            Ok(b) => b,
            // Out of memory: what `Vec` does too.
            Err(_) => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(cap, MIN_BUFFER_ALIGN)
                    .unwrap_or_else(|_| std::alloc::Layout::new::<[u8; MIN_BUFFER_ALIGN]>()),
            ),
        };
        if let Some(old) = self.buf.take() {
            fresh.capacity_mut()[..len].copy_from_slice(old.as_slice());
        }
        self.buf = Some(fresh);
        self.set_len(len);
    }

    fn set_len(&mut self, len: usize) {
        if let Some(b) = self.buf.as_mut() {
            // Callers keep len <= capacity; a failure would leave the window unchanged.
            let r = b.set_window(0, len);
            debug_assert!(r.is_ok());
        }
    }

    /// Appends `data`.
    pub(crate) fn extend_from_slice(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.reserve(data.len());
        let len = self.len();
        if let Some(b) = self.buf.as_mut() {
            b.capacity_mut()[len..len + data.len()].copy_from_slice(data);
        }
        self.set_len(len + data.len());
    }

    /// Grows to `new_len` bytes, filling with `value` (or shortens, as `truncate`).
    pub(crate) fn resize(&mut self, new_len: usize, value: u8) {
        let len = self.len();
        if new_len <= len {
            self.truncate(new_len);
            return;
        }
        self.reserve(new_len - len);
        if let Some(b) = self.buf.as_mut() {
            b.capacity_mut()[len..new_len].fill(value);
        }
        self.set_len(new_len);
    }

    /// Keeps the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.set_len(len);
        }
    }

    /// Empties it, keeping the memory.
    pub(crate) fn clear(&mut self) {
        self.set_len(0);
    }
}

impl Deref for PartBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], AlignedBuf::as_slice)
    }
}

impl DerefMut for PartBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self.buf.as_mut() {
            Some(b) => b.as_mut_slice(),
            None => &mut [],
        }
    }
}

/// Writers at once whose part buffers a tier's pool keeps for reuse: the DCP writer's default
/// `save_parallelism` (parts of a checkpoint saved at once), so that its parts reuse mapped pages.
pub(crate) const WRITERS_KEPT: usize = 4;

/// Reusable part buffers of one tier (shared by its writers).
#[derive(Debug)]
pub(crate) struct PartPool {
    free: Mutex<Vec<PartBuf>>,
    /// Buffers kept at most (more are freed on return).
    keep: usize,
    /// Capacity of a new buffer.
    capacity: usize,
}

impl PartPool {
    /// A pool keeping at most `keep` buffers of `capacity` bytes.
    pub(crate) fn new(keep: usize, capacity: usize) -> Arc<Self> {
        // Buffers are whole pages.
        let capacity = capacity.div_ceil(MIN_BUFFER_ALIGN).max(1) * MIN_BUFFER_ALIGN;
        Arc::new(PartPool { free: Mutex::new(Vec::new()), keep, capacity })
    }

    /// An empty buffer (with `capacity` bytes reserved): a returned one when there is one.
    pub(crate) fn take(&self) -> PartBuf {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        reused.unwrap_or_else(|| {
            tracing::debug!(bytes = self.capacity, "s3: a new part buffer");
            PartBuf::with_capacity(self.capacity)
        })
    }

    /// Gives `buf` back (kept when the pool has room and it is not oversized).
    pub(crate) fn put(&self, mut buf: PartBuf) {
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
    pub(crate) fn freeze(self: &Arc<Self>, buf: PartBuf) -> Bytes {
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
    buf: PartBuf,
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

/// Writers' buffers sent as parts without a copy ([`LentPool::lend`]), and the buffers handed
/// back to writers in their place.
///
/// `write_at` hands the tier a whole chunk (32 MiB for a checkpoint save) of page-aligned
/// memory; copying it into part buffers was a fifth of a DCP save's client CPU
/// (`bench/results/python-dcp-s3-tmpfs-*.md`). Instead, whole parts are sent as slices of the
/// caller's buffer, and the caller gets an equal buffer from here at once; its own comes back
/// here when the last part cut from it has been sent. Buffers kept here have their pages
/// mapped: a new one costs a page fault per 4 KiB when first written.
#[derive(Debug)]
pub(crate) struct LentPool {
    free: Mutex<Vec<AlignedBuf>>,
    /// Bytes kept at most (more are freed on return).
    keep_bytes: usize,
}

impl LentPool {
    /// A pool keeping at most `keep_bytes` of buffers.
    pub(crate) fn new(keep_bytes: usize) -> Arc<Self> {
        Arc::new(LentPool { free: Mutex::new(Vec::new()), keep_bytes })
    }

    /// An empty buffer of `capacity` bytes aligned to `align`: a returned one when there is
    /// one of that shape.
    pub(crate) fn take(&self, capacity: usize, align: usize) -> ringtier_core::Result<AlignedBuf> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.iter().position(|b| b.capacity() == capacity && b.align() == align) {
            let mut b = free.swap_remove(i);
            b.clear();
            return Ok(b);
        }
        drop(free);
        tracing::debug!(bytes = capacity, "s3: a new buffer in place of one lent");
        AlignedBuf::new(capacity, align)
    }

    /// Gives `buf` back. Within the byte limit the oldest buffers make room for it (writers of
    /// another shape, say objects of other sizes, leave nothing held for good); one larger than
    /// the limit is freed.
    fn put(&self, buf: AlignedBuf) {
        if buf.capacity() > self.keep_bytes {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut held: usize = free.iter().map(AlignedBuf::capacity).sum();
        while held + buf.capacity() > self.keep_bytes && !free.is_empty() {
            held -= free.remove(0).capacity();
        }
        free.push(buf);
    }

    /// The data window of `buf` as `Bytes` without a copy; the buffer comes to this pool when
    /// the last `Bytes` of it is dropped.
    pub(crate) fn lend(self: &Arc<Self>, buf: AlignedBuf) -> Bytes {
        Bytes::from_owner(Lent { buf: Some(buf), pool: Arc::downgrade(self) })
    }

    /// Buffers held for reuse (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A writer's buffer lent out as `Bytes`.
struct Lent {
    buf: Option<AlignedBuf>,
    pool: Weak<LentPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], AlignedBuf::as_slice)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(pool), Some(buf)) = (self.pool.upgrade(), self.buf.take()) {
            pool.put(buf);
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
    fn a_lent_buffer_comes_back_for_the_next_writer_once_its_slices_are_dropped() {
        let pool = LentPool::new(2 * 8192);
        let mut b = pool.take(8192, 4096).expect("buffer");
        b.fill_from(&[5u8; 6000]).expect("fill");
        let ptr = b.as_ptr();
        let bytes = pool.lend(b);
        assert_eq!(bytes.len(), 6000);
        let (first, second) = (bytes.slice(..4096), bytes.slice(4096..));
        drop(bytes);
        drop(first);
        assert_eq!(pool.held(), 0, "a slice still holds it");
        assert_eq!(&second[..], &[5u8; 1904][..]);
        drop(second);
        assert_eq!(pool.held(), 1);
        // Another shape is a new buffer; the same shape is the one given back, emptied.
        assert_ne!(pool.take(16384, 4096).expect("other").as_ptr(), ptr);
        let again = pool.take(8192, 4096).expect("again");
        assert_eq!((again.as_ptr(), again.len()), (ptr, 0));
        // At most its byte limit is kept, the newest first: a buffer of another shape makes room.
        for _ in 0..3 {
            drop(pool.lend(AlignedBuf::new(8192, 4096).expect("b")));
        }
        assert_eq!(pool.held(), 2);
        drop(pool.lend(AlignedBuf::new(12288, 4096).expect("b")));
        assert_eq!(pool.held(), 1, "both older ones made room");
        assert!(pool.take(12288, 4096).is_ok_and(|b| b.capacity() == 12288));
        drop(pool.lend(AlignedBuf::new(65536, 4096).expect("b")));
        assert_eq!(pool.held(), 0, "larger than the limit: freed");
        // A buffer outliving its pool is simply freed.
        let bytes = pool.lend(again);
        drop(pool);
        drop(bytes);
    }

    #[test]
    fn part_buffers_are_page_aligned_and_grow_like_a_vec() {
        let pool = PartPool::new(1, 8192);
        let mut b = pool.take();
        assert_eq!(b.as_ptr() as usize % MIN_BUFFER_ALIGN, 0);
        assert_eq!(b.capacity(), 8192);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        b.extend_from_slice(&data[..5000]);
        b.extend_from_slice(&data[5000..]);
        assert!(b.capacity() >= 20_000);
        assert_eq!(b.as_ptr() as usize % MIN_BUFFER_ALIGN, 0, "still aligned after growing");
        assert_eq!(&b[..], &data[..]);
        b[3] ^= 0xff;
        assert_ne!(b[3], data[3]);
        b.truncate(100);
        assert_eq!(b.len(), 100);
        b.resize(150, 0);
        assert_eq!(&b[100..], &[0u8; 50][..]);
        assert_eq!(&b[..3], &data[..3]);
        b.clear();
        assert!(b.is_empty());
        let empty = PartBuf::default();
        assert_eq!((empty.len(), empty.capacity()), (0, 0));
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit_and_skips_odd_sizes() {
        let pool = PartPool::new(1, 64);
        pool.put(PartBuf::with_capacity(64));
        pool.put(PartBuf::with_capacity(64));
        assert_eq!(pool.held(), 1);
        let pool = PartPool::new(4, 8192);
        pool.put(PartBuf::with_capacity(8));
        pool.put(PartBuf::with_capacity(64 << 10));
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
