//! The [`Tier`] trait: a flat namespace of named objects with positional, owned-buffer I/O.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;

use crate::buf::{AlignedBuf, BufferPool};
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::validate_key;
use crate::listing::{ListOptions, Listing};

/// What a tier can do, as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Reads and writes bypass the page cache (O_DIRECT).
    pub direct_io: bool,
    /// Alignment, in bytes, that buffer addresses, offsets and lengths of direct I/O need on
    /// this tier (the root's `statx` DIO alignment for file tiers; 1 when there is none).
    /// Individual files may differ; file tiers decide per file.
    pub alignment: usize,
    /// A committed object survives a crash of the process and of the machine. False for the
    /// memory tier and for file tiers on a file system held in memory (tmpfs, ramfs).
    pub durable: bool,
    /// Upper bound of bytes the tier may hold, when it has one.
    pub capacity_bytes: Option<u64>,
    /// `read_batch` submits the whole batch at once rather than one request at a time.
    pub native_batch: bool,
    /// [`Tier::lock`] takes real locks (it returns `Some` guard): one writer per tier, held
    /// across processes (file tiers: `flock`; object stores: a conditional-create lease).
    /// False where `lock` returns `Ok(None)` (the memory tier). A layer reports its inner
    /// tier's value and forwards `lock` (see [`crate::layers::LayeredTier`]); the conformance
    /// suite holds every tier and layer to what this says.
    pub locks: bool,
}

impl Default for Capabilities {
    /// No direct I/O, alignment 1, not durable, unbounded, one request at a time; `locks` true:
    /// most tiers lock (file tiers, object stores), and one that does not says so (the memory
    /// tier), so a tier that forgets [`Tier::lock`] fails the conformance suite's `locks` check.
    fn default() -> Self {
        Capabilities {
            direct_io: false,
            alignment: 1,
            durable: false,
            capacity_bytes: None,
            native_batch: false,
            locks: true,
        }
    }
}

/// Room on a tier, in bytes (see [`Tier::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes that can still be written: for a file tier, the file system's blocks available to
    /// this user (`statvfs` `f_bavail` times `f_frsize`).
    pub free_bytes: u64,
    /// Bytes the tier holds when empty: the file system's size, or a capacity bound.
    pub total_bytes: u64,
}

/// Metadata of one committed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification time, where the tier keeps one.
    pub modified: Option<SystemTime>,
}

/// What [`Tier::adopt`] published: the object's metadata and the CRC-32C of its bytes, read
/// once as they were adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The object now under the key.
    pub meta: ObjectMeta,
    /// CRC-32C (Castagnoli) of its bytes.
    pub crc32c: u32,
}

/// A staged object being written. Nothing is visible under its key until [`commit`].
///
/// Dropping a writer without committing discards the staged data (best effort).
///
/// [`commit`]: ObjectWriter::commit
#[async_trait]
pub trait ObjectWriter: Send + fmt::Debug {
    /// The key the object will have once committed.
    fn key(&self) -> &str;

    /// Writes all of `buf.as_slice()` at `offset`, handing the buffer back.
    ///
    /// On tiers with direct I/O, `offset` must be a multiple of the tier's alignment; a length
    /// that is not is allowed (the tail is padded and trimmed at commit).
    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf);

    /// The size of the blocks whose CRC-32Cs [`write_at_crcs`] can use (an S3 writer: its part
    /// size); `None`, the default, for a writer that takes none.
    ///
    /// [`write_at_crcs`]: ObjectWriter::write_at_crcs
    fn crc_block(&self) -> Option<usize> {
        None
    }

    /// [`write_at`] with the CRC-32C of each [`crc_block`]-sized piece of `buf.as_slice()`, in
    /// order (the last may be shorter), taken by the caller while the bytes were in its cache:
    /// a writer that checksums what it sends uses them instead of reading every byte again.
    /// `offset` is a multiple of the block. A CRC that does not match its bytes is caught by
    /// whoever checks it (an S3 server refuses the part); it never passes as the bytes' own.
    /// The default ignores them.
    ///
    /// [`write_at`]: ObjectWriter::write_at
    /// [`crc_block`]: ObjectWriter::crc_block
    async fn write_at_crcs(&mut self, offset: u64, buf: AlignedBuf, crcs: &[u32]) -> (Result<()>, AlignedBuf) {
        let _ = crcs;
        self.write_at(offset, buf).await
    }

    /// Makes the object durable (where the tier is durable) and visible, atomically replacing
    /// any object under the same key. File tiers: data fsync, atomic rename, directory fsync.
    async fn commit(self: Box<Self>) -> Result<ObjectMeta>;

    /// Discards the staged object.
    async fn abort(self: Box<Self>) -> Result<()>;
}

