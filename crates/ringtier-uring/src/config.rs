//! Configuration of the io_uring engine.

use std::fmt;
use std::str::FromStr;

/// Whether reads and writes bypass the page cache (O_DIRECT), decided per file from
/// `statx(STATX_DIOALIGN)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIoPolicy {
    /// Always buffered I/O through the page cache.
    Off,
    /// O_DIRECT where the file supports it and the buffer fits its alignment; buffered
    /// otherwise, counting each fallback (`ringtier_direct_io_fallbacks_total`).
    #[default]
    Auto,
    /// O_DIRECT or an error that names the file and its filesystem.
    Required,
}

impl DirectIoPolicy {
    /// The policy's name as accepted by `FromStr`.
    pub fn as_str(self) -> &'static str {
        match self {
            DirectIoPolicy::Off => "off",
            DirectIoPolicy::Auto => "auto",
            DirectIoPolicy::Required => "required",
        }
    }
}

impl fmt::Display for DirectIoPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DirectIoPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(DirectIoPolicy::Off),
            "auto" => Ok(DirectIoPolicy::Auto),
            "required" => Ok(DirectIoPolicy::Required),
            _ => Err(format!("unknown direct-I/O policy {s:?} (expected off, auto or required)")),
        }
    }
}

/// How writes to files opened without O_DIRECT (policy `off`, a filesystem without direct
/// I/O such as tmpfs, or an `auto` fallback) are issued.
///
/// io_uring cannot complete a large buffered write without blocking, so the kernel hands it
/// to an io-wq worker thread anyway, a slower path than a `pwrite` from one of the tier's own
/// threads (measured with `examples/save_vs_raw.rs` in ringtier-migrate and `ringtier bench
/// ckpt --fast-dir /dev/shm/...`; figures in `docs/CHECKPOINTS.md`). O_DIRECT writes always
/// go through the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferedWrites {
    /// `pwrite` on the tier's metadata threads (the owned buffer travels with the call).
    #[default]
    Threads,
    /// `IORING_OP_WRITE` through the ring, like direct writes.
    Ring,
}

impl BufferedWrites {
    /// The name as accepted by `FromStr`.
    pub fn as_str(self) -> &'static str {
        match self {
            BufferedWrites::Threads => "threads",
            BufferedWrites::Ring => "ring",
        }
    }
}

impl fmt::Display for BufferedWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BufferedWrites {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "threads" => Ok(BufferedWrites::Threads),
            "ring" => Ok(BufferedWrites::Ring),
            _ => Err(format!("unknown buffered-write path {s:?} (expected threads or ring)")),
        }
    }
}

/// Knobs of the io_uring engine: `UringConfig::default()` and the `with_*` methods
/// (`#[non_exhaustive]`: new knobs do not break callers).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringConfig {
    /// Requests in flight per ring (files in progress for batch reads). Default 32.
    pub queue_depth: u32,
    /// Number of rings, each on its own driver thread; batches are spread round-robin.
    /// Default 1.
    pub rings: usize,
    /// Kernel submission-queue polling thread with this idle time in milliseconds; `None`
    /// (the default) submits with `io_uring_enter`. SQPOLL costs a core while busy.
    pub sqpoll_idle_ms: Option<u32>,
    /// Register the tier's buffer pool as fixed buffers (`READ_FIXED`). Default true. When
    /// the kernel refuses (memlock limit too low), plain buffers are used and a warning is
    /// logged once.
    pub register_buffers: bool,
    /// Registered (fixed) files: files opened with [`crate::UringTier::open_file`] are
    /// registered in a slot, and each per-file open of a batch read returns a direct
    /// descriptor (no file-table entry; read and closed by slot; Linux 6.0). Default false.
    pub register_files: bool,
    /// Direct-I/O policy. Default [`DirectIoPolicy::Auto`].
    pub direct_io: DirectIoPolicy,
    /// Threads for metadata calls io_uring has no opcode for (listing, rename). Default 2.
    pub metadata_threads: usize,
    /// Largest single read, in bytes (fio's `--bs`): a larger request is read in successive
    /// reads of this size on the same open file (rounded down to the file's direct-I/O
    /// alignment). 0, the default, reads each request with one read.
    pub max_read_bytes: u32,
    /// How writes to files without O_DIRECT are issued. Default [`BufferedWrites::Threads`].
    pub buffered_writes: BufferedWrites,
    /// `IORING_SETUP_COOP_TASKRUN` (with `TASKRUN_FLAG`, Linux 5.19): completions are not
    /// forced on the driver thread with an interrupt; they run at its next transition into the
    /// kernel, which the driver makes anyway to submit and wait. Default false. Not with SQPOLL.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` with `SINGLE_ISSUER` (and `TASKRUN_FLAG`, Linux 6.1):
    /// completion work waits until the ring's one submitter asks for completions. Each ring has
    /// exactly one driver thread that submits, registers and reaps, so the requirement holds;
    /// the ring is created disabled and enabled on that thread. Default false. Not with SQPOLL.
    pub defer_taskrun: bool,
}

