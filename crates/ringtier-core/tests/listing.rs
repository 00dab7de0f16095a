//! One bad entry never stops a lenient listing (`Tier::list_with` with `skip_bad`): a dangling
//! link, a link loop, a chain of links that never ends, a directory that cannot be read and a
//! name that is not UTF-8 are left out and named, and the rest is listed; a strict listing
//! fails on the first of them with an error naming it. Sizes come from a stat per file, or
//! from the directory entries alone (unknown for regular files).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use ringtier_core::fs::FsFailPoints;
use ringtier_core::{ErrorKind, ListOptions, PosixConfig, PosixTier, Tier, UNKNOWN_SIZE};

fn write(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, data).expect("write");
}

/// A dataset with three good files, one good file link, and one of each kind of bad entry.
fn dataset() -> (tempfile::TempDir, std::path::PathBuf) {
    let outer = tempfile::tempdir().expect("tempdir");
    let root = outer.path().join("root");
    write(&root.join("a/1.bin"), &[1; 10]);
    write(&root.join("a/2.bin"), &[2; 20]);
    write(&root.join("b/3.bin"), &[3; 30]);
    write(&outer.path().join("elsewhere.bin"), &[4; 40]);
    write(&root.join("locked/4.bin"), &[5; 50]);
    std::os::unix::fs::symlink(outer.path().join("elsewhere.bin"), root.join("b/link.bin")).expect("file link");
    std::os::unix::fs::symlink(outer.path().join("gone.bin"), root.join("a/dead.bin")).expect("dangling link");
    std::os::unix::fs::symlink(&root, root.join("b/up")).expect("loop link");
    std::os::unix::fs::symlink("x2", root.join("x1")).expect("chain");
    std::os::unix::fs::symlink("x1", root.join("x2")).expect("chain");
    let odd = std::ffi::OsStr::from_bytes(b"a/bad-\xff.bin");
    std::fs::write(root.join(odd), b"odd").expect("non-UTF-8 name");
    (outer, root)
}

