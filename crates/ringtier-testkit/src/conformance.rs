//! The conformance suite every tier and layer runs.
//!
//! Each check takes a fresh, empty tier and panics with a message naming the tier on any
//! deviation from the [`Tier`] contract. [`conformance_tests!`](crate::conformance_tests)
//! expands to one `#[tokio::test]` per check for a tier factory. [`confinement`] and
//! [`staging_hygiene`] are the file tiers' own checks (links never followed, dead writers'
//! staged files removed); they open their tier over a directory they prepare.

use std::any::Any;
use std::sync::Arc;

use ringtier_core::buf::{direct_span, AlignedBuf};
use ringtier_core::ops;
use ringtier_core::{ErrorKind, ReadBatch, Tier};

use crate::{pattern, snapshot};

/// A tier under test plus whatever must live as long as it (a temp dir).
pub struct Fixture {
    /// The tier under test.
    pub tier: Arc<dyn Tier>,
    /// Dropped after the test (temp dirs, servers).
    pub guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture").field("tier", &self.tier).finish()
    }
}

impl Fixture {
    /// A fixture with nothing to keep alive.
    pub fn new(tier: Arc<dyn Tier>) -> Self {
        Fixture { tier, guard: Box::new(()) }
    }

    /// A fixture keeping `guard` alive.
    pub fn with_guard(tier: Arc<dyn Tier>, guard: impl Any + Send) -> Self {
        Fixture { tier, guard: Box::new(guard) }
    }
}

/// A buffer big enough for a read of `len` bytes at `offset` on `tier`.
pub fn buffer_for(tier: &dyn Tier, offset: u64, len: usize) -> AlignedBuf {
    let align = tier.capabilities().alignment.max(1) as u64;
    let (_, span, _) = direct_span(offset, len.max(1), align);
    AlignedBuf::new(span, align as usize).expect("buffer allocation")
}

/// A temporary directory for a file tier's test: under `CARGO_TARGET_TMPDIR` (the work tree's
/// file system, with direct I/O) when cargo says, else the system's.
fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| std::env::temp_dir().into_os_string()))
        .expect("tempdir")
}

async fn put(tier: &dyn Tier, key: &str, data: &[u8]) {
    ops::put(tier, key, data, 64 * 1024)
        .await
        .unwrap_or_else(|e| panic!("[{}] put {key} ({} bytes): {e}", tier.name(), data.len()));
}

async fn read(tier: &dyn Tier, key: &str, offset: u64, len: usize) -> Vec<u8> {
    let (res, buf) = tier.read_at(key, offset, len, buffer_for(tier, offset, len)).await;
    let n = res.unwrap_or_else(|e| panic!("[{}] read {key}@{offset}+{len}: {e}", tier.name()));
    assert_eq!(n, buf.len(), "[{}] returned count and buffer window disagree", tier.name());
    buf.as_slice().to_vec()
}

/// Objects of many sizes, including empty, sub-block and unaligned ones, read back intact.
pub async fn round_trip(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    for (i, size) in
        [0usize, 1, 100, 511, 512, 513, 4095, 4096, 4097, 65_536 + 7, (1 << 20) + 3].into_iter().enumerate()
    {
        let key = format!("rt/obj-{i}");
        let data = pattern(i as u64, size);
        put(t, &key, &data).await;
        let meta = t.stat(&key).await.unwrap_or_else(|e| panic!("[{}] stat {key}: {e}", t.name()));
        assert_eq!(meta.size, size as u64, "[{}] size of {key}", t.name());
        let got = ops::get(t, &key).await.unwrap_or_else(|e| panic!("[{}] get {key}: {e}", t.name()));
        assert!(got == data, "[{}] {key}: {} bytes read back differ", t.name(), size);
        assert_eq!(read(t, &key, 0, size).await, data, "[{}] read_at of whole {key}", t.name());
    }
}

