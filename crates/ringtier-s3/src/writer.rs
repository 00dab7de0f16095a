//! [`S3Writer`]: a staged object written as a multipart upload, parts in parallel.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::PutPayload;
use ringtier_core::{AlignedBuf, Error, ErrorKind, ObjectMeta, ObjectWriter, Operation, Result};
use tokio::task::JoinHandle;

use crate::checksummed::{put_checked, server_checks_parts};
use crate::config::UploadVerify;
use crate::parts::PartBuf;
use crate::tier::Inner;
use crate::uploads::{self, LiveUpload};

/// A part's index and its result: the part id and whether the server answered with the
/// part's checksum.
type PartTask = JoinHandle<(usize, Result<(PartId, bool)>)>;

/// A multipart upload under way: its id (registered as live, with a marker object) and the
/// parts so far.
struct Upload {
    live: LiveUpload,
    parts: Vec<Option<PartId>>,
    in_flight: FuturesUnordered<PartTask>,
    /// Parts whose stored checksum the server did not confirm.
    unconfirmed: usize,
    /// Every part's CRC-32C, in order (named in the completion of a checksummed upload).
    crcs: Vec<u32>,
}

/// A staged S3 object. Bytes are written in order into a part buffer; each full part
/// (`part_size` bytes) starts uploading at once on the tier's runtime while writing goes on,
/// at most `upload_concurrency` parts in flight (a further write waits for one to finish).
/// Writes ahead of the end wait in memory until the gap fills (a gap left at commit reads as
/// zeros, as a hole in a file does); rewriting bytes of a part already sent is `Unsupported`.
pub(crate) struct S3Writer {
    inner: Arc<Inner>,
    key: String,
    path: Path,
    /// Bytes from `cur_start` on, not yet sent (a buffer of the tier's part pool).
    cur: PartBuf,
    /// CRC-32C of `cur`, computed as bytes are appended (each block right after its copy,
    /// while it is in cache); None once bytes in it were rewritten or filled out of order
    /// (then computed when the part is sent).
    cur_crc: Option<u32>,
    cur_start: u64,
    /// Writes past the end of `cur`, by offset.
    ahead: BTreeMap<u64, Vec<u8>>,
    upload: Option<Upload>,
    failed: Option<String>,
    done: bool,
    /// CRC-32C of the bytes sent so far, in order.
    crc: u32,
    /// False once a byte went to the server without a checksum it confirmed.
    confirmed: bool,
}

impl fmt::Debug for S3Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Writer")
            .field("key", &self.key)
            .field("sent", &self.cur_start)
            .field("buffered", &self.cur.len())
            .finish_non_exhaustive()
    }
}

impl S3Writer {
    pub(crate) fn new(inner: Arc<Inner>, key: String, path: Path) -> Self {
        let cur = inner.parts.take();
        S3Writer {
            inner,
            key,
            path,
            cur,
            cur_crc: Some(0),
            cur_start: 0,
            ahead: BTreeMap::new(),
            upload: None,
            failed: None,
            done: false,
            crc: 0,
            confirmed: true,
        }
    }

    fn err(&self, kind: ErrorKind, msg: impl Into<String>, op: Operation) -> Error {
        Error::new(kind, msg).context(op, &self.key, &self.inner.cfg.name)
    }

    fn end(&self) -> u64 {
        self.cur_start + self.cur.len() as u64
    }

    /// Copies `data` at `offset` into the part buffer (extending it), or keeps it aside when
    /// it starts past the buffer's end.
    fn place(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if offset < self.cur_start {
            return Err(self.err(
                ErrorKind::Unsupported,
                format!(
                    "rewriting bytes at {offset} that were already uploaded (S3 parts are sent once; \
                     the first {} bytes are sent)",
                    self.cur_start
                ),
                Operation::Write,
            ));
        }
        let end = self.end();
        if offset > end {
            self.ahead.insert(offset, data.to_vec());
            return Ok(());
        }
        let at = (offset - self.cur_start) as usize;
        let overlap = (self.cur.len() - at).min(data.len());
        if overlap > 0 {
            self.cur[at..at + overlap].copy_from_slice(&data[..overlap]);
            self.cur_crc = None;
        }
        self.append(&data[overlap..]);
        // Writes kept aside that the buffer now reaches.
        while let Some((&off, _)) = self.ahead.first_key_value() {
            if off > self.end() {
                break;
            }
            let (off, chunk) = self.ahead.pop_first().unwrap_or_default();
            self.place(off, &chunk)?;
        }
        Ok(())
    }

