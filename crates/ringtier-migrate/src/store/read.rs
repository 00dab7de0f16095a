//! The one read path of restore, drain and verify: spans of part objects read in order, many
//! chunk reads in flight (each its own task, so reads progress while the consumer writes),
//! answered in order, with memory bounded by `depth` buffers of one chunk.

use super::*;
use ringtier_core::ObjectReader;
use std::collections::VecDeque;
use tokio::task::JoinHandle;

/// A byte range of one object to read.
pub(super) struct Span {
    pub(super) tier: Arc<dyn Tier>,
    pub(super) key: String,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The object of a span, opened once by its first read ([`Tier::open_read`]) and shared by
/// the others; `None` inside where the tier reads by key.
type Opened = Arc<tokio::sync::OnceCell<Option<Arc<dyn ObjectReader>>>>;

/// One chunk read: through the opened object where the tier has one, by key otherwise.
async fn read_chunk(
    tier: Arc<dyn Tier>,
    key: String,
    opened: Opened,
    off: u64,
    len: usize,
    buf: AlignedBuf,
) -> (Result<usize>, AlignedBuf) {
    match opened.get_or_try_init(|| tier.open_read(&key)).await {
        Ok(Some(reader)) => reader.read_at(off, len, buf).await,
        Ok(None) => tier.read_at(&key, off, len, buf).await,
        Err(e) => (Err(e), buf),
    }
}

/// One answered chunk read: `buf.as_slice()` holds `[offset, offset + len)` of span `span`,
/// or the read failed. Spans of zero bytes are answered by one chunk with no buffer.
pub(super) struct Chunk {
    pub(super) span: usize,
    pub(super) offset: u64,
    pub(super) result: Result<usize>,
    pub(super) buf: Option<AlignedBuf>,
}

struct InFlight {
    span: usize,
    offset: u64,
    len: usize,
    task: Option<JoinHandle<(Result<usize>, AlignedBuf)>>,
}

/// Chunk reads of a list of spans, issued in order with up to `depth` in flight.
pub(super) struct ChunkReads {
    spans: Vec<Span>,
    /// Per span, its opened object.
    opened: Vec<Opened>,
    /// Next read to issue: span index and offset.
    cursor: (usize, u64),
    queue: VecDeque<InFlight>,
    free: Vec<AlignedBuf>,
    /// Buffers that exist (free, in flight or lent to the consumer).
    buffers: usize,
    chunk: usize,
    align: usize,
    /// Bytes of each read buffer: a chunk and one alignment block (a direct read may need the
    /// aligned span), less where every span is shorter than a chunk (a small part gets a
    /// buffer its size, not a chunk's).
    buf_size: usize,
    depth: usize,
    /// Where a direct restore reads each chunk instead of a pool buffer (see `direct.rs`).
    targets: Option<Arc<dyn ReadTargets>>,
}

impl ChunkReads {
    /// Reads of `spans` in chunks of `chunk` bytes (a multiple of every tier's alignment) with
    /// up to `depth` in flight.
    pub(super) fn new(spans: Vec<Span>, chunk: usize, depth: usize) -> Self {
        let align = spans.iter().map(|s| s.tier.capabilities().alignment).max().unwrap_or(1).max(4096);
        let chunk = ringtier_core::buf::align_up(chunk.max(4096) as u64, align as u64) as usize;
        let cursor = (0, spans.first().map_or(0, |s| s.start));
        let longest = spans.iter().map(|s| s.end.saturating_sub(s.start)).max().unwrap_or(0);
        let read = ringtier_core::buf::align_up(longest.clamp(1, chunk as u64), align as u64) as usize;
        ChunkReads {
            opened: spans.iter().map(|_| Opened::default()).collect(),
            spans,
            cursor,
            queue: VecDeque::new(),
            free: Vec::new(),
            buffers: 0,
            chunk,
            align,
            buf_size: read + align,
            depth: depth.max(1),
            targets: None,
        }
    }

    /// Alignment of every read (the largest of the tiers', at least 4096).
    pub(super) fn align(&self) -> usize {
        self.align
    }

    /// Reads each chunk straight into the window of `targets` it belongs to, not a pool buffer.
    pub(super) fn set_targets(&mut self, targets: Arc<dyn ReadTargets>) {
        self.targets = Some(targets);
    }

    /// Bytes per read.
    pub(super) fn chunk(&self) -> usize {
        self.chunk
    }