/// The engines share one on-disk format: what a tier opened by `write` over a directory
/// commits (objects of many sizes, nested keys), a tier opened by `read` over the same
/// directory lists, stats and reads back byte for byte, batched too; and the other way round
/// for an object `read`'s tier writes. Run with io_uring writing and the thread pool reading,
/// and the reverse (`ringtier_uring::engine`).
pub async fn same_files_across_engines<W, R>(write: W, read_with: R)
where
    W: Fn(&std::path::Path) -> Arc<dyn Tier>,
    R: Fn(&std::path::Path) -> Arc<dyn Tier>,
{
    let base = scratch_dir("engines");
    let (writer, reader) = (write(base.path()), read_with(base.path()));
    let (w, r) = (writer.as_ref(), reader.as_ref());
    let sizes = [0usize, 1, 511, 4096, 4097, 65_536 + 7, (1 << 20) + 3];
    for (i, size) in sizes.into_iter().enumerate() {
        put(w, &format!("x/{i}/obj"), &pattern(i as u64, size)).await;
    }
    let listed = r.list("x/").await.unwrap_or_else(|e| panic!("[{}] list: {e}", r.name()));
    assert_eq!(listed.len(), sizes.len(), "[{}] lists what [{}] wrote", r.name(), w.name());
    let mut batch = ReadBatch::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let key = format!("x/{i}/obj");
        let meta = r.stat(&key).await.unwrap_or_else(|e| panic!("[{}] stat {key}: {e}", r.name()));
        assert_eq!(meta.size, size as u64, "[{}] size of {key} written by [{}]", r.name(), w.name());
        let got = ops::get(r, &key).await.unwrap_or_else(|e| panic!("[{}] get {key}: {e}", r.name()));
        assert!(got == pattern(i as u64, size), "[{}] {key} written by [{}] differs", r.name(), w.name());
        if size > 0 {
            batch.push(&key, 0, size, buffer_for(r, 0, size));
        }
    }
    let mut batch = r.read_batch(batch).await;
    for (key, _, res, buf) in batch.drain() {
        let n = res.unwrap_or_else(|e| panic!("[{}] batched read of {key}: {e}", r.name()));
        let i: u64 = key.split('/').nth(1).and_then(|s| s.parse().ok()).expect("index");
        let buf = buf.expect("the batch hands the buffer back");
        assert!(buf.as_slice()[..n] == pattern(i, sizes[i as usize])[..], "[{}] batched {key}", r.name());
    }
    put(r, "back/obj", &pattern(99, 70_001)).await;
    let got = ops::get(w, "back/obj").await.unwrap_or_else(|e| panic!("[{}] get back/obj: {e}", w.name()));
    assert!(got == pattern(99, 70_001), "[{}] reads what [{}] wrote", w.name(), r.name());
}

/// Reads that run past the end return what is there; at the end 0; past it an error.
pub async fn short_read_at_eof(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let data = pattern(7, 10_000);
    put(t, "eof/x", &data).await;
    assert_eq!(read(t, "eof/x", 9_000, 4_096).await, &data[9_000..], "[{}] tail read", t.name());
    assert_eq!(read(t, "eof/x", 10_000, 100).await, b"", "[{}] read at end", t.name());
    let (res, _) = t.read_at("eof/x", 10_001, 10, buffer_for(t, 10_001, 10)).await;
    let err = res.expect_err("read past the end must fail");
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "[{}] {err}", t.name());
}

/// Reads at offsets and lengths that are not multiples of any alignment.
pub async fn unaligned_ranges(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let data = pattern(11, 300_000);
    put(t, "ua/x", &data).await;
    for (off, len) in [(0usize, 1usize), (1, 1), (7, 3_000), (511, 2), (4_095, 4_097), (123_457, 65_536), (299_999, 1)]
    {
        assert_eq!(read(t, "ua/x", off as u64, len).await, &data[off..off + len], "[{}] {off}+{len}", t.name());
    }
}

/// Objects smaller than one alignment block, read whole and in part.
pub async fn sub_block_objects(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    for size in [1usize, 17, 200] {
        let key = format!("small/{size}");
        let data = pattern(size as u64, size);
        put(t, &key, &data).await;
        assert_eq!(read(t, &key, 0, 4096).await, data, "[{}] whole {key} with a larger ask", t.name());
        assert_eq!(read(t, &key, 1, size - 1).await, &data[1..], "[{}] part of {key}", t.name());
    }
}

/// Many readers at once on overlapping ranges.
pub async fn concurrent_readers(tier: Arc<dyn Tier>) {
    let data = Arc::new(pattern(3, 1 << 20));
    put(tier.as_ref(), "cc/x", &data).await;
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let tier = Arc::clone(&tier);
        let data = Arc::clone(&data);
        tasks.push(tokio::spawn(async move {
            for j in 0..8u64 {
                let off = ((i * 7919 + j * 104_729) % (1 << 20)) as usize;
                let len = (1 << 20) - off;
                let len = len.min(50_000 + (j as usize) * 1000);
                let got = read(tier.as_ref(), "cc/x", off as u64, len).await;
                assert!(got == data[off..off + len], "[{}] concurrent read {off}+{len}", tier.name());
            }
        }));
    }
    for t in tasks {
        t.await.expect("reader task panicked");
    }
}

