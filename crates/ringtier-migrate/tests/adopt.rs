//! `CheckpointStore::commit_files`: files a program wrote under the fast tier committed as a
//! step without being written again (adopted: the part is the very file), on the posix and the
//! io_uring tier over a real directory; what is refused (links, files outside the root, FIFOs,
//! the store's own prefix) and what is copied instead (a file with several links, a fast tier
//! that does not adopt). Power cuts during `commit_files` run in `tests/power_cut.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::fs::FsFailPoints;
use ringtier_core::layers::LayeredTier;
use ringtier_core::{ErrorKind, PosixConfig, PosixTier, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn posix(root: &Path, name: &str) -> Arc<dyn Tier> {
    Arc::new(PosixTier::new(PosixConfig::new(root).with_create(true).with_name(name.into())).expect("posix"))
}

fn uring(root: &Path, name: &str) -> Arc<dyn Tier> {
    let options = UringTierOptions::default().with_name(name.to_string()).with_create_root(true);
    Arc::new(UringTier::with_options(root, UringConfig::default(), options).expect("uring"))
}

fn cfg() -> StoreConfig {
    StoreConfig::default().with_chunk_bytes(1 << 20).with_keep_last(1)
}

/// The files of a checkpoint as TensorFlow writes them: a large data file (not a multiple of
/// the page size) and a small index.
fn files(step: u64) -> Vec<(String, Vec<u8>)> {
    vec![
        ("ckpt.data-00000-of-00001".into(), pattern(step, (3 << 20) + 4321)),
        ("ckpt.index".into(), pattern(step + 1000, 517)),
    ]
}

/// Writes `files` into `dir` (made) as a program would, without the tier.
fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for (name, data) in files {
        std::fs::write(dir.join(name), data).expect("write");
    }
}

fn names(files: &[(String, Vec<u8>)]) -> Vec<String> {
    files.iter().map(|(n, _)| n.clone()).collect()
}

fn part_path(fast: &Path, step: u64, name: &str) -> PathBuf {
    fast.join(format!("ckpt/{step:020}/parts/{name}"))
}

/// Everything under `dir` (relative paths), for "nothing changed" checks.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).expect("under dir").display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