/// One object opened for many positional reads (see [`Tier::open_read`]). Reads may run
/// concurrently; dropping the reader while reads are in flight is safe (they keep what they
/// need open until they complete).
#[async_trait]
pub trait ObjectReader: Send + Sync + fmt::Debug {
    /// The object's size when it was opened.
    fn size(&self) -> u64;

    /// Reads like [`Tier::read_at`], from the opened object.
    async fn read_at(&self, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf);
}

/// An exclusive lock on a tier (see [`Tier::lock`]), released when dropped.
pub struct TierLock {
    _guard: Box<dyn Send + Sync>,
}

impl TierLock {
    /// A lock held for as long as `guard` lives (an open, `flock`ed file, for example).
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        TierLock { _guard: Box::new(guard) }
    }
}

impl fmt::Debug for TierLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TierLock")
    }
}

/// A storage tier: memory, a local filesystem through threads or io_uring, a remote store.
///
/// Keys are validated by every method (see [`crate::key`]); a bad key is an
/// [`ErrorKind::InvalidKey`] error, never a path outside the tier.
///
/// Layers (a tier wrapping a tier) implement [`crate::layers::LayeredTier`] instead, which
/// forwards every method to the inner tier unless the layer changes it. A method added here
/// is added there too (with its forwarding default and its line in the blanket
/// implementation); otherwise every layer would silently answer with this trait's default.
#[async_trait]
pub trait Tier: Send + Sync + fmt::Debug + 'static {
    /// The tier's name, used in errors and as a metric label value (keep it short and fixed).
    fn name(&self) -> &str;

    /// What the tier can do.
    fn capabilities(&self) -> Capabilities;

    /// Metadata of one committed object.
    async fn stat(&self, key: &str) -> Result<ObjectMeta>;

    /// Committed objects whose key starts with `prefix` (a plain string prefix), sorted by key.
    /// Staged, uncommitted objects are never listed.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>>;

    /// Committed objects whose key starts with `prefix`, sorted by key, as one arena of keys and
    /// sizes ([`Listing`]), listed as `options` says: leaving out (and recording) entries that
    /// cannot be listed instead of failing, learning sizes from directory entries instead of a
    /// stat per file, using a cached listing. The default lists with [`Tier::list`]: every
    /// size exact, nothing to skip (a tier whose listing has no bad entries of its own, such
    /// as memory or an object store). File tiers implement all of it
    /// ([`crate::fs::FsRoot::list_with`]); layers forward it.
    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        let _ = options;
        Ok(Listing::from_objects(self.list(prefix).await?))
    }

    /// Removes a committed object. Deleting a missing object is a `NotFound` error.
    async fn delete(&self, key: &str) -> Result<()>;

    /// Takes the exclusive advisory lock `name` (one key component) on this tier, held until
    /// the returned guard is dropped; a lock held elsewhere is an [`ErrorKind::Busy`] error
    /// that says who holds it. `Ok(None)` where the tier has no locks (the default: the memory
    /// tier); [`Capabilities::locks`] says which. File tiers: `flock` on
    /// `ROOT/.ringtier-lock-NAME`, which the kernel releases when the holding process dies;
    /// S3: a conditional-create lease. Layers forward it ([`crate::layers::LayeredTier`]).
    async fn lock(&self, name: &str) -> Result<Option<TierLock>> {
        let _ = name;
        Ok(None)
    }

    /// Removes the directory `prefix` names and the directories below it that hold nothing,
    /// once every object under it was deleted (a checkpoint step's directory after its parts
    /// and manifest). File tiers: [`crate::fs::FsRoot::remove_empty_dirs`] (links never
    /// followed, a directory that still holds anything kept). `Ok(())` (the default) where keys
    /// are not directories (memory, object stores). Layers forward it.
    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        let _ = prefix;
        Ok(())
    }

    /// Room on the tier now, where it can tell: the file system's free and total bytes for file
    /// tiers (`statvfs` of the root), the capacity bound minus what is held for a bounded memory
    /// tier. `Ok(None)` (the default) where it cannot (an unbounded memory tier, remote stores).
    /// Layers forward it. A burst buffer treats the free bytes as a capacity.
    async fn space(&self) -> Result<Option<Space>> {
        Ok(None)
    }

    /// The buffer pool this tier reads into best (registered with the kernel as fixed
    /// buffers, for the io_uring tier), when it has one. A loader over the tier takes its
    /// buffers from it instead of allocating a second, unregistered pool. Layers forward it.
    fn buffer_pool(&self) -> Option<BufferPool> {
        None
    }

    /// Reads up to `len` bytes at `offset` into `buf` and hands it back with the byte count.
    ///
    /// The data lands in `buf.as_slice()` (its window is set; on direct-I/O tiers it may start
    /// past the beginning of the memory). Fewer than `len` bytes are returned only at the end
    /// of the object; a read starting exactly at the end returns 0, one starting past it is
    /// an [`ErrorKind::OutOfRange`] error. `buf` must be large enough for the read, including
    /// the aligned span around it on direct-I/O tiers (see [`crate::buf::direct_span`]).
    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf);

    /// Starts a staged object under `key`.
    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>>;

    /// Publishes what lies at `from` under `key` without copying its bytes, with the durability
    /// of [`ObjectWriter::commit`], and returns it with the CRC-32C of its bytes; `Ok(None)`
    /// where it is not adopted, and then `from` is left as it was (copy it instead).
    ///
    /// `from` is written as a key (relative, no `..`, no `.ringtier` component). File tiers
    /// ([`crate::fs::FsRoot::adopt`]): a regular file under the root that a program wrote there
    /// itself (TensorFlow's saver into a directory of the fast tier), never through a link (a
    /// link on the way or at `from` is [`ErrorKind::PermissionDenied`] naming it; a FIFO, a
    /// directory or a device is [`ErrorKind::InvalidInput`]). It is moved into the tier's
    /// staging directory, read once for its CRC-32C (from the page cache, while its writeback
    /// runs), its data fsynced, renamed onto `key`, the directory fsynced. A file with several
    /// links (another name could change the object) or on another file system is declined.
    /// The memory tier moves the object. The default, `Ok(None)`: object stores, and layers
    /// that change writes (see [`crate::layers::LayeredTier::adopt`]). The caller must not
    /// change the file while it is adopted; an error after the move puts it back at `from`
    /// where it can.
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        let _ = (from, key);
        Ok(None)
    }

    /// Opens `key` for many positional reads, where the tier has a faster way than reading by
    /// key each time: the io_uring tier opens the file once (O_DIRECT per the file, a fixed
    /// file where registered) instead of an open and a close around every read. `Ok(None)`
    /// (the default) where it has not: read by key then. Layers forward it by default; the
    /// metered layer wraps the reader, counting its reads; layers that change reads (throttle,
    /// faults, power cut, cache) answer `Ok(None)`, so every read still goes through them.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let _ = key;
        Ok(None)
    }

    /// Performs every pending request of `batch`, setting each one's result.
    ///
    /// The default runs the requests one after another through [`Tier::read_at`]; tiers with
    /// a native batch path submit them together.
    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        read_one_at_a_time(self, batch).await
    }
}

