//! Listings of many keys ([`Tier::list_with`](crate::Tier::list_with)): keys and sizes in one
//! arena ([`Listing`]), the entries a lenient listing left out ([`Skipped`]), and what the
//! listing does ([`ListOptions`]).
//!
//! A million keys as a `Vec<ObjectMeta>` cost a `String` (24 bytes plus a heap block) and a
//! modification time each; a [`Listing`] keeps the keys end to end in one `String` with one
//! `u64` end offset and one `u64` size per key: the key's bytes plus 16 per key.

use crate::error::Error;
use crate::tier::ObjectMeta;

/// The size of an entry whose size the listing did not learn (see
/// [`ListOptions::stat_files`]): the reader learns it from the read.
pub const UNKNOWN_SIZE: u64 = u64::MAX;

/// What [`Tier::list_with`](crate::Tier::list_with) does. The default is what
/// [`Tier::list`](crate::Tier::list) does: the first bad entry fails the listing, every file
/// is stat'd, nothing is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListOptions {
    /// Leave out an entry that cannot be listed (a dangling symbolic link, a link loop, a
    /// directory that cannot be read, a name that is not UTF-8) and record it in
    /// [`Listing::skipped`]; false (the default): the first one fails the listing with an
    /// error naming it.
    pub skip_bad: bool,
    /// Stat every file for its size (sizes exact as of the listing). False: file tiers take
    /// what the directory entries say (`getdents` with `d_type`) and stat only links and
    /// entries of unknown type; a regular file's size is then [`UNKNOWN_SIZE`]. Default true.
    pub stat_files: bool,
    /// File tiers, whole-root listings (prefix `""`): use the listing cached in
    /// `ROOT/.ringtier-listing` when every directory it names is unchanged (same inode,
    /// modification and change times), and write it after a listing otherwise
    /// (best effort: a read-only dataset is listed every time). Sizes from the cache are hints
    /// ([`Listing::sizes_are_hints`]). Default false.
    pub cache: bool,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions { skip_bad: false, stat_files: true, cache: false }
    }
}

impl ListOptions {
    /// Sets [`ListOptions::skip_bad`].
    pub fn with_skip_bad(mut self, skip_bad: bool) -> Self {
        self.skip_bad = skip_bad;
        self
    }

    /// Sets [`ListOptions::stat_files`].
    pub fn with_stat_files(mut self, stat_files: bool) -> Self {
        self.stat_files = stat_files;
        self
    }

    /// Sets [`ListOptions::cache`].
    pub fn with_cache(mut self, cache: bool) -> Self {
        self.cache = cache;
        self
    }
}

/// An entry a lenient listing left out, and why.
#[derive(Debug)]
pub struct Skipped {
    /// The entry's key (a directory's key for a directory that could not be read).
    pub key: String,
    /// Why (its kind and OS error code kept).
    pub error: Error,
}

/// Keys and their sizes, sorted by key, in one arena: the result of
/// [`Tier::list_with`](crate::Tier::list_with).
#[derive(Debug, Default)]
pub struct Listing {
    keys: String,
    ends: Vec<u64>,
    sizes: Vec<u64>,
    sizes_are_hints: bool,
    from_cache: bool,
    skipped: Vec<Skipped>,
}

impl Listing {
    /// An empty listing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The objects of a [`Tier::list`](crate::Tier::list), sorted by key, exact sizes.
    pub fn from_objects(objects: Vec<ObjectMeta>) -> Self {
        let mut l = Listing::new();
        l.keys.reserve(objects.iter().map(|o| o.key.len()).sum());
        l.ends.reserve(objects.len());
        l.sizes.reserve(objects.len());
        for o in &objects {
            l.push(&o.key, o.size);
        }
        l.sort();
        l
    }

    /// Adds `key` with `size` ([`UNKNOWN_SIZE`] when unknown). Call [`Listing::sort`] after
    /// the last one.
    pub fn push(&mut self, key: &str, size: u64) {
        self.keys.push_str(key);
        self.ends.push(self.keys.len() as u64);
        self.sizes.push(size);
    }

    /// Records an entry left out.
    pub fn push_skipped(&mut self, key: impl Into<String>, error: Error) {
        self.skipped.push(Skipped { key: key.into(), error });
    }