/// Listing by prefix, sorted, and deletion.
pub async fn list_and_delete(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    for key in ["ls/a/1", "ls/a/2", "ls/ab", "ls/b/1", "other"] {
        put(t, key, key.as_bytes()).await;
    }
    let keys = |v: Vec<ringtier_core::ObjectMeta>| v.into_iter().map(|m| m.key).collect::<Vec<_>>();
    let all = keys(t.list("").await.expect("list all"));
    assert_eq!(all, ["ls/a/1", "ls/a/2", "ls/ab", "ls/b/1", "other"], "[{}] list all", t.name());
    assert_eq!(keys(t.list("ls/a/").await.expect("list")), ["ls/a/1", "ls/a/2"], "[{}] list ls/a/", t.name());
    assert_eq!(keys(t.list("ls/a").await.expect("list")), ["ls/a/1", "ls/a/2", "ls/ab"], "[{}] list ls/a", t.name());
    assert!(t.list("nothing/").await.expect("list").is_empty(), "[{}] empty prefix", t.name());
    let sizes: Vec<u64> = t.list("ls/b").await.expect("list").iter().map(|m| m.size).collect();
    assert_eq!(sizes, [6], "[{}] listed size", t.name());
    t.delete("ls/a/1").await.unwrap_or_else(|e| panic!("[{}] delete: {e}", t.name()));
    assert_eq!(t.stat("ls/a/1").await.expect_err("deleted").kind(), ErrorKind::NotFound);
    assert_eq!(t.delete("ls/a/1").await.expect_err("deleted twice").kind(), ErrorKind::NotFound);
    assert_eq!(keys(t.list("ls/a/").await.expect("list")), ["ls/a/2"], "[{}] after delete", t.name());
    let (res, _) = t.read_at("ls/a/1", 0, 1, buffer_for(t, 0, 1)).await;
    assert_eq!(res.expect_err("read deleted").kind(), ErrorKind::NotFound, "[{}]", t.name());
}

/// Directories left by deleted objects: once every object under a directory-like prefix is
/// deleted, `remove_empty_dirs` of it succeeds and the tier lists nothing there; its keys can be
/// written again; a prefix that still holds an object keeps it, readable; a missing prefix is
/// no error. (What file tiers do on disk: [`empty_dirs_on_disk`].)
pub async fn empty_dirs(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let name = t.name().to_string();
    let keys = |v: Vec<ringtier_core::ObjectMeta>| v.into_iter().map(|m| m.key).collect::<Vec<_>>();
    for key in ["ed/s1/parts/a", "ed/s1/parts/b", "ed/s1/MANIFEST.json", "ed/s2/parts/a"] {
        put(t, key, key.as_bytes()).await;
    }
    for key in ["ed/s1/parts/a", "ed/s1/parts/b", "ed/s1/MANIFEST.json"] {
        t.delete(key).await.unwrap_or_else(|e| panic!("[{name}] delete {key}: {e}"));
    }
    t.remove_empty_dirs("ed/s1").await.unwrap_or_else(|e| panic!("[{name}] remove_empty_dirs ed/s1: {e}"));
    t.remove_empty_dirs("ed/s2").await.unwrap_or_else(|e| panic!("[{name}] remove_empty_dirs ed/s2: {e}"));
    t.remove_empty_dirs("ed/never").await.unwrap_or_else(|e| panic!("[{name}] a missing prefix: {e}"));
    assert_eq!(keys(t.list("ed/").await.expect("list")), ["ed/s2/parts/a"], "[{name}]");
    assert_eq!(read(t, "ed/s2/parts/a", 0, 64).await, b"ed/s2/parts/a", "[{name}] kept");
    put(t, "ed/s1/parts/a", b"again").await;
    assert_eq!(read(t, "ed/s1/parts/a", 0, 64).await, b"again", "[{name}] written again");
}