    /// Appends `data` to the part buffer, block by block, each block's CRC-32C taken right
    /// after its copy (from cache: one pass over memory instead of two).
    fn append(&mut self, data: &[u8]) {
        const BLOCK: usize = 256 << 10;
        for block in data.chunks(BLOCK) {
            let from = self.cur.len();
            self.cur.extend_from_slice(block);
            if let Some(crc) = self.cur_crc.as_mut() {
                *crc = crc32c::crc32c_append(*crc, &self.cur[from..]);
            }
        }
    }

    /// Takes the part buffer (and its CRC-32C, computed now if it was not kept), leaving an
    /// empty one from the pool.
    fn take_cur(&mut self) -> (PartBuf, u32) {
        let buf = std::mem::replace(&mut self.cur, self.inner.parts.take());
        let crc = self.cur_crc.replace(0).unwrap_or_else(|| crc32c::crc32c(&buf));
        (buf, crc)
    }

    /// Starts the multipart upload (and its marker) if not yet started.
    async fn ensure_upload(&mut self) -> Result<()> {
        if self.upload.is_some() {
            return Ok(());
        }
        if self.checksums() {
            // Asked once per tier: whether a confirmed checksum proves anything here.
            self.confirmed &= server_checks_parts(&self.inner).await?;
        }
        let live = uploads::start(&self.inner, &self.path, &self.key, self.checksums()).await?;
        self.upload = Some(Upload {
            live,
            parts: Vec::new(),
            in_flight: FuturesUnordered::new(),
            unconfirmed: 0,
            crcs: Vec::new(),
        });
        Ok(())
    }

