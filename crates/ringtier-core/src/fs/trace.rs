//! A trace of a file tier's file-system operations, and injected protocol bugs (feature
//! `fs-trace`, for tests only): what the crash-state explorer of the test kit replays.
//!
//! A tier given an [`FsTrace`] records, as each system call succeeds, the logical operation it
//! made: a staged file created, bytes written at an offset (and whether through O_DIRECT), a
//! length set, a data fsync, a directory made, fsynced, a rename, an unlink. Files are named by
//! an id given at creation, so that a rename keeps their identity. A test adds its own markers
//! ([`FsTrace::mark`]) between calls, e.g. when a save is acknowledged.
//!
//! A [`Mutation`] makes the tier break the durability protocol on purpose, so that a test can
//! check that the explorer finds the bug.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One logical file-system operation, in the order the calls succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOp {
    /// A new, empty file (a staged object), `O_CREAT | O_EXCL`.
    Create {
        /// Its id.
        file: u64,
        /// Its path.
        path: PathBuf,
    },
    /// Bytes written to a file.
    Write {
        /// The file's id.
        file: u64,
        /// Where.
        offset: u64,
        /// What.
        data: Vec<u8>,
        /// Through O_DIRECT (past the page cache; maybe in the device's cache).
        direct: bool,
    },
    /// The file's length set (`ftruncate`).
    SetLen {
        /// The file's id.
        file: u64,
        /// The new length.
        len: u64,
    },
    /// The file's data made durable (`fdatasync`).
    Fsync {
        /// The file's id.
        file: u64,
    },
    /// A directory made.
    Mkdir {
        /// Its path.
        path: PathBuf,
    },
    /// A directory's entries made durable (`fsync` of the directory).
    FsyncDir {
        /// Its path.
        path: PathBuf,
    },
    /// A rename (replacing `to` when it exists).
    Rename {
        /// From.
        from: PathBuf,
        /// To.
        to: PathBuf,
    },
    /// A file removed.
    Unlink {
        /// Its path.
        path: PathBuf,
    },
    /// An empty directory removed.
    Rmdir {
        /// Its path.
        path: PathBuf,
    },
    /// A marker the test added (not a file-system operation).
    Mark(String),
}

/// A bug injected into the durability protocol of the tiers sharing the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Commits skip the data fsync of the staged file.
    SkipDataSync,
    /// Every directory fsync is skipped (new parents, renames, unlinks).
    SkipDirFsync,
    /// Commits rename the staged file into place before its data fsync.
    RenameBeforeSync,
    /// The directory fsync after renaming a key that ends with `key_suffix`, in a tier whose
    /// root path ends with `root_suffix`, is skipped (a tier whose commit returns before the
    /// name is durable: eviction of the faster copy then races it).
    SkipDirFsyncAfterRenameOf {
        /// The tier's root path ends with this (`"slow"`).
        root_suffix: String,
        /// The renamed key ends with this (`"MANIFEST.json"`).
        key_suffix: String,
    },
    /// No fsync at all: a tier that acknowledges unsynced data.
    NoSync,
}

/// The recorder shared by the tiers of a test.
#[derive(Debug, Default)]
pub struct FsTrace {
    ops: Mutex<Vec<FsOp>>,
    next_file: AtomicU64,
    mutation: Mutex<Option<Mutation>>,
}

impl FsTrace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a marker.
    pub fn mark(&self, label: impl Into<String>) {
        self.record(FsOp::Mark(label.into()));
    }

    /// The operations so far.
    pub fn ops(&self) -> Vec<FsOp> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Injects `mutation` (or none) into the tiers sharing this trace.
    pub fn set_mutation(&self, mutation: Option<Mutation>) {
        *self.mutation.lock().unwrap_or_else(|p| p.into_inner()) = mutation;
    }

    /// The injected mutation.
    pub fn mutation(&self) -> Option<Mutation> {
        self.mutation.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `op`.
    pub fn record(&self, op: FsOp) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// A new file id.
    pub fn new_file(&self) -> u64 {
        self.next_file.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether data fsyncs are skipped.
    pub fn skips_data_sync(&self) -> bool {
        matches!(self.mutation(), Some(Mutation::SkipDataSync | Mutation::NoSync))
    }

    /// Whether commits rename before the data fsync.
    pub fn renames_before_sync(&self) -> bool {
        self.mutation() == Some(Mutation::RenameBeforeSync)
    }

    /// Whether the directory fsync of a tier rooted at `root` after renaming `key` (`None`:
    /// any other directory fsync) is skipped.
    pub fn skips_dir_fsync(&self, root: &std::path::Path, renamed: Option<&str>) -> bool {
        match self.mutation() {
            Some(Mutation::SkipDirFsync | Mutation::NoSync) => true,
            Some(Mutation::SkipDirFsyncAfterRenameOf { root_suffix, key_suffix }) => {
                root.ends_with(&root_suffix) && renamed.is_some_and(|k| k.ends_with(&key_suffix))
            }
            _ => false,
        }
    }
}