async fn round_trip(open: fn(&Path, &str) -> Arc<dyn Tier>) {
    let base = scratch("adopt");
    let (fast, slow) = (base.path().join("fast"), base.path().join("slow"));
    let store = CheckpointStore::open(vec![open(&fast, "fast"), open(&slow, "slow")], cfg()).await.expect("open");
    let mut inodes = Vec::new();
    for step in 1..=3u64 {
        let f = files(step);
        let incoming = fast.join(format!("incoming/step-{step}"));
        write_files(&incoming, &f);
        let before: Vec<u64> =
            f.iter().map(|(n, _)| std::fs::metadata(incoming.join(n)).expect("stat").ino()).collect();
        let total: u64 = f.iter().map(|(_, d)| d.len() as u64).sum();
        let r = store.commit_files(step, &format!("incoming/step-{step}"), &names(&f)).await.expect("commit_files");
        assert_eq!((r.step, r.bytes, r.adopted_bytes, r.tier.as_str()), (step, total, total, "fast"));
        assert!(!r.wrote_through);
        // Not written again: each part is the very file the program wrote.
        for ((name, data), ino) in f.iter().zip(&before) {
            let part = part_path(&fast, step, name);
            assert_eq!(std::fs::metadata(&part).expect("part").ino(), *ino, "{name} was copied, not adopted");
            assert_eq!(std::fs::metadata(&part).expect("part").nlink(), 1);
            assert!(std::fs::read(&part).expect("read") == *data);
            assert!(!incoming.join(name).exists(), "{name} is still where it was written");
        }
        inodes.push(before);
        // A step like any other: listed, verified, loaded.
        let loaded = store.load(step).await.expect("load");
        assert_eq!(loaded.parts, f);
        for (tier, res) in store.verify(step).await.expect("verify") {
            res.unwrap_or_else(|e| panic!("verify {step} on {tier}: {e}"));
        }
        // Nothing left in the tier's staging directory.
        assert_eq!(tree(&fast.join(".ringtier-staging")), Vec::<String>::new());
    }
    // Drained and evicted as saved steps are: keep_last 1 keeps step 3 on the fast tier.
    store.drain().await.expect("drain");
    let listed = store.list().await.expect("list");
    assert_eq!(listed.iter().map(|c| c.step).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(listed.iter().all(|c| c.tiers.iter().any(|t| t == "slow")), "{listed:?}");
    assert!(!fast.join("ckpt/00000000000000000001").exists(), "step 1 evicted from the fast tier");
    let r = store.load(1).await.expect("load 1 from the slow tier");
    assert_eq!((r.tier.as_str(), r.parts), ("slow", files(1)));
    // The step exists now: committing it again is refused, and nothing moves.
    write_files(&fast.join("incoming/again"), &files(3));
    let err = store.commit_files(3, "incoming/again", &names(&files(3))).await.expect_err("exists");
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert_eq!(tree(&fast.join("incoming/again")).len(), 2);
    drop(store);
    // Reopened (recovery): the committed steps are intact.
    let store = CheckpointStore::open(vec![open(&fast, "fast"), open(&slow, "slow")], cfg()).await.expect("reopen");
    assert_eq!(store.load(3).await.expect("load 3").parts, files(3));
    assert_eq!(std::fs::metadata(part_path(&fast, 3, "ckpt.index")).expect("part").ino(), inodes[2][1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_adopted_on_the_posix_tier() {
    round_trip(posix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_adopted_on_the_uring_tier() {
    round_trip(uring).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_fifos_files_outside_the_root_and_the_prefix_are_refused() {
    use std::os::unix::fs::symlink;
    let base = scratch("adopt-refused");
    let fast = base.path().join("fast");
    let outside = base.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("ckpt.index"), b"outside the root").expect("outside file");
    let store = CheckpointStore::open(vec![posix(&fast, "fast")], cfg()).await.expect("open");
    let f = files(1);
    let refused = |res: ringtier_core::Result<ringtier_migrate::SaveReport>| res.expect_err("refused");

    // A link planted in the directory, to a file outside the root: refused, naming it, and
    // the other file of the commit is not moved either.
    let dir = fast.join("incoming/linked-file");
    write_files(&dir, &f[..1]);
    symlink(outside.join("ckpt.index"), dir.join("ckpt.index")).expect("symlink");
    let before = (tree(&fast), tree(&outside));
    let err = refused(store.commit_files(1, "incoming/linked-file", &names(&f)).await);
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(err.to_string().contains("incoming/linked-file/ckpt.index"), "{err}");
    assert_eq!((tree(&fast), tree(&outside)), before, "nothing moved");

    // The directory itself a link out of the root.
    symlink(&outside, fast.join("incoming/linked-dir")).expect("symlink");
    let err = refused(store.commit_files(1, "incoming/linked-dir", &["ckpt.index".into()]).await);
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("incoming/linked-dir"), "{err}");
    assert_eq!(std::fs::read(outside.join("ckpt.index")).expect("outside"), b"outside the root");

    // Outside the root by name: no `..`, no absolute path.
    for dir in ["../outside", "incoming/../../outside", "/tmp"] {
        let err = refused(store.commit_files(1, dir, &["ckpt.index".into()]).await);
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{dir}: {err}");
    }
    assert_eq!(std::fs::read(outside.join("ckpt.index")).expect("outside"), b"outside the root");

    // A FIFO is not a regular file.
    let fifo_dir = fast.join("incoming/fifo");
    std::fs::create_dir_all(&fifo_dir).expect("mkdir");
    let c = std::ffi::CString::new(fifo_dir.join("ckpt.index").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path; it touches no memory of ours.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let err = refused(store.commit_files(1, "incoming/fifo", &["ckpt.index".into()]).await);
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("not a regular file"), "{err}");

    // Files inside the store's own prefix (another step's parts) are never taken.
    store.save(5, vec![Part::bytes("ckpt.index", b"step 5")]).await.expect("save 5");
    let err = refused(store.commit_files(1, "ckpt/00000000000000000005/parts", &["ckpt.index".into()]).await);
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(store.load(5).await.expect("load 5").parts[0].1, b"step 5");

    // Bad part names, none given, twice the same.
    write_files(&fast.join("incoming/ok"), &f);
    for bad in [vec![], vec!["MANIFEST.json".to_string()], vec!["a/b".into()], vec!["ckpt.index".into(); 2]] {
        let err = refused(store.commit_files(1, "incoming/ok", &bad).await);
        assert!(matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::InvalidKey), "{bad:?}: {err}");
    }
    // A missing file: nothing moved.
    let err = refused(store.commit_files(1, "incoming/ok", &["ckpt.index".into(), "nope".into()]).await);
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(tree(&fast.join("incoming/ok")).len(), 2);
    // No step 1 came out of any of it; then the good directory commits.
    assert_eq!(store.latest().await.expect("latest"), Some(5));
    store.commit_files(1, "incoming/ok", &names(&f)).await.expect("commit");
    assert_eq!(store.load(1).await.expect("load").parts, f);
    // A read-only store commits nothing.
    drop(store);
    let ro = CheckpointStore::open_read_only(vec![posix(&fast, "fast")], cfg()).await.expect("read-only");
    write_files(&fast.join("incoming/ro"), &f);
    assert_eq!(refused(ro.commit_files(2, "incoming/ro", &names(&f)).await).kind(), ErrorKind::Unsupported);
}

/// A layer that changes nothing: it declines adoption (the `LayeredTier` default), so files
/// are copied through it.
#[derive(Debug)]
struct NoAdoption(Arc<dyn Tier>);

impl LayeredTier for NoAdoption {
    fn inner(&self) -> &dyn Tier {
        self.0.as_ref()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_cannot_be_adopted_are_copied() {
    let base = scratch("adopt-copied");
    let (fast, slow) = (base.path().join("fast"), base.path().join("slow"));
    let store = CheckpointStore::open(vec![posix(&fast, "fast"), posix(&slow, "slow")], cfg()).await.expect("open");
    // A file with a second link (another name could change it): copied, left in place.
    let f = files(1);
    write_files(&fast.join("incoming/1"), &f);
    std::fs::hard_link(fast.join("incoming/1/ckpt.index"), fast.join("elsewhere")).expect("link");
    let r = store.commit_files(1, "incoming/1", &names(&f)).await.expect("commit");
    assert_eq!(r.adopted_bytes, f[0].1.len() as u64, "the data file adopted, the linked index copied");
    assert!(fast.join("incoming/1/ckpt.index").exists() && !fast.join("incoming/1").join(&f[0].0).exists());
    let index = std::fs::metadata(part_path(&fast, 1, "ckpt.index")).expect("part");
    assert_ne!(index.ino(), std::fs::metadata(fast.join("elsewhere")).expect("link").ino());
    assert_eq!(store.load(1).await.expect("load").parts, f);
    drop(store);

    // A fast tier that declines every file (a layer): every file copied, every one left.
    let layered: Arc<dyn Tier> = Arc::new(NoAdoption(posix(&fast, "fast")));
    let store = CheckpointStore::open(vec![layered, posix(&slow, "slow")], cfg()).await.expect("open layered");
    let f = files(2);
    write_files(&fast.join("incoming/2"), &f);
    let r = store.commit_files(2, "incoming/2", &names(&f)).await.expect("commit");
    assert_eq!((r.adopted_bytes, r.bytes), (0, f.iter().map(|(_, d)| d.len() as u64).sum()));
    assert_eq!(tree(&fast.join("incoming/2")).len(), 2, "copied files stay");
    assert_eq!(store.load(2).await.expect("load").parts, f);
    store.drain().await.expect("drain");
    assert_eq!(store.load(1).await.expect("load 1").parts, files(1));

    // The fast tier over its capacity bound with write-through: copied to the next tier.
    drop(store);
    let cfg = cfg().with_fast_capacity_bytes(Some(1 << 20)).with_on_full(ringtier_migrate::OnFull::WriteThrough);
    let store = CheckpointStore::open(vec![posix(&fast, "fast"), posix(&slow, "slow")], cfg).await.expect("open");
    let f = files(3);
    write_files(&fast.join("incoming/3"), &f);
    let r = store.commit_files(3, "incoming/3", &names(&f)).await.expect("commit");
    assert!(r.wrote_through && r.tier == "slow" && r.adopted_bytes == 0, "{r:?}");
    assert_eq!(store.load(3).await.expect("load").parts, f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_leaves_no_step_and_puts_the_file_back() {
    let base = scratch("adopt-fail");
    let fast = base.path().join("fast");
    let fail = Arc::new(FsFailPoints::new());
    let tier: Arc<dyn Tier> = Arc::new(
        PosixTier::new(
            PosixConfig::new(&fast)
                .with_create(true)
                .with_name("fast".into())
                .with_fail_points(Some(Arc::clone(&fail))),
        )
        .expect("posix"),
    );
    let store = CheckpointStore::open(vec![tier], cfg()).await.expect("open");
    let f = files(1);
    write_files(&fast.join("incoming"), &f);
    // The directory fsync after the index's rename fails twice: un-published, put back.
    fail.fail_dir_fsync_after_rename("parts/ckpt.index", 2, libc::EIO);
    let err = store.commit_files(1, "incoming", &names(&f)).await.expect_err("commit fails");
    assert!(err.to_string().contains("un-published"), "{err}");
    assert_eq!(fail.fired(), 2);
    assert_eq!(store.list().await.expect("list").len(), 0, "no step");
    assert!(!fast.join("ckpt/00000000000000000001").exists(), "nothing of the step stays");
    assert_eq!(std::fs::read(fast.join("incoming/ckpt.index")).expect("put back"), f[1].1);
    assert_eq!(tree(&fast.join(".ringtier-staging")), Vec::<String>::new());
    // The data file was adopted before the failure and went with the step's parts.
    assert!(!fast.join("incoming").join(&f[0].0).exists());
    // Written again, it commits.
    write_files(&fast.join("incoming"), &f);
    store.commit_files(1, "incoming", &names(&f)).await.expect("commit");
    assert_eq!(store.load(1).await.expect("load").parts, f);
}
