//! Writes to a staged file through the rings: O_DIRECT where the file system allows (the tail
//! zero-padded to the alignment and trimmed at commit), buffered where it cannot, then
//! `fdatasync` through the ring, rename and directory fsync on the metadata threads.

use super::*;

/// An object being written through a [`UringTier`].
pub(super) struct UringWriter {
    pub(super) tier: UringTier,
    pub(super) key: String,
    /// Writes not yet completed (some perhaps abandoned by a dropped future).
    pub(super) in_flight: Arc<WritesInFlight>,
    /// Shared with the metadata threads while they write to it (buffered writes on threads).
    pub(super) file: Option<Arc<File>>,
    /// A second, buffered descriptor for writes O_DIRECT cannot take (policy `auto`).
    pub(super) buffered: Option<Arc<File>>,
    pub(super) staged: StagedFile,
    pub(super) direct: bool,
    pub(super) align: u64,
    pub(super) end: u64,
    pub(super) padded: bool,
}

impl fmt::Debug for UringWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringWriter")
            .field("key", &self.key)
            .field("staged", &self.staged)
            .field("direct", &self.direct)
            .field("align", &self.align)
            .finish()
    }
}

impl UringWriter {
    fn err(&self, e: Error, op: Operation) -> Error {
        e.context(op, &self.key, self.tier.name())
    }
}

#[async_trait]
impl ObjectWriter for UringWriter {
    fn key(&self) -> &str {
        &self.key
    }

    async fn write_at(&mut self, offset: u64, mut buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        if self.file.is_none() {
            return (
                Err(self.err(Error::new(ErrorKind::InvalidInput, "writer already finished"), Operation::Write)),
                buf,
            );
        }
        let len = buf.len();
        if len == 0 {
            return (Ok(()), buf);
        }
        // Writes of a writer land in order, even after a dropped write_at future.
        self.in_flight.idle().await;
        let Some(file) = self.file.as_ref() else {
            return (
                Err(self.err(Error::new(ErrorKind::InvalidInput, "writer already finished"), Operation::Write)),
                buf,
            );
        };
        let mut target = file;
        let mut direct = self.direct;
        let mut io_len = len;
        if self.direct {
            let padded = align_up(len as u64, self.align) as usize;
            let addr = buf.as_ptr() as u64 + buf.head() as u64;
            let ok = offset % self.align == 0 && addr % self.align == 0 && buf.head() + padded <= buf.capacity();
            if ok {
                if padded > len {
                    let head = buf.head();
                    buf.capacity_mut()[head + len..head + padded].fill(0);
                    self.padded = true;
                }
                io_len = padded;
            } else if self.tier.inner.shared.policy == DirectIoPolicy::Required {
                let e = Error::new(
                    ErrorKind::Misaligned,
                    format!(
                        "direct I/O is required: offset {offset}, buffer address and padded length must be multiples of \
                         {} and fit the buffer's capacity {}",
                        self.align,
                        buf.capacity()
                    ),
                );
                return (Err(self.err(e, Operation::Write)), buf);
            } else {
                if self.buffered.is_none() {
                    match self.staged.reopen(libc::O_WRONLY) {
                        Ok(f) => self.buffered = Some(Arc::new(f)),
                        Err(e) => return (Err(self.err(e, Operation::Write)), buf),
                    }
                }
                self.tier.inner.shared.count_fallback("unaligned write");
                target = self.buffered.as_ref().unwrap_or(target);
                direct = false;
            }
        }
        self.end = self.end.max(offset + len as u64);
        let ticket = self.in_flight.ticket();
        if !direct && self.tier.inner.config.buffered_writes == BufferedWrites::Threads {
            let file = Arc::clone(target);
            let res = self
                .tier
                .inner
                .meta
                .run(move || {
                    use std::os::unix::fs::FileExt;
                    let _ticket = ticket;
                    match file.write_all_at(&buf.as_slice()[..io_len], offset) {
                        Ok(()) => Ok((Ok(()), buf)),
                        Err(e) => Ok((Err(Error::from(e)), buf)),
                    }
                })
                .await;
            return match res {
                Ok((res, buf)) => {
                    #[cfg(feature = "fs-trace")]
                    if res.is_ok() {
                        self.staged.trace_write(offset, &buf.as_slice()[..io_len], false);
                    }
                    (res.map_err(|e| self.err(e, Operation::Write)), buf)
                }
                Err(e) => (Err(self.err(e, Operation::Write)), fallback_buf()),
            };
        }
        let align = if direct { self.align } else { 1 };
        let (res, back) = self.tier.inner.write(Arc::clone(target), offset, io_len, align, buf, ticket).await;
        match back {
            Some(buf) => {
                #[cfg(feature = "fs-trace")]
                if res.is_ok() {
                    self.staged.trace_write(offset, &buf.as_slice()[..io_len.min(buf.len())], direct);
                }
                (res.map_err(|e| self.err(e, Operation::Write)), buf)
            }
            None => (Err(self.err(Error::new(ErrorKind::Shutdown, "buffer lost"), Operation::Write)), fallback_buf()),
        }
    }

    async fn commit(mut self: Box<Self>) -> Result<ObjectMeta> {
        if self.file.is_none() {
            return Err(self.err(Error::new(ErrorKind::InvalidInput, "writer already finished"), Operation::Commit));
        }
        // Writes abandoned by dropped futures finish before the data fsync.
        self.in_flight.idle().await;
        let Some(file) = self.file.take() else {
            return Err(self.err(Error::new(ErrorKind::InvalidInput, "writer already finished"), Operation::Commit));
        };
        self.buffered.take();
        // If this future is dropped before the rename, the staged file goes (a rename already
        // under way on a metadata thread then fails, or has already published the object).
        let staged_guard = StagedGuard::new(self.staged.clone());
        let res = async {
            if self.padded {
                file.set_len(self.end)?;
                #[cfg(feature = "fs-trace")]
                if let Some((t, id)) = self.staged.trace() {
                    t.record(ringtier_core::fs::trace::FsOp::SetLen { file: id, len: self.end });
                }
            }
            #[cfg(feature = "fs-trace")]
            let (skip_sync, rename_first) = match self.tier.inner.root.trace() {
                Some(t) => (t.skips_data_sync(), t.renames_before_sync()),
                None => (false, false),
            };
            #[cfg(not(feature = "fs-trace"))]
            let (skip_sync, rename_first) = (false, false);
            let publish = |file: Arc<File>| {
                let inner = Arc::clone(&self.tier.inner);
                let (staged, key) = (self.staged.clone(), self.key.clone());
                self.tier.inner.meta.run(move || inner.root.publish_staged(&file, &staged, &key))
            };
            let published = if rename_first { Some(publish(Arc::clone(&file)).await?) } else { None };
            if !skip_sync {
                self.tier.inner.fdatasync(Arc::clone(&file)).await?;
                #[cfg(feature = "fs-trace")]
                if let Some((t, id)) = self.staged.trace() {
                    t.record(ringtier_core::fs::trace::FsOp::Fsync { file: id });
                }
            }
            match published {
                Some(meta) => Ok(meta),
                None => publish(file).await,
            }
        }
        .await;
        if res.is_ok() {
            staged_guard.keep();
        } else {
            drop(staged_guard);
        }
        res.map_err(|e| self.err(e, Operation::Commit))
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        self.file.take();
        self.buffered.take();
        self.staged.remove().map_err(|e| self.err(e, Operation::Abort))
    }
}

impl Drop for UringWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = self.staged.remove();
        }
    }
}
