//! Reading safetensors files through a [`Tier`]: the header first (one small read, a second
//! one only for a header larger than the first read), then the data region in large aligned
//! chunks with many reads in flight, into memory the caller chooses.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::stream::{FuturesUnordered, StreamExt};
use ringtier_core::buf::{align_down, align_up, direct_span};
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::{AlignedBuf, ObjectReader, Tier};

use crate::header::{Header, LEN_BYTES};

/// Bytes of the first read of a file: the length field and, for most files, the whole JSON.
const FIRST_READ: usize = 256 << 10;

/// How the data region is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Bytes per read request (rounded up to the alignment). Default 8 MiB.
    pub chunk_bytes: usize,
    /// Read requests in flight at once, over all the files of one call. Default 16.
    pub depth: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { chunk_bytes: 8 << 20, depth: 16 }
    }
}

impl ReadOptions {
    /// Sets [`ReadOptions::chunk_bytes`].
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// Sets [`ReadOptions::depth`].
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }
}

/// The alignment every read of `tier` uses: the tier's, at least a page.
pub fn read_alignment(tier: &dyn Tier) -> usize {
    tier.capabilities().alignment.max(4096)
}

/// One safetensors object of a tier, its header read and checked (see [`SafetensorsFile::open`]).
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    tier: Arc<dyn Tier>,
    key: String,
    reader: Option<Arc<dyn ObjectReader>>,
    header: Header,
}

async fn read_one(
    tier: &Arc<dyn Tier>,
    reader: Option<&Arc<dyn ObjectReader>>,
    key: &str,
    offset: u64,
    len: usize,
    buf: AlignedBuf,
) -> (Result<usize>, AlignedBuf) {
    match reader {
        Some(r) => r.read_at(offset, len, buf).await,
        None => tier.read_at(key, offset, len, buf).await,
    }
}

/// `[offset, offset + len)` of `key`, all of it, in a buffer whose window it is.
async fn exact(
    tier: &Arc<dyn Tier>,
    reader: Option<&Arc<dyn ObjectReader>>,
    key: &str,
    offset: u64,
    len: usize,
) -> Result<AlignedBuf> {
    let align = read_alignment(tier.as_ref());
    let (_, span, _) = direct_span(offset, len, align as u64);
    let buf = AlignedBuf::new(span + align, align)?;
    let ctx = |e: Error| e.context(Operation::Read, key, tier.name());
    let (res, buf) = read_one(tier, reader, key, offset, len, buf).await;
    match res {
        Ok(n) if n == len => Ok(buf),
        Ok(n) => Err(ctx(Error::new(ErrorKind::Corrupt, format!("truncated: {n} of {len} bytes at offset {offset}")))),
        Err(e) if e.kind() == ErrorKind::OutOfRange => {
            Err(ctx(Error::new(ErrorKind::Corrupt, format!("truncated before offset {offset}"))))
        }
        Err(e) => Err(ctx(e)),
    }
}

/// The part of a file the data read covers: from the data region's start rounded down to the
/// alignment, to the end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSpan {
    /// Offset in the file of the span's first byte (a multiple of the alignment).
    pub base: u64,
    /// Bytes of the span (0 for a file without tensor bytes).
    pub len: u64,
    /// Offset in the span of the data region's first byte (byte 0 of the first tensor).
    pub data_offset: u64,
}

impl SafetensorsFile {
    /// Opens `key` on `tier`: its size, then its header, read and checked as hostile input
    /// (see [`Header::parse`]): the JSON's length is bounded by the file's size and
    /// [`crate::MAX_HEADER_BYTES`] before it is read.
    pub async fn open(tier: Arc<dyn Tier>, key: &str) -> Result<SafetensorsFile> {
        let size = tier.stat(key).await?.size;
        let reader = tier.open_read(key).await?;
        let ctx = |e: Error| e.context(Operation::Read, key, tier.name());
        let first_len = FIRST_READ.min(usize::try_from(size).unwrap_or(FIRST_READ));
        let first = exact(&tier, reader.as_ref(), key, 0, first_len).await?;
        let n = Header::json_len_from(first.as_slice(), size).map_err(ctx)?;
        let need = (LEN_BYTES + n) as usize;
        let header = if need <= first.len() {
            Header::parse(first.as_slice(), size)
        } else {
            drop(first);
            let all = exact(&tier, reader.as_ref(), key, 0, need).await?;
            Header::parse(all.as_slice(), size)
        }
        .map_err(ctx)?;
        Ok(SafetensorsFile { tier, key: key.to_string(), reader, header })
    }