/// [`empty_dirs`] on disk, for a file tier (`open(root)` opens it over an existing
/// directory): the emptied directories are gone and the prefix's parent stays; a directory
/// holding anything stays (a file that is no object, a link, which is not followed: what it
/// points at is untouched); a chain of empty directories deeper than the bound stays, without
/// an error; a prefix that is a link is refused and named; the root is never removed.
pub async fn empty_dirs_on_disk<F>(open: F)
where
    F: Fn(&std::path::Path) -> Arc<dyn Tier>,
{
    let base = scratch_dir("empty-dirs");
    let (root, outside) = (base.path().join("root"), base.path().join("outside"));
    std::fs::create_dir_all(&root).expect("root");
    std::fs::create_dir_all(outside.join("empty")).expect("outside");
    let tier = open(&root);
    let t = tier.as_ref();
    let name = t.name().to_string();
    for step in ["s1", "s2", "s3", "s4"] {
        for part in ["parts/a", "parts/b", "MANIFEST.json"] {
            put(t, &format!("ck/{step}/{part}"), b"x").await;
        }
    }
    // s2: a stray file beside the objects; s3: a link to an empty directory outside; s4: kept.
    std::fs::write(root.join("ck/s2/parts/notes.txt"), b"mine").expect("stray");
    std::os::unix::fs::symlink(outside.join("empty"), root.join("ck/s3/parts/link")).expect("symlink");
    for step in ["s1", "s2", "s3"] {
        for part in ["parts/a", "parts/b", "MANIFEST.json"] {
            t.delete(&format!("ck/{step}/{part}")).await.expect("delete");
        }
        t.remove_empty_dirs(&format!("ck/{step}")).await.unwrap_or_else(|e| panic!("[{name}] {step}: {e}"));
    }
    assert!(!root.join("ck/s1").exists(), "[{name}] the emptied step directory is gone");
    assert!(root.join("ck/s2/parts/notes.txt").is_file(), "[{name}] a stray file and its directories stay");
    assert!(
        std::fs::symlink_metadata(root.join("ck/s3/parts/link")).is_ok_and(|m| m.file_type().is_symlink()),
        "[{name}] a link stays"
    );
    assert!(outside.join("empty").is_dir(), "[{name}] what a link points at is untouched");
    assert!(root.join("ck/s4/parts/a").is_file() && root.join("ck").is_dir(), "[{name}] the rest stays");
    // Deeper than the bound: left, no error.
    let deep: String = (0..ringtier_core::fs::MAX_PRUNE_DEPTH + 4).map(|i| format!("/d{i}")).collect();
    std::fs::create_dir_all(root.join(format!("deep{deep}"))).expect("deep");
    t.remove_empty_dirs("deep").await.unwrap_or_else(|e| panic!("[{name}] deep: {e}"));
    assert!(root.join(format!("deep{deep}")).is_dir(), "[{name}] past the bound, nothing is removed");
    // Within the bound: all of it.
    std::fs::create_dir_all(root.join("shallow/a/b/c")).expect("shallow");
    t.remove_empty_dirs("shallow").await.unwrap_or_else(|e| panic!("[{name}] shallow: {e}"));
    assert!(!root.join("shallow").exists(), "[{name}] a chain of empty directories within the bound goes");
    // The prefix a link: refused, named, nothing removed outside.
    std::os::unix::fs::symlink(&outside, root.join("ck/s5")).expect("symlink");
    let e = t.remove_empty_dirs("ck/s5").await.expect_err("a link");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "[{name}] {e}");
    assert!(e.to_string().contains("ck/s5"), "[{name}] names the link: {e}");
    assert!(outside.join("empty").is_dir(), "[{name}] untouched");
    for bad in ["", "..", "../outside", "/etc", "ck/../.."] {
        let e = t.remove_empty_dirs(bad).await.expect_err("a bad prefix");
        assert_eq!(e.kind(), ErrorKind::InvalidKey, "[{name}] {bad:?}: {e}");
    }
    assert!(root.is_dir() && outside.is_dir(), "[{name}] neither root removed");
}

/// A tier locks exactly when its [`Capabilities::locks`](ringtier_core::Capabilities::locks)
/// says so: one that does not answers `lock` with `None`; one that does (and every layer over
/// it, which must forward `lock`) hands out a lock that refuses a second holder with `Busy`
/// (naming the holder), is free again once dropped, is never listed, and takes only
/// one-component names.
pub async fn locks(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let says = t.capabilities().locks;
    let got = t.lock("conformance").await.unwrap_or_else(|e| panic!("[{}] lock: {e}", t.name()));
    let Some(held) = got else {
        assert!(!says, "[{}] capabilities().locks is true but lock() returned None: a dropped lock", t.name());
        return;
    };
    assert!(says, "[{}] lock() returned a lock but capabilities().locks is false", t.name());
    let e = t.lock("conformance").await.expect_err("a second holder");
    assert_eq!(e.kind(), ErrorKind::Busy, "[{}] {e}", t.name());
    assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "[{}] names the holder: {e}", t.name());
    let other = t.lock("another").await.expect("a different lock").expect("held");
    assert!(t.list("").await.expect("list").is_empty(), "[{}] lock files are not objects", t.name());
    drop(held);
    let again = t.lock("conformance").await.expect("free after drop").expect("held");
    drop((again, other));
    for bad in ["a/b", "..", ".ringtier-x", ""] {
        assert_eq!(
            t.lock(bad).await.expect_err("bad lock name").kind(),
            ErrorKind::InvalidKey,
            "[{}] {bad:?}",
            t.name()
        );
    }
}

