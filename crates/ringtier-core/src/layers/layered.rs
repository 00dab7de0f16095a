//! [`LayeredTier`]: a tier that wraps another and forwards whatever it does not change.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;

use crate::buf::{AlignedBuf, BufferPool};
use crate::error::Result;
use crate::listing::{ListOptions, Listing};
use crate::tier::{Adopted, Capabilities, ObjectMeta, ObjectReader, ObjectWriter, ReadBatch, Space, Tier, TierLock};

/// A layer: a tier that wraps an inner [`Tier`] and is a tier itself (the model is opendal's
/// `LayeredAccess`). Every method forwards to [`inner`](LayeredTier::inner) by default, so a
/// layer implements only what it changes, and a method added to [`Tier`] reaches every layer
/// without touching it. Every `LayeredTier` is a [`Tier`] through a blanket implementation.
/// One exception: [`adopt`](LayeredTier::adopt) is declined unless a layer forwards it, since
/// it publishes bytes that never passed through the layer (declining only costs a copy).
///
/// What a layer must keep in mind when it changes one method:
///
/// * **Reads.** A layer that changes [`read_at`](LayeredTier::read_at) (throttle, faults,
///   power cut, cache) also decides [`read_batch`](LayeredTier::read_batch) (the default
///   hands the whole batch to the inner tier, past the layer's `read_at`;
///   [`read_one_at_a_time`](crate::tier::read_one_at_a_time) sends each request through it)
///   and [`open_read`](LayeredTier::open_read) (the default hands out the inner tier's reader;
///   answer `Ok(None)` to keep every read going through the layer).
/// * **Capabilities.** Override [`capabilities`](LayeredTier::capabilities) only to change
///   what the layer changes (`native_batch` where batches no longer go down whole), starting
///   from the inner tier's: [`Capabilities::locks`] must stay the inner tier's, as
///   [`lock`](LayeredTier::lock) forwards to it. The test kit's conformance suite checks both
///   for every layer over every tier.
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use ringtier_core::layers::LayeredTier;
/// use ringtier_core::{MemoryTier, Result, Tier};
///
/// /// Refuses deletes; everything else (locks, space, batches, ...) is the inner tier's.
/// #[derive(Debug)]
/// struct NoDeletes(Arc<dyn Tier>);
///
/// #[async_trait]
/// impl LayeredTier for NoDeletes {
///     fn inner(&self) -> &dyn Tier {
///         self.0.as_ref()
///     }
///
///     async fn delete(&self, key: &str) -> Result<()> {
///         Err(ringtier_core::Error::new(ringtier_core::ErrorKind::PermissionDenied, format!("{key}: no deletes")))
///     }
/// }
///
/// let tier: Arc<dyn Tier> = Arc::new(NoDeletes(Arc::new(MemoryTier::new())));
/// assert_eq!(tier.capabilities(), MemoryTier::new().capabilities());
/// ```
#[async_trait]
pub trait LayeredTier: Send + Sync + fmt::Debug + 'static {
    /// The wrapped tier, which every method not overridden forwards to.
    fn inner(&self) -> &dyn Tier;

    /// [`Tier::name`]; default: the inner tier's.
    fn name(&self) -> &str {
        self.inner().name()
    }

    /// [`Tier::capabilities`]; default: the inner tier's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Tier::stat`]; default: forwarded.
    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        self.inner().stat(key).await
    }

    /// [`Tier::list`]; default: forwarded.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.inner().list(prefix).await
    }

    /// [`Tier::list_with`]; default: forwarded.
    async fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        self.inner().list_with(prefix, options).await
    }

    /// [`Tier::delete`]; default: forwarded.
    async fn delete(&self, key: &str) -> Result<()> {
        self.inner().delete(key).await
    }

    /// [`Tier::lock`]; default: forwarded, so the layer keeps the inner tier's one-writer
    /// guarantee.
    async fn lock(&self, name: &str) -> Result<Option<TierLock>> {
        self.inner().lock(name).await
    }

    /// [`Tier::remove_empty_dirs`]; default: forwarded.
    async fn remove_empty_dirs(&self, prefix: &str) -> Result<()> {
        self.inner().remove_empty_dirs(prefix).await
    }

    /// [`Tier::space`]; default: forwarded.
    async fn space(&self) -> Result<Option<Space>> {
        self.inner().space().await
    }

    /// [`Tier::buffer_pool`]; default: the inner tier's.
    fn buffer_pool(&self) -> Option<BufferPool> {
        self.inner().buffer_pool()
    }

    /// [`Tier::read_at`]; default: forwarded.
    async fn read_at(&self, key: &str, offset: u64, len: usize, buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        self.inner().read_at(key, offset, len, buf).await
    }

    /// [`Tier::create`]; default: forwarded (the inner tier's writer, unwrapped).
    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        self.inner().create(key).await
    }

    /// [`Tier::adopt`]; default: **not** forwarded, `Ok(None)` (the caller copies instead,
    /// through the layer's own writer). Adopting publishes bytes that never went through the
    /// layer, so a layer that changes or watches writes (throttle, faults, power cut) would be
    /// passed by; a layer that may let it through says so by forwarding it (the metered layer).
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        let _ = (from, key);
        Ok(None)
    }

    /// [`Tier::open_read`]; default: forwarded (the inner tier's reader, unwrapped). A layer
    /// that changes reads answers `Ok(None)` instead.
    async fn open_read(&self, key: &str) -> Result<Option<Arc<dyn ObjectReader>>> {
        self.inner().open_read(key).await
    }

    /// [`Tier::read_batch`]; default: the whole batch to the inner tier's batch path. A layer
    /// that changes single reads sends each request through its own `read_at` instead
    /// ([`read_one_at_a_time`](crate::tier::read_one_at_a_time)).
    async fn read_batch(&self, batch: ReadBatch) -> ReadBatch {
        self.inner().read_batch(batch).await
    }
}