    /// The spans, as given (with tiers switched by [`ChunkReads::restart`]).
    pub(super) fn span(&self, i: usize) -> &Span {
        &self.spans[i]
    }

    /// Lends `bufs` (kept from an earlier restore) for this one's reads, so that it does not
    /// allocate (and fault in) buffers of its own: those too small or past `depth` are dropped.
    pub(super) fn seed(&mut self, bufs: Vec<AlignedBuf>) {
        for mut b in bufs {
            if self.buffers < self.depth && b.capacity() >= self.buf_size && b.align() >= self.align {
                b.clear();
                self.free.push(b);
                self.buffers += 1;
            }
        }
    }

    /// The read buffers not in use, taken back (for the next restore to [`seed`](Self::seed)).
    pub(super) fn take_free(&mut self) -> Vec<AlignedBuf> {
        self.buffers = self.buffers.saturating_sub(self.free.len());
        std::mem::take(&mut self.free)
    }

    /// Hands a buffer back for later reads.
    pub(super) fn recycle(&mut self, mut buf: AlignedBuf) {
        if self.targets.is_some() {
            // A window of the destination: dropping it hands it back to its owner.
            drop(buf);
            return;
        }
        if buf.capacity() >= self.buf_size && buf.align() >= self.align {
            buf.clear();
            self.free.push(buf);
        } else {
            // Not one of ours (a sink handed back another): it stands for one of ours, which
            // the sink keeps, so a new one may be allocated in its place.
            drop(buf);
            self.buffers = self.buffers.saturating_sub(1);
        }
    }

    /// A buffer of this reader's size for the consumer (one that is not being read into).
    pub(super) fn spare_buffer(&mut self) -> Result<AlignedBuf> {
        match self.free.pop() {
            Some(b) => Ok(b),
            None => AlignedBuf::new(self.chunk + self.align, self.align),
        }
    }

    fn buffer(&mut self) -> Result<Option<AlignedBuf>> {
        if let Some(b) = self.free.pop() {
            return Ok(Some(b));
        }
        if self.buffers < self.depth {
            let b = AlignedBuf::new(self.buf_size, self.align)?;
            self.buffers += 1;
            return Ok(Some(b));
        }
        Ok(None)
    }

    /// Issues reads until `depth` are in flight, the buffers are all lent, or every span is
    /// issued.
    fn refill(&mut self) -> Result<()> {
        while self.queue.len() < self.depth {
            let (i, off) = self.cursor;
            let Some(span) = self.spans.get(i) else { break };
            let (span_end, empty) = (span.end, span.start == span.end);
            if empty {
                self.queue.push_back(InFlight { span: i, offset: off, len: 0, task: None });
                self.cursor = (i + 1, self.spans.get(i + 1).map_or(0, |s| s.start));
                continue;
            }
            let len = (self.chunk as u64).min(span_end - off) as usize;
            let buf = match &self.targets {
                Some(t) => t.window(i, off - self.spans[i].start, len, self.align)?,
                None => match self.buffer()? {
                    Some(b) => b,
                    None => break,
                },
            };
            let span = &self.spans[i];
            let task = tokio::spawn(read_chunk(
                Arc::clone(&span.tier),
                span.key.clone(),
                Arc::clone(&self.opened[i]),
                off,
                len,
                buf,
            ));
            self.queue.push_back(InFlight { span: i, offset: off, len, task: Some(task) });
            self.cursor = if off + len as u64 >= span_end {
                (i + 1, self.spans.get(i + 1).map_or(0, |s| s.start))
            } else {
                (i, off + len as u64)
            };
        }
        Ok(())
    }