/// A layer keeps its inner tier's one-writer guarantee: `layered` (the layer named `layer`,
/// wrapping `inner`) says it locks exactly when `inner` does, and its locks are `inner`'s own
/// (a lock taken through the layer refuses `inner`'s own holder and the other way round), so
/// that a layer that does not forward `lock` fails here. Then the [`locks`] check through the
/// layer.
pub async fn layer_keeps_locks(layer: &str, inner: Arc<dyn Tier>, layered: Arc<dyn Tier>) {
    let name = format!("{layer} over {}", inner.name());
    let says = layered.capabilities().locks;
    assert_eq!(says, inner.capabilities().locks, "[{name}] capabilities().locks differs from the inner tier's");
    let through = layered.lock("layered").await.unwrap_or_else(|e| panic!("[{name}] lock: {e}"));
    assert_eq!(through.is_some(), says, "[{name}] lock() through the layer");
    if says {
        let e = inner.lock("layered").await.expect_err("the inner tier's lock is held through the layer");
        assert_eq!(e.kind(), ErrorKind::Busy, "[{name}] {e}");
        drop(through);
        let held = inner.lock("layered").await.expect("free after drop").expect("held");
        let e = layered.lock("layered").await.expect_err("held on the inner tier");
        assert_eq!(e.kind(), ErrorKind::Busy, "[{name}] {e}");
        drop(held);
    }
    locks(layered).await;
}

/// Bad keys are rejected by every operation, and nothing outside the tier is touched.
pub async fn bad_keys(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    for key in ["../x", "/etc/passwd", "a/../../etc/passwd", "a\0b", "", "a//b", "./a", ".ringtier-staging/x"] {
        let want = ErrorKind::InvalidKey;
        let e = t.stat(key).await.expect_err("stat of bad key");
        assert_eq!(e.kind(), want, "[{}] stat {key:?}: {e}", t.name());
        let (res, _) = t.read_at(key, 0, 10, buffer_for(t, 0, 10)).await;
        assert_eq!(res.expect_err("read of bad key").kind(), want, "[{}] read {key:?}", t.name());
        assert_eq!(t.create(key).await.expect_err("create of bad key").kind(), want, "[{}] create {key:?}", t.name());
        assert_eq!(t.delete(key).await.expect_err("delete of bad key").kind(), want, "[{}] delete {key:?}", t.name());
    }
    assert_eq!(t.list("../").await.expect_err("list ../").kind(), ErrorKind::InvalidKey);
}

/// A staged object is invisible until commit, gone after abort, and a commit replaces.
pub async fn commit_visibility(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let align = t.capabilities().alignment.max(1);
    let data = pattern(5, 8192);
    let mut w = t.create("vis/x").await.expect("create");
    let mut buf = AlignedBuf::new(8192, align).expect("buf");
    buf.fill_from(&data).expect("fill");
    let (res, _buf) = w.write_at(0, buf).await;
    res.unwrap_or_else(|e| panic!("[{}] write: {e}", t.name()));
    assert_eq!(t.stat("vis/x").await.expect_err("uncommitted").kind(), ErrorKind::NotFound, "[{}]", t.name());
    assert!(t.list("").await.expect("list").is_empty(), "[{}] uncommitted object listed", t.name());
    let meta = w.commit().await.unwrap_or_else(|e| panic!("[{}] commit: {e}", t.name()));
    assert_eq!(meta.size, 8192);
    assert_eq!(ops::get(t, "vis/x").await.expect("get"), data);

    // Aborted: nothing visible, the old object untouched.
    let mut w = t.create("vis/x").await.expect("create");
    let mut buf = AlignedBuf::new(4096, align).expect("buf");
    buf.fill_from(&[1u8; 4096]).expect("fill");
    let (res, _buf) = w.write_at(0, buf).await;
    res.expect("write");
    w.abort().await.unwrap_or_else(|e| panic!("[{}] abort: {e}", t.name()));
    assert_eq!(ops::get(t, "vis/x").await.expect("get"), data, "[{}] abort changed the object", t.name());
    assert_eq!(t.list("").await.expect("list").len(), 1, "[{}] abort left something listed", t.name());

    // Replaced atomically by a shorter object.
    put(t, "vis/x", b"short").await;
    assert_eq!(ops::get(t, "vis/x").await.expect("get"), b"short", "[{}] replace", t.name());

    // Dropped without commit: not visible.
    {
        let mut w = t.create("vis/dropped").await.expect("create");
        let mut buf = AlignedBuf::new(4096, align).expect("buf");
        buf.fill_from(&[2u8; 100]).expect("fill");
        let (res, _buf) = w.write_at(0, buf).await;
        res.expect("write");
    }
    assert_eq!(t.stat("vis/dropped").await.expect_err("dropped writer").kind(), ErrorKind::NotFound);
}