    fn context(&self, e: Error) -> Error {
        e.context(Operation::Read, &self.key, self.tier.name())
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tier it is read from.
    pub fn tier(&self) -> &Arc<dyn Tier> {
        &self.tier
    }

    /// Its header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The span a data read of this file covers, for reads aligned to `align`.
    pub fn data_span(&self, align: usize) -> DataSpan {
        let start = self.header.data_start();
        if self.header.data_len() == 0 {
            return DataSpan { base: start, len: 0, data_offset: 0 };
        }
        let base = align_down(start, align as u64);
        DataSpan { base, len: self.header.file_size() - base, data_offset: start - base }
    }

    /// One read at `offset` of `len` bytes into `buf` (through the opened object where the
    /// tier has one).
    async fn read_at(&self, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        read_one(&self.tier, self.reader.as_ref(), &self.key, offset, len, buf).await
    }

    /// Bytes `[offset, offset + len)` of the file, all of them (a short read is a
    /// [`ErrorKind::Corrupt`] error: the file shrank), in a buffer whose window they are.
    pub async fn read_exact(&self, offset: u64, len: usize) -> Result<AlignedBuf> {
        exact(&self.tier, self.reader.as_ref(), &self.key, offset, len).await
    }

    /// The bytes of tensor `name`, read on their own (lazy access): the buffer's window is
    /// exactly the tensor's bytes. A [`ErrorKind::NotFound`] error for a name the file lacks.
    pub async fn read_tensor(&self, name: &str) -> Result<AlignedBuf> {
        let t = self
            .header
            .get(name)
            .ok_or_else(|| self.context(Error::new(ErrorKind::NotFound, format!("no tensor {name:?} in this file"))))?;
        let len = usize::try_from(t.byte_len())
            .map_err(|_| Error::new(ErrorKind::ResourceExhausted, "tensor larger than memory"))?;
        self.read_exact(self.header.data_start() + t.data_offsets.0, len).await
    }

    /// Reads the whole data region into one page-aligned buffer of its own, which is returned
    /// with its window set to the data region (tensor offsets index it directly). The chunks
    /// are read at depth into `depth` buffers of one chunk and copied into place; for reads
    /// without that copy, see [`read_into_targets`].
    pub async fn read_all(&self, opts: &ReadOptions) -> Result<AlignedBuf> {
        let align = read_alignment(self.tier.as_ref());
        let span = self.data_span(align);
        let len = usize::try_from(span.len)
            .map_err(|_| Error::new(ErrorKind::ResourceExhausted, "file larger than memory"))?;
        let mut out = AlignedBuf::new(len.max(1), align)?;
        {
            let dest = out.capacity_mut();
            read_chunks(std::slice::from_ref(self), opts, |_, at, bytes| {
                dest[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
                Ok(())
            })
            .await?;
        }
        out.set_window(span.data_offset as usize, self.header.data_len() as usize)?;
        Ok(out)
    }
}

/// Memory a data read lands in without a copy: for each file, one region the size of its
/// [`DataSpan`], lent out in windows, one per read request. The Python package's
/// implementation maps one anonymous region per file and faults it in ahead of the reads.
pub trait DataTargets: Send + Sync {
    /// Called once before any read with each file's span length (`spans[i]` for file `i`)
    /// and the alignment of every read.
    fn prepare(&self, spans: &[u64], align: usize) -> Result<()>;

    /// The buffer to read bytes `[offset, offset + len)` of file `file`'s span into: at least
    /// `len` bytes rounded up to `align`, aligned to `align`, its first byte where byte
    /// `offset` of the span belongs. Dropping it hands it back.
    fn window(&self, file: usize, offset: u64, len: usize, align: usize) -> Result<AlignedBuf>;
}

type ReadFuture = Pin<Box<dyn Future<Output = (usize, u64, usize, (Result<usize>, AlignedBuf))> + Send>>;

/// The chunk reads of `files`' spans: (file, offset in the file, offset in its span, length),
/// in order; with `wanted`, of each file only the aligned chunks covering `wanted[i]` (a range
/// of its data region; empty: none of it).
fn requests<'a>(
    files: &'a [SafetensorsFile],
    wanted: Option<&'a [Range<u64>]>,
    align: usize,
    chunk: usize,
) -> impl Iterator<Item = (usize, u64, u64, usize)> + 'a {
    files.iter().enumerate().flat_map(move |(i, f)| {
        let span = f.data_span(align);
        let (from, to) = match wanted.and_then(|w| w.get(i)) {
            None if wanted.is_some() => (0, 0),
            None => (0, span.len),
            Some(r) if r.start >= r.end || span.len == 0 => (0, 0),
            Some(r) => {
                let from = align_down(span.data_offset + r.start, align as u64).min(span.len);
                (from, align_up(span.data_offset + r.end, align as u64).min(span.len))
            }
        };
        let n = (to - from).div_ceil(chunk as u64);
        (0..n).map(move |c| {
            let off = from + c * chunk as u64;
            (i, span.base + off, off, (to - off).min(chunk as u64) as usize)
        })
    })
}