fn tier(root: &Path) -> (PosixTier, Arc<FsFailPoints>) {
    let fail = Arc::new(FsFailPoints::new());
    // Tests run as root, which reads any directory: the kernel's EACCES is injected instead.
    fail.fail_listing("locked", libc::EACCES);
    let t = PosixTier::new(PosixConfig::new(root).with_follow_links(true).with_fail_points(Some(Arc::clone(&fail))))
        .expect("posix");
    (t, fail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lenient_listing_leaves_out_and_names_every_bad_entry() {
    let (_outer, root) = dataset();
    let (t, fail) = tier(&root);
    for stat_files in [true, false] {
        let options = ListOptions::default().with_skip_bad(true).with_stat_files(stat_files);
        let listing = t.list_with("", options).await.expect("a lenient listing");
        let got: Vec<(&str, u64)> = listing.iter().collect();
        let size = |n: u64| if stat_files { n } else { UNKNOWN_SIZE };
        // The file link is stat'd either way (a link says nothing of its target's size).
        assert_eq!(got, [("a/1.bin", size(10)), ("a/2.bin", size(20)), ("b/3.bin", size(30)), ("b/link.bin", 40)]);
        let mut skipped: Vec<(&str, ErrorKind, String)> =
            listing.skipped().iter().map(|s| (s.key.as_str(), s.error.kind(), s.error.to_string())).collect();
        skipped.sort_by(|a, b| a.0.cmp(b.0));
        let keys: Vec<&str> = skipped.iter().map(|s| s.0).collect();
        assert_eq!(keys, ["a/bad-\u{fffd}.bin", "a/dead.bin", "b/up", "locked", "x1", "x2"], "{skipped:#?}");
        let why = |k: &str| skipped.iter().find(|s| s.0 == k).expect("skipped").clone();
        assert_eq!(why("a/dead.bin").1, ErrorKind::NotFound);
        assert!(why("a/dead.bin").2.contains("broken symbolic link"), "{:?}", why("a/dead.bin"));
        assert!(why("b/up").2.contains("symbolic link loop"), "{:?}", why("b/up"));
        assert!(why("x1").2.contains("symbolic link loop"), "{:?}", why("x1"));
        assert_eq!(why("locked").1, ErrorKind::PermissionDenied, "{:?}", why("locked"));
        assert_eq!(why("a/bad-\u{fffd}.bin").1, ErrorKind::InvalidKey);
        for s in listing.skipped() {
            assert_eq!(s.error.key(), Some(s.key.as_str()), "each error names its entry");
            assert_eq!(s.error.tier(), Some(t.name()), "and its tier");
        }
    }
    assert!(fail.fired() >= 2, "the injected EACCES was met");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_listing_fails_naming_the_entry() {
    let (_outer, root) = dataset();
    let (t, _fail) = tier(&root);
    let err = t.list("").await.expect_err("list meets a bad entry");
    let strict = t.list_with("", ListOptions::default()).await.expect_err("strict list_with too");
    for e in [err, strict] {
        let key = e.key().expect("names the entry").to_string();
        assert!(["a/dead.bin", "b/up", "locked", "x1", "x2"].contains(&key.as_str()), "{e}");
    }
    // Each bad entry alone fails a strict listing of its prefix, naming it.
    for (prefix, key, kind) in [
        ("a/", "a/dead.bin", ErrorKind::NotFound),
        ("b/", "b/up", ErrorKind::InvalidInput),
        ("locked", "locked", ErrorKind::PermissionDenied),
        ("x1", "x1", ErrorKind::InvalidInput),
    ] {
        let e = t.list(prefix).await.expect_err(key);
        assert_eq!((e.key(), e.kind()), (Some(key), kind), "{e}");
    }
    // Away from them, a strict listing works.
    let keys: Vec<String> = t.list("b/3").await.expect("list").into_iter().map(|m| m.key).collect();
    assert_eq!(keys, ["b/3.bin"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_that_does_not_follow_links_skips_them_when_lenient() {
    let (_outer, root) = dataset();
    let t = PosixTier::new(PosixConfig::new(&root)).expect("posix");
    let listing = t.list_with("", ListOptions::default().with_skip_bad(true)).await.expect("lenient");
    let keys: Vec<&str> = listing.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a/1.bin", "a/2.bin", "b/3.bin", "locked/4.bin"]);
    for s in listing.skipped().iter().filter(|s| s.key != "a/bad-\u{fffd}.bin") {
        assert_eq!(s.error.kind(), ErrorKind::PermissionDenied, "{}: {}", s.key, s.error);
        assert!(s.error.to_string().contains("is a symbolic link inside the tier root"), "{}", s.error);
    }
    assert_eq!(listing.skipped().len(), 6);
}

/// Waits out the window in which a directory's change may share its timestamp tick with a
/// listing (a listing of directories changed this recently is not cached).
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(2100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_listing_is_used_only_while_every_directory_is_unchanged() {
    let (_outer, root) = dataset();
    let (t, _fail) = tier(&root);
    let cached = ListOptions::default().with_skip_bad(true).with_stat_files(false).with_cache(true);
    let cache = root.join(ringtier_core::fs::LISTING_CACHE_FILE);
    // Just written: a directory changed within two seconds is not cached.
    let first = t.list_with("", cached).await.expect("list");
    assert!(!first.from_cache() && !cache.exists());
    settle();
    let first = t.list_with("", cached).await.expect("list");
    assert!(!first.from_cache() && cache.exists(), "written after the listing");
    let again = t.list_with("", cached).await.expect("from the cache");
    assert!(again.from_cache() && again.sizes_are_hints());
    assert_eq!(again.iter().collect::<Vec<_>>(), first.iter().collect::<Vec<_>>());
    let keys = |l: &ringtier_core::Listing| l.skipped().iter().map(|s| s.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&again), keys(&first), "entries left out are remembered");
    // The cache is never listed, and a strict listing does not use a cache that left entries out.
    assert!(again.iter().all(|(k, _)| !k.contains(".ringtier")));
    assert!(t.list_with("", ListOptions::default().with_cache(true)).await.is_err());
    // Sizes asked for: a cache without them is not used.
    let with_sizes = ListOptions::default().with_skip_bad(true).with_cache(true);
    assert!(!t.list_with("", with_sizes).await.expect("list").from_cache());

    // A file added in a class directory: that directory's times changed.
    write(&root.join("b/new.bin"), b"new");
    let stale = t.list_with("", cached).await.expect("list");
    assert!(!stale.from_cache());
    assert!(stale.iter().any(|(k, _)| k == "b/new.bin"));
    settle();
    t.list_with("", cached).await.expect("list again, cached");
    assert!(t.list_with("", cached).await.expect("list").from_cache());
    // An entry of the root added or removed: the root's entries are read again.
    write(&root.join("c/5.bin"), b"5");
    let stale = t.list_with("", cached).await.expect("list");
    assert!(!stale.from_cache() && stale.iter().any(|(k, _)| k == "c/5.bin"));
    settle();
    t.list_with("", cached).await.expect("list again, cached");
    std::fs::remove_file(root.join("x1")).expect("rm");
    let stale = t.list_with("", cached).await.expect("list");
    assert!(!stale.from_cache());
    assert!(!stale.skipped().iter().any(|s| s.key == "x1"));
    settle();
    t.list_with("", cached).await.expect("list again, cached");
    // A directory replaced by another of the same name (a new inode).
    std::fs::rename(root.join("c"), root.join("c-old")).expect("mv");
    write(&root.join("c/6.bin"), b"6");
    std::fs::rename(root.join("c-old"), _outer.path().join("c-old")).expect("mv");
    assert!(!t.list_with("", cached).await.expect("list").from_cache());
    settle();
    t.list_with("", cached).await.expect("list again, cached");

    // A damaged cache is not used (and is written again); nor is one that is a link.
    let mut bytes = std::fs::read(&cache).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&cache, &bytes).expect("damage");
    assert!(!t.list_with("", cached).await.expect("list").from_cache());
    assert!(t.list_with("", cached).await.expect("list").from_cache(), "rewritten");
    let good = _outer.path().join("good-cache");
    std::fs::rename(&cache, &good).expect("mv");
    std::os::unix::fs::symlink(&good, &cache).expect("link");
    let listed = t.list_with("", cached).await.expect("list");
    assert!(!listed.from_cache(), "a cache that is a link is not followed");
}