    /// Sorts the keys (and their sizes) by key, removing duplicates.
    pub fn sort(&mut self) {
        let n = self.len();
        if (1..n).all(|i| self.key(i - 1) < self.key(i)) {
            return;
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| self.key(a as usize).cmp(self.key(b as usize)));
        order.dedup_by(|a, b| self.key(*a as usize) == self.key(*b as usize));
        let mut sorted = Listing {
            keys: String::with_capacity(self.keys.len()),
            ends: Vec::with_capacity(order.len()),
            sizes: Vec::with_capacity(order.len()),
            sizes_are_hints: self.sizes_are_hints,
            from_cache: self.from_cache,
            skipped: std::mem::take(&mut self.skipped),
        };
        for i in order {
            sorted.push(self.key(i as usize), self.sizes[i as usize]);
        }
        *self = sorted;
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True without keys.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Key `i`. Panics when `i >= len()`.
    pub fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends[i] as usize]
    }

    /// Size of key `i`: exact, a hint ([`Listing::sizes_are_hints`]) or [`UNKNOWN_SIZE`].
    pub fn size(&self, i: usize) -> u64 {
        self.sizes[i]
    }

    /// Sets the size of key `i` (learned later, e.g. by a stat).
    pub fn set_size(&mut self, i: usize, size: u64) {
        self.sizes[i] = size;
    }

    /// `(key, size)` in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, u64)> + '_ {
        (0..self.len()).map(move |i| (self.key(i), self.sizes[i]))
    }

    /// True when the sizes may be out of date (read from a cached listing): a reader trusts
    /// the file over them.
    pub fn sizes_are_hints(&self) -> bool {
        self.sizes_are_hints
    }

    /// Marks the sizes as hints (or exact).
    pub fn set_sizes_are_hints(&mut self, hints: bool) {
        self.sizes_are_hints = hints;
    }

    /// True when the listing came from a cached listing rather than the directories.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// Marks the listing as read from a cache.
    pub fn set_from_cache(&mut self, cached: bool) {
        self.from_cache = cached;
    }

    /// True when no size is [`UNKNOWN_SIZE`].
    pub fn sizes_known(&self) -> bool {
        !self.sizes.contains(&UNKNOWN_SIZE)
    }

    /// Entries left out by a lenient listing.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Takes the entries left out.
    pub fn take_skipped(&mut self) -> Vec<Skipped> {
        std::mem::take(&mut self.skipped)
    }

    /// Bytes this listing holds on the heap (keys, offsets, sizes; capacity, not length).
    pub fn heap_bytes(&self) -> usize {
        self.keys.capacity() + self.ends.capacity() * 8 + self.sizes.capacity() * 8
    }

    /// Gives back spare capacity.
    pub fn shrink_to_fit(&mut self) {
        self.keys.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.sizes.shrink_to_fit();
    }

    /// The listing as [`ObjectMeta`]s (no modification times).
    pub fn to_objects(&self) -> Vec<ObjectMeta> {
        self.iter().map(|(key, size)| ObjectMeta { key: key.to_string(), size, modified: None }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn sorts_dedups_and_keeps_sizes() {
        let mut l = Listing::new();
        for (k, s) in [("b/2", 2), ("a.b", 9), ("a/x", 1), ("b/2", 2), ("a", UNKNOWN_SIZE)] {
            l.push(k, s);
        }
        l.push_skipped("dead", Error::new(ErrorKind::NotFound, "broken symbolic link"));
        l.sort();
        let got: Vec<(&str, u64)> = l.iter().collect();
        assert_eq!(got, [("a", UNKNOWN_SIZE), ("a.b", 9), ("a/x", 1), ("b/2", 2)]);
        assert!(!l.sizes_known());
        assert_eq!(l.skipped().len(), 1);
        assert_eq!(l.skipped()[0].key, "dead");
        let from = Listing::from_objects(vec![
            ObjectMeta { key: "z".into(), size: 1, modified: None },
            ObjectMeta { key: "y".into(), size: 2, modified: None },
        ]);
        assert_eq!(from.iter().collect::<Vec<_>>(), [("y", 2), ("z", 1)]);
        assert!(from.sizes_known() && !from.sizes_are_hints());
    }
}
