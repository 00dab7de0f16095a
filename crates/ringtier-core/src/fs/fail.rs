//! Fail points of a file tier's root (feature `fail-points`, for tests): make chosen system
//! calls fail as the kernel would, so that the handling of each failure can be tested.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Faults to inject into an [`FsRoot`](super::FsRoot). Share one between a test and a tier.
#[derive(Debug, Default)]
pub struct FsFailPoints {
    /// How many of the next directory fsyncs after a publishing rename fail.
    dir_fsync: AtomicU32,
    /// The errno they fail with (`EIO` when 0).
    errno: AtomicU32,
    /// Faults fired so far.
    fired: AtomicU64,
    /// Only renames of keys ending with this (empty: any).
    suffix: std::sync::Mutex<String>,
    /// Entries a listing meets that fail (opening a directory, or the stat of any other
    /// entry), with their errno, every time.
    listing: std::sync::Mutex<Vec<(String, i32)>>,
}

impl FsFailPoints {
    /// No faults armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `times` directory fsyncs that follow a publishing rename of a key ending with
    /// `suffix` (`""`: any key) fail with `errno`.
    pub fn fail_dir_fsync_after_rename(&self, suffix: &str, times: u32, errno: i32) {
        *self.suffix.lock().unwrap_or_else(|p| p.into_inner()) = suffix.to_string();
        self.errno.store(errno as u32, Ordering::SeqCst);
        self.dir_fsync.store(times, Ordering::SeqCst);
    }

    /// From now on, every listing that meets the entry `key` fails on it with `errno`: opening
    /// it when it is a directory (`EACCES`: a directory that cannot be read), its stat
    /// otherwise (`ELOOP`, `EIO`). What a test running as root cannot make the kernel do.
    pub fn fail_listing(&self, key: &str, errno: i32) {
        self.listing.lock().unwrap_or_else(|p| p.into_inner()).push((key.to_string(), errno));
    }

    /// The errno armed for the listing entry `key`, counting it as fired.
    pub(super) fn listing_errno(&self, key: &str) -> Option<i32> {
        let armed = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        let errno = armed.iter().find(|(k, _)| k == key).map(|&(_, e)| e)?;
        self.fired.fetch_add(1, Ordering::SeqCst);
        Some(errno)
    }

    /// Faults fired so far.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    /// The errno for this directory fsync after the rename of `key`, when one is armed.
    pub(super) fn take_dir_fsync(&self, key: &str) -> Option<i32> {
        if !key.ends_with(self.suffix.lock().unwrap_or_else(|p| p.into_inner()).as_str()) {
            return None;
        }
        self.dir_fsync.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).ok()?;
        self.fired.fetch_add(1, Ordering::SeqCst);
        match self.errno.load(Ordering::SeqCst) {
            0 => Some(libc::EIO),
            e => Some(e as i32),
        }
    }
}
