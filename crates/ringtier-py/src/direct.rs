//! The destinations of a direct checkpoint load (`ringtier_migrate::ReadTargets`): one
//! anonymous mapping per part, page-aligned. A fresh gigabyte must be faulted in (zeroed, page
//! tables filled), which costs about as much CPU as the disk takes to read it; here a
//! prefaulting thread runs ahead of the reads through the mappings (`MADV_POPULATE_WRITE`,
//! which faults pages in without writing them), so the faults run on another core while the
//! reads are in flight instead of on the thread that submits them (an O_DIRECT read faults in
//! what it pins that is not yet present). A large mapping asks for transparent huge pages
//! where the free lists can serve it without compacting memory (`crate::thp`).
//! Chunk reads get windows of it ([`AlignedBuf::from_raw_parts`]); once every window is back,
//! each part's mapping becomes the memory of a `PartBuffer` that Python's tensors share.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ringtier_core::buf::{align_up, AlignedBuf};
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_migrate::{PartInfo, ReadTargets};

use crate::buffer::OwnedBytes;

/// Largest part a direct load maps (1 TiB): past it the copying load's own bounds apply.
const MAX_DIRECT_PART: u64 = 1 << 40;

/// Alignment of each mapping's start: 2 MiB (any read alignment a tier asks for divides it).
const MAP_ALIGN: usize = 2 << 20;

/// Bytes the prefaulting thread faults in per call (it checks for a stop between calls).
const PREFAULT_STEP: usize = 4 << 20;