/// A batch with good, missing, bad-key and end-of-object requests reports each on its own.
pub async fn batch_reads(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let mut objects = Vec::new();
    for i in 0..40u64 {
        let data = pattern(100 + i, 1000 + (i as usize) * 3777);
        put(t, &format!("batch/{i:03}"), &data).await;
        objects.push(data);
    }
    let mut batch = ReadBatch::with_capacity(64, 1024);
    for (i, data) in objects.iter().enumerate() {
        let off = (i * 13) % data.len();
        let len = (data.len() - off).min(9000);
        batch.push(&format!("batch/{i:03}"), off as u64, len, buffer_for(t, off as u64, len));
    }
    batch.push("batch/missing", 0, 10, buffer_for(t, 0, 10));
    batch.push("../escape", 0, 10, buffer_for(t, 0, 10));
    batch.push("batch/000", 1000, 10, buffer_for(t, 1000, 10));
    batch.push("batch/001", 5000, 10, buffer_for(t, 5000, 10));
    let batch = t.read_batch(batch).await;
    let mut n = 0;
    for (i, (key, entry)) in batch.iter().enumerate() {
        let res = entry.result().unwrap_or_else(|| panic!("[{}] request {i} ({key}) not executed", t.name()));
        match i {
            0..=39 => {
                let data = &objects[i];
                let off = (i * 13) % data.len();
                let len = (data.len() - off).min(9000);
                let got = res.as_ref().unwrap_or_else(|e| panic!("[{}] batch {key}: {e}", t.name()));
                assert_eq!(*got, len);
                assert!(
                    entry.buf().map(|b| b.as_slice()) == Some(&data[off..off + len]),
                    "[{}] batch data of {key}",
                    t.name()
                );
            }
            40 => assert_eq!(res.as_ref().expect_err("missing").kind(), ErrorKind::NotFound, "[{}]", t.name()),
            41 => assert_eq!(res.as_ref().expect_err("bad key").kind(), ErrorKind::InvalidKey, "[{}]", t.name()),
            42 => assert_eq!(*res.as_ref().expect("at end"), 0, "[{}] batch read at end", t.name()),
            _ => assert_eq!(res.as_ref().expect_err("past end").kind(), ErrorKind::OutOfRange, "[{}]", t.name()),
        }
        n += 1;
    }
    assert_eq!(n, 44);
}

/// Adoption ([`Tier::adopt`]): an adopted object is under its new key with its bytes and
/// their CRC-32C, replacing what was there, and gone from where it was; a declined one
/// (`Ok(None)`, the default) is left as it was and nothing appears under the key. A tier that
/// adopts refuses bad keys, a missing source and adopting an object onto itself.
pub async fn adopt(tier: Arc<dyn Tier>) {
    let t = tier.as_ref();
    let data = pattern(9, 70_001);
    put(t, "adopt/src.bin", &data).await;
    put(t, "adopt/dst/old.bin", b"old").await;
    let adopted = t.adopt("adopt/src.bin", "adopt/dst/old.bin").await;
    let adopted = adopted.unwrap_or_else(|e| panic!("[{}] adopt: {e}", t.name()));
    let Some(a) = adopted else {
        assert_eq!(ops::get(t, "adopt/src.bin").await.expect("declined: left"), data, "[{}]", t.name());
        assert_eq!(ops::get(t, "adopt/dst/old.bin").await.expect("declined"), b"old", "[{}]", t.name());
        return;
    };
    assert_eq!((a.meta.key.as_str(), a.meta.size), ("adopt/dst/old.bin", data.len() as u64), "[{}]", t.name());
    assert_eq!(a.crc32c, crc32c::crc32c(&data), "[{}] the CRC-32C of the adopted bytes", t.name());
    assert_eq!(ops::get(t, "adopt/dst/old.bin").await.expect("adopted"), data, "[{}]", t.name());
    let gone = t.stat("adopt/src.bin").await.expect_err("the source is gone");
    assert_eq!(gone.kind(), ErrorKind::NotFound, "[{}]", t.name());
    let keys: Vec<String> = t.list("adopt/").await.expect("list").into_iter().map(|m| m.key).collect();
    assert_eq!(keys, ["adopt/dst/old.bin"], "[{}]", t.name());
    // An empty object, into a new directory.
    put(t, "adopt/empty", b"").await;
    let a = t.adopt("adopt/empty", "adopt/new/dir/empty").await.expect("adopt empty").expect("adopted");
    assert_eq!((a.meta.size, a.crc32c), (0, 0), "[{}]", t.name());
    assert_eq!(ops::get(t, "adopt/new/dir/empty").await.expect("get"), b"", "[{}]", t.name());
    let kind = |r: ringtier_core::Result<Option<ringtier_core::Adopted>>| r.map(|_| ()).expect_err("refused").kind();
    assert_eq!(kind(t.adopt("adopt/missing", "adopt/x").await), ErrorKind::NotFound, "[{}]", t.name());
    assert_eq!(kind(t.adopt("../escape", "adopt/x").await), ErrorKind::InvalidKey, "[{}]", t.name());
    assert_eq!(kind(t.adopt("adopt/dst/old.bin", "/abs").await), ErrorKind::InvalidKey, "[{}]", t.name());
    let own = t.adopt("adopt/dst/old.bin", "adopt/dst/old.bin").await;
    assert_eq!(kind(own), ErrorKind::InvalidInput, "[{}]", t.name());
    assert_eq!(ops::get(t, "adopt/dst/old.bin").await.expect("still there"), data, "[{}]", t.name());
}

