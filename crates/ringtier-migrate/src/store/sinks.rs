//! Where a restore puts what it reads: caller buffers, vectors, a function, another tier, or
//! nowhere (a verification).

use super::*;

/// Each part into a buffer of exactly its size that the caller holds (see
/// [`CheckpointStore::load_into`]).
#[derive(Debug)]
pub struct BufferSink<'a> {
    buffers: Vec<(String, &'a mut [u8])>,
    /// Index into `buffers` of the part being delivered.
    current: Option<usize>,
}

impl<'a> BufferSink<'a> {
    /// A sink over `(part name, buffer)` pairs.
    pub fn new(buffers: Vec<(String, &'a mut [u8])>) -> Self {
        BufferSink { buffers, current: None }
    }
}

impl RestoreSink for BufferSink<'_> {
    async fn prepare(&mut self, parts: &[PartInfo]) -> Result<()> {
        for (name, buf) in &self.buffers {
            let Some(p) = parts.iter().find(|p| p.name == *name) else {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("a destination buffer names part {name:?}, which this restore does not read"),
                ));
            };
            if buf.len() as u64 != p.end - p.start {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "the destination buffer for part {name:?} holds {} bytes; the part{} has {}",
                        buf.len(),
                        if p.end - p.start == p.size { "" } else { "'s range" },
                        p.end - p.start
                    ),
                ));
            }
        }
        Ok(())
    }

    async fn begin(&mut self, part: &PartInfo) -> Result<()> {
        let i = self.buffers.iter().position(|(n, _)| *n == part.name).ok_or_else(|| {
            Error::new(ErrorKind::InvalidInput, format!("no destination buffer for part {:?}", part.name))
        })?;
        self.current = Some(i);
        Ok(())
    }

    async fn write(&mut self, part: &PartInfo, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let Some(i) = self.current else {
            return (Err(Error::new(ErrorKind::InvalidInput, format!("part {:?} not begun", part.name))), buf);
        };
        let dst = &mut self.buffers[i].1;
        let src = buf.as_slice();
        let res = match (offset as usize).checked_add(src.len()) {
            Some(end) if end <= dst.len() => {
                dst[offset as usize..end].copy_from_slice(src);
                Ok(())
            }
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("destination buffer for part {:?} ({} bytes) is too small", part.name, dst.len()),
            )),
        };
        (res, buf)
    }

    async fn finish(&mut self, _part: &PartInfo) -> Result<()> {
        self.current = None;
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {
        self.current = None;
    }
}

/// Each part into a new `Vec` (what [`CheckpointStore::load`] uses).
#[derive(Debug, Default)]
pub(super) struct VecSink {
    pub(super) parts: Vec<(String, Vec<u8>)>,
}

impl RestoreSink for VecSink {
    async fn begin(&mut self, part: &PartInfo) -> Result<()> {
        let cap = usize::try_from(part.size).map_err(|_| {
            Error::new(ErrorKind::InvalidInput, format!("part {:?} is too large for memory", part.name))
        })?;
        // Reserved up to what the manifest says, but at most 64 MiB ahead of the bytes that
        // arrive: a manifest that claims more than its part holds never allocates it.
        let mut v = Vec::new();
        v.try_reserve_exact(cap.min(64 << 20)).map_err(|e| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("part {:?} ({cap} bytes) does not fit in memory: {e}", part.name),
            )
        })?;
        self.parts.push((part.name.clone(), v));
        Ok(())
    }

    async fn write(&mut self, _part: &PartInfo, _offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        if let Some((_, v)) = self.parts.last_mut() {
            v.extend_from_slice(buf.as_slice());
        }
        (Ok(()), buf)
    }

    async fn finish(&mut self, _part: &PartInfo) -> Result<()> {
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {
        self.parts.pop();
    }
}

/// Reads and checks, keeps nothing (verification).
pub(super) struct DiscardSink;

impl RestoreSink for DiscardSink {
    async fn begin(&mut self, _part: &PartInfo) -> Result<()> {
        Ok(())
    }

    async fn write(&mut self, _part: &PartInfo, _offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        (Ok(()), buf)
    }