    /// The next chunk, in span and offset order; `None` after the last.
    pub(super) async fn next(&mut self) -> Option<Chunk> {
        if let Err(e) = self.refill() {
            if self.queue.is_empty() {
                let span = self.cursor.0;
                if span >= self.spans.len() {
                    return None;
                }
                return Some(Chunk { span, offset: self.cursor.1, result: Err(e), buf: None });
            }
        }
        let f = self.queue.pop_front()?;
        let Some(task) = f.task else {
            return Some(Chunk { span: f.span, offset: f.offset, result: Ok(0), buf: None });
        };
        let (result, buf) = match task.await {
            Ok((Ok(n), mut buf)) if self.targets.is_some() && buf.head() != 0 => {
                // A tier that read a wider span left the bytes past the window's start: move
                // them where they belong in the destination.
                let head = buf.head();
                buf.capacity_mut().copy_within(head..head + n, 0);
                (buf.set_window(0, n).map(|()| n), Some(buf))
            }
            Ok((res, buf)) => (res, Some(buf)),
            Err(e) => {
                // The task (and its buffer) is gone. Saturating: a buffer a sink kept, or a
                // window of a direct restore's destination, was never counted here.
                self.buffers = self.buffers.saturating_sub(1);
                (Err(Error::new(ErrorKind::Shutdown, format!("a read task ended without its result: {e}"))), None)
            }
        };
        let span = &self.spans[f.span];
        let result = match result {
            Ok(n) if n == f.len => Ok(n),
            Ok(n) => Err(Error::new(
                ErrorKind::Corrupt,
                format!("{} on tier {:?} is truncated at {} bytes", span.key, span.tier.name(), f.offset + n as u64),
            )),
            Err(e) if e.kind() == ErrorKind::OutOfRange => Err(Error::new(
                ErrorKind::Corrupt,
                format!("{} on tier {:?} is truncated before {} bytes", span.key, span.tier.name(), f.offset),
            )),
            Err(e) => Err(e.context(Operation::Read, &span.key, span.tier.name())),
        };
        // Keep the pipe full while the consumer works on this chunk.
        let _ = self.refill();
        Some(Chunk { span: f.span, offset: f.offset, result, buf })
    }

    /// Drops every read issued so far (waiting for them, so their buffers come back), points
    /// span `span` at `tier` and `key`, and goes on from its start.
    pub(super) async fn restart(&mut self, span: usize, tier: Arc<dyn Tier>, key: String) {
        while let Some(f) = self.queue.pop_front() {
            if let Some(task) = f.task {
                match task.await {
                    Ok((_, buf)) => self.recycle(buf),
                    Err(_) => self.buffers = self.buffers.saturating_sub(1),
                }
            }
        }
        let s = &mut self.spans[span];
        s.tier = tier;
        s.key = key;
        self.opened[span] = Opened::default();
        self.cursor = (span, s.start);
    }
}

/// A part as a restore delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// Its position in the checkpoint's manifest (save order).
    pub index: usize,
    /// Its name.
    pub name: String,
    /// Its size in bytes (the whole part, also when a range of it is read).
    pub size: u64,
    /// The CRC-32C of the whole part, from the manifest.
    pub crc32c: u32,
    /// The bytes of the part this restore delivers, `start..end` (the whole part but for
    /// [`CheckpointStore::read_part_range`]); offsets given to the sink count from `start`.
    pub start: u64,
    /// See [`PartInfo::start`].
    pub end: u64,
}

/// Where a restore puts the bytes it reads: see [`CheckpointStore::restore`].
///
/// The store calls, for each part in save order: [`begin`](RestoreSink::begin), then
/// [`write`](RestoreSink::write) with consecutive chunks (offsets relative to the start of what
/// is read of the part), then [`finish`](RestoreSink::finish) once the whole part has arrived
/// and its checksum matched. When a copy turns out bad part-way (truncated, corrupt, gone), the
/// store calls [`discard`](RestoreSink::discard) and delivers the part again from the start,
/// from the next tier holding a copy. Chunks arrive in owned, aligned buffers that the sink
/// hands back (a file sink writes them as they are, without a copy). An error from the sink
/// ends the restore (after `discard`).
///
/// Implementations may write `async fn` for these methods.
pub trait RestoreSink: Send {
    /// Called once, before anything is read, with every part that will be delivered: check
    /// sizes and destinations here, so that bad arguments fail before any I/O.
    fn prepare(&mut self, parts: &[PartInfo]) -> impl std::future::Future<Output = Result<()>> + Send {
        let _ = parts;
        async { Ok(()) }
    }

    /// Part `part` starts (again, after a discard).
    fn begin(&mut self, part: &PartInfo) -> impl std::future::Future<Output = Result<()>> + Send;

    /// The part's next bytes, `buf.as_slice()`, at `offset`; hand `buf` back.
    fn write(
        &mut self,
        part: &PartInfo,
        offset: u64,
        buf: AlignedBuf,
    ) -> impl std::future::Future<Output = (Result<()>, AlignedBuf)> + Send;

    /// Every byte of the part arrived and (for whole parts) matched its checksum.
    fn finish(&mut self, part: &PartInfo) -> impl std::future::Future<Output = Result<()>> + Send;

    /// What was written of the part since its `begin` must not be used.
    fn discard(&mut self, part: &PartInfo) -> impl std::future::Future<Output = ()> + Send;
}
