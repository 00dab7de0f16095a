//! A loader's read buffers allocated without touching them (`Loader(lazy_pool=True)`, what
//! `ringtier.torch` datasets use in DataLoader workers).
//!
//! A loader's pool holds `(prefetch + 2) x batch + hold` buffers, each the dataset's largest
//! sample: 320 buffers of about 1 MiB (340 MB) for the ImageNet-like set. `BufferPool::new`
//! faults every page of it in at once (so the hot path never takes a first-touch fault) and
//! the io_uring tier registers it as fixed buffers (which pins, and so faults, every page
//! too). On these machines 4 KiB faults run at about 1.6 GiB/s: 0.2 to 1.2 s per loader,
//! paid again by every DataLoader worker, in parallel on the same cores, before its first
//! batch. A lazy pool is a private anonymous mapping (zero pages, mapped on first touch) that
//! is not registered: a read faults in only the pages its sample fills (a 111 KB median sample
//! touches 28 of a buffer's 257 pages), once, since buffers are reused.

use std::ptr::NonNull;

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{BufferPool, PoolConfig};

/// A pool of `cfg`'s shape over an untouched private anonymous mapping.
pub(crate) fn lazy_pool(cfg: &PoolConfig) -> Result<BufferPool> {
    let align = cfg.align.max(4096);
    if !align.is_power_of_two() || cfg.count == 0 || cfg.buf_size == 0 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "a buffer pool needs count > 0, buf_size > 0 and a power-of-two alignment",
        ));
    }
    let buf_size = cfg.buf_size.next_multiple_of(align);
    let len = buf_size
        .checked_mul(cfg.count)
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "buffer pool size overflows"))?;
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(Error::new(ErrorKind::ResourceExhausted, format!("cannot map {len} bytes of read buffers")));
    }
    // The address, as an integer, for the release closure (which must be Send + Sync).
    let addr = raw as usize;
    let release = move || {
        // SAFETY: unmaps exactly the mapping made above, once: when the pool and every buffer
        // taken from it are gone, or below when it cannot become a pool.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    };
    let base = match NonNull::new(raw.cast::<u8>()) {
        Some(b) if addr % align == 0 => b,
        _ => {
            release();
            return Err(Error::new(ErrorKind::InvalidInput, format!("alignment {align} is above the page size")));
        }
    };
    // SAFETY: `base` is aligned to `align` (checked) and points to `len = buf_size * count`
    // bytes that read as zero (anonymous memory, zero-filled on first touch), readable and
    // writable, used by nothing else until `release` runs; `buf_size` is a multiple of `align`,
    // a power of two (checked above).
    unsafe { BufferPool::from_raw_slab(base, buf_size, cfg.count, align, release) }
}
