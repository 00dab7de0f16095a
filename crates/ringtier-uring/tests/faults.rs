//! Every branch of the driver's completion handling, forced through its fail points: short
//! reads and writes, EAGAIN, EINTR, ECANCELED, EIO, on statx, open, read, close, write and
//! fsync, and a driver thread that panics. Each ends retried and correct, or as a clear error
//! naming the file; never silent corruption, never a hang.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ringtier_core::{ops, AlignedBuf, ErrorKind, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_uring::fail::{FailAction, FailOp, FailPoints, FailRule};
use ringtier_uring::{BufferedWrites, DirectIoPolicy, UringConfig, UringTier, UringTierOptions};

/// Tests here count open descriptors, so they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ext4_dir() -> tempfile::TempDir {
    // Direct I/O and its alignment are real on ext4 (tmpfs accepts anything).
    tempfile::Builder::new().prefix("faults").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn tier(dir: &Path, config: UringConfig, fail: &Arc<FailPoints>) -> UringTier {
    let options = UringTierOptions::default().with_fail_points(Arc::clone(fail));
    UringTier::with_options(dir, config, options).expect("tier")
}

/// A tier for faults of `op`: for `statx`, one with no alignment guess, so that every request
/// goes statx -> open -> read -> close (with the root's alignment known, reads skip statx).
fn tier_for(op: FailOp, dir: &Path, config: UringConfig, fail: &Arc<FailPoints>) -> UringTier {
    let mut options = UringTierOptions::default().with_fail_points(Arc::clone(fail));
    if op == FailOp::Statx {
        options = options.with_assume_dio_alignment((0, 0));
    }
    UringTier::with_options(dir, config, options).expect("tier")
}

/// Sizes around the direct-I/O alignment: under a block, an unaligned tail, several blocks.
const SIZES: [usize; 4] = [100, 4096 * 3 + 17, 64 << 10, 200_000];

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let key = format!("f{i}");
            let data = pattern(i as u64 + 1, n);
            std::fs::write(dir.join(&key), &data).expect("write");
            (key, data)
        })
        .collect()
}

/// Open descriptors other than tokio runtimes' own (`eventpoll`, `eventfd`, pipes): the tests
/// of this file each build a runtime before they wait for the serial lock, so runtimes come
/// and go while a test counts; files and rings are what a leak would leave.
fn open_fds() -> usize {
    fd_targets()
        .iter()
        .filter(|t| {
            !(t.starts_with("anon_inode:[eventpoll]")
                || t.starts_with("anon_inode:[eventfd]")
                || t.starts_with("pipe:"))
        })
        .count()
}

