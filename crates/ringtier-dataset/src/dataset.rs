//! The samples a loader reads: keys and sizes on a tier.
//!
//! Keys live end to end in one arena ([`ringtier_core::Listing`]) with an end offset and a
//! size per sample (plus a CRC-32C where a manifest gave one): a key's bytes plus 16 bytes per
//! sample (20 with CRCs), shared by every clone of the [`Dataset`].

use std::path::Path;
use std::sync::Arc;

use crate::manifest::Manifest;
use crate::OnBadSample;
use ringtier_core::catalog;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{ListOptions, Listing, Skipped, Tier, UNKNOWN_SIZE};

/// Stats [`Dataset::from_keys`] keeps in flight.
pub(crate) const STATS_IN_FLIGHT: usize = 64;

/// Files [`Dataset::from_dir_with`] stats to estimate the largest size when the listing did
/// not stat them.
pub(crate) const ESTIMATE_STATS: usize = 256;

/// One sample, owned: its key on the tier, its size, and its CRC-32C when a manifest gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Key on the tier.
    pub key: String,
    /// Size in bytes ([`UNKNOWN_SIZE`] when the listing did not learn it).
    pub size: u64,
    /// CRC-32C from the manifest.
    pub crc32c: Option<u32>,
}

/// One sample of a [`Dataset`], borrowed from its arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRef<'a> {
    /// Key on the tier.
    pub key: &'a str,
    /// Size in bytes: exact, a hint ([`Dataset::sizes_are_hints`]) or [`UNKNOWN_SIZE`].
    pub size: u64,
    /// CRC-32C from the manifest.
    pub crc32c: Option<u32>,
}

impl SampleRef<'_> {
    /// The size, when known.
    pub fn known_size(&self) -> Option<u64> {
        (self.size != UNKNOWN_SIZE).then_some(self.size)
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Sample {
        Sample { key: self.key.to_string(), size: self.size, crc32c: self.crc32c }
    }
}

#[derive(Debug, Default)]
struct Table {
    listing: Listing,
    crcs: Option<Vec<u32>>,
    skipped: Vec<Skipped>,
}

/// The samples of a [`Dataset`] without its tier ([`Dataset::samples`]): keys, sizes and
/// checksums by index, sharing the dataset's arena. What a consumer keeps to name samples by
/// index without keeping the tier (and its threads) alive.
#[derive(Debug, Clone)]
pub struct Samples(Arc<Table>);

impl Samples {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.listing.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Key of sample `i`, or `None` past the end.
    pub fn key(&self, i: usize) -> Option<&str> {
        (i < self.len()).then(|| self.0.listing.key(i))
    }
}

/// Samples on a tier. Cloning shares the samples.
#[derive(Debug, Clone)]
pub struct Dataset {
    tier: Arc<dyn Tier>,
    table: Arc<Table>,
    /// The largest sample size known, or estimated where sizes are unknown.
    largest: u64,
}

impl Dataset {
    fn new(tier: Arc<dyn Tier>, mut listing: Listing, crcs: Option<Vec<u32>>) -> Self {
        let skipped = listing.take_skipped();
        listing.shrink_to_fit();
        let largest = listing.iter().map(|(_, size)| size).filter(|&s| s != UNKNOWN_SIZE).max().unwrap_or(0);
        Dataset { tier, table: Arc::new(Table { listing, crcs, skipped }), largest }
    }

    /// From a `ringtier gen` manifest of the tier's root directory (sizes exact, checksums
    /// kept, the manifest's order).
    pub fn from_manifest(tier: Arc<dyn Tier>, manifest: &Manifest) -> Self {
        let mut listing = Listing::new();
        for e in &manifest.entries {
            listing.push(&e.key, e.size);
        }
        let crcs = manifest.entries.iter().map(|e| e.crc32c).collect();
        Self::new(tier, listing, Some(crcs))
    }

    /// From the manifest in `dir` (the tier's root), or a strict listing of the tier when
    /// there is none: every file stat'd, and the first entry that cannot be listed fails
    /// (see [`Dataset::from_dir_with`] for the lenient, faster forms).
    pub async fn from_dir(tier: Arc<dyn Tier>, dir: &Path) -> Result<Self> {
        Self::from_dir_with(tier, dir, ListOptions::default()).await
    }