/// The future type `#[async_trait]` gives both traits' methods.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Every layer is a tier. The async methods are written as `#[async_trait]` expands them and
/// hand back the layer's own boxed future as it is: one allocation per call, not two.
impl<L: LayeredTier> Tier for L {
    fn name(&self) -> &str {
        LayeredTier::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        LayeredTier::capabilities(self)
    }

    fn stat<'s, 'k, 'f>(&'s self, key: &'k str) -> BoxFuture<'f, Result<ObjectMeta>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::stat(self, key)
    }

    fn list<'s, 'k, 'f>(&'s self, prefix: &'k str) -> BoxFuture<'f, Result<Vec<ObjectMeta>>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::list(self, prefix)
    }

    fn list_with<'s, 'k, 'f>(&'s self, prefix: &'k str, options: ListOptions) -> BoxFuture<'f, Result<Listing>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::list_with(self, prefix, options)
    }

    fn delete<'s, 'k, 'f>(&'s self, key: &'k str) -> BoxFuture<'f, Result<()>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::delete(self, key)
    }

    fn lock<'s, 'k, 'f>(&'s self, name: &'k str) -> BoxFuture<'f, Result<Option<TierLock>>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::lock(self, name)
    }

    fn remove_empty_dirs<'s, 'k, 'f>(&'s self, prefix: &'k str) -> BoxFuture<'f, Result<()>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::remove_empty_dirs(self, prefix)
    }

    fn space<'s, 'f>(&'s self) -> BoxFuture<'f, Result<Option<Space>>>
    where
        's: 'f,
        Self: 'f,
    {
        LayeredTier::space(self)
    }

    fn buffer_pool(&self) -> Option<BufferPool> {
        LayeredTier::buffer_pool(self)
    }

    fn read_at<'s, 'k, 'f>(
        &'s self,
        key: &'k str,
        offset: u64,
        len: usize,
        buf: AlignedBuf,
    ) -> BoxFuture<'f, (Result<usize>, AlignedBuf)>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::read_at(self, key, offset, len, buf)
    }

    fn create<'s, 'k, 'f>(&'s self, key: &'k str) -> BoxFuture<'f, Result<Box<dyn ObjectWriter>>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::create(self, key)
    }

    fn adopt<'s, 'a, 'k, 'f>(&'s self, from: &'a str, key: &'k str) -> BoxFuture<'f, Result<Option<Adopted>>>
    where
        's: 'f,
        'a: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::adopt(self, from, key)
    }

    fn open_read<'s, 'k, 'f>(&'s self, key: &'k str) -> BoxFuture<'f, Result<Option<Arc<dyn ObjectReader>>>>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        LayeredTier::open_read(self, key)
    }

    fn read_batch<'s, 'f>(&'s self, batch: ReadBatch) -> BoxFuture<'f, ReadBatch>
    where
        's: 'f,
        Self: 'f,
    {
        LayeredTier::read_batch(self, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ops, MemoryTier, PosixConfig, PosixTier};

    /// A layer that changes nothing: every method is the default.
    #[derive(Debug)]
    struct Nothing(Arc<dyn Tier>);

    impl LayeredTier for Nothing {
        fn inner(&self) -> &dyn Tier {
            self.0.as_ref()
        }
    }

    #[tokio::test]
    async fn a_layer_that_changes_nothing_is_its_inner_tier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let posix: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.path())).expect("posix"));
        let memory: Arc<dyn Tier> = Arc::new(MemoryTier::with_capacity(1 << 20));
        for inner in [posix, memory] {
            let layer: Arc<dyn Tier> = Arc::new(Nothing(Arc::clone(&inner)));
            assert_eq!(layer.name(), inner.name());
            assert_eq!(layer.capabilities(), inner.capabilities());
            // Free bytes move with whatever else writes to the file system: compare the totals.
            let total = |s: Option<Space>| s.map(|s| s.total_bytes);
            assert_eq!(total(layer.space().await.expect("space")), total(inner.space().await.expect("space")));
            ops::put(layer.as_ref(), "a/b", b"hello", 4096).await.expect("put");
            assert_eq!(ops::get(inner.as_ref(), "a/b").await.expect("get"), b"hello");
            assert_eq!(layer.stat("a/b").await.expect("stat").size, 5);
            assert_eq!(layer.list("a/").await.expect("list").len(), 1);
            let listed = layer.list_with("a/", ListOptions::default().with_skip_bad(true)).await.expect("list_with");
            assert_eq!(listed.iter().collect::<Vec<_>>(), [("a/b", 5)]);
            let mut batch = ReadBatch::new();
            batch.push("a/b", 0, 5, AlignedBuf::new(4096, 4096).expect("buf"));
            let batch = layer.read_batch(batch).await;
            assert!(matches!(batch.get(0).and_then(|(_, e)| e.result()), Some(Ok(5))));
            let held = layer.lock("one").await.expect("lock");
            assert_eq!(held.is_some(), inner.capabilities().locks);
            if held.is_some() {
                assert!(inner.lock("one").await.is_err(), "the layer's lock is the inner tier's");
            }
            layer.delete("a/b").await.expect("delete");
            layer.remove_empty_dirs("a").await.expect("remove empty dirs");
            assert!(inner.list("").await.expect("list").is_empty());
        }
    }
}
