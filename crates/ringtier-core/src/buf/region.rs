//! Memory for buffers and pools: zeroed, every page touched once, huge-page backed where large.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::align_up;
use crate::error::{Error, ErrorKind, Result};

/// Size (and alignment) of a transparent huge page on x86-64 and arm64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// Memory from [`alloc_touched`]: zeroed, every page touched, freed with [`Region::free`].
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    kind: RegionKind,
}

#[derive(Debug, Clone, Copy)]
enum RegionKind {
    /// From the global allocator with this layout.
    Heap(Layout),
    /// A private anonymous mapping of `len` bytes of its own.
    Mapped,
}

// SAFETY: plain memory, owned by whoever holds the region.
unsafe impl Send for Region {}
// SAFETY: as above; the region itself gives no access to the memory.
unsafe impl Sync for Region {}

impl Region {
    /// The first byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Its length in bytes (at least what was asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty region (never: regions hold at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns the memory.
    ///
    /// # Safety
    ///
    /// Nothing may use a pointer into the region afterwards.
    pub unsafe fn free(self) {
        match self.kind {
            // SAFETY: allocated by `alloc_touched` with this layout (caller: no further use).
            RegionKind::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: our own mapping of exactly `len` bytes (caller: no further use).
            RegionKind::Mapped => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            },
        }
    }
}

/// Allocates `size` zeroed bytes aligned to `align`, every page touched. Allocations of at
/// least [`HUGE_PAGE`] get a private anonymous mapping of their own, 2 MiB aligned and advised
/// for transparent huge pages *before* the first touch (the global allocator would hand back
/// recycled, already-faulted 4 KiB pages, and advice after the touch changes nothing).
///
/// Why: a direct read or write from a buffer is split into one device segment per physically
/// contiguous run of it, and a device takes a bounded number of segments per request, so a
/// buffer of scattered 4 KiB pages turns one large O_DIRECT write into several requests and
/// runs measurably slower; huge pages make each 2 MiB one run (figures in
/// `docs/BENCHMARKS.md`, "The burst buffer").
pub fn alloc_touched(size: usize, align: usize) -> Result<Region> {
    let oom = |n: usize| Error::new(ErrorKind::ResourceExhausted, format!("out of memory allocating {n} bytes"));
    if size >= HUGE_PAGE && align <= HUGE_PAGE {
        let len = align_up(size as u64, 4096) as usize;
        let span = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom(size));
        }
        let start = raw as usize;
        let aligned = align_up(start as u64, HUGE_PAGE as u64) as usize;
        // SAFETY: both trims lie inside the mapping just made and outside [aligned, aligned+len).
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let end = aligned + len;
            if start + span > end {
                libc::munmap(end as *mut libc::c_void, start + span - end);
            }
            // Advisory only.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let ptr = NonNull::new(aligned as *mut u8).ok_or_else(|| oom(size))?;
        // One write per page faults every page in now (the kernel hands them over zeroed,
        // a whole huge page at a time where it can); writing every byte again would only
        // double the cost (a pool of 340 MB: ~9% of a Python `Loader`'s construction).
        for off in (0..len).step_by(4096) {
            // SAFETY: [aligned, aligned+len) is mapped read-write; writes the zero it holds.
            unsafe { ptr.as_ptr().add(off).write_volatile(0) };
        }
        return Ok(Region { ptr, len, kind: RegionKind::Mapped });
    }
    let layout = Layout::from_size_align(size.max(1), align)
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("bad buffer layout: {e}")))?;
    // SAFETY: the layout has a non-zero size.
    let raw = unsafe { alloc::alloc_zeroed(layout) };
    let ptr = NonNull::new(raw).ok_or_else(|| oom(size))?;
    for off in (0..layout.size()).step_by(4096) {
        // SAFETY: inside the allocation; writes the zero it holds (first touch now).
        unsafe { ptr.as_ptr().add(off).write_volatile(0) };
    }
    Ok(Region { ptr, len: layout.size(), kind: RegionKind::Heap(layout) })
}
