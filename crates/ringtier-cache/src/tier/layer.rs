//! [`CachedTier`] as a [`Tier`] layer over its backing tier: reads served from a level or the
//! backing tier (never through a reader of the backing tier), writes and deletes passed
//! through with the cached copy dropped; everything else (name, capabilities, stat, list,
//! locks, space, empty directories, buffer pool) is the backing tier's.

use ringtier_core::layers::LayeredTier;
use ringtier_core::ObjectReader;

use super::*;

#[async_trait]
impl LayeredTier for CachedTier {
    fn inner(&self) -> &dyn Tier {
        self.inner.backing.as_ref()
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.invalidate(key);
        self.inner.backing.delete(key).await
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        if let Err(e) = ringtier_core::key::validate_key(key) {
            return (Err(e.with_operation(Operation::Read)), buf);
        }
        if self.inner.shared.is_some() {
            let mut one = ReadBatch::with_capacity(1, key.len());
            one.push(key, offset, len, buf);
            let mut one = self.inner.shared_read_batch(one).await;
            let (res, b) = match one.drain().next() {
                Some((_, _, res, b)) => (res, b),
                None => (Err(Error::new(ErrorKind::Shutdown, "not read")), None),
            };
            // The slow tier keeps the buffer of a failed read only sometimes: hand back a fresh one.
            let b = match b {
                Some(b) => b,
                None => AlignedBuf::new(4096, 4096).expect("allocating a 4 KiB buffer"),
            };
            return (res, b);
        }
        let buf = match self.inner.read_cached(key, offset, len, buf).await {
            Ok(done) => return done,
            Err(buf) => buf,
        };
        let demand = DemandGuard::new(&self.inner, 1);
        let (res, buf) = self.inner.backing.read_at(key, offset, len, buf).await;
        drop(demand);
        if res.is_ok() {
            let (id, _) = self.inner.id_of(key);
            self.inner.after_miss(key, id, offset, len, Some(buf.as_slice())).await;
        }
        (res, buf)
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        self.invalidate(key);
        self.inner.backing.create(key).await
    }

    /// Reads by key, so that each is served from the cache or fills it.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        let _ = key;
        Ok(None)
    }

    async fn read_batch(&self, mut batch: ReadBatch) -> ReadBatch {
        if self.inner.shared.is_some() {
            return self.inner.shared_read_batch(batch).await;
        }
        // Cached objects first; the rest go to the slow tier as one batch (its own batch path).
        let mut misses = ReadBatch::new();
        let mut missed = Vec::new();
        let (keys, entries) = batch.parts_mut();
        for (i, e) in entries.iter_mut().enumerate() {
            if e.is_done() {
                continue;
            }
            let Some(buf) = e.take_buf() else { continue };
            let key = e.key(keys);
            match self.inner.read_cached(key, e.offset(), e.len(), buf).await {
                Ok((res, buf)) => e.finish(res, buf),
                Err(buf) => {
                    misses.push(key, e.offset(), e.len(), buf);
                    missed.push(i);
                }
            }
        }
        if missed.is_empty() {
            return batch;
        }
        let demand = DemandGuard::new(&self.inner, misses.len());
        let mut misses = self.inner.backing.read_batch(misses).await;
        drop(demand);
        let mut done = Vec::with_capacity(missed.len());
        for (key, offset, res, buf) in misses.drain() {
            done.push((key.to_string(), offset, res, buf));
        }
        let (_, entries) = batch.parts_mut();
        for (i, (key, offset, res, buf)) in missed.into_iter().zip(done) {
            let e = &mut entries[i];
            if let (Ok(_), Some(b)) = (&res, &buf) {
                let (id, _) = self.inner.id_of(&key);
                self.inner.after_miss(&key, id, offset, e.len(), Some(b.as_slice())).await;
            }
            match buf {
                Some(b) => e.finish(res, b),
                None => e.set_result(res),
            }
        }
        batch
    }
}

impl CachedTier {
    /// Drops the cached copy of `key` (it is being rewritten or deleted on the slow tier).
    fn invalidate(&self, key: &str) {
        let id = self.inner.keys.read().unwrap_or_else(|p| p.into_inner()).ids.get(key).copied();
        if let Some(id) = id {
            let victim = self.inner.lock().evict(id);
            self.inner.drop_files(victim.into_iter().collect());
        }
    }
}