    /// From the manifest in `dir` (the tier's root), or a listing of the tier as `options`
    /// says ([`ListOptions`]): with `skip_bad`, entries that cannot be listed (a dangling
    /// link, a link loop, a directory that cannot be read) are left out, named once in a
    /// warning, counted in `ringtier_loader_samples_skipped_total` and kept in
    /// [`Dataset::skipped`]; without `stat_files`, sizes of regular files are unknown (the
    /// loader learns them from the reads); with `cache`, a current `.ringtier-listing` in
    /// `dir` is used instead of listing, and written after a listing.
    pub async fn from_dir_with(tier: Arc<dyn Tier>, dir: &Path, options: ListOptions) -> Result<Self> {
        if dir.join(crate::manifest::MANIFEST_FILE).exists() {
            return Ok(Self::from_manifest(tier, &Manifest::load(dir)?));
        }
        let listing = tier.list_with("", options).await?;
        let mut ds = Self::new(tier, listing, None);
        ds.report_skipped(&dir.display().to_string());
        if !ds.sizes_known() {
            ds.largest = ds.estimated_max_size(ESTIMATE_STATS).await?;
        }
        if ds.is_empty() {
            let why = match ds.skipped().first() {
                Some(s) => format!(
                    "no samples in {} ({} entries could not be listed, the first {}: {})",
                    dir.display(),
                    ds.skipped().len(),
                    s.key,
                    s.error
                ),
                None => format!("no samples in {}", dir.display()),
            };
            return Err(Error::new(ErrorKind::NotFound, why));
        }
        Ok(ds)
    }

    /// From keys on any tier; sizes come from `stat`, up to 64 at a time (on a remote or
    /// parallel file system each stat is a round trip). Order is kept; the first error wins.
    pub async fn from_keys(tier: Arc<dyn Tier>, keys: impl IntoIterator<Item = String>) -> Result<Self> {
        Self::from_keys_with(tier, keys, OnBadSample::Fail).await
    }

    /// [`Dataset::from_keys`] with a policy for keys whose stat fails (a dangling link, a file
    /// gone or unreadable): [`OnBadSample::Skip`] leaves them out (named once in a warning,
    /// counted, kept in [`Dataset::skipped`]); [`OnBadSample::Fail`] fails with the first
    /// error. An error of the tier itself (shut down) fails either way.
    pub async fn from_keys_with(
        tier: Arc<dyn Tier>,
        keys: impl IntoIterator<Item = String>,
        on_bad: OnBadSample,
    ) -> Result<Self> {
        let keys: Vec<String> = keys.into_iter().collect();
        let mut sizes: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        sizes.resize_with(keys.len(), || Ok(0));
        let mut stats = tokio::task::JoinSet::new();
        let mut next = 0;
        while next < keys.len() || !stats.is_empty() {
            while next < keys.len() && stats.len() < STATS_IN_FLIGHT {
                let (tier, key, i) = (Arc::clone(&tier), keys[next].clone(), next);
                stats.spawn(async move { (i, tier.stat(&key).await) });
                next += 1;
            }
            if let Some(joined) = stats.join_next().await {
                let (i, meta) =
                    joined.map_err(|e| Error::new(ErrorKind::Shutdown, format!("a stat task failed: {e}")))?;
                match meta {
                    Ok(m) => sizes[i] = Ok(m.size),
                    Err(e) if on_bad == OnBadSample::Fail || e.kind() == ErrorKind::Shutdown => return Err(e),
                    Err(e) => sizes[i] = Err(e),
                }
            }
        }
        let mut listing = Listing::new();
        for (key, size) in keys.iter().zip(sizes) {
            match size {
                Ok(size) => listing.push(key, size),
                Err(e) => listing.push_skipped(key.as_str(), e),
            }
        }
        let ds = Self::new(tier, listing, None);
        ds.report_skipped("the keys given");
        Ok(ds)
    }

