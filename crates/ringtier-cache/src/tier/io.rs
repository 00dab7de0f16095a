//! The cache's I/O: where a level keeps its copies ([`Store`]: memory, or a directory of
//! its own), reads served from a level, misses read from the slow tier and admitted in the
//! background, copies written, demoted and dropped, and the count of readers' reads in flight
//! at the slow tier that the prefetcher yields to.

use super::*;

/// Where a level keeps its copies.
pub(super) enum Store {
    Memory,
    Dir { tier: PosixTier, root: PathBuf },
}

/// Counts readers' reads in flight at the slow tier while it lives (also when a read's future
/// is dropped), and wakes the prefetcher when they end.
pub(super) struct DemandGuard<'a> {
    inner: &'a Inner,
    n: usize,
}

impl<'a> DemandGuard<'a> {
    pub(super) fn new(inner: &'a Inner, n: usize) -> Self {
        inner.demand.fetch_add(n, Ordering::AcqRel);
        DemandGuard { inner, n }
    }
}

impl Drop for DemandGuard<'_> {
    fn drop(&mut self) {
        self.inner.demand.fetch_sub(self.n, Ordering::AcqRel);
        self.inner.notify.notify_waiters();
    }
}

/// A directory level's store: a directory of its own under `dir` (checked writable now), read
/// and written through a thread-pool tier.
pub(super) fn open_dir(dir: &std::path::Path) -> Result<Store> {
    let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
    let root = dir.join(format!("ringtier-cache-{}-{n}", std::process::id()));
    let fail = |what: &str, e: std::io::Error| {
        Error::from_errno(
            e.raw_os_error().unwrap_or(libc_eio()),
            format!("cache directory {}: {what}: {e}", dir.display()),
        )
        .with_operation(Operation::Write)
    };
    std::fs::create_dir_all(&root).map_err(|e| fail("cannot create it", e))?;
    // A directory we may create but not write into (read-only mount, permissions for others).
    let probe = root.join(".probe");
    if let Err(e) = std::fs::write(&probe, b"ringtier") {
        let _ = std::fs::remove_dir(&root);
        return Err(fail("cannot write into it", e));
    }
    let _ = std::fs::remove_file(&probe);
    let tier = PosixTier::new(PosixConfig::new(&root).with_name("cache-dir".into()).with_sync(false).with_threads(4))?;
    Ok(Store::Dir { tier, root })
}

fn libc_eio() -> i32 {
    5
}

/// The key of object `id`'s copy in a directory level.
pub(super) fn dir_key(id: u32) -> String {
    format!("c{id}")
}