/// Expands to one `#[tokio::test]` per conformance check, each on a fresh fixture from
/// `$factory` (an expression of type `fn() -> Fixture`).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            round_trip, short_read_at_eof, unaligned_ranges, sub_block_objects, concurrent_readers,
            list_and_delete, bad_keys, commit_visibility, batch_reads, locks, empty_dirs, adopt);
    };
    (@each $factory:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fixture: $crate::conformance::Fixture = ($factory)();
                $crate::conformance::$name(::std::sync::Arc::clone(&fixture.tier)).await;
                drop(fixture);
            }
        )*
    };
}

/// Confinement of a file tier that writes: a symbolic link at every component of every
/// operation's path (and at the staging directory and the lock file), pointing outside the
/// root to a tree where following it would succeed, makes the operation fail with
/// [`ErrorKind::PermissionDenied`] naming the link, and changes nothing outside the root.
/// `open(root)` opens the tier under test over an existing directory.
pub async fn confinement<F>(open: F)
where
    F: Fn(&std::path::Path) -> Arc<dyn Tier>,
{
    use std::os::unix::fs::symlink;
    let base = scratch_dir("confinement");
    let outside = base.path().join("outside");
    // What a link would lead to: the same tree outside the root.
    let fill_outside = || {
        let _ = std::fs::remove_dir_all(&outside);
        std::fs::create_dir_all(outside.join("a/b")).expect("outside");
        std::fs::write(outside.join("a/b/c.bin"), b"outside c").expect("outside file");
        std::fs::write(outside.join("b/c.bin").with_file_name("x"), b"").ok();
        std::fs::create_dir_all(outside.join("b")).expect("outside b");
        std::fs::write(outside.join("b/c.bin"), b"outside bc").expect("outside file");
        std::fs::write(outside.join("c.bin"), b"outside top").expect("outside file");
        std::fs::write(outside.join("lock"), b"outside lock").expect("outside lock");
    };
    let key = "a/b/c.bin";
    // (the component replaced by a link, where it points)
    let cases: [(&str, std::path::PathBuf); 3] =
        [("a", outside.join("a")), ("a/b", outside.join("b")), ("a/b/c.bin", outside.join("c.bin"))];
    for (i, (link_at, target)) in cases.iter().enumerate() {
        for op in ["stat", "read", "write", "delete", "prune", "list", "list-prefix", "adopt", "adopt-to"] {
            let root = base.path().join(format!("root-{i}-{op}"));
            std::fs::create_dir_all(&root).expect("root");
            fill_outside();
            // The real tree up to the link.
            let link_path = root.join(link_at);
            if let Some(parent) = link_path.parent() {
                std::fs::create_dir_all(parent).expect("parents");
            }
            symlink(target, &link_path).expect("symlink");
            let before = snapshot(&outside);
            let tier = open(&root);
            let name = tier.name().to_string();
            let res: ringtier_core::Result<()> = match op {
                "stat" => tier.stat(key).await.map(|_| ()),
                "read" => {
                    let (res, _) = tier.read_at(key, 0, 16, buffer_for(tier.as_ref(), 0, 16)).await;
                    res.map(|_| ())
                }
                "write" => ops::put(tier.as_ref(), key, b"inside", 1 << 20).await.map(|_| ()),
                "delete" => tier.delete(key).await,
                "prune" => tier.remove_empty_dirs(link_at).await,
                // The file to adopt reached through the link, and a file adopted onto a key
                // whose way is the link: refused, and that file left where it was.
                "adopt" => tier.adopt(key, "adopted.bin").await.map(|_| ()),
                "adopt-to" => {
                    std::fs::write(root.join("src.bin"), b"to adopt").expect("file to adopt");
                    let res = tier.adopt("src.bin", key).await.map(|_| ());
                    assert_eq!(std::fs::read(root.join("src.bin")).ok().as_deref(), Some(&b"to adopt"[..]), "{name}");
                    res
                }
                "list" => tier.list("").await.map(|_| ()),
                _ => tier.list("a/").await.map(|_| ()),
            };
            let err = match res {
                Err(e) => e,
                Ok(()) => panic!("{name}: {op} of {key} with a link at {link_at} succeeded"),
            };
            assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{name}: {op}, link at {link_at}: {err}");
            assert!(err.to_string().contains(link_at), "{name}: {op}: the error names the link {link_at}: {err}");
            assert_eq!(
                snapshot(&outside),
                before,
                "{name}: {op} with a link at {link_at} changed files outside the root"
            );
            // The link itself is still there, untouched.
            assert!(std::fs::symlink_metadata(&link_path).is_ok_and(|m| m.file_type().is_symlink()));
        }
    }
    // The staging directory and the lock file as links.
    let root = base.path().join("root-staging");
    std::fs::create_dir_all(&root).expect("root");
    fill_outside();
    symlink(&outside, root.join(ringtier_core::fs::STAGING_DIR)).expect("symlink");
    let before = snapshot(&outside);
    let tier = open(&root);
    let err = ops::put(tier.as_ref(), "x.bin", b"inside", 1 << 20).await.expect_err("staging through a link");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{}: {err}", tier.name());
    assert!(err.to_string().contains(ringtier_core::fs::STAGING_DIR), "{}: {err}", tier.name());
    assert_eq!(snapshot(&outside), before, "{}: a write through a linked staging dir", tier.name());
    let root = base.path().join("root-lock");
    std::fs::create_dir_all(&root).expect("root");
    symlink(outside.join("lock"), root.join(format!("{}-lock-store", ringtier_core::key::RESERVED_PREFIX)))
        .expect("symlink");
    let before = snapshot(&outside);
    let tier = open(&root);
    let err = tier.lock("store").await.expect_err("a lock file that is a link");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{}: {err}", tier.name());
    assert!(err.to_string().contains("lock-store"), "{}: {err}", tier.name());
    assert_eq!(snapshot(&outside), before, "{}: the lock wrote through a link", tier.name());
}