    /// From keys on any tier without a stat each: sizes unknown (the loader learns them from
    /// the reads), the largest estimated from up to 256 stats spread over the keys. Order is
    /// kept. A key that cannot be read (gone, a dangling link) is found when it is read: the
    /// loader skips it or fails naming it, as its `on_bad` says. What a million keys need
    /// instead of a million stats (in every DataLoader worker).
    pub async fn from_keys_unsized(tier: Arc<dyn Tier>, keys: impl IntoIterator<Item = String>) -> Result<Self> {
        let mut listing = Listing::new();
        for key in keys {
            listing.push(&key, UNKNOWN_SIZE);
        }
        let mut ds = Self::new(tier, listing, None);
        ds.largest = ds.estimated_max_size(ESTIMATE_STATS).await?;
        Ok(ds)
    }

    /// Warns once (naming up to 8 entries) and counts the entries the listing left out.
    fn report_skipped(&self, origin: &str) {
        let skipped = self.skipped();
        if skipped.is_empty() {
            return;
        }
        metrics::counter!(catalog::LOADER_SKIPPED_TOTAL).increment(skipped.len() as u64);
        tracing::warn!("{}", Self::skipped_summary(skipped, origin));
    }

    /// One line naming the entries a listing of `origin` left out (up to 8 of them, then how
    /// many more): what the warning says.
    pub fn skipped_summary(skipped: &[Skipped], origin: &str) -> String {
        let shown: Vec<String> = skipped.iter().take(8).map(|s| format!("{} ({})", s.key, s.error.message())).collect();
        let more = match skipped.len().saturating_sub(shown.len()) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        format!(
            "{} entries of {origin} could not be listed and are left out (on_bad=\"skip\"): {}{more}",
            skipped.len(),
            shown.join(", ")
        )
    }

    /// The same samples on another tier (the same files opened with other options, e.g. a
    /// tier given a buffer pool sized from [`Dataset::max_size`]).
    pub fn with_tier(mut self, tier: Arc<dyn Tier>) -> Self {
        self.tier = tier;
        self
    }

    /// The tier.
    pub fn tier(&self) -> &Arc<dyn Tier> {
        &self.tier
    }

