//! The shared directory's on-disk protocol: one file per slot, written whole to a private
//! temporary file and renamed into place under the slot's lock, read without locks and
//! verified.
//!
//! A slot file is a 48-byte header (magic, plan id, sample, slot, generation, length, CRC-32C
//! of the data, CRC-32C of the header) and the sample's bytes. The directory is hostile: a
//! file is read only through `O_NOFOLLOW | O_NONBLOCK` (a link or a FIFO is never followed or
//! waited on), only when it is a regular file of exactly the expected length (so nothing is
//! allocated from what the file claims), and used only when its header names the sample, slot
//! and generation the plan expects and both checksums match. Anything else is a miss.
//!
//! Safety against concurrent readers: a rename or an unlink replaces the name, never the open
//! file (Linux keeps an unlinked inode alive while it is open), so a reader reads either the
//! old copy whole or the new one whole, and the checksum catches the rest. Writers of one slot
//! serialize on an advisory `flock` of its lock file, which the kernel releases when a process
//! dies: a crashed rank leaves no wedge, only its temporary files, which the next start
//! removes (their process is gone, or they are older than [`STALE_TMP`]).

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ringtier_core::error::{Error, ErrorKind, Operation, Result};

pub(crate) const HEADER: usize = 48;
const MAGIC: [u8; 8] = *b"RTNODE01";
/// The header of a run's end: the slot is free, and a late writer of that run must not bring
/// its copy back.
const ENDED: [u8; 8] = *b"RTNODEX1";
/// A temporary file older than this is removed at start even if its process seems alive.
pub(crate) const STALE_TMP: Duration = Duration::from_secs(600);

/// Who holds a slot now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Occupant {
    /// No file.
    Absent,
    /// A copy of this plan.
    Copy { sample: u32, gen: u64 },
    /// The end of a run of this plan (a header without data): the slot is free.
    Ended { sample: u32, gen: u64 },
    /// Something else: another plan's copy, a torn or foreign file, a link, a directory.
    Foreign,
}

/// What reading a slot gave.
#[derive(Debug)]
pub(crate) enum Found {
    /// The expected copy, verified.
    Copy(Vec<u8>),
    /// No file, or another run's copy (not an error).
    Miss,
    /// A file that is not a valid copy of this plan (counted, then treated as a miss).
    Bad,
}

/// How a write may treat the slot's current copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    /// The run has started (a reader wrote it): any older generation goes.
    Older,
    /// A prefetch ahead of the run's start: only a slot that is free by the plan (no copy, a
    /// foreign file, or a copy older than the previous run).
    Free,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// The copy is in its slot.
    Placed,
    /// The slot holds this run or a newer one, or is not free yet: nothing written.
    Skipped,
}

/// Whether a prefetch may write a slot now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// The copy (or a newer run) is there: nothing to do.
    Done,
    /// The slot is free by the plan.
    Free,
    /// The previous run's copy is still in use.
    Busy,
}

#[derive(Debug, Clone, Copy)]
struct Header {
    ended: bool,
    plan: u64,
    sample: u32,
    slot: u32,
    gen: u64,
    len: u64,
    crc: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..8].copy_from_slice(if self.ended { &ENDED } else { &MAGIC });
        h[8..16].copy_from_slice(&self.plan.to_le_bytes());
        h[16..20].copy_from_slice(&self.sample.to_le_bytes());
        h[20..24].copy_from_slice(&self.slot.to_le_bytes());
        h[24..32].copy_from_slice(&self.gen.to_le_bytes());
        h[32..40].copy_from_slice(&self.len.to_le_bytes());
        h[40..44].copy_from_slice(&self.crc.to_le_bytes());
        let hc = crc32c::crc32c(&h[..44]);
        h[44..48].copy_from_slice(&hc.to_le_bytes());
        h
    }

    fn decode(h: &[u8; HEADER]) -> Option<Header> {
        let word = |r: std::ops::Range<usize>| -> u64 {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&h[r]);
            u64::from_le_bytes(b)
        };
        let ended = h[..8] == ENDED;
        if (h[..8] != MAGIC && !ended) || crc32c::crc32c(&h[..44]) != word(44..48) as u32 {
            return None;
        }
        Some(Header {
            ended,
            plan: word(8..16),
            sample: word(16..20) as u32,
            slot: word(20..24) as u32,
            gen: word(24..32),
            len: word(32..40),
            crc: word(40..44) as u32,
        })
    }
}

/// One node's shared cache directory (a subdirectory of the configured one, named by the plan
/// id, so jobs with other plans never read each other's copies).
#[derive(Debug)]
pub(crate) struct SlotDir {
    root: PathBuf,
    plan: u64,
}

