//! io_uring tier behaviour beyond the conformance suite: the direct-I/O policy, alignment on
//! ext4, fixed buffers and files, many small files, and bad input.

use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use ringtier_core::{ops, AlignedBuf, BufferPool, ErrorKind, PoolConfig, ReadBatch, Tier};
use ringtier_testkit::pattern;
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};

fn ext4_dir() -> tempfile::TempDir {
    // Alignment tests must run on ext4: tmpfs accepts misaligned O_DIRECT on this kernel.
    tempfile::Builder::new().prefix("uring").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn write_file(dir: &Path, key: &str, data: &[u8]) {
    let p = dir.join(key);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

fn tier(dir: &Path, config: UringConfig) -> UringTier {
    UringTier::new(dir, config).expect("tier")
}

/// A buffer whose data starts `skew` bytes past a 4096-byte boundary.
fn skewed_buf(cap: usize, skew: usize) -> (AlignedBuf, AlignedBuf) {
    let mut backing = AlignedBuf::new(cap + 4096, 4096).expect("backing");
    // SAFETY: the skewed view stays inside `backing`, which the caller keeps alive and does
    // not touch while the view is in use.
    let ptr = unsafe { NonNull::new_unchecked(backing.as_mut_ptr().add(skew)) };
    // SAFETY: as above; alignment 1 is honest for a skewed pointer.
    let view = unsafe { AlignedBuf::from_raw_parts(ptr, cap, 1, || {}) };
    (view, backing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_reads_go_direct_and_tails_read_correctly() {
    let dir = ext4_dir();
    let t = tier(dir.path(), UringConfig::default());
    assert_eq!(t.filesystem(), "ext4");
    let (mem, off) = t.root_dio_alignment();
    assert!(mem > 0 && off > 0, "ext4 reports direct-I/O alignment");
    assert!(t.capabilities().direct_io);
    // Smaller than one block, an unaligned tail, and an exact multiple.
    let sizes = [1usize, off as usize - 1, 3 * off as usize + 17, 8 * 4096];
    for (i, size) in sizes.iter().enumerate() {
        write_file(dir.path(), &format!("f{i}"), &pattern(i as u64, *size));
    }
    for (i, size) in sizes.iter().enumerate() {
        let data = pattern(i as u64, *size);
        let got = ops::get(&t, &format!("f{i}")).await.expect("get");
        assert_eq!(got, data, "file of {size} bytes");
        // A read straddling the unaligned tail.
        if *size > 10 {
            let got = ops::read_exact_at(&t, &format!("f{i}"), (*size - 10) as u64, 100).await.expect("tail");
            assert_eq!(got, &data[size - 10..]);
        }
    }
    let s = t.stats();
    assert!(s.reads_direct >= 4, "{s:?}");
    assert_eq!(s.reads_buffered, 0, "{s:?}");
    assert_eq!(s.direct_io_fallbacks, 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_off_reads_buffered() {
    let dir = ext4_dir();
    write_file(dir.path(), "x", &pattern(1, 5000));
    let t = tier(dir.path(), UringConfig::default().with_direct_io(DirectIoPolicy::Off));
    assert!(!t.capabilities().direct_io);
    assert_eq!(ops::get(&t, "x").await.expect("get"), pattern(1, 5000));
    let s = t.stats();
    assert_eq!((s.reads_direct, s.reads_buffered), (0, 1), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misaligned_buffer_falls_back_under_auto_and_fails_under_required() {
    let dir = ext4_dir();
    let data = pattern(9, 20_000);
    write_file(dir.path(), "x", &data);

    let auto = tier(dir.path(), UringConfig::default());
    let (buf, _backing) = skewed_buf(16_384, 8);
    let (res, buf) = auto.read_at("x", 100, 10_000, buf).await;
    assert_eq!(res.expect("auto read"), 10_000);
    assert_eq!(buf.as_slice(), &data[100..10_100]);
    let s = auto.stats();
    assert_eq!((s.direct_io_fallbacks, s.reads_buffered), (1, 1), "counted fallback: {s:?}");

    let required = tier(dir.path(), UringConfig::default().with_direct_io(DirectIoPolicy::Required));
    let (buf, _backing2) = skewed_buf(16_384, 8);
    let (res, _buf) = required.read_at("x", 100, 10_000, buf).await;
    let err = res.expect_err("misaligned buffer under required");
    assert_eq!(err.kind(), ErrorKind::Misaligned, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"x\"") && msg.contains("ext4"), "error names file and filesystem: {msg}");

    // A buffer too small for the aligned span is the same kind of error under required.
    let small = AlignedBuf::new(4096, 4096).expect("buf");
    let (res, _) = required.read_at("x", 4000, 4000, small).await;
    assert_eq!(res.expect_err("span too big").kind(), ErrorKind::Misaligned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_files_in_one_batch_with_a_registered_pool() {
    let dir = ext4_dir();
    let n = 300;
    for i in 0..n {
        write_file(dir.path(), &format!("class{:02}/img{i:04}.jpg", i % 7), &pattern(i as u64, 500 + i * 97));
    }
    let pool = BufferPool::new(PoolConfig::new(64 << 10, n, 4096)).expect("pool");
    let options = UringTierOptions::default().with_pool(pool.clone());
    let t = UringTier::with_options(dir.path(), UringConfig::default().with_queue_depth(8), options).expect("tier");
    let mut batch = ReadBatch::with_capacity(n, n * 24);
    for i in 0..n {
        batch.push(&format!("class{:02}/img{i:04}.jpg", i % 7), 0, 64 << 10, pool.try_acquire().expect("buffer"));
    }
    let batch = t.read_batch(batch).await;
    for (i, (key, e)) in batch.iter().enumerate() {
        let n_read = *e.result().expect("done").as_ref().unwrap_or_else(|err| panic!("{key}: {err}"));
        assert_eq!(n_read, 500 + i * 97);
        assert_eq!(e.buf().expect("buf").as_slice(), pattern(i as u64, 500 + i * 97), "{key}");
    }
    let s = t.stats();
    assert_eq!(s.fixed_buffer_reads, n as u64, "{s:?}");
    assert_eq!(s.reads_direct, n as u64, "{s:?}");
    // Whole-file reads skip statx (the root's alignment is known): openat2 + read + close per
    // file, plus the driver's wake-up reads (re-armed whenever a job woke it).
    assert!(s.sqes > 3 * n as u64 && s.sqes <= 3 * n as u64 + 4, "{s:?}");
    assert!(s.submits < s.sqes, "submissions are batched: {s:?}");
    drop(batch);
    assert_eq!(pool.in_use(), 0, "every buffer returned to the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_file_random_reads_with_fixed_files_and_buffers() {
    let dir = ext4_dir();
    let data = pattern(42, 4 << 20);
    write_file(dir.path(), "big.bin", &data);
    let pool = BufferPool::new(PoolConfig::new(128 << 10, 32, 4096)).expect("pool");
    let config = UringConfig::default().with_register_files(true).with_rings(2);
    let options = UringTierOptions::default().with_pool(pool.clone());
    let t = UringTier::with_options(dir.path(), config, options).expect("tier");
    let f = t.open_file("big.bin").await.expect("open");
    assert!(f.is_direct());
    assert!(f.fixed_slot().is_some(), "registered as a fixed file");
    let mut batch = ReadBatch::with_capacity(32, 0);
    for round in 0..4u64 {
        for i in 0..32u64 {
            let off = ((i * 7 + round * 13) % 32) * (128 << 10);
            batch.push_range(off, 128 << 10, pool.acquire().await);
        }
        batch = f.read_batch(batch).await;
        for (_, e) in batch.iter() {
            let off = e.offset() as usize;
            assert_eq!(*e.result().expect("done").as_ref().expect("read"), 128 << 10);
            assert!(e.buf().expect("buf").as_slice() == &data[off..off + (128 << 10)]);
        }
        batch.clear();
    }
    let s = t.stats();
    assert_eq!((s.fixed_file_reads, s.fixed_buffer_reads), (128, 128), "{s:?}");
    // A read past the end of the file, and one at its end.
    batch.push_range(data.len() as u64 + 4096, 4096, pool.acquire().await);
    batch.push_range(data.len() as u64, 4096, pool.acquire().await);
    let mut batch = f.read_batch(batch).await;
    let results: Vec<_> = batch.drain().map(|(_, _, r, _)| r.map_err(|e| e.kind())).collect();
    assert_eq!(results, [Err(ErrorKind::OutOfRange), Ok(0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_clear_errors_and_never_leaves_the_root() {
    let outer = ext4_dir();
    let root = outer.path().join("root");
    std::fs::create_dir(&root).expect("root");
    write_file(outer.path(), "secret", b"outside the root");
    std::os::unix::fs::symlink(outer.path().join("secret"), root.join("escape")).expect("symlink");
    std::os::unix::fs::symlink("../secret", root.join("escape_rel")).expect("symlink");
    std::fs::create_dir(root.join("adir")).expect("dir");
    let t = tier(&root, UringConfig::default());

    for key in ["escape", "escape_rel"] {
        let (res, buf) = t.read_at(key, 0, 100, AlignedBuf::new(4096, 4096).expect("buf")).await;
        let err = res.expect_err("symlink out of the root must not be read");
        assert!(buf.as_slice().is_empty(), "nothing read from outside");
        assert!(err.to_string().contains(key), "{err}");
    }
    let (res, _) = t.read_at("missing", 0, 10, AlignedBuf::new(4096, 4096).expect("buf")).await;
    let err = res.expect_err("missing");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("\"missing\"") && err.to_string().contains("uring"), "{err}");
    let (res, _) = t.read_at("adir", 0, 10, AlignedBuf::new(4096, 4096).expect("buf")).await;
    assert_eq!(res.expect_err("directory").kind(), ErrorKind::NotFound);
    assert!(UringTier::new(outer.path().join("nope"), UringConfig::default()).is_err(), "missing root");
    assert!(UringTier::new(&root, UringConfig::default().with_queue_depth(0)).is_err());
    assert!(t.open_file("../secret").await.is_err());
    assert!(t.open_file("escape").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_writes_pad_and_trim_the_tail() {
    let dir = ext4_dir();
    let t: Arc<dyn Tier> = Arc::new(tier(dir.path(), UringConfig::default().with_direct_io(DirectIoPolicy::Required)));
    let data = pattern(3, 3 * 4096 + 123);
    ops::put(t.as_ref(), "ckpt/part-0", &data, 8192).await.expect("put");
    assert_eq!(std::fs::read(dir.path().join("ckpt/part-0")).expect("read back"), data);
    // Under required, an unaligned offset is refused with a clear error and nothing lands.
    let mut w = t.create("ckpt/part-1").await.expect("create");
    let mut buf = AlignedBuf::new(4096, 4096).expect("buf");
    buf.fill_from(&[1u8; 4096]).expect("fill");
    let (res, _) = w.write_at(100, buf).await;
    assert_eq!(res.expect_err("unaligned offset").kind(), ErrorKind::Misaligned);
    w.abort().await.expect("abort");
    assert!(t.stat("ckpt/part-1").await.is_err());
    // Under auto the same write falls back to buffered I/O and is counted.
    let auto = tier(dir.path(), UringConfig::default());
    let mut w = auto.create("ckpt/part-2").await.expect("create");
    let mut buf = AlignedBuf::new(4096, 4096).expect("buf");
    buf.fill_from(&[7u8; 4096]).expect("fill");
    let (res, _) = w.write_at(100, buf).await;
    res.expect("buffered fallback");
    w.commit().await.expect("commit");
    let got = std::fs::read(dir.path().join("ckpt/part-2")).expect("read");
    assert_eq!(got.len(), 4196);
    assert!(got[..100].iter().all(|&b| b == 0) && got[100..].iter().all(|&b| b == 7));
    assert_eq!(auto.stats().direct_io_fallbacks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_without_direct_io_errors_under_required_and_falls_back_under_auto() {
    // procfs has no O_DIRECT (statx reports no DIO alignment for its files).
    let required = tier(Path::new("/proc/self"), UringConfig::default().with_direct_io(DirectIoPolicy::Required));
    let (res, _) = required.read_at("status", 0, 100, AlignedBuf::new(4096, 4096).expect("buf")).await;
    let err = res.expect_err("no O_DIRECT on procfs");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"status\"") && msg.contains("proc"), "names file and filesystem: {msg}");

    let auto = tier(Path::new("/proc/self"), UringConfig::default());
    let (res, _) = auto.read_at("status", 0, 100, AlignedBuf::new(4096, 4096).expect("buf")).await;
    res.expect("buffered fallback");
    let s = auto.stats();
    assert_eq!((s.direct_io_fallbacks, s.reads_direct), (1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_read_bytes_reads_a_file_in_chunks_through_one_open() {
    let dir = ext4_dir();
    let data = pattern(8, (1 << 20) + 100);
    write_file(dir.path(), "big", &data);
    let t = tier(dir.path(), UringConfig::default().with_max_read_bytes(128 << 10));
    let mut batch = ReadBatch::new();
    batch.push("big", 0, data.len(), AlignedBuf::new(data.len() + 4096, 4096).expect("buf"));
    let batch = t.read_batch(batch).await;
    let (_, e) = batch.get(0).expect("entry");
    assert_eq!(*e.result().expect("done").as_ref().expect("read"), data.len());
    assert!(e.buf().expect("buf").as_slice() == data.as_slice());
    assert!(e.latency().is_some(), "service time recorded");
    let s = t.stats();
    // openat2, 9 reads of at most 128 KiB, close, plus the driver's wake-up read(s).
    assert!((1 + 9 + 1 + 1..=1 + 9 + 1 + 3).contains(&s.sqes), "{s:?}");
    assert_eq!(s.resubmits, 0, "chunks are not short reads: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_of_a_file_skip_statx_and_ranges_at_or_past_the_end_are_told_apart() {
    let dir = ext4_dir();
    let size = 300_007usize;
    let data = pattern(13, size);
    write_file(dir.path(), "f", &data);
    let t = tier(dir.path(), UringConfig::default().with_queue_depth(4));
    // Three pieces of 128 KiB (the last asks one byte more, as a loader noticing growth does)
    // and one at an unaligned offset.
    let chunk = 128 << 10;
    let pieces = [(0usize, chunk), (chunk, chunk), (2 * chunk, size - 2 * chunk + 1), (77_777, 5_000)];
    let mut batch = ReadBatch::new();
    for &(off, len) in &pieces {
        batch.push("f", off as u64, len, AlignedBuf::new(chunk + 8192, 4096).expect("buf"));
    }
    let batch = t.read_batch(batch).await;
    for (i, ((_, e), &(off, len))) in batch.iter().zip(&pieces).enumerate() {
        let want = len.min(size - off);
        assert_eq!(*e.result().expect("done").as_ref().expect("read"), want, "piece {i}");
        assert!(e.buf().expect("buf").as_slice() == &data[off..off + want], "piece {i}");
    }
    let s = t.stats();
    // openat2 + read + close per piece, no statx, plus the driver's wake-up read(s).
    assert!((4 * 3 + 1..=4 * 3 + 4).contains(&s.sqes), "{s:?}");
    // At the end: empty; past it (in the last block, and beyond): OutOfRange, as statx says.
    let (res, _) = t.read_at("f", size as u64, 100, AlignedBuf::new(8192, 4096).expect("buf")).await;
    assert_eq!(res.expect("at the end"), 0);
    for off in [size as u64 + 1, size as u64 + 10_000] {
        let (res, _) = t.read_at("f", off, 100, AlignedBuf::new(16_384, 4096).expect("buf")).await;
        assert_eq!(res.expect_err("past the end").kind(), ErrorKind::OutOfRange, "at {off}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_alignment_guess_is_corrected_through_statx() {
    let dir = ext4_dir();
    let data = pattern(12, 10_000);
    write_file(dir.path(), "x", &data);
    // Pretend new files need no alignment; ext4 needs 512 bytes, so the kernel refuses the
    // unaligned direct read of the fast path and statx decides instead.
    let options = UringTierOptions::default().with_assume_dio_alignment((1, 1));
    let t = UringTier::with_options(dir.path(), UringConfig::default(), options).expect("tier");
    let (res, buf) = t.read_at("x", 0, 10_000, AlignedBuf::new(16_384, 4096).expect("buf")).await;
    assert_eq!(res.expect("read"), 10_000);
    assert_eq!(buf.as_slice(), data.as_slice());
    let s = t.stats();
    assert_eq!((s.reads_direct, s.direct_io_fallbacks), (2, 0), "refused fast read, then the statx path: {s:?}");
    // openat2 + refused read + close, then statx + openat2 + read + close, plus wake-up read(s).
    assert!((3 + 4 + 1..=3 + 4 + 3).contains(&s.sqes), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_files_read_many_small_files_through_direct_descriptors() {
    let dir = ext4_dir();
    let n = 200;
    for i in 0..n {
        write_file(dir.path(), &format!("d/f{i}"), &pattern(i as u64, 1000 + i * 50));
    }
    let config = UringConfig::default().with_register_files(true).with_queue_depth(16);
    let t = tier(dir.path(), config);
    let mut batch = ReadBatch::new();
    for i in 0..n {
        batch.push(&format!("d/f{i}"), 0, 1000 + i * 50, AlignedBuf::new(16 << 10, 4096).expect("buf"));
    }
    // Twice: slots are released by close and reused.
    for _ in 0..2 {
        batch = t.read_batch(batch).await;
        for (i, (key, e)) in batch.iter().enumerate() {
            assert_eq!(*e.result().expect("done").as_ref().unwrap_or_else(|err| panic!("{key}: {err}")), 1000 + i * 50);
            assert_eq!(e.buf().expect("buf").as_slice(), pattern(i as u64, 1000 + i * 50));
        }
        let mut again = ReadBatch::new();
        for (i, (_, bufs)) in batch.drain().map(|(k, _, _, b)| (k.to_string(), b)).enumerate() {
            again.push(&format!("d/f{i}"), 0, 1000 + i * 50, bufs.expect("buffer back"));
        }
        batch = again;
    }
    let s = t.stats();
    assert_eq!(s.fixed_file_reads, 2 * n as u64, "every read through a direct descriptor: {s:?}");
    assert_eq!(s.register_fallbacks, 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_and_free_space_come_from_the_filesystem() {
    let dir = ext4_dir();
    let t = tier(dir.path(), UringConfig::default());
    assert!(t.capabilities().durable, "ext4 keeps what was fsynced");
    let space = t.space().await.expect("space").expect("a file tier knows its space");
    assert!(space.free_bytes > 0 && space.free_bytes <= space.total_bytes, "{space:?}");
    let Ok(shm) = tempfile::Builder::new().prefix("uring").tempdir_in("/dev/shm") else {
        eprintln!("skipped the tmpfs half: no /dev/shm");
        return;
    };
    let t = tier(shm.path(), UringConfig::default());
    assert_eq!(t.filesystem(), "tmpfs");
    assert!(!t.capabilities().durable, "tmpfs loses everything at a power cut");
}

#[test]
fn tiers_are_named_after_what_and_where_they_are() {
    let (a, b) = (ext4_dir(), ext4_dir());
    let (ta, tb) = (tier(a.path(), UringConfig::default()), tier(b.path(), UringConfig::default()));
    assert_eq!(ta.name(), format!("uring:{}", a.path().display()));
    assert_ne!(ta.name(), tb.name(), "two tiers are told apart in errors and metrics");
}

/// One write and one read larger than a single SQE takes (1 GiB): split into several SQEs,
/// never truncated. 1.5 GiB of disk and about 3 GiB of memory, so only with
/// `RINGTIER_LARGE_IO=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_beyond_one_sqe_are_split_not_truncated() {
    if std::env::var_os("RINGTIER_LARGE_IO").is_none() {
        eprintln!("skipped: set RINGTIER_LARGE_IO=1 to write and read 1.5 GiB");
        return;
    }
    let dir = ext4_dir();
    let t = tier(dir.path(), UringConfig::default());
    let len = (3usize << 29) + 4096 + 123; // 1.5 GiB and an unaligned tail
    let mut buf = AlignedBuf::new(len.next_multiple_of(4096), 4096).expect("buffer");
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ (i >> 20) as u8).collect();
    buf.fill_from(&data).expect("fill");
    let mut w = t.create("big").await.expect("create");
    let (res, _buf) = w.write_at(0, buf).await;
    res.expect("write");
    w.commit().await.expect("commit");
    assert_eq!(std::fs::metadata(dir.path().join("big")).expect("stat").len(), len as u64);
    let back = AlignedBuf::new(len.next_multiple_of(4096) + 4096, 4096).expect("buffer");
    let (res, back) = t.read_at("big", 0, len, back).await;
    assert_eq!(res.expect("read"), len);
    assert!(back.as_slice() == &data[..], "the bytes read back differ");
    assert!(t.stats().resubmits >= 1, "the write took more than one SQE: {:?}", t.stats());
}