    async fn finish(&mut self, _part: &PartInfo) -> Result<()> {
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {}
}

/// One step of a restore as a [`FnSink`] sees it.
#[derive(Debug)]
pub enum RestoreEvent<'a> {
    /// A part starts (again, after a [`RestoreEvent::Discard`]).
    Begin(&'a PartInfo),
    /// The part's next bytes, at `offset`.
    Data {
        /// The part.
        part: &'a PartInfo,
        /// Offset of `bytes` in what is read of the part.
        offset: u64,
        /// The bytes.
        bytes: &'a [u8],
    },
    /// The part is complete and matched its checksum.
    Finish(&'a PartInfo),
    /// Forget what arrived of the part since its `Begin`: the copy was bad; it comes again.
    Discard(&'a PartInfo),
}

/// A sink that hands every chunk to a closure, as it is read (a hash, a network stream, a
/// custom deserializer).
pub struct FnSink<F>(pub F);

impl<F> fmt::Debug for FnSink<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnSink")
    }
}

impl<F: FnMut(RestoreEvent<'_>) -> Result<()> + Send> RestoreSink for FnSink<F> {
    async fn begin(&mut self, part: &PartInfo) -> Result<()> {
        (self.0)(RestoreEvent::Begin(part))
    }

    async fn write(&mut self, part: &PartInfo, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let res = (self.0)(RestoreEvent::Data { part, offset, bytes: buf.as_slice() });
        (res, buf)
    }

    async fn finish(&mut self, part: &PartInfo) -> Result<()> {
        (self.0)(RestoreEvent::Finish(part))
    }

    async fn discard(&mut self, part: &PartInfo) {
        let _ = (self.0)(RestoreEvent::Discard(part));
    }
}

/// Each part written as an object of another tier, `PREFIX/NAME` (or `NAME`): staged, and
/// committed (durable, atomically renamed) only once complete and checked; a bad copy's
/// staged object is aborted. Over a directory's io_uring tier this is `ringtier ckpt restore
/// --out DIR`: O_DIRECT writes of the very buffers the reads filled, no copy, and never a file
/// under its final name that is not whole.
#[derive(Debug)]
pub struct TierSink {
    tier: Arc<dyn Tier>,
    prefix: Option<String>,
    writer: Option<Box<dyn ringtier_core::ObjectWriter>>,
    written: Vec<ringtier_core::ObjectMeta>,
}

impl TierSink {
    /// A sink writing parts as objects of `tier`, under `prefix/` when given.
    pub fn new(tier: Arc<dyn Tier>, prefix: Option<String>) -> Self {
        TierSink { tier, prefix, writer: None, written: Vec::new() }
    }

    /// The objects committed so far.
    pub fn written(&self) -> &[ringtier_core::ObjectMeta] {
        &self.written
    }

    fn key(&self, name: &str) -> String {
        match &self.prefix {
            Some(p) => format!("{p}/{name}"),
            None => name.to_string(),
        }
    }
}

impl RestoreSink for TierSink {
    async fn prepare(&mut self, parts: &[PartInfo]) -> Result<()> {
        for p in parts {
            validate_key(&self.key(&p.name))?;
        }
        Ok(())
    }

    async fn begin(&mut self, part: &PartInfo) -> Result<()> {
        if let Some(w) = self.writer.take() {
            let _ = w.abort().await;
        }
        self.writer = Some(self.tier.create(&self.key(&part.name)).await?);
        Ok(())
    }

    async fn write(&mut self, part: &PartInfo, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let Some(w) = self.writer.as_mut() else {
            return (Err(Error::new(ErrorKind::InvalidInput, format!("part {:?} not begun", part.name))), buf);
        };
        if buf.head() != 0 {
            // Chunk offsets are aligned, so direct reads land at the start; a tier that did not
            // is written from a copy.
            let mut copy = match AlignedBuf::new(buf.len().max(1), buf.align()) {
                Ok(c) => c,
                Err(e) => return (Err(e), buf),
            };
            if let Err(e) = copy.fill_from(buf.as_slice()) {
                return (Err(e), buf);
            }
            let (res, _) = w.write_at(offset, copy).await;
            return (res, buf);
        }
        w.write_at(offset, buf).await
    }

    async fn finish(&mut self, part: &PartInfo) -> Result<()> {
        let w = self
            .writer
            .take()
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, format!("part {:?} not begun", part.name)))?;
        let meta = w.commit().await?;
        self.written.push(meta);
        Ok(())
    }

    async fn discard(&mut self, _part: &PartInfo) {
        if let Some(w) = self.writer.take() {
            let _ = w.abort().await;
        }
    }
}
