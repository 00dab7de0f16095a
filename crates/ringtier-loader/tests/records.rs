//! Sharded record datasets (TFRecord, WebDataset tar) through the io_uring tier on ext4:
//! every record exactly once per epoch across ranks and workers, a seeded order, resume
//! mid-epoch, bad records named by shard and byte offset or skipped and counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringtier_core::{ErrorKind, Tier};
use ringtier_dataset::OnBadSample;
use ringtier_loader::records::{
    list_shards, list_shards_with, write_tar_end, write_tar_member, write_tfrecord, Record, RecordConfig, RecordFormat,
    RecordLoader,
};
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier};

/// TFRecord shards of varied sizes; some records are larger than the read size, so they span
/// several requests. Returns (dir, payload by (shard key, offset)).
fn tfrecord_shards() -> (tempfile::TempDir, BTreeMap<(String, u64), Vec<u8>>) {
    let dir = tempfile::Builder::new().prefix("records").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut all = BTreeMap::new();
    let mut n = 0u64;
    for s in 0..7 {
        let key = format!("train-{s:05}-of-00007.tfrecord");
        let mut bytes = Vec::new();
        for r in 0..(5 + s * 9) {
            let len = if r % 11 == 3 { 200_000 + r * 13 } else { 100 + (r * 977) % 9000 };
            let data = pattern(n, len);
            n += 1;
            all.insert((key.clone(), bytes.len() as u64), data.clone());
            write_tfrecord(&mut bytes, &data);
        }
        std::fs::write(dir.path().join(&key), &bytes).expect("write");
    }
    (dir, all)
}

fn cfg() -> RecordConfig {
    RecordConfig::default().with_read_size(64 << 10).with_depth(4).with_shuffle_buffer(16).with_seed(5)
}

async fn collect(loader: &RecordLoader, epoch: u64, position: u64) -> Vec<Record> {
    let mut e = loader.epoch(epoch, position);
    let mut out = Vec::new();
    while let Some(r) = e.next().await {
        out.push(r.expect("record"));
    }
    out
}

async fn uring(
    dir: &std::path::Path,
) -> (Arc<dyn Tier>, Vec<ringtier_loader::records::Shard>, Vec<ringtier_loader::records::Shard>) {
    let tier: Arc<dyn Tier> = Arc::new(UringTier::new(dir, UringConfig::default()).expect("tier"));
    let tf = list_shards(tier.as_ref(), RecordFormat::TfRecord).await.unwrap_or_default();
    let wds = list_shards(tier.as_ref(), RecordFormat::WebDataset).await.unwrap_or_default();
    (tier, tf, wds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_once_per_epoch_across_ranks_and_workers() {
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    assert_eq!(shards.len(), 7);
    let (world, workers) = (2, 3);
    for epoch in [0, 1] {
        let mut seen = BTreeMap::new();
        for rank in 0..world {
            for worker in 0..workers {
                let c = cfg().with_rank(rank).with_world(world).with_worker(worker).with_workers(workers);
                let loader =
                    RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c).expect("loader");
                assert_eq!(loader.pool_bytes(), 2 * 4 * ((64 << 10) + 4096), "pool = 2 x depth x read size");
                for r in collect(&loader, epoch, 0).await {
                    let k = (shards[r.shard].key.clone(), r.offset);
                    assert!(seen.insert(k, r.fields[0].data.clone()).is_none(), "a record read twice");
                }
            }
        }
        assert_eq!(seen, all, "epoch {epoch}: every record, once, intact");
    }
    // One reader: seeded and deterministic, another order the next epoch, shuffled across
    // shard boundaries by the buffer.
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, cfg()).expect("loader");
    let order = |v: &[Record]| v.iter().map(|r| (r.shard, r.offset)).collect::<Vec<_>>();
    let a = order(&collect(&loader, 3, 0).await);
    assert_eq!(a, order(&collect(&loader, 3, 0).await));
    assert_ne!(a, order(&collect(&loader, 4, 0).await));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_ne!(a, sorted, "shuffled");
    // Resume mid-epoch: exactly the rest.
    let rest = order(&collect(&loader, 3, 40).await);
    assert_eq!(rest, a[40..]);
    let mut e = loader.epoch(3, 40);
    let _ = e.next().await;
    assert_eq!(e.position(), 41, "the position to save");
}

