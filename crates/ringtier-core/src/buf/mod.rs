//! Aligned, owned I/O buffers and a pool of them allocated once.
//!
//! An [`AlignedBuf`] is handed to a tier by value and handed back with the result, so the
//! kernel never holds a borrow. Its memory is always initialised (zeroed at allocation), so
//! the whole capacity can be exposed as a byte slice. The valid data is a window
//! `[head, head + len)` inside the capacity: a Direct-I/O read of an unaligned range reads the
//! aligned span around it and sets `head` to where the asked-for bytes start, with no copy.
//!
//! A [`BufferPool`] carves one slab into equal buffers, touches every page once at creation
//! (first-touch page faults are slower than the disk) and recycles buffers on drop. The slab
//! may also be memory allocated elsewhere (pinned host memory), and the uring tier registers
//! the same slab as fixed buffers: a pooled buffer knows its pool id and index.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, ErrorKind, Result};

mod region;
pub use region::{alloc_touched, Region, HUGE_PAGE};

/// Rounds `v` down to a multiple of `align` (a power of two).
#[inline]
pub fn align_down(v: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    v & !(align - 1)
}

/// Rounds `v` up to a multiple of `align` (a power of two).
#[inline]
pub fn align_up(v: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (v + align - 1) & !(align - 1)
}

/// The aligned span a Direct-I/O read of `[offset, offset + len)` must cover.
///
/// Returns `(aligned_offset, span_len, head)`: read `span_len` bytes at `aligned_offset`, and
/// the asked-for bytes start `head` bytes into the buffer.
#[inline]
pub fn direct_span(offset: u64, len: usize, align: u64) -> (u64, usize, usize) {
    let start = align_down(offset, align);
    let end = align_up(offset + len as u64, align);
    (start, (end - start) as usize, (offset - start) as usize)
}

/// The smallest alignment every buffer gets: a page. Copies into buffers that start just past
/// a page boundary are several times slower on common CPUs, so buffers never do.
pub const MIN_BUFFER_ALIGN: usize = 4096;

fn check_align(align: usize) -> Result<usize> {
    if !align.is_power_of_two() {
        return Err(Error::new(ErrorKind::InvalidInput, format!("alignment {align} is not a power of two")));
    }
    Ok(align.max(MIN_BUFFER_ALIGN))
}

enum Origin {
    /// Allocated by [`AlignedBuf::new`] (taken when freed).
    Own(Option<Region>),
    /// Slot `index` of a pool; returned to the pool on drop.
    Pool { pool: Arc<PoolShared>, index: u32 },
    /// Memory owned elsewhere; the callback releases it.
    Foreign(Option<Box<dyn FnOnce() + Send + Sync>>),
}

/// An owned, aligned, initialised byte buffer with a window of valid data.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    align: usize,
    head: usize,
    len: usize,
    origin: Origin,
}

