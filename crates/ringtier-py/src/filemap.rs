//! `ringtier.safetensors.load_file(..., mmap=True)` underneath: a safetensors file mapped
//! private (copy-on-write) and its data span read into the page cache ahead of use by several
//! threads at once (`MADV_POPULATE_READ`, Linux 5.14; older kernels: one byte per page read by
//! the same threads). The tensors are views of page-cache pages: no fresh anonymous memory is
//! faulted in and zeroed for them, which on a VM whose free memory the host reclaims costs more
//! CPU than the read itself (docs/SAFETENSORS.md).
//!
//! The mapping is shared with the page cache until a tensor is written (then that page is
//! copied). As with any mapped file, the file must not be truncated while a tensor is alive: a
//! page past the new end faults with `SIGBUS` (the size is checked against the header when
//! mapped, and the populate reads every page once, so a file shorter than its header says is an
//! error before any tensor exists).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use ringtier_core::error::{Error, ErrorKind, Result};

use crate::buffer::OwnedBytes;

/// An I/O error with what was being done.
fn io_error(e: std::io::Error, what: String) -> Error {
    match e.raw_os_error() {
        Some(code) => Error::from_errno(code, format!("{what}: {e}")),
        None => Error::new(ErrorKind::Io, format!("{what}: {e}")),
    }
}

/// `MADV_POPULATE_READ` (Linux 5.14): fault the range in for reading, reading the file's pages
/// into the page cache; not in every libc crate version's constants.
const MADV_POPULATE_READ: libc::c_int = 22;

/// A file's data span, mapped private. Invariant: `ptr` is a live mapping of `map_len` bytes
/// (none when `map_len` is 0) owned by this value alone, unmapped once in `Drop`; `start + len
/// <= map_len`.
#[derive(Debug)]
pub(crate) struct FileMap {
    ptr: NonNull<u8>,
    map_len: usize,
    start: usize,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; moving it moves the ownership.
unsafe impl Send for FileMap {}
// SAFETY: `&FileMap` gives no access to the bytes except `populate`, which only reads them.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `path` (expected `file_size` bytes long) and keeps `[start, start + len)` of it.
    pub(crate) fn open(path: &Path, file_size: u64, start: u64, len: u64) -> Result<FileMap> {
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| io_error(e, format!("opening {shown} to map it")))?;
        let actual = file.metadata().map_err(|e| io_error(e, format!("stat of {shown}")))?.len();
        if actual != file_size {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{shown} is {actual} bytes, its header was read from {file_size}: it changed since it was opened"
                ),
            ));
        }
        let end = start.checked_add(len).filter(|&e| e <= file_size).ok_or_else(|| {
            Error::new(ErrorKind::Corrupt, format!("{shown}: data span {start}+{len} past its {file_size} bytes"))
        })?;
        let too_big =
            || Error::new(ErrorKind::InvalidInput, format!("{shown}: {file_size} bytes cannot be mapped here"));
        let map_len = usize::try_from(end).map_err(|_| too_big())?;
        let start = usize::try_from(start).map_err(|_| too_big())?;
        let len = usize::try_from(len).map_err(|_| too_big())?;
        if len == 0 {
            return Ok(FileMap { ptr: NonNull::dangling(), map_len: 0, start: 0, len: 0 });
        }
        // SAFETY: a new private mapping of an open file, read-write copy-on-write: no existing
        // memory is affected; the descriptor may be closed after (the mapping keeps the file).
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io_error(std::io::Error::last_os_error(), format!("mapping {shown}")));
        }
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or_else(|| Error::new(ErrorKind::Io, "mmap returned null"))?;
        Ok(FileMap { ptr, map_len, start, len })
    }

    /// Reads the data span into the page cache and maps it: `threads` threads, each taking the
    /// next `chunk` bytes in turn. An I/O error (or a file cut short under the mapping) is an
    /// error naming the offset.
    pub(crate) fn populate(&self, threads: usize, chunk: usize) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let page = page_size();
        let chunk = chunk.max(page).next_multiple_of(page);
        let first = self.start / page * page;
        let end = self.start + self.len;
        let next = AtomicUsize::new(first);
        let base = self.ptr.as_ptr() as usize;
        let work = || -> Result<()> {
            let mut fallback = false;
            loop {
                let off = next.fetch_add(chunk, Ordering::Relaxed);
                if off >= end {
                    return Ok(());
                }
                let n = chunk.min(end - off);
                let mut tries = 0;
                while !fallback {
                    // SAFETY: `[base + off, base + off + n)` lies inside the live mapping
                    // (`off` page-aligned, `off + n <= end <= map_len`); madvise only faults
                    // pages in.
                    let rc = unsafe { libc::madvise((base + off) as *mut libc::c_void, n, MADV_POPULATE_READ) };
                    if rc == 0 {
                        break;
                    }
                    let err = std::io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::EINVAL) | Some(libc::ENOSYS) => fallback = true, // before Linux 5.14
                        Some(libc::EINTR) | Some(libc::EAGAIN) if tries < 100 => tries += 1, // this chunk again
                        _ => return Err(io_error(err, format!("reading the mapped file at offset {off}"))),
                    }
                }
                if !fallback {
                    continue;
                }
                let mut p = off;
                while p < off + n {
                    // SAFETY: inside the live mapping, as above; a volatile read of one byte
                    // faults its page in (a file cut short would raise SIGBUS here, which the
                    // size check at `open` rules out for the file as it was then).
                    unsafe { std::ptr::read_volatile((base + p) as *const u8) };
                    p += page;
                }
            }
        };
        let threads = threads.clamp(1, 64);
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut result = work();
            for h in handles {
                let r = h.join().unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a populate thread panicked")));
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    }
}

impl OwnedBytes for FileMap {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `[start, start + len)` lies inside the live mapping (invariant), which `&mut
        // self` borrows exclusively; the mapping is readable and writable (copy-on-write).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.start), self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        if self.map_len > 0 {
            // SAFETY: the mapping made in `open`, unmapped exactly once, here.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n.is_power_of_two()).unwrap_or(4096)
}