/// Runs the chunk reads of `files` with up to `opts.depth` in flight: `buffer` gives each
/// request's buffer (file, offset in its span, length), `done` takes each completed one
/// (file, offset in its span, the buffer with the bytes as its window) in completion order.
async fn drive<B, D>(
    files: &[SafetensorsFile],
    wanted: Option<&[Range<u64>]>,
    opts: &ReadOptions,
    align: usize,
    mut buffer: B,
    mut done: D,
) -> Result<()>
where
    B: FnMut(usize, u64, usize) -> Result<AlignedBuf>,
    D: FnMut(usize, u64, AlignedBuf) -> Result<()>,
{
    let chunk = align_up(opts.chunk_bytes.max(align) as u64, align as u64) as usize;
    let mut todo = requests(files, wanted, align, chunk);
    let mut flight: FuturesUnordered<ReadFuture> = FuturesUnordered::new();
    let depth = opts.depth.max(1);
    loop {
        while flight.len() < depth {
            let Some((i, at, span_off, len)) = todo.next() else { break };
            let buf = buffer(i, span_off, len)?;
            let f = files[i].clone();
            flight.push(Box::pin(async move {
                let r = f.read_at(at, len, buf).await;
                (i, span_off, len, r)
            }));
        }
        let Some((i, span_off, len, (res, mut buf))) = flight.next().await else { return Ok(()) };
        let f = &files[i];
        let at = f.data_span(align).base + span_off;
        match res {
            Ok(n) if n == len => {}
            Ok(n) => {
                return Err(f.context(Error::new(
                    ErrorKind::Corrupt,
                    format!("truncated: {n} of {len} bytes at offset {at} (the file shrank while read)"),
                )))
            }
            Err(e) if e.kind() == ErrorKind::OutOfRange => {
                return Err(f.context(Error::new(ErrorKind::Corrupt, format!("truncated before offset {at}"))))
            }
            Err(e) => return Err(f.context(e)),
        }
        if buf.head() != 0 {
            // A tier that read a wider span left the bytes past the buffer's start.
            let head = buf.head();
            buf.capacity_mut().copy_within(head..head + len, 0);
            buf.set_window(0, len)?;
        }
        done(i, span_off, buf)?;
    }
}

/// Reads the data spans of `files` (one tier or several) straight into `targets`, with up
/// to `opts.depth` reads in flight over all of them: no copy of the data. Returns each file's
/// span, in the order of `files`; tensor `t` of file `i` is then at
/// `spans[i].data_offset + t.data_offsets.0` in that file's region.
pub async fn read_into_targets(
    files: &[SafetensorsFile],
    targets: &dyn DataTargets,
    opts: &ReadOptions,
) -> Result<Vec<DataSpan>> {
    let align = files.iter().map(|f| read_alignment(f.tier.as_ref())).max().unwrap_or(4096);
    let spans: Vec<DataSpan> = files.iter().map(|f| f.data_span(align)).collect();
    targets.prepare(&spans.iter().map(|s| s.len).collect::<Vec<_>>(), align)?;
    drive(
        files,
        None,
        opts,
        align,
        |i, off, len| targets.window(i, off, len, align),
        |_, _, buf| {
            drop(buf);
            Ok(())
        },
    )
    .await?;
    Ok(spans)
}

/// Reads the data spans of `files` in chunks at depth into `opts.depth` buffers of one chunk
/// (bounded memory), handing each chunk to `sink` as (file, offset in its span, bytes) in
/// completion order: the way to fill memory the caller already has (tensors given to load
/// into). Subtract [`DataSpan::data_offset`] for offsets in the data region.
pub async fn read_chunks<S>(files: &[SafetensorsFile], opts: &ReadOptions, sink: S) -> Result<()>
where
    S: FnMut(usize, u64, &[u8]) -> Result<()>,
{
    read_chunks_inner(files, None, opts, sink).await
}

/// [`read_chunks`] of only part of each file: `wanted[i]` is the range of file `i`'s data
/// region to read (an empty range: none of it; `wanted` shorter than `files`: none of the
/// files past its end). The chunks read are the aligned ones covering each range, so a sink
/// sees bytes before and after it within the first and last chunk: clip to what you want.
pub async fn read_chunks_of<S>(
    files: &[SafetensorsFile],
    wanted: &[Range<u64>],
    opts: &ReadOptions,
    sink: S,
) -> Result<()>
where
    S: FnMut(usize, u64, &[u8]) -> Result<()>,
{
    read_chunks_inner(files, Some(wanted), opts, sink).await
}

async fn read_chunks_inner<S>(
    files: &[SafetensorsFile],
    wanted: Option<&[Range<u64>]>,
    opts: &ReadOptions,
    mut sink: S,
) -> Result<()>
where
    S: FnMut(usize, u64, &[u8]) -> Result<()>,
{
    let align = files.iter().map(|f| read_alignment(f.tier.as_ref())).max().unwrap_or(4096);
    let chunk = align_up(opts.chunk_bytes.max(align) as u64, align as u64) as usize;
    // At most `depth` buffers exist: each comes back here once its bytes are handed on.
    let free: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
    let take = |_: usize, _: u64, _: usize| -> Result<AlignedBuf> {
        match free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(b) => Ok(b),
            None => AlignedBuf::new(chunk + align, align),
        }
    };
    drive(files, wanted, opts, align, take, |i, off, mut buf| {
        sink(i, off, buf.as_slice())?;
        buf.clear();
        free.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
        Ok(())
    })
    .await
}