/// A writer killed mid-write leaves its staged file; a tier's first write (no lock taken, as a
/// plain save takes none) removes it, and leaves a staged file whose lock is held.
pub async fn staging_swept_by_first_write<F>(open: F)
where
    F: Fn(&std::path::Path) -> Arc<dyn Tier>,
{
    let base = scratch_dir("staging-swept");
    let root = base.path().join("root");
    let staging = root.join(ringtier_core::fs::STAGING_DIR);
    std::fs::create_dir_all(&staging).expect("staging");
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    std::fs::write(staging.join(format!("{dead}-0")), vec![7u8; 1 << 16]).expect("dead writer's file");
    std::fs::write(staging.join(format!("{dead}-1")), b"held").expect("held file");
    let held = std::fs::File::open(staging.join(format!("{dead}-1"))).expect("open held");
    let held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockShared).map_err(|(_, e)| e).expect("flock");
    let tier = open(&root);
    let started = std::time::Instant::now();
    put(tier.as_ref(), "saved.bin", &pattern(2, 4096)).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(1), "{}: the sweep waited on a held lock", tier.name());
    let names: Vec<String> = std::fs::read_dir(&staging)
        .expect("read staging")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{dead}-1")], "{}: only the held file stays", tier.name());
    drop(held);
}

/// Staging hygiene of a file tier: staged files of a dead writer (a pid no longer running,
/// nobody holding the file's lock) are removed when the tier is next locked; a live
/// writer's are kept. `open(root)` opens the tier under test over an existing directory.
pub async fn staging_hygiene<F>(open: F)
where
    F: Fn(&std::path::Path) -> Arc<dyn Tier>,
{
    let base = scratch_dir("staging");
    let root = base.path().join("root");
    let staging = root.join(ringtier_core::fs::STAGING_DIR);
    std::fs::create_dir_all(&staging).expect("staging");
    // A pid that is not running: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    std::fs::write(staging.join(format!("{dead}-0")), vec![7u8; 1 << 16]).expect("dead writer's file");
    // A writer whose pid this process cannot see (another pid namespace) but whose lock is
    // held: kept.
    std::fs::write(staging.join(format!("{dead}-1")), b"held").expect("held file");
    let held = std::fs::File::open(staging.join(format!("{dead}-1"))).expect("open held");
    let held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockShared).map_err(|(_, e)| e).expect("flock");
    let tier = open(&root);
    // A live writer of this process: its staged file stays.
    let mut writer = tier.create("live.bin").await.expect("create");
    let (res, _) = writer
        .write_at(0, {
            let mut b = buffer_for(tier.as_ref(), 0, 4096);
            b.fill_from(&pattern(1, 4096)).expect("fill");
            b
        })
        .await;
    res.expect("write");
    let lock = tier.lock("hygiene").await.expect("lock").expect("file tiers lock");
    let names: Vec<String> = std::fs::read_dir(&staging)
        .expect("read staging")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.contains(&format!("{dead}-0")),
        "{}: the dead writer's staged file survived: {names:?}",
        tier.name()
    );
    assert!(names.contains(&format!("{dead}-1")), "{}: a locked staged file was removed: {names:?}", tier.name());
    assert_eq!(names.len(), 2, "{}: the live writer's staged file stays: {names:?}", tier.name());
    writer.commit().await.expect("commit");
    drop(lock);
    drop(held);
    let names: Vec<String> = std::fs::read_dir(&staging)
        .expect("read staging")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{dead}-1")], "{}", tier.name());
}