    /// Waits for one part in flight and records it.
    async fn reap_one(&mut self) -> Result<()> {
        let Some(up) = self.upload.as_mut() else {
            return Ok(());
        };
        if let Some(joined) = up.in_flight.next().await {
            let (idx, res) = joined.map_err(|e| {
                Error::new(ErrorKind::Shutdown, format!("part upload task ended early: {e}")).context(
                    Operation::Write,
                    &self.key,
                    &self.inner.cfg.name,
                )
            })?;
            match res {
                Ok((part, confirmed)) => {
                    up.parts[idx] = Some(part);
                    up.unconfirmed += usize::from(!confirmed);
                }
                Err(e) => {
                    self.failed = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sends `data`, whose CRC-32C is `part_crc`, as the next part; waits first while
    /// `upload_concurrency` parts are in flight.
    async fn send_part(&mut self, data: Bytes, part_crc: u32) -> Result<()> {
        self.ensure_upload().await?;
        while self.upload.as_ref().is_some_and(|u| u.in_flight.len() >= self.inner.cfg.upload_concurrency) {
            self.reap_one().await?;
        }
        let Some(up) = self.upload.as_mut() else {
            return Err(self.err(ErrorKind::Io, "multipart upload missing", Operation::Write));
        };
        self.crc = crc32c::crc32c_combine(self.crc, part_crc, data.len());
        let idx = up.parts.len();
        up.parts.push(None);
        up.crcs.push(part_crc);
        let inner = Arc::clone(&self.inner);
        let path = self.path.clone();
        let id = up.live.id().to_string();
        let key = self.key.clone();
        let checksums = self.inner.cfg.verify == UploadVerify::Checksums;
        up.in_flight.push(self.inner.io_handle().spawn(async move {
            let res = inner
                .retry
                .run(|| async {
                    if checksums {
                        put_checked(&inner, &path, Some((&id, idx)), data.clone(), part_crc, &key, Operation::Write)
                            .await
                    } else {
                        let payload = PutPayload::from(data.clone());
                        let part = inner.store.put_part(&path, &id, idx, payload).await;
                        Ok((part.map_err(|e| inner.err(e, Operation::Write, &key))?, false))
                    }
                })
                .await
                .map_err(|e| {
                    Error::new(e.kind(), format!("part {} of the upload failed: {}", idx + 1, e.message()))
                        .set_temporary(e.is_temporary())
                        .context(Operation::Write, &key, &inner.cfg.name)
                });
            (idx, res)
        }));
        Ok(())
    }

    /// Sends the whole parts of `buf` (which starts where the next part does, nothing
    /// buffered) as slices of it, without a copy, and keeps the rest as the start of the next
    /// part; hands back an equal buffer from the tier's [`LentPool`] (`buf` goes there once
    /// its parts are sent).
    ///
    /// `crcs`, when given, are the CRC-32Cs of `buf`'s part-sized pieces, used as the parts'.
    ///
    /// What can fail for a passing reason (starting the upload, a buffer) is done while `buf`
    /// is still the caller's, so a retried write has its data; once part of it is sent, a
    /// failure is the upload's ([`S3Writer::check_failed`] refuses every later write).
    ///
    /// [`LentPool`]: crate::parts::LentPool
    async fn send_lent(&mut self, buf: AlignedBuf, crcs: Option<&[u32]>) -> (Result<()>, AlignedBuf) {
        if let Err(e) = self.ensure_upload().await {
            return (Err(e), buf);
        }
        let part = self.inner.cfg.part_size;
        let in_place = match self.inner.lent.take(buf.capacity(), buf.align()) {
            Ok(b) => b,
            Err(e) => return (Err(e), buf),
        };
        let whole = buf.len() / part * part;
        let bytes = self.inner.lent.lend(buf);
        for (i, at) in (0..whole).step_by(part).enumerate() {
            let data = bytes.slice(at..at + part);
            // The caller's CRC when it gave one (the server checks it against the bytes, or
            // the read-back checks the object's CRC built from it), else taken now.
            let crc = crcs.and_then(|c| c.get(i).copied()).unwrap_or_else(|| crc32c::crc32c(&data));
            self.cur_start += part as u64;
            if let Err(e) = self.send_part(data, crc).await {
                self.failed.get_or_insert_with(|| e.to_string());
                return (Err(e), in_place);
            }
        }
        self.append(&bytes[whole..]);
        (Ok(()), in_place)
    }

    /// Sends every full part in the buffer.
    async fn flush_full_parts(&mut self) -> Result<()> {
        let part = self.inner.cfg.part_size;
        while self.cur.len() >= part {
            let (mut full, mut crc) = self.take_cur();
            if full.len() > part {
                // The bytes past the part start the next buffer; the full one goes out as is.
                self.append(&full[part..]);
                full.truncate(part);
                crc = crc32c::crc32c(&full);
            }
            self.cur_start += part as u64;
            self.send_part(self.inner.parts.freeze(full), crc).await?;
        }
        Ok(())
    }

    fn checksums(&self) -> bool {
        self.inner.cfg.verify == UploadVerify::Checksums
    }

    fn check_failed(&self, op: Operation) -> Result<()> {
        match &self.failed {
            Some(why) => Err(self.err(ErrorKind::Io, format!("an earlier part failed: {why}"), op)),
            None => Ok(()),
        }
    }

    async fn commit_inner(&mut self) -> Result<ObjectMeta> {
        self.check_failed(Operation::Commit)?;
        // A writer whose lease on the prefix was taken over publishes nothing more.
        self.inner.check_lease(Operation::Commit, &self.key)?;
        // Fill gaps before writes kept aside with zeros, as a file would read its holes.
        while let Some((off, chunk)) = self.ahead.pop_first() {
            let end = self.end();
            if off > end {
                self.cur.resize(self.cur.len() + (off - end) as usize, 0);
                self.cur_crc = None;
            }
            self.place(off, &chunk)?;
        }
        let size = self.end();
        if self.upload.is_none() && self.cur.len() <= self.inner.cfg.single_put_max.max(self.inner.cfg.part_size) {
            // Small object: one PUT, atomic by nature.
            let (buf, part_crc) = self.take_cur();
            let data = self.inner.parts.freeze(buf);
            self.crc = crc32c::crc32c_combine(self.crc, part_crc, data.len());
            let inner = Arc::clone(&self.inner);
            let (path, key) = (self.path.clone(), self.key.clone());
            if self.checksums() {
                self.confirmed &= server_checks_parts(&self.inner).await?;
                let crc = self.crc;
                let (_, confirmed) = self
                    .inner
                    .spawn(async move {
                        inner
                            .retry
                            .run(|| put_checked(&inner, &path, None, data.clone(), crc, &key, Operation::Commit))
                            .await
                    })
                    .await??;
                self.confirmed &= confirmed;
            } else {
                self.inner.spawn(async move { inner.put_retrying(&path, data, &key).await }).await??;
            }
        } else {
            self.flush_full_parts().await?;
            if !self.cur.is_empty() {
                let (buf, crc) = self.take_cur();
                let last = self.inner.parts.freeze(buf);
                self.cur_start += last.len() as u64;
                self.send_part(last, crc).await?;
            }
            while self.upload.as_ref().is_some_and(|u| !u.in_flight.is_empty()) {
                self.reap_one().await?;
            }
            let Some(up) = self.upload.as_mut() else {
                return Err(self.err(ErrorKind::Io, "multipart upload missing", Operation::Commit));
            };
            let parts: Vec<PartId> = up.parts.iter().flatten().cloned().collect();
            if parts.len() != up.parts.len() {
                return Err(self.err(ErrorKind::Io, "a part of the upload has no result", Operation::Commit));
            }
            self.confirmed &= up.unconfirmed == 0;
            let crcs = (self.inner.cfg.verify == UploadVerify::Checksums).then(|| up.crcs.clone());
            uploads::complete(&self.inner, &self.path, &self.key, &up.live, parts, crcs, size).await?;
        }
        if let Some(up) = self.upload.take() {
            up.live.finish(&self.inner).await;
        }
        self.done = true;
        match self.inner.cfg.verify {
            UploadVerify::Off => {}
            // Every part's checksum checked by a server that refuses a mismatch: what is
            // stored is what was sent; the object must hold all of it.
            UploadVerify::Checksums if self.confirmed => {
                uploads::check_size(&self.inner, &self.path, &self.key, size).await?;
            }
            _ => uploads::verify(&self.inner, &self.path, &self.key, size, self.crc).await?,
        }
        Ok(ObjectMeta { key: self.key.clone(), size, modified: Some(std::time::SystemTime::now()) })
    }

    async fn abort_inner(&mut self) -> Result<()> {
        self.done = true;
        let Some(up) = self.upload.take() else {
            return Ok(());
        };
        for t in up.in_flight.iter() {
            t.abort();
        }
        uploads::abort(&self.inner, &self.path, &self.key, up.live).await
    }

    /// `write_at`, with the CRC-32C of each part-sized piece of `buf` when the caller has them.
    async fn write(&mut self, offset: u64, buf: AlignedBuf, crcs: Option<&[u32]>) -> (Result<()>, AlignedBuf) {
        if let Err(e) = self.check_failed(Operation::Write) {
            return (Err(e), buf);
        }
        let part = self.inner.cfg.part_size as u64;
        if self.cur.is_empty()
            && self.ahead.is_empty()
            && offset == self.cur_start
            && buf.len() as u64 >= part
            && buf.is_own()
            && buf.as_ptr() as usize % ringtier_core::buf::MIN_BUFFER_ALIGN == 0
        {
            // CRCs of another split than this writer's parts are not used.
            let crcs = crcs.filter(|c| c.len() == buf.len().div_ceil(part as usize));
            return self.send_lent(buf, crcs).await;
        }
        // Placed up to each part boundary at a time (parts start at multiples of the part
        // size), so a part buffer never grows past one part.
        let data = buf.as_slice();
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let n = ((part - at % part) as usize).min(data.len() - done);
            if let Err(e) = self.place(at, &data[done..done + n]) {
                return (Err(e), buf);
            }
            if let Err(e) = self.flush_full_parts().await {
                return (Err(e), buf);
            }
            done += n;
        }
        (Ok(()), buf)
    }
}

#[async_trait]
impl ObjectWriter for S3Writer {
    fn key(&self) -> &str {
        &self.key
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        self.write(offset, buf, None).await
    }

    fn crc_block(&self) -> Option<usize> {
        Some(self.inner.cfg.part_size)
    }

    async fn write_at_crcs(&mut self, offset: u64, buf: AlignedBuf, crcs: &[u32]) -> (Result<()>, AlignedBuf) {
        self.write(offset, buf, Some(crcs)).await
    }

    async fn commit(mut self: Box<Self>) -> Result<ObjectMeta> {
        match self.commit_inner().await {
            Ok(m) => Ok(m),
            Err(e) => {
                // Nothing half-done stays behind: the upload is aborted (its marker too).
                let _ = self.abort_inner().await;
                Err(e)
            }
        }
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        self.abort_inner().await
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        self.inner.parts.put(std::mem::take(&mut self.cur));
        if self.done {
            return;
        }
        // Dropped without commit or abort: abort the upload in the background (best effort;
        // if this process dies first, the marker lets the next recovery abort it).
        if let Some(up) = self.upload.take() {
            for t in up.in_flight.iter() {
                t.abort();
            }
            let inner = Arc::clone(&self.inner);
            let (path, key) = (self.path.clone(), self.key.clone());
            drop(self.inner.io_handle().spawn(async move {
                let _ = uploads::abort(&inner, &path, &key, up.live).await;
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn part_crcs_combine_into_the_objects() {
        let part = 5 << 20;
        let data: Vec<u8> = (0..3 * part + 11).map(|i| (i * 7 + i / 13) as u8).collect();
        let mut crc = 0u32;
        for c in data.chunks(part) {
            crc = crc32c::crc32c_combine(crc, crc32c::crc32c(c), c.len());
        }
        assert_eq!(crc, crc32c::crc32c(&data));
    }
}