/// The open descriptors once those of dropped tiers are closed: a tier's driver and metadata
/// threads close theirs as they end, after the drop returns, so a count taken at once can
/// see them; a leak stays past the 5 s this waits.
async fn open_fds_settled(bound: usize) -> usize {
    for _ in 0..100 {
        let n = open_fds();
        if n <= bound {
            return n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    open_fds()
}

/// What the open descriptors are (for a leak's message).
fn fd_targets() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// Whole-file reads (the fast path, no statx) and reads at an offset (the statx path).
async fn read_all_ways(t: &UringTier, files: &[(String, Vec<u8>)]) {
    for (key, data) in files {
        assert_eq!(ops::get(t, key).await.expect("get"), *data, "{key} whole");
        let off = data.len() / 3;
        let got = ops::read_exact_at(t, key, off as u64, data.len() - off).await.expect("read at");
        assert_eq!(got, data[off..], "{key} at {off}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_direct_reads_of_whole_blocks_continue_on_both_paths() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let fail = FailPoints::new(1);
    // Under O_DIRECT the kernel completes a read short of what was asked in whole blocks
    // (anything else is end of file): model that with a multiple of the alignment.
    fail.add(FailRule::new(FailOp::Read, FailAction::Short(4096)));
    let t = tier(dir.path(), UringConfig::default(), &fail);
    read_all_ways(&t, &files).await;
    assert!(fail.fired() > 0);
    assert!(t.stats().resubmits > 0, "{:?}", t.stats());
    assert!(t.stats().reads_direct > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_reads_of_any_length_continue_where_the_size_is_known_or_reads_are_buffered() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    for policy in [DirectIoPolicy::Auto, DirectIoPolicy::Off] {
        let fail = FailPoints::new(2);
        fail.add(FailRule::new(FailOp::Read, FailAction::Short(1000)));
        let t = tier(dir.path(), UringConfig::default().with_direct_io(policy), &fail);
        for (key, data) in &files {
            // At an offset: the statx path knows the size, so an unaligned short O_DIRECT
            // read is continued from an aligned position, not taken for the end.
            let got = ops::read_exact_at(&t, key, 1, data.len() - 1).await.expect("read at");
            assert_eq!(got, data[1..], "{key} under {policy:?}");
        }
        if policy == DirectIoPolicy::Off {
            // Buffered whole-file reads: any short count is continued.
            for (key, data) in &files {
                assert_eq!(ops::get(&t, key).await.expect("get"), *data, "{key} buffered whole");
            }
        }
        assert!(fail.fired() > 0, "{policy:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eagain_and_eintr_are_retried_on_every_read_step() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let before = open_fds();
    for op in [FailOp::Statx, FailOp::Open, FailOp::Read] {
        for errno in [libc::EAGAIN, libc::EINTR] {
            let fail = FailPoints::new(3);
            fail.add(FailRule::new(op, FailAction::Errno(errno)).times(5));
            let t = tier_for(op, dir.path(), UringConfig::default(), &fail);
            read_all_ways(&t, &files).await;
            assert_eq!(fail.fired(), 5, "{op:?} errno {errno}");
        }
    }
    // Opens that succeeded in the kernel but were reported as failed were closed.
    let after = open_fds_settled(before + 2).await;
    assert!(after <= before + 2, "descriptors leaked: {before} before, {after} after: {:?}", fd_targets());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_fail_only_their_request_and_name_the_file() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let before = open_fds();
    for op in [FailOp::Statx, FailOp::Open, FailOp::Read] {
        for errno in [libc::EIO, libc::ECANCELED] {
            let fail = FailPoints::new(4);
            // The second request of the batch's step fails once.
            fail.add(FailRule::new(op, FailAction::Errno(errno)).after(1).times(1));
            let t = tier_for(op, dir.path(), UringConfig::default().with_queue_depth(1), &fail);
            let mut batch = ReadBatch::new();
            for (key, data) in &files {
                // Offset 1: an unaligned start, read from the block before it.
                batch.push(key, 1, data.len(), AlignedBuf::new(data.len() + 8192, 4096).expect("buf"));
            }
            let mut batch = t.read_batch(batch).await;
            let mut failed = Vec::new();
            for (i, (key, _, res, buf)) in batch.drain().enumerate() {
                match res {
                    Ok(n) => assert_eq!(&buf.expect("buffer").as_slice()[..n], &files[i].1[1..], "{key}"),
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains(key), "error names the file: {msg}");
                        assert!(msg.contains("uring"), "error names the tier: {msg}");
                        assert_eq!(e.os_code(), Some(errno), "{msg}");
                        assert!(buf.is_some(), "the buffer comes back with the error");
                        failed.push(key.to_string());
                    }
                }
            }
            assert_eq!(failed, ["f1"], "{op:?} errno {errno}: only the second request fails");
        }
    }
    let after = open_fds_settled(before + 2).await;
    assert!(after <= before + 2, "descriptors leaked: {before} before, {after} after: {:?}", fd_targets());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_eagain_ends_in_an_error_not_a_hang() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let fail = FailPoints::new(5);
    fail.add(FailRule::new(FailOp::Read, FailAction::Errno(libc::EAGAIN)));
    let t = tier(dir.path(), UringConfig::default(), &fail);
    let e = tokio::time::timeout(Duration::from_secs(30), ops::get(&t, &files[0].0))
        .await
        .expect("no hang")
        .expect_err("gives up");
    assert!(e.is_temporary(), "{e}");
    assert!(e.to_string().contains(&files[0].0), "{e}");
    assert!(fail.fired() > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_errors_do_not_fail_a_read_that_completed() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let fail = FailPoints::new(6);
    fail.add(FailRule::new(FailOp::Close, FailAction::Errno(libc::EIO)));
    let t = tier(dir.path(), UringConfig::default(), &fail);
    read_all_ways(&t, &files).await;
    assert!(fail.fired() >= files.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_files_reads_retry_short_and_name_the_key_on_errors() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let files = files(dir.path());
    let (key, data) = &files[3];
    let fail = FailPoints::new(7);
    fail.add(FailRule::new(FailOp::Read, FailAction::Short(8192)).times(3));
    fail.add(FailRule::new(FailOp::Read, FailAction::Errno(libc::EINTR)).times(2));
    let t = tier(dir.path(), UringConfig::default().with_register_files(true), &fail);
    let file = t.open_file(key).await.expect("open");
    let mut batch = ReadBatch::new();
    for off in [0usize, 65536, 131072] {
        batch.push_range(off as u64, 65536, AlignedBuf::new(65536, 4096).expect("buf"));
    }
    let mut out = file.read_batch(batch).await;
    for (i, (_, _, res, buf)) in out.drain().enumerate() {
        let n = res.expect("read");
        assert_eq!(&buf.expect("buf").as_slice()[..n], &data[i * 65536..(i + 1) * 65536]);
    }
    assert_eq!(fail.fired(), 5);
    fail.add(FailRule::new(FailOp::Read, FailAction::Errno(libc::EIO)).times(1));
    let mut batch = ReadBatch::new();
    batch.push_range(0, 4096, AlignedBuf::new(4096, 4096).expect("buf"));
    let mut out = file.read_batch(batch).await;
    let (_, _, res, _) = out.drain().next().expect("one");
    let e = res.expect_err("EIO");
    assert!(e.to_string().contains(key.as_str()), "names the key: {e}");
    assert_eq!(e.kind(), ErrorKind::Io);
}

async fn write_object(t: &UringTier, key: &str, data: &[u8], chunk: usize) -> ringtier_core::Result<()> {
    let mut w = t.create(key).await?;
    for (i, part) in data.chunks(chunk).enumerate() {
        let mut buf = AlignedBuf::new(chunk.next_multiple_of(4096), 4096).expect("buf");
        buf.fill_from(part).expect("fill");
        let (res, _) = w.write_at((i * chunk) as u64, buf).await;
        res?;
    }
    w.commit().await.map(|_| ())
}

fn staging_is_empty(root: &Path) -> bool {
    std::fs::read_dir(root.join(".ringtier-staging")).map(|mut d| d.next().is_none()).unwrap_or(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_writes_continue_under_direct_and_buffered_io() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let data = pattern(9, 3 * 65536 + 123);
    // Direct: short by whole blocks and off the alignment (continued from an aligned
    // position); buffered through the ring: any length.
    let cases = [
        (DirectIoPolicy::Auto, 4096u32),
        (DirectIoPolicy::Auto, 1000),
        (DirectIoPolicy::Off, 1000),
        (DirectIoPolicy::Off, 1),
    ];
    for (i, (policy, short)) in cases.into_iter().enumerate() {
        let fail = FailPoints::new(10);
        fail.add(FailRule::new(FailOp::Write, FailAction::Short(short)).times(20));
        let config = UringConfig::default().with_direct_io(policy).with_buffered_writes(BufferedWrites::Ring);
        let t = tier(dir.path(), config, &fail);
        let key = format!("w{i}");
        write_object(&t, &key, &data, 65536).await.expect("write");
        assert_eq!(std::fs::read(dir.path().join(&key)).expect("read back"), data, "{policy:?} short {short}");
        assert!(fail.fired() > 0, "{policy:?} short {short}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_fsync_errors_fail_the_object_and_publish_nothing() {
    let _s = SERIAL.lock().await;
    let dir = ext4_dir();
    let data = pattern(11, 2 * 65536 + 5);
    // Temporary errors are retried.
    for op in [FailOp::Write, FailOp::Fsync] {
        for errno in [libc::EAGAIN, libc::EINTR] {
            let fail = FailPoints::new(12);
            fail.add(FailRule::new(op, FailAction::Errno(errno)).times(3));
            let t = tier(dir.path(), UringConfig::default(), &fail);
            let key = format!("ok-{op:?}-{errno}");
            write_object(&t, &key, &data, 65536).await.expect("retried");
            assert_eq!(std::fs::read(dir.path().join(&key)).expect("read"), data);
            assert_eq!(fail.fired(), 3);
        }
    }
    // Others fail the write or the commit, with the key; nothing becomes visible.
    for op in [FailOp::Write, FailOp::Fsync] {
        for errno in [libc::EIO, libc::ECANCELED, libc::ENOSPC] {
            let fail = FailPoints::new(13);
            // The second write, or the one fsync, fails.
            let skip = if op == FailOp::Write { 1 } else { 0 };
            fail.add(FailRule::new(op, FailAction::Errno(errno)).after(skip).times(1));
            let t = tier(dir.path(), UringConfig::default(), &fail);
            let key = format!("bad-{op:?}-{errno}");
            let e = write_object(&t, &key, &data, 65536).await.expect_err("fails");
            assert!(e.to_string().contains(&key), "names the key: {e}");
            assert_eq!(e.os_code(), Some(errno), "{e}");
            if errno == libc::ENOSPC {
                assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
            }
            assert!(!dir.path().join(&key).exists(), "{key} published after an error");
            assert!(t.stat(&key).await.is_err());
        }
    }
    assert!(staging_is_empty(dir.path()), "staged files left behind");
}

#[test]
fn a_driver_panic_fails_its_waiters_and_nothing_hangs() {
    let _s = SERIAL.blocking_lock();
    let dir = ext4_dir();
    let files = files(dir.path());
    let fail = FailPoints::new(14);
    fail.add(FailRule::new(FailOp::Read, FailAction::Panic).after(2).times(1));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (tx, rx) = std::sync::mpsc::channel();
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        rt.block_on(async {
            let t = tier(&root, UringConfig::default().with_queue_depth(4), &fail);
            let mut batch = ReadBatch::new();
            for _ in 0..4 {
                for (key, data) in &files {
                    batch.push(key, 0, data.len() + 1, AlignedBuf::new(data.len() + 8192, 4096).expect("buf"));
                }
            }
            let mut out = t.read_batch(batch).await;
            let errors: Vec<_> = out.drain().filter_map(|(_, _, r, _)| r.err()).collect();
            let stopped = errors.iter().filter(|e| e.kind() == ErrorKind::Shutdown).count();
            // The driver is gone: later requests fail at once.
            let later = ops::get(&t, &files[0].0).await.expect_err("driver stopped");
            drop(t);
            let _ = tx.send((stopped, later.kind()));
        });
    });
    let (stopped, later) = rx.recv_timeout(Duration::from_secs(60)).expect("no hang after a driver panic");
    assert!(stopped > 0, "waiters told the driver stopped");
    assert_eq!(later, ErrorKind::Shutdown);
}