/// A private anonymous mapping, unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    /// Bytes mapped.
    cap: usize,
    /// Bytes of the part it holds.
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; moving it to another thread moves the
// ownership (no thread-local state is attached to it).
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` gives no access to the bytes (only `OwnedBytes::as_mut_bytes`, through
// `&mut`).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `cap` bytes (a multiple of 4096), 2 MiB aligned, untouched.
    fn new(cap: usize) -> Result<Self> {
        let oom = || Error::new(ErrorKind::ResourceExhausted, format!("cannot map {cap} bytes for a checkpoint part"));
        let span = cap.checked_add(MAP_ALIGN).ok_or_else(oom)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom());
        }
        let start = raw as usize;
        let aligned = align_up(start as u64, MAP_ALIGN as u64) as usize;
        // SAFETY: both trims lie inside the mapping just made and outside [aligned, aligned + cap).
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let end = aligned + cap;
            if start + span > end {
                libc::munmap(end as *mut libc::c_void, start + span - end);
            }
        }
        let ptr = NonNull::new(aligned as *mut u8).ok_or_else(oom)?;
        if crate::thp::want_huge_pages(cap) {
            // SAFETY: advice on the mapping just made, which this value owns; MADV_HUGEPAGE
            // changes how its pages are backed, never their contents. A refusal (THP not
            // built in) leaves small pages, which is what no advice gives.
            unsafe {
                libc::madvise(ptr.as_ptr().cast(), cap, libc::MADV_HUGEPAGE);
            }
        }
        Ok(Mapping { ptr, cap, len: 0 })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no window outlives it (each holds
        // the `Arc` that owns it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.cap);
        }
    }
}

impl OwnedBytes for Mapping {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `len <= cap` bytes of a read-write mapping this value owns; anonymous memory
        // reads as zeros where no read wrote (there is none: a part is complete when taken).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// One part's mapping and the windows of it lent to reads now.
#[derive(Debug)]
struct Slot {
    map: Arc<Mapping>,
    /// Live windows, start -> end (bytes of the mapping).
    live: Arc<Mutex<BTreeMap<usize, usize>>>,
}

/// The thread faulting in the mappings ahead of the reads, and its stop flag.
#[derive(Debug)]
struct Prefault {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Prefault {
    /// Faults in `maps` front to back, `PREFAULT_STEP` bytes at a time, until done or stopped.
    /// `None` where no thread could be started (the reads then fault pages in themselves).
    fn start(maps: Vec<Arc<Mapping>>) -> Option<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ringtier-prefault".into())
            .spawn(move || {
                for map in &maps {
                    let mut at = 0;
                    while at < map.cap && !flag.load(Ordering::Relaxed) {
                        let n = PREFAULT_STEP.min(map.cap - at);
                        // SAFETY: `[ptr + at, ptr + at + n)` lies inside the mapping, which
                        // `maps` keeps alive. MADV_POPULATE_WRITE only faults pages in (as a
                        // write fault would, without writing): bytes already read into a page
                        // stay as they are, so it may race the reads filling the same pages.
                        let rc =
                            unsafe { libc::madvise(map.ptr.as_ptr().add(at).cast(), n, libc::MADV_POPULATE_WRITE) };
                        if rc != 0 {
                            // An older kernel (before 5.14) or no memory now: the reads fault
                            // the rest in themselves.
                            return;
                        }
                        at += n;
                    }
                }
            })
            .ok()?;
        Some(Prefault { stop, thread })
    }

    /// Stops the thread and waits for it (at most one step), releasing its mappings.
    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The destinations of one direct load (see the module).
#[derive(Debug, Default)]
pub(crate) struct MappedParts {
    slots: Mutex<Vec<Slot>>,
    prefault: Mutex<Option<Prefault>>,
}

impl MappedParts {
    fn stop_prefault(&self) {
        if let Some(p) = self.prefault.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.finish();
        }
    }

    /// The parts' memory, in the order of `prepare`, each `len` set to its part's size;
    /// `None` while any window is still lent out (a read of a cancelled restore not yet
    /// reaped).
    pub(crate) fn take(&self, sizes: &[u64]) -> Option<Vec<Mapping>> {
        // The prefaulting thread holds the mappings too: it ends first.
        self.stop_prefault();
        let slots = std::mem::take(&mut *self.slots.lock().unwrap_or_else(|p| p.into_inner()));
        let mut out = Vec::with_capacity(slots.len());
        for (slot, &size) in slots.into_iter().zip(sizes) {
            let mut map = Arc::try_unwrap(slot.map).ok()?;
            map.len = usize::try_from(size).ok().filter(|&n| n <= map.cap)?;
            out.push(map);
        }
        Some(out)
    }
}

impl ReadTargets for MappedParts {
    fn prepare(&self, parts: &[PartInfo], sizes: &[u64], align: usize) -> Result<bool> {
        if !align.is_power_of_two() || align > MAP_ALIGN {
            return Ok(false);
        }
        let mut slots = Vec::with_capacity(parts.len());
        for (p, &size) in parts.iter().zip(sizes) {
            // An object shorter or longer than its manifest says, or one too large: the
            // copying load (its truncation checks and fallbacks) handles it.
            if size != p.size || p.size > MAX_DIRECT_PART || p.start != 0 || p.end != p.size {
                return Ok(false);
            }
            let cap = align_up(p.size.max(1), align as u64) as usize;
            slots.push(Slot { map: Arc::new(Mapping::new(cap)?), live: Arc::default() });
        }
        self.stop_prefault();
        let maps = slots.iter().map(|s| Arc::clone(&s.map)).collect();
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = slots;
        *self.prefault.lock().unwrap_or_else(|p| p.into_inner()) = Prefault::start(maps);
        Ok(true)
    }

    fn window(&self, part: usize, offset: u64, len: usize, align: usize) -> Result<AlignedBuf> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let bad = |m: String| Error::new(ErrorKind::InvalidInput, m);
        let slot = slots.get(part).ok_or_else(|| bad(format!("no destination for part {part}")))?;
        let start = usize::try_from(offset).map_err(|_| bad(format!("offset {offset} out of range")))?;
        let want = align_up(len.max(1) as u64, align as u64) as usize;
        let end = start.checked_add(want).filter(|&e| e <= slot.map.cap).ok_or_else(|| {
            bad(format!("a read of {len} bytes at {offset} does not fit the part's {} bytes", slot.map.cap))
        })?;
        if start % align != 0 {
            return Err(bad(format!("a read at {offset} is not aligned to {align}")));
        }
        {
            let mut live = slot.live.lock().unwrap_or_else(|p| p.into_inner());
            // No two live windows may share a byte: the one before must end at or before
            // `start`, the one after start at or after `end`.
            let before = live.range(..=start).next_back().is_some_and(|(_, &e)| e > start);
            let after = live.range(start..end).next().is_some();
            if before || after {
                return Err(bad(format!("bytes {start}..{end} of part {part} are already being read")));
            }
            live.insert(start, end);
        }
        let (map, live) = (Arc::clone(&slot.map), Arc::clone(&slot.live));
        let ptr = NonNull::new(map.ptr.as_ptr().wrapping_add(start)).ok_or_else(|| bad("null window".to_string()))?;
        let release = move || {
            live.lock().unwrap_or_else(|p| p.into_inner()).remove(&start);
            // The mapping lives as long as any window of it.
            drop(map);
        };
        // SAFETY: `[ptr, ptr + want)` lies inside the mapping (`end <= cap`), which the
        // release closure keeps alive; it is read-write, and anonymous memory is initialised
        // (zeros); no other live window overlaps it (checked above, under the lock that every
        // release takes), and the mapping is handed to anyone else only by `take`, which
        // refuses while any window is alive. `ptr` is aligned to `align`: the mapping starts
        // on a 2 MiB boundary and `start` is a multiple of `align`, a power of two.
        Ok(unsafe { AlignedBuf::from_raw_parts(ptr, want, align, release) })
    }
}

impl Drop for MappedParts {
    fn drop(&mut self) {
        self.stop_prefault();
    }
}
