//! The parts a save takes (bytes, streams, rewindable streams) and the chunk sources the
//! save and the drain read them through.

use super::*;

/// Where a part's bytes come from.
pub enum PartData<'a> {
    /// A buffer the caller holds (never copied whole: written chunk by chunk).
    Bytes(&'a [u8]),
    /// A stream, read chunk by chunk; `size_hint` helps the capacity check. It cannot be read
    /// twice: a save that finds the fast tier full part-way through it fails with
    /// [`ErrorKind::NoSpace`] (use [`PartData::Seekable`] where the source can be re-read).
    Reader {
        /// The stream.
        reader: Box<dyn Read + Send + 'a>,
        /// Its expected size, if known.
        size_hint: Option<u64>,
    },
    /// A stream that can be read again from where the save started (a file): a save that
    /// finds a tier full part-way through rewinds it and applies [`OnFull`].
    Seekable {
        /// The stream, read from its position when the save starts.
        reader: Box<dyn SeekRead + 'a>,
        /// Its expected size, if known.
        size_hint: Option<u64>,
    },
}

/// A readable, seekable stream (a [`std::fs::File`], a [`std::io::Cursor`], a
/// [`std::io::BufReader`] over either): the source of a [`PartData::Seekable`].
pub trait SeekRead: Read + Seek + Send {}

impl<T: Read + Seek + Send> SeekRead for T {}

impl fmt::Debug for PartData<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            PartData::Reader { size_hint, .. } => write!(f, "Reader(size_hint {size_hint:?})"),
            PartData::Seekable { size_hint, .. } => write!(f, "Seekable(size_hint {size_hint:?})"),
        }
    }
}

/// A named part of a checkpoint (model weights, optimizer state, metadata).
#[derive(Debug)]
pub struct Part<'a> {
    /// One key component: no `/`, not `.` or `..`.
    pub name: String,
    /// The bytes.
    pub data: PartData<'a>,
}

impl<'a> Part<'a> {
    /// A part from a buffer.
    pub fn bytes(name: impl Into<String>, data: &'a [u8]) -> Self {
        Part { name: name.into(), data: PartData::Bytes(data) }
    }

    /// A part from a stream.
    pub fn reader(name: impl Into<String>, reader: impl Read + Send + 'a, size_hint: Option<u64>) -> Self {
        Part { name: name.into(), data: PartData::Reader { reader: Box::new(reader), size_hint } }
    }

    /// A part from a stream that can be rewound (a file): see [`PartData::Seekable`].
    pub fn seekable(name: impl Into<String>, reader: impl Read + Seek + Send + 'a, size_hint: Option<u64>) -> Self {
        Part { name: name.into(), data: PartData::Seekable { reader: Box::new(reader), size_hint } }
    }

    pub(super) fn size_hint(&self) -> u64 {
        match &self.data {
            PartData::Bytes(b) => b.len() as u64,
            PartData::Reader { size_hint, .. } | PartData::Seekable { size_hint, .. } => size_hint.unwrap_or(0),
        }
    }
}

pub(super) fn validate_part_name(name: &str) -> Result<()> {
    if name.contains('/') || name == "MANIFEST.json" {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            format!("bad part name {name:?}: one path component, not MANIFEST.json"),
        ));
    }
    validate_key(name)
}

/// Seeks every seekable part back to where the save started reading it.
pub(super) fn rewind(parts: &mut [Part<'_>], starts: &[Option<u64>]) -> Result<()> {
    for (p, start) in parts.iter_mut().zip(starts) {
        if let (PartData::Seekable { reader, .. }, Some(pos)) = (&mut p.data, start) {
            reader.seek(SeekFrom::Start(*pos)).map_err(|e| {
                Error::from(e).with_key(format!("part {:?} (rewinding it for another attempt)", p.name))
            })?;
        }
    }
    Ok(())
}

/// A source of chunks, filled asynchronously into an owned buffer.
pub(super) trait AsyncChunks: Send {
    /// Fills up to `max` bytes of `buf` (setting its data window); 0 at the end.
    fn fill(
        &mut self,
        buf: AlignedBuf,
        max: usize,
    ) -> impl std::future::Future<Output = (Result<usize>, AlignedBuf)> + Send;
}

fn fill_from_slice(mut buf: AlignedBuf, src: &[u8]) -> (Result<usize>, AlignedBuf) {
    let n = src.len();
    buf.capacity_mut()[..n].copy_from_slice(src);
    let res = buf.set_window(0, n).map(|()| n);
    (res, buf)
}

pub(super) struct BytesChunks<'a> {
    pub(super) data: &'a [u8],
}

impl AsyncChunks for BytesChunks<'_> {
    async fn fill(&mut self, buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        let n = max.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        fill_from_slice(buf, head)
    }
}

pub(super) struct ReaderChunks<'r, 'a> {
    pub(super) reader: &'r mut (dyn Read + Send + 'a),
}

impl AsyncChunks for ReaderChunks<'_, '_> {
    async fn fill(&mut self, mut buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        let mut n = 0;
        let dst = &mut buf.capacity_mut()[..max];
        while n < max {
            match self.reader.read(&mut dst[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return (Err(Error::from(e).with_operation(Operation::Write)), buf),
            }
        }
        let res = buf.set_window(0, n).map(|()| n);
        (res, buf)
    }
}

/// Reads an object of a tier through the restore's read path ([`ChunkReads`]: reads in
/// flight ahead of the writer) and hands each filled buffer to the writer (no copy).
pub(super) struct TierChunks {
    pub(super) reads: ChunkReads,
}

impl TierChunks {
    /// `size` bytes of `key` on `tier`, in reads of `chunk` bytes, `depth` in flight.
    pub(super) fn new(tier: Arc<dyn Tier>, key: String, size: u64, chunk: usize, depth: usize) -> Self {
        TierChunks { reads: ChunkReads::new(vec![Span { tier, key, start: 0, end: size }], chunk, depth) }
    }
}

impl AsyncChunks for TierChunks {
    async fn fill(&mut self, buf: AlignedBuf, max: usize) -> (Result<usize>, AlignedBuf) {
        debug_assert!(max >= self.reads.chunk(), "the writer's chunk holds a read");
        self.reads.recycle(buf);
        let Some(chunk) = self.reads.next().await else {
            return match self.reads.spare_buffer() {
                Ok(b) => (Ok(0), b),
                Err(e) => (Err(e), fallback_buf()),
            };
        };
        let buf = match chunk.buf {
            Some(b) => b,
            None => match self.reads.spare_buffer() {
                Ok(b) => b,
                Err(e) => return (Err(e), fallback_buf()),
            },
        };
        let res = match chunk.result {
            Ok(n) if buf.head() == 0 => Ok(n),
            Ok(_) => Err(Error::new(ErrorKind::Misaligned, "chunk read landed off the start of the buffer")),
            Err(e) => Err(e),
        };
        (res, buf)
    }
}

/// A one-page buffer to hand back where an allocation failed (the error says so).
fn fallback_buf() -> AlignedBuf {
    AlignedBuf::new(4096, 4096).unwrap_or_else(|e| panic!("cannot allocate one page: {e}"))
}
