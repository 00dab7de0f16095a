//! Datasets laid out with symbolic links (files or class folders that are links to another
//! disk or a shared copy) are listed and read through the links by a tier that follows them,
//! as torchvision's `ImageFolder` does; loops are reported; tiers that do not follow links
//! (the default, and every checkpoint store) keep refusing paths that leave their root.

use std::path::Path;
use std::sync::Arc;

use ringtier_core::{AlignedBuf, ErrorKind, PosixConfig, PosixTier, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn write(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, data).expect("write");
}

/// `outer/root` with a class folder that is an absolute link, a file that is a link, and a
/// relative directory link that leads out of the root; the targets live beside the root.
fn linked_dataset() -> (tempfile::TempDir, std::path::PathBuf, Vec<(&'static str, Vec<u8>)>) {
    let outer = tempfile::Builder::new().prefix("links").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let o = outer.path();
    let root = o.join("root");
    let files = vec![
        ("classA/a.bin", pattern(1, 5000)),
        ("classA/b.bin", pattern(2, 70_000)),
        ("classB/f.bin", pattern(3, 4096)),
        ("classB/own.bin", pattern(4, 10)),
        ("classB/rel/x.bin", pattern(5, 123)),
    ];
    write(&o.join("disk2/real/a.bin"), &files[0].1);
    write(&o.join("disk2/real/b.bin"), &files[1].1);
    write(&o.join("shared/f.bin"), &files[2].1);
    write(&root.join("classB/own.bin"), &files[3].1);
    write(&o.join("shared/rel/x.bin"), &files[4].1);
    std::os::unix::fs::symlink(o.join("disk2/real"), root.join("classA")).expect("dir link");
    std::os::unix::fs::symlink(o.join("shared/f.bin"), root.join("classB/f.bin")).expect("file link");
    std::os::unix::fs::symlink("../../shared/rel", root.join("classB/rel")).expect("relative dir link");
    (outer, root, files)
}

async fn check_reads(t: &dyn Tier, files: &[(&str, Vec<u8>)]) {
    let listed: Vec<(String, u64)> = t.list("").await.expect("list").into_iter().map(|m| (m.key, m.size)).collect();
    let want: Vec<(String, u64)> = files.iter().map(|(k, d)| (k.to_string(), d.len() as u64)).collect();
    assert_eq!(listed, want, "{}: listed through the links", t.name());
    let mut batch = ReadBatch::new();
    for (k, d) in files {
        batch.push(k, 0, d.len() + 1, AlignedBuf::new(d.len() + 8192, 4096).expect("buf"));
        assert_eq!(t.stat(k).await.expect("stat").size, d.len() as u64);
    }
    let mut batch = t.read_batch(batch).await;
    for ((key, _, res, buf), (k, d)) in batch.drain().zip(files) {
        assert_eq!(res.expect("read"), d.len(), "{key}");
        assert_eq!(buf.expect("buf").as_slice(), &d[..], "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_files_and_class_folders_are_read_through_the_links() {
    let (_outer, root, files) = linked_dataset();
    let uring =
        UringTier::with_options(&root, UringConfig::default(), UringTierOptions::default().with_follow_links(true))
            .expect("uring");
    check_reads(&uring, &files).await;
    let posix = PosixTier::new(PosixConfig::new(&root).with_follow_links(true)).expect("posix");
    check_reads(&posix, &files).await;
    // A tier that follows links is read-only, and keys still cannot climb out of the root.
    let tiers: [Arc<dyn Tier>; 2] = [Arc::new(uring), Arc::new(posix)];
    for t in tiers {
        assert_eq!(t.create("new").await.expect_err("read-only").kind(), ErrorKind::Unsupported, "{}", t.name());
        assert_eq!(t.delete("classB/own.bin").await.expect_err("read-only").kind(), ErrorKind::Unsupported);
        let (res, _) = t.read_at("../shared/f.bin", 0, 10, AlignedBuf::new(4096, 4096).expect("buf")).await;
        assert_eq!(res.expect_err("..").kind(), ErrorKind::InvalidKey);
    }
    assert!(root.join("classB/own.bin").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_that_do_not_follow_links_keep_refusing_paths_out_of_the_root() {
    let (_outer, root, _files) = linked_dataset();
    let uring = UringTier::new(&root, UringConfig::default()).expect("uring");
    let posix = PosixTier::new(PosixConfig::new(&root)).expect("posix");
    let tiers: [Arc<dyn Tier>; 2] = [Arc::new(uring), Arc::new(posix)];
    for t in tiers {
        // A link met by a listing is an error that names it, not something skipped silently.
        let err = t.list("").await.expect_err("a listing that meets a link");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{}: {err}", t.name());
        assert!(err.to_string().contains("is a symbolic link inside the tier root"), "{}: {err}", t.name());
        // Keys away from the links still list and read.
        let keys: Vec<String> = t.list("classB/own").await.expect("list").into_iter().map(|m| m.key).collect();
        assert_eq!(keys, ["classB/own.bin"], "{}", t.name());
        for key in ["classA/a.bin", "classB/f.bin", "classB/rel/x.bin"] {
            let (res, buf) = t.read_at(key, 0, 100, AlignedBuf::new(4096, 4096).expect("buf")).await;
            let err = res.expect_err("a read through a link");
            assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{}: {key}: {err}", t.name());
            assert!(buf.as_slice().is_empty());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_loops_are_reported_not_walked_forever() {
    let dir = tempfile::Builder::new().prefix("loop").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let root = dir.path().join("root");
    write(&root.join("c/x.bin"), b"x");
    std::os::unix::fs::symlink(&root, root.join("c/back")).expect("loop link");
    let t = UringTier::with_options(&root, UringConfig::default(), UringTierOptions::default().with_follow_links(true))
        .expect("uring");
    let err = t.list("").await.expect_err("a loop");
    assert!(err.to_string().contains("symbolic link loop") && err.to_string().contains("c/back"), "{err}");
    // A dangling link is named too.
    let dir2 = tempfile::Builder::new().prefix("dangling").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    std::os::unix::fs::symlink(dir2.path().join("gone"), dir2.path().join("x.bin")).expect("dangling link");
    let t = PosixTier::new(PosixConfig::new(dir2.path()).with_follow_links(true)).expect("posix");
    let err = t.list("").await.expect_err("dangling");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("broken symbolic link") && err.to_string().contains("x.bin"), "{err}");
}