impl Inner {
    /// Removes the directory copies of `victims`, in the background (a memory copy goes with
    /// the state's entry).
    pub(super) fn drop_files(&self, victims: Vec<Victim>) {
        let files: Vec<(PosixTier, String)> = victims
            .into_iter()
            .filter_map(|v| match &self.stores[v.level] {
                Store::Dir { tier, .. } => Some((tier.clone(), dir_key(v.id))),
                Store::Memory => None,
            })
            .collect();
        if files.is_empty() {
            return;
        }
        let fut = async move {
            for (tier, key) in files {
                if let Err(e) = tier.delete(&key).await {
                    if e.kind() != ErrorKind::NotFound {
                        tracing::warn!("dropping a cached copy: {e}");
                    }
                }
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(fut);
        }
    }

    /// Puts `data` (object `id`) into the level the admission chose, carries out its evictions
    /// and demotions.
    pub(super) async fn store(self: &Arc<Self>, id: u32, adm: Admission, data: Arc<[u8]>) {
        self.drop_files(adm.victims);
        for d in adm.demotions {
            let ok = self.write_level(d.id, d.level, d.data.clone()).await;
            let mut st = self.lock();
            if ok {
                st.complete(d.id, self.memory_copy(d.level, &d.data));
            } else {
                st.abandon(d.id);
            }
        }
        if let Some(level) = adm.level {
            let ok = self.write_level(id, level, data.clone()).await;
            let mut st = self.lock();
            if ok {
                st.complete(id, self.memory_copy(level, &data));
            } else {
                st.abandon(id);
            }
        }
        self.report();
        self.notify.notify_waiters();
    }

    /// The copy a memory level holds of `data` (`None` for a directory level).
    pub(super) fn memory_copy(&self, level: usize, data: &Arc<[u8]>) -> Option<Arc<[u8]>> {
        matches!(self.stores[level], Store::Memory).then(|| Arc::clone(data))
    }

    /// Writes object `id`'s copy into `level` (nothing to write for memory); `false` when the
    /// write failed (the object is then read from the slow tier).
    pub(super) async fn write_level(&self, id: u32, level: usize, data: Arc<[u8]>) -> bool {
        match &self.stores[level] {
            Store::Memory => true,
            Store::Dir { tier, .. } => match ringtier_core::ops::put(tier, &dir_key(id), &data, 1 << 20).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(
                        "writing a copy into the cache directory failed (read from the slow tier instead): {e}"
                    );
                    false
                }
            },
        }
    }

    /// Reads object `key` of `size` bytes whole from the slow tier, in concurrent ranges of at
    /// most `range_bytes`.
    pub(super) async fn fetch_whole(&self, key: &str, size: u64) -> Result<Arc<[u8]>> {
        self.fetch_many(&[(key.to_string(), size)])
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::new(ErrorKind::Shutdown, "not read")))
    }

    /// Reads objects whole from the slow tier as one batch (the slow tier's batch path: one
    /// round trip on a throttled tier, concurrent requests on S3), each in ranges of at most
    /// `range_bytes`. One result per object, in order.
    pub(super) async fn fetch_many(&self, objects: &[(String, u64)]) -> Vec<Result<Arc<[u8]>>> {
        let range = self.cfg.range_bytes.max(1) as u64;
        let align = self.backing.capabilities().alignment.max(1);
        let mut out: Vec<Result<Vec<u8>>> =
            objects.iter().map(|(_, size)| Ok(Vec::with_capacity(*size as usize))).collect();
        let mut batch = ReadBatch::with_capacity(objects.len(), objects.iter().map(|(k, _)| k.len()).sum());
        let mut owner = Vec::with_capacity(objects.len());
        for (i, (key, size)) in objects.iter().enumerate() {
            let mut off = 0u64;
            while off < *size {
                let len = range.min(size - off) as usize;
                match AlignedBuf::new((len + 2 * align).next_multiple_of(align), align) {
                    Ok(buf) => {
                        batch.push(key, off, len, buf);
                        owner.push((i, len));
                    }
                    Err(e) => out[i] = Err(e),
                }
                off += range;
            }
        }
        if !batch.is_empty() {
            let mut batch = self.backing.read_batch(batch).await;
            for ((key, off, res, buf), (i, want)) in batch.drain().zip(owner) {
                let Ok(data) = &mut out[i] else { continue };
                match (res, buf) {
                    (Ok(n), Some(b)) if n == want => data.extend_from_slice(b.as_slice()),
                    (Ok(n), _) => {
                        out[i] = Err(Error::new(
                            ErrorKind::Corrupt,
                            format!("size changed while caching: read {n} of {want} bytes at {off}"),
                        )
                        .context(Operation::Read, key, self.backing.name()))
                    }
                    (Err(e), _) => out[i] = Err(e),
                }
            }
        }
        let fetched: u64 = out.iter().flatten().map(|d| d.len() as u64).sum();
        self.lock().counters.fetched_bytes += fetched;
        out.into_iter().map(|r| r.map(Arc::from)).collect()
    }

    /// After a read from the slow tier: admit the object if the policy keeps it. A read that
    /// covered the whole object is copied from; otherwise the object is fetched in ranges.
    pub(super) async fn after_miss(self: &Arc<Self>, key: &str, id: u32, offset: u64, len: usize, got: Option<&[u8]>) {
        let (_, mut size) = self.id_of(key);
        if let Some(g) = got {
            self.lock().count_bytes(false, g.len() as u64);
            if size == UNKNOWN && offset == 0 && g.len() < len {
                size = g.len() as u64;
                self.learn_size(id, size);
            }
        }
        if self.cfg.policy == CachePolicy::None || self.stores.is_empty() {
            self.report();
            return;
        }
        if size == UNKNOWN {
            match self.backing.stat(key).await {
                Ok(m) => {
                    size = m.size;
                    self.learn_size(id, size);
                }
                Err(_) => return,
            }
        }
        let adm = self.lock().admit(id, size, false);
        if adm.level.is_none() && adm.victims.is_empty() && adm.demotions.is_empty() {
            self.report();
            return;
        }
        let whole = got.filter(|g| offset == 0 && g.len() as u64 == size).map(Arc::<[u8]>::from);
        let this = Arc::clone(self);
        let key = key.to_string();
        let work = async move {
            let data = match whole {
                Some(d) => Ok(d),
                None => this.fetch_whole(&key, size).await,
            };
            match data {
                Ok(d) => this.store(id, adm, d).await,
                Err(e) => {
                    tracing::warn!("caching {key}: {e}");
                    this.drop_files(adm.victims);
                    let mut st = this.lock();
                    if adm.level.is_some() {
                        st.abandon(id);
                    }
                    for d in adm.demotions {
                        st.complete(d.id, this.memory_copy(d.level, &d.data));
                    }
                }
            }
        };
        // In the background: the reader has its bytes already.
        tokio::spawn(work);
    }

    /// Serves a read from the cache if it holds the object (waiting for a copy being fetched);
    /// `Err(buf)` when the reader must go to the slow tier.
    pub(super) async fn read_cached(
        &self,
        key: &str,
        offset: u64,
        len: usize,
        mut buf: AlignedBuf,
    ) -> std::result::Result<(Result<usize>, AlignedBuf), AlignedBuf> {
        let (id, _) = self.id_of(key);
        let mut waited = false;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let found = self.lock().lookup(id, offset, len, waited);
            match found {
                Lookup::Memory(data) => {
                    self.notify.notify_waiters(); // a staged copy read: room for the prefetcher
                    let res =
                        copy_out(&data, offset, len, &mut buf).map_err(|e| e.context(Operation::Read, key, "cache"));
                    if let Ok(n) = &res {
                        self.lock().count_bytes(true, *n as u64);
                    }
                    return Ok((res, buf));
                }
                Lookup::Dir(level) => {
                    let Store::Dir { tier, .. } = &self.stores[level] else { return Err(buf) };
                    let (res, b) = tier.read_at(&dir_key(id), offset, len, buf).await;
                    self.notify.notify_waiters();
                    match res {
                        Ok(n) => {
                            self.lock().count_bytes(true, n as u64);
                            return Ok((Ok(n), b));
                        }
                        Err(e) => {
                            // The copy is gone or unreadable: drop it, read the slow tier.
                            tracing::warn!("reading a cached copy of {key} failed (reading the slow tier): {e}");
                            let victim = self.lock().evict(id);
                            self.drop_files(victim.into_iter().collect());
                            return Err(b);
                        }
                    }
                }
                Lookup::Pending => {
                    if !waited && offset == 0 {
                        // Counted as a miss once, when the copy arrives.
                        waited = true;
                    }
                    notified.await
                }
                Lookup::Miss => return Err(buf),
            }
        }
    }
}

/// Copies `[offset, offset + len)` of `data` (clipped at its end) into `buf`'s window.
pub(super) fn copy_out(data: &[u8], offset: u64, len: usize, buf: &mut AlignedBuf) -> Result<usize> {
    let size = data.len() as u64;
    if offset > size {
        return Err(Error::new(ErrorKind::OutOfRange, format!("read at {offset} past the end ({size} bytes)")));
    }
    let n = len.min((size - offset) as usize);
    if n > buf.capacity() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("buffer of {} bytes is too small for a read of {n}", buf.capacity()),
        ));
    }
    buf.set_window(0, n)?;
    buf.as_mut_slice().copy_from_slice(&data[offset as usize..offset as usize + n]);
    Ok(n)
}