impl UringConfig {
    /// Files in progress per ring for a dataset: [`UringConfig::dataset`]'s queue depth.
    pub const DATASET_QUEUE_DEPTH: u32 = 256;

    /// The settings for reading a dataset of many small files: the default's, with
    /// [`Self::DATASET_QUEUE_DEPTH`] files in progress. Each file is an open, a read and a
    /// close; a cold open waits for its inode in one of io_uring's worker threads, so the disk's
    /// queue stays full only with many files at once. Measured on this project's virtual disk
    /// (200,000 files of 1-3 KB, cold, one loader): about 36,000 files/s at depth 32, 64,000 at
    /// 256, about the same at 512 (docs/SCALE.md, "Files in progress").
    pub fn dataset() -> Self {
        UringConfig { queue_depth: Self::DATASET_QUEUE_DEPTH, ..UringConfig::default() }
    }

    /// Sets [`UringConfig::queue_depth`].
    pub fn with_queue_depth(mut self, queue_depth: u32) -> Self {
        self.queue_depth = queue_depth;
        self
    }

    /// Sets [`UringConfig::rings`].
    pub fn with_rings(mut self, rings: usize) -> Self {
        self.rings = rings;
        self
    }

    /// Sets [`UringConfig::sqpoll_idle_ms`].
    pub fn with_sqpoll_idle_ms(mut self, sqpoll_idle_ms: impl Into<Option<u32>>) -> Self {
        self.sqpoll_idle_ms = sqpoll_idle_ms.into();
        self
    }

    /// Sets [`UringConfig::register_buffers`].
    pub fn with_register_buffers(mut self, register_buffers: bool) -> Self {
        self.register_buffers = register_buffers;
        self
    }

    /// Sets [`UringConfig::register_files`].
    pub fn with_register_files(mut self, register_files: bool) -> Self {
        self.register_files = register_files;
        self
    }

    /// Sets [`UringConfig::direct_io`].
    pub fn with_direct_io(mut self, direct_io: DirectIoPolicy) -> Self {
        self.direct_io = direct_io;
        self
    }

    /// Sets [`UringConfig::metadata_threads`].
    pub fn with_metadata_threads(mut self, metadata_threads: usize) -> Self {
        self.metadata_threads = metadata_threads;
        self
    }

    /// Sets [`UringConfig::max_read_bytes`].
    pub fn with_max_read_bytes(mut self, max_read_bytes: u32) -> Self {
        self.max_read_bytes = max_read_bytes;
        self
    }

    /// Sets [`UringConfig::buffered_writes`].
    pub fn with_buffered_writes(mut self, buffered_writes: BufferedWrites) -> Self {
        self.buffered_writes = buffered_writes;
        self
    }

    /// Sets [`UringConfig::coop_taskrun`].
    pub fn with_coop_taskrun(mut self, coop_taskrun: bool) -> Self {
        self.coop_taskrun = coop_taskrun;
        self
    }

    /// Sets [`UringConfig::defer_taskrun`].
    pub fn with_defer_taskrun(mut self, defer_taskrun: bool) -> Self {
        self.defer_taskrun = defer_taskrun;
        self
    }

    /// Checks combinations the kernel refuses, with a message naming the knobs: SQPOLL's
    /// kernel thread runs the completions itself, so COOP_TASKRUN and DEFER_TASKRUN make no
    /// sense with it (`io_uring_setup` fails with EINVAL).
    pub fn validate(&self) -> Result<(), String> {
        if self.sqpoll_idle_ms.is_some() && (self.coop_taskrun || self.defer_taskrun) {
            return Err(format!(
                "SQPOLL cannot be combined with {} (the kernel refuses the ring: its polling thread runs completions itself)",
                if self.defer_taskrun { "DEFER_TASKRUN" } else { "COOP_TASKRUN" }
            ));
        }
        if self.queue_depth == 0 || self.rings == 0 {
            return Err("queue_depth and rings must be at least 1".to_string());
        }
        Ok(())
    }
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            queue_depth: 32,
            rings: 1,
            sqpoll_idle_ms: None,
            register_buffers: true,
            register_files: false,
            direct_io: DirectIoPolicy::Auto,
            metadata_threads: 2,
            max_read_bytes: 0,
            buffered_writes: BufferedWrites::Threads,
            coop_taskrun: false,
            defer_taskrun: false,
        }
    }
}