/// Performs every pending request of `batch` one after another through `tier`'s
/// [`Tier::read_at`], recording each one's latency: [`Tier::read_batch`]'s default, and what a
/// layer that changes single reads (faults, power cut) uses so that every request of a batch
/// goes through its `read_at`.
pub async fn read_one_at_a_time<T: Tier + ?Sized>(tier: &T, mut batch: ReadBatch) -> ReadBatch {
    let (keys, entries) = batch.parts_mut();
    for entry in entries.iter_mut().filter(|e| !e.is_done()) {
        let Some(buf) = entry.take_buf() else {
            continue;
        };
        let key = entry.key(keys);
        let start = std::time::Instant::now();
        let (res, buf) = tier.read_at(key, entry.offset(), entry.len(), buf).await;
        entry.set_latency(start.elapsed());
        entry.finish(res, buf);
    }
    batch
}

/// One request of a [`ReadBatch`].
#[derive(Debug)]
pub struct ReadEntry {
    key_start: u32,
    key_end: u32,
    offset: u64,
    len: usize,
    buf: Option<AlignedBuf>,
    result: Option<Result<usize>>,
    latency: Option<std::time::Duration>,
}

impl ReadEntry {
    /// Service time of the request, where the tier measures it: from its first submission to
    /// the data being in the buffer (queueing inside the batch before it started excluded).
    #[inline]
    pub fn latency(&self) -> Option<std::time::Duration> {
        self.latency
    }

    /// Records the request's service time.
    #[inline]
    pub fn set_latency(&mut self, latency: std::time::Duration) {
        self.latency = Some(latency);
    }