    /// Sample `i`. Panics when `i >= len()`.
    pub fn sample(&self, i: usize) -> SampleRef<'_> {
        let t = &self.table;
        SampleRef { key: t.listing.key(i), size: t.listing.size(i), crc32c: t.crcs.as_ref().map(|c| c[i]) }
    }

    /// The samples without the tier (shared, not copied).
    pub fn samples(&self) -> Samples {
        Samples(Arc::clone(&self.table))
    }

    /// Key of sample `i`. Panics when `i >= len()`.
    pub fn key(&self, i: usize) -> &str {
        self.table.listing.key(i)
    }

    /// The samples, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = SampleRef<'_>> + '_ {
        (0..self.len()).map(move |i| self.sample(i))
    }

    /// Entries the listing (or the stats of [`Dataset::from_keys_with`]) left out, with why.
    pub fn skipped(&self) -> &[Skipped] {
        &self.table.skipped
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.table.listing.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when every sample's size is known (none [`UNKNOWN_SIZE`]).
    pub fn sizes_known(&self) -> bool {
        self.table.listing.sizes_known()
    }

    /// True when the sizes may be out of date (from a cached listing): a reader reads each
    /// file whole, whatever its size now, instead of holding it to the listed size.
    pub fn sizes_are_hints(&self) -> bool {
        self.table.listing.sizes_are_hints()
    }

    /// True when the samples came from a cached listing (`.ringtier-listing`).
    pub fn from_cache(&self) -> bool {
        self.table.listing.from_cache()
    }

    /// The largest sample size: the largest known, or, where the listing left sizes unknown,
    /// the estimate of [`Dataset::estimated_max_size`] taken when it was listed (a loader sizes
    /// its buffers by it; a larger sample is read whole all the same, in more requests).
    pub fn max_size(&self) -> u64 {
        self.largest
    }

    /// The largest sample size, estimated where sizes are unknown: the largest known size and
    /// the largest of up to `n` stats of samples of unknown size spread evenly over the
    /// dataset (64 in flight). What a loader sizes its buffers by when the listing did not
    /// stat every file; a larger sample is still read whole, in more than one request.
    pub async fn estimated_max_size(&self, n: usize) -> Result<u64> {
        let known = self.iter().filter_map(|s| s.known_size()).max().unwrap_or(0);
        let unknown: Vec<usize> = (0..self.len()).filter(|&i| self.sample(i).size == UNKNOWN_SIZE).collect();
        if unknown.is_empty() || n == 0 {
            return Ok(known);
        }
        let step = (unknown.len() / n).max(1);
        let picks: Vec<String> = unknown.iter().step_by(step).take(n).map(|&i| self.key(i).to_string()).collect();
        let mut largest = known;
        let mut stats = tokio::task::JoinSet::new();
        let mut picks = picks.into_iter();
        loop {
            while stats.len() < STATS_IN_FLIGHT {
                let Some(key) = picks.next() else { break };
                let tier = Arc::clone(&self.tier);
                stats.spawn(async move { tier.stat(&key).await });
            }
            let Some(joined) = stats.join_next().await else { break };
            // A sample that cannot be stat'd now is the reader's to skip or report.
            if let Ok(Ok(meta)) = joined {
                largest = largest.max(meta.size);
            }
        }
        Ok(largest)
    }

    /// Bytes the samples hold on the heap (keys, offsets, sizes, checksums): what the dataset
    /// costs per sample, times its length.
    pub fn heap_bytes(&self) -> usize {
        self.table.listing.heap_bytes() + self.table.crcs.as_ref().map_or(0, |c| c.capacity() * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtier_core::{ops, MemoryTier};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn from_keys_stats_concurrently_and_keeps_order() {
        let tier = Arc::new(MemoryTier::new());
        let keys: Vec<String> = (0..300).map(|i| format!("k{i:03}")).collect();
        for (i, k) in keys.iter().enumerate() {
            ops::put(tier.as_ref(), k, &vec![7u8; i + 1], 4096).await.expect("put");
        }
        let ds = Dataset::from_keys(tier.clone(), keys.clone()).await.expect("dataset");
        let got: Vec<(String, u64)> = ds.iter().map(|s| (s.key.to_string(), s.size)).collect();
        let want: Vec<(String, u64)> = keys.iter().enumerate().map(|(i, k)| (k.clone(), i as u64 + 1)).collect();
        assert_eq!(got, want);
        assert!(ds.sizes_known() && !ds.sizes_are_hints());
        assert_eq!(ds.estimated_max_size(16).await.expect("estimate"), 300);
        let mut with_missing = keys;
        with_missing.insert(150, "missing".into());
        let e = Dataset::from_keys(tier.clone(), with_missing.clone()).await.expect_err("a missing key fails");
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        // Skipped instead, and named.
        let no_stats = Dataset::from_keys_unsized(tier.clone(), with_missing.clone()).await.expect("unsized");
        assert_eq!(no_stats.len(), 301);
        assert!(!no_stats.sizes_known() && no_stats.max_size() >= 200, "estimated: {}", no_stats.max_size());
        let ds = Dataset::from_keys_with(tier, with_missing, OnBadSample::Skip).await.expect("lenient");
        assert_eq!(ds.len(), 300);
        assert_eq!(ds.skipped().len(), 1);
        assert_eq!(ds.skipped()[0].key, "missing");
        assert_eq!(ds.key(150), "k150");
        let line = Dataset::skipped_summary(ds.skipped(), "the keys given");
        assert!(
            line.starts_with("1 entries of the keys given could not be listed") && line.contains("missing"),
            "{line}"
        );
    }

    #[test]
    fn memory_per_sample_is_the_key_and_sixteen_bytes() {
        let mut listing = Listing::new();
        for i in 0..10_000 {
            listing.push(&format!("n{:08}/{i:08}.JPEG", i % 1000), 1000 + i as u64);
        }
        listing.sort();
        let ds = Dataset::new(Arc::new(ringtier_core::MemoryTier::new()), listing, None);
        let per_sample = ds.heap_bytes() as f64 / ds.len() as f64;
        // 23-byte keys: 39 bytes a sample.
        assert!(per_sample <= 40.0, "{per_sample} bytes per sample");
        assert_eq!(ds.sample(0).key, "n00000000/00000000.JPEG");
    }
}