/// Temporary file names: unique in the process (every instance of a process shares it).
static SEQ: AtomicU64 = AtomicU64::new(0);

fn io_err(what: String, e: std::io::Error) -> Error {
    Error::from_errno(e.raw_os_error().unwrap_or(5), format!("{what}: {e}")).with_operation(Operation::Write)
}

fn open_read(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)
}

impl SlotDir {
    /// Opens (creating it when missing) the plan's directory under `dir`, and removes the
    /// temporary files of processes that are gone.
    pub(crate) fn open(dir: &Path, plan: u64) -> Result<SlotDir> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(format!("node cache directory {}", dir.display()), e))?;
        let root = dir.join(format!("ringtier-node-{plan:016x}"));
        match std::fs::create_dir(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(format!("node cache directory {}", root.display()), e)),
        }
        let meta = std::fs::symlink_metadata(&root)
            .map_err(|e| io_err(format!("node cache directory {}", root.display()), e))?;
        if !meta.is_dir() {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("node cache directory {} is not a directory (a link or a file): refusing it", root.display()),
            ));
        }
        let d = SlotDir { root, plan };
        d.probe()?;
        d.clean_stale();
        Ok(d)
    }

    /// The directory holding the slots.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    fn probe(&self) -> Result<()> {
        let p = self.tmp_path();
        let res = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .and_then(|mut f| f.write_all(b"ringtier"));
        let _ = std::fs::remove_file(&p);
        res.map_err(|e| io_err(format!("node cache directory {}: cannot write into it", self.root.display()), e))
    }

    fn slot_path(&self, slot: u32) -> PathBuf {
        self.root.join(format!("slot-{slot:08}"))
    }

    fn tmp_path(&self) -> PathBuf {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!(".tmp-{}-{n}", std::process::id()))
    }

    /// Removes temporary files whose process is gone (or that are older than [`STALE_TMP`]).
    pub(crate) fn clean_stale(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return 0 };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix(".tmp-") else { continue };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists());
            let old = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            if (!alive || old) && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Bytes of slot files and of temporary files in the directory now (for checks). Each
    /// name counts once: a directory listing taken while files are renamed over may return a
    /// name twice.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return (0, 0) };
        let mut seen = std::collections::HashSet::new();
        let (mut slots, mut tmp) = (0, 0);
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !seen.insert(name.to_string()) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            if !m.is_file() {
                continue;
            }
            if name.starts_with("slot-") && !name.ends_with(".lock") {
                slots += m.len();
            } else if name.starts_with(".tmp-") {
                tmp += m.len();
            }
        }
        (slots, tmp)
    }

    /// Reads slot `slot`, expecting run `gen` of `sample` with `size` bytes.
    pub(crate) fn read(&self, slot: u32, sample: u32, gen: u64, size: u64) -> Found {
        let mut f = match open_read(&self.slot_path(slot)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Miss,
            Err(_) => return Found::Bad,
        };
        let Ok(m) = f.metadata() else { return Found::Bad };
        if !m.is_file() || m.size() < HEADER as u64 {
            return Found::Bad;
        }
        let mut h = [0u8; HEADER];
        if f.read_exact(&mut h).is_err() {
            return Found::Bad;
        }
        let Some(h) = Header::decode(&h) else { return Found::Bad };
        if h.plan != self.plan || h.slot != slot {
            return Found::Bad;
        }
        if h.ended || h.sample != sample || h.gen != gen {
            return Found::Miss; // another run of this plan
        }
        if h.len != size || m.size() != HEADER as u64 + size {
            return Found::Bad;
        }
        let mut data = vec![0u8; size as usize];
        if f.read_exact(&mut data).is_err() || crc32c::crc32c(&data) != h.crc {
            return Found::Bad;
        }
        Found::Copy(data)
    }

    /// Who holds `slot` now (its header only).
    pub(crate) fn occupant(&self, slot: u32) -> Occupant {
        let mut f = match open_read(&self.slot_path(slot)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Occupant::Absent,
            Err(_) => return Occupant::Foreign,
        };
        let mut h = [0u8; HEADER];
        let ok = f.metadata().is_ok_and(|m| m.is_file()) && f.read_exact(&mut h).is_ok();
        match Header::decode(&h).filter(|h| ok && h.plan == self.plan && h.slot == slot) {
            Some(h) if h.ended => Occupant::Ended { sample: h.sample, gen: h.gen },
            Some(h) => Occupant::Copy { sample: h.sample, gen: h.gen },
            None => Occupant::Foreign,
        }
    }

    fn lock(&self, slot: u32) -> Result<File> {
        let p = self.root.join(format!("slot-{slot:08}.lock"));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|e| io_err(format!("lock of {}", p.display()), e))?;
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Err(Error::new(ErrorKind::PermissionDenied, format!("{} is not a regular file", p.display())));
        }
        ringtier_core::fs::lock_exclusive(&f).map_err(|e| io_err(format!("locking {}", p.display()), e))?;
        Ok(f)
    }

    /// Writes run `gen` of `sample` into `slot`: to a private temporary file first, then, under
    /// the slot's lock, renamed into place if `replace` allows what holds the slot now.
    pub(crate) fn write(&self, slot: u32, sample: u32, gen: u64, data: &[u8], replace: Replace) -> Result<Wrote> {
        // Cheap check first: nothing to write when the slot is taken (no temp file made).
        if !self.allows(self.occupant(slot), sample, gen, replace) {
            return Ok(Wrote::Skipped);
        }
        let h = Header {
            ended: false,
            plan: self.plan,
            sample,
            slot,
            gen,
            len: data.len() as u64,
            crc: crc32c::crc32c(data),
        };
        self.put(slot, h, data, |occ| self.allows(occ, sample, gen, replace))
    }

    /// Writes header `h` and `data` to a temporary file, then renames it into `slot` under the
    /// slot's lock if `may` allows what holds the slot then.
    fn put(&self, slot: u32, h: Header, data: &[u8], may: impl Fn(Occupant) -> bool) -> Result<Wrote> {
        let tmp = self.tmp_path();
        let created = Cell::new(false);
        let res = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
                .map_err(|e| io_err(format!("temporary copy {}", tmp.display()), e))?;
            created.set(true);
            f.write_all(&h.encode())
                .and_then(|()| f.write_all(data))
                .map_err(|e| io_err(format!("writing {}", tmp.display()), e))?;
            drop(f);
            let lock = self.lock(slot)?;
            if !may(self.occupant(slot)) {
                return Ok(Wrote::Skipped);
            }
            std::fs::rename(&tmp, self.slot_path(slot))
                .map_err(|e| io_err(format!("placing a copy in slot {slot}"), e))?;
            drop(lock);
            Ok(Wrote::Placed)
        })();
        if created.get() && !matches!(res, Ok(Wrote::Placed)) {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }

    /// Whether a prefetch of run `gen` of `sample` into `slot` may go now.
    pub(crate) fn prefetch_state(&self, slot: u32, sample: u32, gen: u64, replace: Replace) -> SlotState {
        match self.occupant(slot) {
            Occupant::Copy { sample: s, gen: g } | Occupant::Ended { sample: s, gen: g }
                if (s == sample && g == gen) || g > gen =>
            {
                SlotState::Done
            }
            occ if self.allows(occ, sample, gen, replace) => SlotState::Free,
            _ => SlotState::Busy,
        }
    }

    fn allows(&self, occ: Occupant, sample: u32, gen: u64, replace: Replace) -> bool {
        match occ {
            Occupant::Absent | Occupant::Foreign => true,
            Occupant::Copy { sample: s, gen: g } if s == sample && g == gen => false,
            Occupant::Ended { sample: s, gen: g } => !(s == sample && g == gen) && g < gen,
            Occupant::Copy { gen: g, .. } => match replace {
                Replace::Older => g < gen,
                Replace::Free => g + 1 < gen,
            },
        }
    }

    /// Ends run `gen` of `sample` in `slot` (the plan's last read of it): its copy, or the
    /// empty slot, becomes a 48-byte end marker, so a late writer of the run cannot bring the
    /// copy back. A newer run in the slot is left alone. True when a copy was removed.
    pub(crate) fn drop_run(&self, slot: u32, sample: u32, gen: u64) -> bool {
        let had = Cell::new(false);
        let h = Header { ended: true, plan: self.plan, sample, slot, gen, len: 0, crc: 0 };
        let res = self.put(slot, h, &[], |occ| {
            had.set(occ == Occupant::Copy { sample, gen });
            had.get() || self.allows(occ, sample, gen, Replace::Older)
        });
        matches!(res, Ok(Wrote::Placed)) && had.get()
    }

    /// Removes the whole directory (the job is over). Another rank's write still landing (a
    /// temporary copy or a slot's lock file made after the listing) makes the last `rmdir`
    /// fail with "not empty": it is tried again, for up to a second, before a warning.
    pub(crate) fn remove(&self) {
        for attempt in 0..50 {
            match std::fs::remove_dir_all(&self.root) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempt < 49 => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!("removing the node cache directory {}: {e}", self.root.display());
                    return;
                }
            }
        }
    }
}