    /// The request's key, given the batch's key arena (from [`ReadBatch::parts_mut`]).
    #[inline]
    pub fn key<'k>(&self, keys: &'k str) -> &'k str {
        &keys[self.key_start as usize..self.key_end as usize]
    }

    /// Byte offset in the object.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes asked for.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length request.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the request has its result.
    #[inline]
    pub fn is_done(&self) -> bool {
        self.result.is_some()
    }

    /// Takes the buffer out for submission; `finish` puts it back.
    #[inline]
    pub fn take_buf(&mut self) -> Option<AlignedBuf> {
        self.buf.take()
    }

    /// Borrows the buffer.
    #[inline]
    pub fn buf(&self) -> Option<&AlignedBuf> {
        self.buf.as_ref()
    }

    /// Records the result and hands the buffer back.
    #[inline]
    pub fn finish(&mut self, result: Result<usize>, buf: AlignedBuf) {
        self.buf = Some(buf);
        self.result = Some(result);
    }

    /// Records a result while the buffer stays where it is.
    #[inline]
    pub fn set_result(&mut self, result: Result<usize>) {
        self.result = Some(result);
    }

    /// The result, once done.
    #[inline]
    pub fn result(&self) -> Option<&Result<usize>> {
        self.result.as_ref()
    }
}

/// A reusable batch of positional reads: (key, offset, length, buffer) requests.
///
/// Keys are copied into one arena string and entries into one vector, both reused across
/// batches, so a steady-state batch allocates nothing per request.
#[derive(Debug, Default)]
pub struct ReadBatch {
    keys: String,
    entries: Vec<ReadEntry>,
}

impl ReadBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `n` requests and `key_bytes` bytes of keys.
    pub fn with_capacity(n: usize, key_bytes: usize) -> Self {
        ReadBatch { keys: String::with_capacity(key_bytes), entries: Vec::with_capacity(n) }
    }

    /// Adds a request. An invalid key does not fail here: the request is marked done with an
    /// [`ErrorKind::InvalidKey`] error and its buffer stays in the batch.
    pub fn push(&mut self, key: &str, offset: u64, len: usize, buf: AlignedBuf) {
        if self.entries.is_empty() {
            self.keys.clear();
        }
        let result = match validate_key(key) {
            Ok(()) => None,
            Err(e) => Some(Err(e.with_operation(Operation::Read))),
        };
        let key_start = self.keys.len() as u32;
        if result.is_none() {
            self.keys.push_str(key);
        }
        let key_end = self.keys.len() as u32;
        self.entries.push(ReadEntry { key_start, key_end, offset, len, buf: Some(buf), result, latency: None });
    }

    /// Adds a request without a key, for reading ranges of one open file (for example
    /// `ringtier_uring::UringFile::read_batch`). A tier given such a request reports it as an
    /// [`ErrorKind::InvalidKey`] error.
    pub fn push_range(&mut self, offset: u64, len: usize, buf: AlignedBuf) {
        if self.entries.is_empty() {
            self.keys.clear();
        }
        let at = self.keys.len() as u32;
        self.entries.push(ReadEntry {
            key_start: at,
            key_end: at,
            offset,
            len,
            buf: Some(buf),
            result: None,
            latency: None,
        });
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the batch holds no request.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total bytes asked for.
    pub fn requested_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.len as u64).sum()
    }

    /// The key arena and the entries, for tiers executing the batch.
    pub fn parts_mut(&mut self) -> (&str, &mut [ReadEntry]) {
        (&self.keys, &mut self.entries)
    }

    /// The `i`-th request as (key, entry).
    pub fn get(&self, i: usize) -> Option<(&str, &ReadEntry)> {
        self.entries.get(i).map(|e| (e.key(&self.keys), e))
    }

    /// Iterates over (key, entry).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ReadEntry)> {
        self.entries.iter().map(move |e| (e.key(&self.keys), e))
    }

    /// Marks every request not yet done with a clone of `err`'s kind and message.
    pub fn fail_pending(&mut self, err: &Error) {
        for e in self.entries.iter_mut().filter(|e| e.result.is_none()) {
            let key = &self.keys[e.key_start as usize..e.key_end as usize];
            e.result = Some(Err(Error::new(err.kind(), err.message().to_string())
                .set_temporary(err.is_temporary())
                .with_operation(Operation::Read)
                .with_key(key)));
        }
    }

    /// Removes every request, handing out (key, offset, result, buffer).
    /// Requests never executed report an [`ErrorKind::Shutdown`] error.
    pub fn drain(&mut self) -> impl Iterator<Item = (&str, u64, Result<usize>, Option<AlignedBuf>)> + '_ {
        let keys = &self.keys;
        self.entries.drain(..).map(move |e| {
            let key = &keys[e.key_start as usize..e.key_end as usize];
            let result = e
                .result
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Shutdown, "request was not executed").with_key(key)));
            (key, e.offset, result, e.buf)
        })
    }

    /// Removes every request, dropping the buffers (pooled ones return to their pool).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.keys.clear();
    }
}