/// Streams an epoch with a consumer slower than the reads (so every stage fills); returns
/// the records (checked against `all`) and the loader's count of the bytes it held at most.
async fn held_peak(loader: &RecordLoader, all: &BTreeMap<(String, u64), Vec<u8>>) -> u64 {
    let mut e = loader.epoch(0, 0);
    let mut seen = BTreeMap::new();
    while let Some(r) = e.next().await {
        let r = r.expect("record");
        if seen.len() % 8 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        seen.insert((loader.shards()[r.shard].key.clone(), r.offset), r.fields[0].data.clone());
    }
    assert_eq!(&seen, all, "every record, once, intact");
    assert_eq!(e.held().now, 0, "nothing held after the epoch");
    e.held().peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_bytes_held_stay_within_the_configured_bound() {
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    let total: usize = all.values().map(Vec::len).sum();
    let max = all.values().map(Vec::len).max().expect("records");
    // Count bounds that would hold the whole set (~5 MB); byte bounds far below it.
    let by_count = cfg().with_shuffle_buffer(10_000).with_prefetch(10_000);
    let bounded = by_count.clone().with_shuffle_bytes(400_000).with_prefetch_bytes(100_000);
    let bound = bounded.held_bound(max).expect("byte bounds on");
    assert!(bound < total / 2, "the bound {bound} is well below the set's {total} bytes");
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, bounded).expect("loader");
    let peak = held_peak(&loader, &all).await as usize;
    assert!(peak <= bound, "held {peak} bytes at most, bound {bound}");
    assert!(peak >= 400_000 - max, "the shuffle buffer filled to its byte bound ({peak})");
    // Without byte bounds the same epoch holds (nearly) the whole set: the bound is what keeps
    // it down.
    let unbounded = by_count.with_shuffle_bytes(0).with_prefetch_bytes(0);
    assert_eq!(unbounded.held_bound(max), None);
    let loader =
        RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, unbounded).expect("loader");
    let peak = held_peak(&loader, &all).await as usize;
    assert!(peak > bound, "unbounded, {peak} bytes held");
    // The defaults bound the bytes too, and the global order's prefetch queue alike.
    let d = RecordConfig::default();
    assert_eq!((d.shuffle_bytes, d.prefetch_bytes), (64 << 20, 16 << 20));
    let global = cfg().with_prefetch(10_000).with_prefetch_bytes(100_000).with_read_size(256 << 10);
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, global).expect("loader");
    let mut indexes = Vec::new();
    for i in 0..shards.len() {
        indexes.push(loader.build_index(i).await.expect("index"));
    }
    let mut e = loader.global_epoch(Arc::new(indexes), 0, 0).expect("global");
    let mut n = 0;
    while let Some(r) = e.next().await {
        r.expect("record");
        n += 1;
        if n % 8 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    assert_eq!(n, all.len());
    // The queue's bytes (or one record larger than that), and the record waiting to enter it.
    assert!(e.held().peak as usize <= 100_000.max(max) + max, "global order held {} bytes", e.held().peak);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_named_or_skipped_and_counted() {
    let (dir, all) = tfrecord_shards();
    // Flip a data byte of the second record of shard 3.
    let key = "train-00003-of-00007.tfrecord";
    let second = all.keys().filter(|(k, _)| k == key).nth(1).expect("second").1;
    let path = dir.path().join(key);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[second as usize + 20] ^= 1;
    std::fs::write(&path, &bytes).expect("write");
    let (tier, shards, _) = uring(dir.path()).await;
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, cfg()).expect("loader");
    let mut e = loader.epoch(0, 0);
    let err = loop {
        match e.next().await.expect("an error before the end") {
            Ok(_) => continue,
            Err(err) => break err,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let msg = err.to_string();
    assert!(msg.contains(key) && msg.contains(&format!("byte offset {second}")) && msg.contains("CRC"), "{msg}");
    let skip = cfg().with_on_bad(OnBadSample::Skip);
    let loader = RecordLoader::new(tier, shards, RecordFormat::TfRecord, skip).expect("loader");
    let mut e = loader.epoch(0, 0);
    let mut n = 0;
    while let Some(r) = e.next().await {
        r.expect("skip mode goes on");
        n += 1;
    }
    assert_eq!((n, e.stats().skipped), (all.len() - 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdataset_shards_stream_whole_samples() {
    let dir = tempfile::Builder::new().prefix("wds").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut want = BTreeMap::new();
    for s in 0..4 {
        let mut tar = Vec::new();
        for i in 0..(10 + s * 7) {
            let key = format!("s{s}/{i:06}");
            let jpg = pattern((s * 1000 + i) as u64, 500 + (i * 4099) % 150_000);
            write_tar_member(&mut tar, &format!("{key}.jpg"), &jpg);
            write_tar_member(&mut tar, &format!("{key}.cls"), format!("{i}").as_bytes());
            want.insert(key, (jpg, format!("{i}").into_bytes()));
        }
        write_tar_end(&mut tar);
        std::fs::write(dir.path().join(format!("shard-{s:04}.tar")), &tar).expect("write");
    }
    let (tier, _, shards) = uring(dir.path()).await;
    let loader = RecordLoader::new(tier, shards, RecordFormat::WebDataset, cfg()).expect("loader");
    let mut got = BTreeMap::new();
    for r in collect(&loader, 0, 0).await {
        let v = (r.field("jpg").expect("jpg").to_vec(), r.field("cls").expect("cls").to_vec());
        assert!(got.insert(r.key.clone(), v).is_none());
    }
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shuffle_through_indexes_reads_every_record_once_in_random_order() {
    use ringtier_loader::records::RecordIndex;
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    let c = cfg().with_read_size(256 << 10);
    let loader =
        RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c.clone()).expect("loader");
    let mut indexes = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        let idx = loader.build_index(i).await.expect("index");
        let want: Vec<u64> = all.keys().filter(|(k, _)| k == &s.key).map(|(_, o)| *o).collect();
        assert_eq!(idx.entries.iter().map(|e| e.0).collect::<Vec<_>>(), want);
        // Through the text format (DALI's tfrecord2idx).
        indexes.push(RecordIndex::parse(&idx.to_text(), &s.key, s.size).expect("parse"));
    }
    let indexes = Arc::new(indexes);
    let mut seen = BTreeMap::new();
    let mut orders = Vec::new();
    for rank in 0..2 {
        let l = RecordLoader::new(
            Arc::clone(&tier),
            shards.clone(),
            RecordFormat::TfRecord,
            c.clone().with_rank(rank).with_world(2),
        )
        .expect("loader");
        let mut e = l.global_epoch(Arc::clone(&indexes), 1, 0).expect("epoch");
        let mut order = Vec::new();
        while let Some(r) = e.next().await {
            let r = r.expect("record");
            order.push(r.shard);
            assert!(seen.insert((shards[r.shard].key.clone(), r.offset), r.fields[0].data.clone()).is_none());
        }
        orders.push(order);
    }
    assert_eq!(seen, all, "every record once, intact");
    // Fully random across shards: the shard changes from one record to the next most of the time.
    let switches = orders[0].windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches * 10 > orders[0].len() * 6, "{switches} of {}", orders[0].len());
    // Resume without re-reading: the rest of the same order.
    let full: Vec<_> = {
        let mut e = loader.global_epoch(Arc::clone(&indexes), 2, 0).expect("epoch");
        let mut v = Vec::new();
        while let Some(r) = e.next().await {
            let r = r.expect("record");
            v.push((r.shard, r.offset));
        }
        v
    };
    let mut e = loader.global_epoch(Arc::clone(&indexes), 2, 30).expect("epoch");
    let mut rest = Vec::new();
    while let Some(r) = e.next().await {
        let r = r.expect("record");
        rest.push((r.shard, r.offset));
    }
    assert_eq!(rest, full[30..]);
    // An index that does not match its shard: named, with the shard and byte offset.
    let mut bad = (*indexes).clone();
    let (o, l) = bad[2].entries[1];
    bad[2].entries[1] = (o + 4, l);
    let mut e = loader.global_epoch(Arc::new(bad), 0, 0).expect("epoch");
    let err = loop {
        match e.next().await.expect("an error") {
            Ok(_) => continue,
            Err(err) => break err,
        }
    };
    let msg = err.to_string();
    assert!(msg.contains(&shards[2].key) && msg.contains("does not match"), "{msg}");
    assert!(msg.contains(&format!("byte offset {}", o + 4)), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdataset_indexes_span_whole_samples() {
    let dir = tempfile::Builder::new().prefix("wdsidx").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut n = 0;
    for s in 0..3 {
        let mut tar = Vec::new();
        for i in 0..(5 + s * 4) {
            write_tar_member(&mut tar, &format!("k{s}_{i}.jpg"), &pattern(i as u64, 100 + i * 3001));
            write_tar_member(&mut tar, &format!("k{s}_{i}.cls"), b"7");
            n += 1;
        }
        write_tar_end(&mut tar);
        std::fs::write(dir.path().join(format!("s{s}.tar")), &tar).expect("write");
    }
    let (tier, _, shards) = uring(dir.path()).await;
    let loader = RecordLoader::new(tier, shards.clone(), RecordFormat::WebDataset, cfg()).expect("loader");
    let mut idx = Vec::new();
    for i in 0..shards.len() {
        idx.push(loader.build_index(i).await.expect("index"));
    }
    let mut e = loader.global_epoch(Arc::new(idx), 0, 0).expect("epoch");
    let mut keys = std::collections::BTreeSet::new();
    while let Some(r) = e.next().await {
        let r = r.expect("sample");
        assert_eq!(r.field("cls"), Some(&b"7"[..]));
        assert!(keys.insert(r.key));
    }
    assert_eq!(keys.len(), n);
}

/// The first error of an epoch (records before it are dropped).
async fn first_error(loader: &RecordLoader) -> ringtier_core::Error {
    let mut e = loader.epoch(0, 0);
    loop {
        match e.next().await.expect("an error before the end") {
            Ok(_) => continue,
            Err(err) => return err,
        }
    }
}

/// Records delivered and skipped in a skipping epoch.
async fn skipping(loader: &RecordLoader) -> (usize, u64) {
    let mut e = loader.epoch(0, 0);
    let mut n = 0;
    while let Some(r) = e.next().await {
        r.expect("skip mode goes on");
        n += 1;
    }
    (n, e.stats().skipped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_records_and_corrupt_tar_headers_name_shard_and_offset() {
    // A TFRecord shard cut 3 bytes into its last record's footer: the error names the shard
    // and the last record's offset; skipping loses that record alone.
    let (dir, all) = tfrecord_shards();
    let key = "train-00004-of-00007.tfrecord";
    let last = all.keys().filter(|(k, _)| k == key).map(|(_, o)| *o).max().expect("last");
    let path = dir.path().join(key);
    let len = std::fs::metadata(&path).expect("stat").len();
    std::fs::OpenOptions::new().write(true).open(&path).expect("open").set_len(len - 3).expect("truncate");
    let (tier, shards, _) = uring(dir.path()).await;
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, cfg()).expect("loader");
    let err = first_error(&loader).await;
    let msg = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(msg.contains(key) && msg.contains(&format!("byte offset {last}")) && msg.contains("truncated"), "{msg}");
    let loader =
        RecordLoader::new(tier, shards, RecordFormat::TfRecord, cfg().with_on_bad(OnBadSample::Skip)).expect("loader");
    assert_eq!(skipping(&loader).await, (all.len() - 1, 1));

    // WebDataset: a corrupt header in one shard (named with the header's offset; skipping
    // drops the rest of that shard, counted once), a shard cut inside a member (named with the
    // member's header offset).
    let dir = tempfile::Builder::new().prefix("wdsbad").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut headers = Vec::new();
    for s in 0..3 {
        let mut tar = Vec::new();
        let mut h = Vec::new();
        for i in 0..8 {
            h.push(tar.len() as u64);
            write_tar_member(&mut tar, &format!("s{s}/{i:03}.jpg"), &pattern(i, 3000 + (i as usize) * 777));
            h.push(tar.len() as u64);
            write_tar_member(&mut tar, &format!("s{s}/{i:03}.cls"), b"1");
        }
        write_tar_end(&mut tar);
        std::fs::write(dir.path().join(format!("shard-{s}.tar")), &tar).expect("write");
        headers.push(h);
    }
    // Shard 1: the header of sample 5's jpg (member 10) gets a flipped name byte.
    let bad = headers[1][10];
    let p1 = dir.path().join("shard-1.tar");
    let mut bytes = std::fs::read(&p1).expect("read");
    bytes[bad as usize + 3] ^= 0x20;
    std::fs::write(&p1, &bytes).expect("write");
    let (tier, _, shards) = uring(dir.path()).await;
    let one = |s: usize| shards.iter().position(|x| x.key == format!("shard-{s}.tar")).expect("shard");
    let only = |s: usize| vec![shards[one(s)].clone()];
    let loader = RecordLoader::new(Arc::clone(&tier), only(1), RecordFormat::WebDataset, cfg().with_shuffle_buffer(0))
        .expect("loader");
    let msg = first_error(&loader).await.to_string();
    assert!(
        msg.contains("shard-1.tar")
            && msg.contains(&format!("byte offset {bad}"))
            && msg.contains("corrupt tar header"),
        "{msg}"
    );
    let skip = cfg().with_shuffle_buffer(0).with_on_bad(OnBadSample::Skip);
    let loader =
        RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::WebDataset, skip.clone()).expect("loader");
    // Samples 0-3 of shard 1 come through (sample 4 may lack fields: not delivered), all of
    // shards 0 and 2.
    assert_eq!(skipping(&loader).await, (8 + 4 + 8, 1));
    // Shard 2 cut in the middle of sample 6's jpg data.
    let cut = headers[2][12] + 512 + 100;
    let p2 = dir.path().join("shard-2.tar");
    std::fs::OpenOptions::new().write(true).open(&p2).expect("open").set_len(cut).expect("truncate");
    let (tier, _, shards) = uring(dir.path()).await;
    let s2 = vec![shards.iter().find(|x| x.key == "shard-2.tar").expect("shard").clone()];
    let loader = RecordLoader::new(Arc::clone(&tier), s2.clone(), RecordFormat::WebDataset, cfg()).expect("loader");
    let msg = first_error(&loader).await.to_string();
    let member = headers[2][12];
    assert!(
        msg.contains("shard-2.tar") && msg.contains(&format!("byte offset {member}")) && msg.contains("truncated"),
        "{msg}"
    );
    let loader = RecordLoader::new(tier, s2, RecordFormat::WebDataset, skip).expect("loader");
    assert_eq!(skipping(&loader).await, (6, 1), "samples 0-5 whole, the cut one skipped");
}

/// Every batch of an epoch (`max_records`, `max_bytes`), each checked to pack into a buffer of
/// its exact size with offsets that give back each record's bytes.
async fn batches(
    e: &mut ringtier_loader::records::RecordEpoch,
    max_records: usize,
    max_bytes: u64,
) -> Vec<Vec<Record>> {
    let mut out = Vec::new();
    loop {
        let b = e.next_batch(max_records, max_bytes).await.expect("batch");
        if b.is_empty() {
            // The end stays the end.
            assert!(e.next_batch(max_records, max_bytes).await.expect("end").is_empty());
            return out;
        }
        let mut buf = vec![0xA5u8; b.packed_len(None) + 3];
        let offsets = b.pack_into(None, &mut buf).expect("pack");
        assert_eq!((offsets.len(), offsets[0], offsets[b.len()]), (b.len() + 1, 0, b.packed_len(None)));
        assert_eq!(&buf[b.packed_len(None)..], &[0xA5; 3], "nothing written past the batch");
        for (i, r) in b.records().iter().enumerate() {
            assert_eq!(&buf[offsets[i]..offsets[i + 1]], r.fields[0].data.as_slice());
        }
        assert_eq!(b.bytes(), b.records().iter().map(Record::bytes).sum::<u64>());
        out.push(b.into_records());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_split_an_epoch_into_every_record_once_in_the_same_order() {
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, cfg()).expect("loader");
    let order = |v: &[Record]| v.iter().map(|r| (r.shard, r.offset)).collect::<Vec<_>>();
    let one_by_one = order(&collect(&loader, 2, 0).await);
    for size in [1, 7, 64, 10_000] {
        let mut e = loader.epoch(2, 0);
        let got = batches(&mut e, size, 0).await;
        let (last, full) = got.split_last().expect("batches");
        assert!(full.iter().all(|b| b.len() == size) && !last.is_empty() && last.len() <= size, "size {size}");
        assert_eq!(order(&got.concat()), one_by_one, "batches of {size}: the record-by-record order");
        assert_eq!((e.position(), e.stats().records), (all.len() as u64, all.len() as u64));
        assert_eq!(e.held().now, 0);
    }
    // Batches and single records mixed; the position after a batch resumes the rest.
    let mut e = loader.epoch(2, 0);
    let first = e.next_batch(10, 0).await.expect("batch").into_records();
    let single = e.next().await.expect("a record").expect("record");
    let second = e.next_batch(10, 0).await.expect("batch").into_records();
    let mixed: Vec<Record> = first.into_iter().chain([single]).chain(second).collect();
    assert_eq!(order(&mixed), one_by_one[..21]);
    assert_eq!(e.position(), 21);
    drop(e); // one epoch of a loader at a time: they share its read pool
    let mut rest = loader.epoch(2, 21);
    assert_eq!(order(&batches(&mut rest, 16, 0).await.concat()), one_by_one[21..]);
    // Across ranks and workers: every record once.
    let mut seen = BTreeMap::new();
    for reader in 0..4 {
        let c = cfg().with_rank(reader / 2).with_world(2).with_worker(reader % 2).with_workers(2);
        let l = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c).expect("loader");
        for r in batches(&mut l.epoch(1, 0), 5, 0).await.concat() {
            assert!(seen.insert((shards[r.shard].key.clone(), r.offset), r.fields[0].data.clone()).is_none());
        }
    }
    assert_eq!(seen, all, "every record once, intact");
    // A global order (through indexes): the same records in batches, and a resume after one.
    let c = cfg().with_read_size(256 << 10);
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c).expect("loader");
    let mut indexes = Vec::new();
    for i in 0..shards.len() {
        indexes.push(loader.build_index(i).await.expect("index"));
    }
    let indexes = Arc::new(indexes);
    let mut e = loader.global_epoch(Arc::clone(&indexes), 1, 0).expect("epoch");
    let mut one_by_one = Vec::new();
    while let Some(r) = e.next().await {
        one_by_one.push(r.expect("record"));
    }
    drop(e);
    let one_by_one = order(&one_by_one);
    let mut e = loader.global_epoch(Arc::clone(&indexes), 1, 0).expect("epoch");
    assert_eq!(order(&batches(&mut e, 13, 0).await.concat()), one_by_one);
    drop(e);
    let mut e = loader.global_epoch(Arc::clone(&indexes), 1, 26).expect("epoch");
    assert_eq!(order(&batches(&mut e, 13, 0).await.concat()), one_by_one[26..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_the_byte_bound_or_the_buffer_is_never_cut() {
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, cfg()).expect("loader");
    let max = all.values().map(Vec::len).max().expect("records") as u64;
    let bound = 50_000u64;
    assert!(max > 3 * bound, "records of {max} bytes, far over the bound");
    let got = batches(&mut loader.epoch(0, 0), 1000, bound).await;
    for b in &got {
        let bytes: u64 = b.iter().map(Record::bytes).sum();
        let (before, last) = (bytes - b[b.len() - 1].bytes(), b[b.len() - 1].bytes());
        assert!(before < bound, "the batch closes at the record that reaches the bound");
        assert!(bytes >= bound || std::ptr::eq(b, &got[got.len() - 1]), "only the last batch ends short");
        assert!(last <= max);
    }
    assert!(got.iter().any(|b| b.len() == 1 && b[0].bytes() > bound), "a large record alone in its batch");
    let mut seen = BTreeMap::new();
    for r in got.concat() {
        assert!(seen.insert((shards[r.shard].key.clone(), r.offset), r.fields[0].data.clone()).is_none());
    }
    assert_eq!(seen, all);
    // A buffer smaller than the batch: refused, nothing written, the batch still whole.
    let mut e = loader.epoch(0, 0);
    let b = e.next_batch(40, 0).await.expect("batch");
    let need = b.packed_len(None);
    let mut small = vec![7u8; need - 1];
    let err = b.pack_into(None, &mut small).expect_err("too small");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains(&format!("{need} bytes")), "{err}");
    assert!(small.iter().all(|&x| x == 7), "nothing written");
    let mut exact = vec![0u8; need];
    let offsets = b.pack_into(None, &mut exact).expect("fits");
    assert_eq!(offsets[40], need);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_count_skipped_records_and_end_before_an_error() {
    let (dir, all) = tfrecord_shards();
    let key = "train-00003-of-00007.tfrecord";
    let second = all.keys().filter(|(k, _)| k == key).nth(1).expect("second").1;
    let path = dir.path().join(key);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[second as usize + 20] ^= 1;
    std::fs::write(&path, &bytes).expect("write");
    let (tier, shards, _) = uring(dir.path()).await;
    let skip = cfg().with_on_bad(OnBadSample::Skip);
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, skip).expect("loader");
    let mut e = loader.epoch(0, 0);
    let got = batches(&mut e, 9, 0).await.concat();
    assert_eq!((got.len(), e.stats().skipped, e.position()), (all.len() - 1, 1, all.len() as u64 - 1));
    assert!(!got.iter().any(|r| shards[r.shard].key == key && r.offset == second), "the bad record left out");
    // Failing: the batch holding the records before the error ends there, the error comes
    // with the next call, and those records are delivered (the position counts them).
    let loader = RecordLoader::new(tier, shards, RecordFormat::TfRecord, cfg()).expect("loader");
    let mut before = 0;
    {
        let mut e = loader.epoch(0, 0);
        while let Some(r) = e.next().await {
            if r.is_err() {
                break;
            }
            before += 1;
        }
    }
    let mut e = loader.epoch(0, 0);
    let mut delivered = 0;
    let err = loop {
        match e.next_batch(1000, 0).await {
            Ok(b) => {
                assert!(!b.is_empty(), "an error before the end");
                delivered += b.len();
            }
            Err(err) => break err,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains(&format!("byte offset {second}")), "{err}");
    assert_eq!((delivered, e.position()), (before, before as u64), "the records before the error, delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_empty_shards_and_webdataset_fields() {
    // Shards with no records among others, and a set of empty shards alone.
    let (dir, all) = tfrecord_shards();
    for s in 0..3 {
        std::fs::write(dir.path().join(format!("empty-{s}.tfrecord")), b"").expect("write");
    }
    let (tier, shards, _) = uring(dir.path()).await;
    assert_eq!(shards.len(), 10);
    let mut seen = BTreeMap::new();
    for worker in 0..3 {
        let c = cfg().with_worker(worker).with_workers(3);
        let l = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c).expect("loader");
        for r in batches(&mut l.epoch(0, 0), 8, 0).await.concat() {
            assert!(seen.insert((shards[r.shard].key.clone(), r.offset), r.fields[0].data.clone()).is_none());
        }
    }
    assert_eq!(seen, all);
    let empty: Vec<_> = shards.iter().filter(|s| s.size == 0).cloned().collect();
    let l = RecordLoader::new(Arc::clone(&tier), empty, RecordFormat::TfRecord, cfg()).expect("loader");
    let mut e = l.epoch(0, 0);
    assert!(e.next_batch(8, 0).await.expect("end").is_empty());
    assert_eq!((e.position(), e.stats()), (0, Default::default()));

    // WebDataset: a field of every sample packed per name; a sample without `cls` takes no
    // bytes of that column.
    let dir = tempfile::Builder::new().prefix("wdsbatch").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut tar = Vec::new();
    let mut want = BTreeMap::new();
    for i in 0..30u64 {
        let key = format!("k{i:03}");
        let jpg = pattern(i, 100 + (i as usize * 571) % 4000);
        write_tar_member(&mut tar, &format!("{key}.jpg"), &jpg);
        let cls = (i % 4 != 1).then(|| format!("{i}").into_bytes());
        if let Some(c) = &cls {
            write_tar_member(&mut tar, &format!("{key}.cls"), c);
        }
        want.insert(key, (jpg, cls.unwrap_or_default()));
    }
    write_tar_end(&mut tar);
    std::fs::write(dir.path().join("s.tar"), &tar).expect("write");
    let (tier, _, shards) = uring(dir.path()).await;
    let loader = RecordLoader::new(tier, shards, RecordFormat::WebDataset, cfg()).expect("loader");
    let mut e = loader.epoch(0, 0);
    let mut got = BTreeMap::new();
    loop {
        let b = e.next_batch(7, 0).await.expect("batch");
        if b.is_empty() {
            break;
        }
        let mut names = b.field_names();
        names.sort_unstable();
        assert_eq!(names, ["cls", "jpg"]);
        let mut cols = Vec::new();
        for name in ["jpg", "cls"] {
            let mut buf = vec![0u8; b.packed_len(Some(name))];
            let offsets = b.pack_into(Some(name), &mut buf).expect("pack");
            cols.push((buf, offsets));
        }
        for (i, r) in b.records().iter().enumerate() {
            let field = |c: usize| cols[c].0[cols[c].1[i]..cols[c].1[i + 1]].to_vec();
            assert!(got.insert(r.key.clone(), (field(0), field(1))).is_none());
        }
    }
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dangling_link_among_the_shards_is_named_or_left_out() {
    let (dir, _) = tfrecord_shards();
    std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("train-99999.tfrecord")).expect("symlink");
    // A dataset tier: links followed (what the Python RecordLoader opens).
    let options = ringtier_uring::DirTierOptions::default().with_follow_links(true);
    let tier = ringtier_uring::open_dir_tier(dir.path(), options).expect("tier").tier;
    let err = list_shards(tier.as_ref(), RecordFormat::TfRecord).await.expect_err("a dangling link fails the listing");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("train-99999.tfrecord"), "{err}");
    let (shards, skipped) =
        list_shards_with(tier.as_ref(), RecordFormat::TfRecord, true).await.expect("lenient listing");
    assert_eq!(shards.len(), 7);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].key, "train-99999.tfrecord");
    assert_eq!(skipped[0].error.kind(), ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_sharing_the_read_buffers_never_wait_on_each_other() {
    // One loader's epochs share its pool of 2 x depth read buffers. (1) An epoch taken from
    // once and then left alive (an iterator dropped while its epoch stays open) fills its
    // queue and keeps the buffers of its reads in flight: the next epoch, streamed or global,
    // still reads every record. (2) Two epochs taken from in turn, a record each (zip of two
    // iterators), both finish. Before, an epoch's oldest read could wait for a buffer that
    // another epoch's finished, unparsed read held, and a global epoch waited for `depth`
    // buffers at once: neither moved again.
    use ringtier_loader::records::{RecordEpoch, RecordIndex};
    let (dir, all) = tfrecord_shards();
    let (tier, shards, _) = uring(dir.path()).await;
    let c =
        cfg().with_read_size(256 << 10).with_depth(2).with_prefetch(2).with_prefetch_bytes(1).with_shuffle_buffer(0);
    let loader = RecordLoader::new(Arc::clone(&tier), shards.clone(), RecordFormat::TfRecord, c).expect("loader");
    let mut indexes = Vec::new();
    for i in 0..shards.len() {
        indexes.push(loader.build_index(i).await.expect("index"));
    }
    let indexes: Arc<Vec<RecordIndex>> = Arc::new(indexes);
    let limit = std::time::Duration::from_secs(60);
    async fn drain(mut e: RecordEpoch) -> usize {
        let mut n = 0;
        while let Some(r) = e.next().await {
            r.expect("record");
            n += 1;
        }
        n
    }
    for global_left in [false, true] {
        let mut left = if global_left {
            loader.global_epoch(Arc::clone(&indexes), 1, 0).expect("global")
        } else {
            loader.epoch(1, 0)
        };
        left.next().await.expect("a record").expect("record");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await; // its queue fills
        let streamed = tokio::time::timeout(limit, drain(loader.epoch(2, 0))).await.expect("the streamed epoch ended");
        assert_eq!(streamed, all.len());
        let global = loader.global_epoch(Arc::clone(&indexes), 2, 0).expect("global");
        assert_eq!(tokio::time::timeout(limit, drain(global)).await.expect("the global epoch ended"), all.len());
        drop(left);
    }
    for two_global in [false, true] {
        let mut a = loader.epoch(3, 0);
        let mut b = if two_global {
            loader.global_epoch(Arc::clone(&indexes), 3, 0).expect("global")
        } else {
            loader.epoch(4, 0)
        };
        let (mut na, mut nb) = (0, 0);
        tokio::time::timeout(limit, async {
            loop {
                let ra = a.next().await;
                let rb = b.next().await;
                na += usize::from(ra.is_some());
                nb += usize::from(rb.is_some());
                if ra.is_none() && rb.is_none() {
                    break;
                }
            }
        })
        .await
        .expect("both epochs ended");
        assert_eq!((na, nb), (all.len(), all.len()));
    }
}