// SAFETY: AlignedBuf uniquely owns its memory (or, for pool slots, exclusively owns one slot
// of the slab); no other handle aliases it, so moving it between threads is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialised memory.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of at least `capacity` bytes (rounded up to the alignment),
    /// aligned to `align` (a power of two; at least [`MIN_BUFFER_ALIGN`]).
    pub fn new(capacity: usize, align: usize) -> Result<Self> {
        let align = check_align(align)?;
        let cap = align_up(capacity.max(1) as u64, align as u64) as usize;
        // Zeroed and touched; huge pages for large buffers (see `alloc_touched`).
        let region = alloc_touched(cap, align)?;
        Ok(AlignedBuf { ptr: region.ptr(), cap, align, head: 0, len: 0, origin: Origin::Own(Some(region)) })
    }

    /// Wraps memory allocated elsewhere (pinned host memory, a registered slab).
    ///
    /// `release` runs once when the buffer is dropped.
    ///
    /// # Safety
    ///
    /// `ptr` must point to `capacity` initialised bytes, valid for reads and writes and not
    /// accessed through any other pointer until `release` runs; `ptr` must be aligned to
    /// `align`, a power of two.
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        capacity: usize,
        align: usize,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        debug_assert!(align.is_power_of_two() && (ptr.as_ptr() as usize) % align == 0);
        AlignedBuf { ptr, cap: capacity, align, head: 0, len: 0, origin: Origin::Foreign(Some(Box::new(release))) }
    }

    /// Total bytes of memory.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Alignment of the start of the memory.
    #[inline]
    pub fn align(&self) -> usize {
        self.align
    }

    /// Length of the valid data window.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the data window is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the data window from the start of the memory.
    #[inline]
    pub fn head(&self) -> usize {
        self.head
    }

    /// The valid data.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: head + len <= cap is an invariant kept by every setter, and the memory is
        // initialised and exclusively ours.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(self.head), self.len) }
    }

    /// The valid data, mutable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.head), self.len) }
    }

    /// The whole capacity, mutable, regardless of the data window.
    #[inline]
    pub fn capacity_mut(&mut self) -> &mut [u8] {
        // SAFETY: cap bytes are allocated, initialised and exclusively ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Raw pointer to the start of the memory, for submitting I/O.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Raw pointer to the start of the memory.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Sets the data window. Fails if it does not fit in the capacity.
    pub fn set_window(&mut self, head: usize, len: usize) -> Result<()> {
        if head.checked_add(len).is_none_or(|end| end > self.cap) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("window {head}+{len} exceeds buffer capacity {}", self.cap),
            ));
        }
        self.head = head;
        self.len = len;
        Ok(())
    }

    /// Empties the data window.
    #[inline]
    pub fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Copies `data` to the start of the buffer and makes it the data window.
    pub fn fill_from(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.cap {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{} bytes do not fit in a buffer of {}", data.len(), self.cap),
            ));
        }
        self.capacity_mut()[..data.len()].copy_from_slice(data);
        self.head = 0;
        self.len = data.len();
        Ok(())
    }

    /// Whether the buffer owns its memory (made by [`AlignedBuf::new`]): neither a pool's slot
    /// nor memory released elsewhere, so it may be kept or handed on without anyone waiting
    /// for it back.
    #[inline]
    pub fn is_own(&self) -> bool {
        matches!(self.origin, Origin::Own(_))
    }

    /// For a pooled buffer: the pool's id and this buffer's index (its fixed-buffer index when
    /// the pool is registered with io_uring).
    #[inline]
    pub fn pool_slot(&self) -> Option<(u64, u32)> {
        match &self.origin {
            Origin::Pool { pool, index } => Some((pool.id, *index)),
            _ => None,
        }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("capacity", &self.cap)
            .field("align", &self.align)
            .field("head", &self.head)
            .field("len", &self.len)
            .field("pool_slot", &self.pool_slot())
            .finish()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match &mut self.origin {
            Origin::Own(region) => {
                if let Some(r) = region.take() {
                    // SAFETY: the buffer is being dropped; nothing uses its memory afterwards.
                    unsafe { r.free() }
                }
            }
            Origin::Pool { pool, index } => pool.release(*index),
            Origin::Foreign(release) => {
                if let Some(f) = release.take() {
                    f()
                }
            }
        }
    }
}

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Configuration of a [`BufferPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Bytes per buffer (rounded up to `align`). Default 1 MiB.
    pub buf_size: usize,
    /// Number of buffers. Default 64.
    pub count: usize,
    /// Alignment of every buffer, a power of two, at least 4096. Default 4096.
    pub align: usize,
}

impl PoolConfig {
    /// `count` buffers of `buf_size` bytes aligned to `align`.
    pub fn new(buf_size: usize, count: usize, align: usize) -> Self {
        PoolConfig { buf_size, count, align }
    }

    /// Sets [`PoolConfig::buf_size`].
    pub fn with_buf_size(mut self, buf_size: usize) -> Self {
        self.buf_size = buf_size;
        self
    }

    /// Sets [`PoolConfig::count`].
    pub fn with_count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// Sets [`PoolConfig::align`].
    pub fn with_align(mut self, align: usize) -> Self {
        self.align = align;
        self
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { buf_size: 1 << 20, count: 64, align: MIN_BUFFER_ALIGN }
    }
}

struct PoolShared {
    id: u64,
    base: NonNull<u8>,
    buf_size: usize,
    count: usize,
    align: usize,
    slab_len: usize,
    dealloc: Mutex<Option<Box<dyn FnOnce() + Send + Sync>>>,
    free: Mutex<Vec<u32>>,
    available: Condvar,
    notify: tokio::sync::Notify,
    in_use: AtomicUsize,
    in_use_gauge: metrics::Gauge,
    bytes_gauge: metrics::Gauge,
}

// SAFETY: the slab is only reached through AlignedBuf slots, each owned by one buffer at a
// time (the free list hands an index out once); the shared bookkeeping is behind Mutexes and
// atomics.
unsafe impl Send for PoolShared {}
// SAFETY: as above.
unsafe impl Sync for PoolShared {}

impl PoolShared {
    fn release(&self, index: u32) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(index);
        drop(free);
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        self.in_use_gauge.decrement(1.0);
        self.available.notify_one();
        self.notify.notify_one();
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        self.bytes_gauge.decrement(self.slab_len as f64);
        let f = self.dealloc.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = f {
            f()
        }
    }
}

/// A fixed set of equal aligned buffers carved from one slab, allocated and touched once.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("id", &self.shared.id)
            .field("buf_size", &self.shared.buf_size)
            .field("count", &self.shared.count)
            .field("align", &self.shared.align)
            .field("in_use", &self.in_use())
            .finish()
    }
}

impl BufferPool {
    /// Allocates the slab, advises transparent huge pages and touches every page once.
    pub fn new(config: PoolConfig) -> Result<Self> {
        let align = check_align(config.align)?;
        if config.count == 0 || config.buf_size == 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "a buffer pool needs count > 0 and buf_size > 0"));
        }
        if config.count > u32::MAX as usize {
            return Err(Error::new(ErrorKind::InvalidInput, "too many buffers in one pool"));
        }
        let buf_size = align_up(config.buf_size as u64, align as u64) as usize;
        let slab_len = buf_size
            .checked_mul(config.count)
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "pool size overflows"))?;
        // Huge pages where the system allows (see `alloc_touched`), every page touched now so
        // the hot path never takes a first-touch fault.
        let region = alloc_touched(slab_len, align)?;
        let base = region.ptr();
        let dealloc = move || {
            // SAFETY: freed once, when the last handle (pool or buffer) is gone.
            unsafe { region.free() }
        };
        Ok(Self::from_parts(base, buf_size, config.count, align, slab_len, Box::new(dealloc)))
    }

    /// Builds a pool over a slab allocated elsewhere (pinned host memory).
    ///
    /// `release` runs once, when the pool and every buffer taken from it are gone.
    ///
    /// # Safety
    ///
    /// `base` must point to `buf_size * count` initialised bytes, valid for reads and writes
    /// and used by nothing else until `release` runs; `base` and `buf_size` must be multiples
    /// of `align`, a power of two.
    pub unsafe fn from_raw_slab(
        base: NonNull<u8>,
        buf_size: usize,
        count: usize,
        align: usize,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> Result<Self> {
        if count == 0 || buf_size == 0 || !align.is_power_of_two() || buf_size % align != 0 {
            return Err(Error::new(ErrorKind::InvalidInput, "bad raw slab geometry"));
        }
        let slab_len =
            buf_size.checked_mul(count).ok_or_else(|| Error::new(ErrorKind::InvalidInput, "pool size overflows"))?;
        Ok(Self::from_parts(base, buf_size, count, align, slab_len, Box::new(release)))
    }

    fn from_parts(
        base: NonNull<u8>,
        buf_size: usize,
        count: usize,
        align: usize,
        slab_len: usize,
        dealloc: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        // Hand out low indices first.
        let free: Vec<u32> = (0..count as u32).rev().collect();
        let bytes_gauge = metrics::gauge!(crate::catalog::BUFFER_POOL_BYTES);
        bytes_gauge.increment(slab_len as f64);
        BufferPool {
            shared: Arc::new(PoolShared {
                id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
                base,
                buf_size,
                count,
                align,
                slab_len,
                dealloc: Mutex::new(Some(dealloc)),
                free: Mutex::new(free),
                available: Condvar::new(),
                notify: tokio::sync::Notify::new(),
                in_use: AtomicUsize::new(0),
                in_use_gauge: metrics::gauge!(crate::catalog::BUFFER_POOL_IN_USE),
                bytes_gauge,
            }),
        }
    }

    /// A process-unique id, matched against [`AlignedBuf::pool_slot`].
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// Alignment of every buffer.
    pub fn align(&self) -> usize {
        self.shared.align
    }

    /// Buffers currently handed out.
    pub fn in_use(&self) -> usize {
        self.shared.in_use.load(Ordering::Relaxed)
    }

    /// Start and length of the slab, for registering it with io_uring or a GPU driver.
    pub fn slab(&self) -> (*mut u8, usize) {
        (self.shared.base.as_ptr(), self.shared.slab_len)
    }

    /// Start of buffer `index` in the slab.
    pub fn buffer_ptr(&self, index: u32) -> *mut u8 {
        assert!((index as usize) < self.shared.count, "buffer index out of range");
        // SAFETY: index < count, so the offset stays inside the slab.
        unsafe { self.shared.base.as_ptr().add(index as usize * self.shared.buf_size) }
    }

    fn take(&self, index: u32) -> AlignedBuf {
        self.shared.in_use.fetch_add(1, Ordering::Relaxed);
        self.shared.in_use_gauge.increment(1.0);
        // SAFETY: buffer_ptr is inside the slab and non-null.
        let ptr = unsafe { NonNull::new_unchecked(self.buffer_ptr(index)) };
        AlignedBuf {
            ptr,
            cap: self.shared.buf_size,
            align: self.shared.align,
            head: 0,
            len: 0,
            origin: Origin::Pool { pool: Arc::clone(&self.shared), index },
        }
    }

    /// A free buffer, or `None` when all are in use.
    pub fn try_acquire(&self) -> Option<AlignedBuf> {
        let index = self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(self.take(index))
    }

    /// A free buffer, blocking the thread until one is returned.
    pub fn acquire_blocking(&self) -> AlignedBuf {
        let mut free = self.shared.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(index) = free.pop() {
                drop(free);
                return self.take(index);
            }
            free = self.shared.available.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A free buffer, waiting asynchronously until one is returned.
    pub async fn acquire(&self) -> AlignedBuf {
        loop {
            let notified = self.shared.notify.notified();
            if let Some(buf) = self.try_acquire() {
                return buf;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(direct_span(0, 100, 512), (0, 512, 0));
        assert_eq!(direct_span(700, 100, 512), (512, 512, 188));
        assert_eq!(direct_span(500, 100, 512), (0, 1024, 500));
        assert_eq!(direct_span(4096, 4096, 4096), (4096, 4096, 0));
    }

    #[test]
    fn heap_buffer_window() {
        let mut b = AlignedBuf::new(100, 512).expect("alloc");
        assert_eq!(b.capacity(), 4096);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        b.fill_from(b"hello").expect("fits");
        assert_eq!(b.as_slice(), b"hello");
        b.set_window(1, 3).expect("fits");
        assert_eq!(b.as_slice(), b"ell");
        assert!(b.set_window(4000, 200).is_err());
        assert!(AlignedBuf::new(10, 3).is_err());
    }

    #[test]
    fn pool_recycles_and_blocks() {
        let pool = BufferPool::new(PoolConfig { buf_size: 8192, count: 2, align: 4096 }).expect("pool");
        let a = pool.try_acquire().expect("a");
        let b = pool.try_acquire().expect("b");
        assert!(pool.try_acquire().is_none());
        assert_eq!(pool.in_use(), 2);
        assert_eq!(a.pool_slot(), Some((pool.id(), 0)));
        assert_eq!(b.pool_slot(), Some((pool.id(), 1)));
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        let p2 = pool.clone();
        let t = std::thread::spawn(move || p2.acquire_blocking().pool_slot());
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(a);
        assert_eq!(t.join().expect("join"), Some((pool.id(), 0)));
        drop(b);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn buffers_outlive_pool_handle() {
        let pool = BufferPool::new(PoolConfig { buf_size: 4096, count: 1, align: 4096 }).expect("pool");
        let mut b = pool.try_acquire().expect("b");
        drop(pool);
        b.fill_from(&[7u8; 4096]).expect("fill");
        assert_eq!(b.as_slice()[4095], 7);
    }

    #[tokio::test]
    async fn async_acquire_waits() {
        let pool = BufferPool::new(PoolConfig { buf_size: 4096, count: 1, align: 4096 }).expect("pool");
        let a = pool.try_acquire().expect("a");
        let p2 = pool.clone();
        let h = tokio::spawn(async move { p2.acquire().await.pool_slot() });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        drop(a);
        assert!(h.await.expect("join").is_some());
    }

    #[test]
    fn raw_slab_release_runs_once() {
        use std::sync::atomic::AtomicBool;
        let backing = AlignedBuf::new(8192, 4096).expect("backing");
        let released = Arc::new(AtomicBool::new(false));
        let r2 = released.clone();
        let ptr = NonNull::new(backing.as_ptr() as *mut u8).expect("nonnull");
        // SAFETY: backing outlives the pool (dropped after it below) and is not used meanwhile.
        let pool = unsafe { BufferPool::from_raw_slab(ptr, 4096, 2, 4096, move || r2.store(true, Ordering::SeqCst)) }
            .expect("pool");
        let b = pool.try_acquire().expect("b");
        drop(pool);
        assert!(!released.load(Ordering::SeqCst));
        drop(b);
        assert!(released.load(Ordering::SeqCst));
        drop(backing);
    }
}
