//! Round trips through real tiers: the io_uring file tier (O_DIRECT on ext4), the thread-pool
//! engine, the memory tier; sharded models; hostile files on disk.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ringtier_core::error::{ErrorKind, Result};
use ringtier_core::{AlignedBuf, MemoryTier, Tier};
use ringtier_safetensors::*;
use ringtier_uring::{open_dir_tier, DirTierOptions, Engine};

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

struct Owned {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// Tensors of every dtype and mixed sizes (some past a chunk, one empty, one scalar).
fn model() -> Vec<Owned> {
    let mut out = Vec::new();
    for (i, d) in Dtype::ALL.iter().enumerate() {
        let shape = if d.bits() < 8 { vec![3, 8] } else { vec![5, 7] };
        let n = d.byte_len(&shape).expect("size") as usize;
        out.push(Owned { name: format!("layer.{i}.{d}"), dtype: *d, shape, data: bytes(n, i as u8) });
    }
    out.push(Owned { name: "big.bf16".into(), dtype: Dtype::BF16, shape: vec![1500, 1024], data: bytes(3_072_000, 7) });
    out.push(Owned {
        name: "big.f32".into(),
        dtype: Dtype::F32,
        shape: vec![777, 1111],
        data: bytes(777 * 1111 * 4, 9),
    });
    out.push(Owned { name: "empty".into(), dtype: Dtype::F32, shape: vec![0, 4], data: vec![] });
    out.push(Owned { name: "scalar".into(), dtype: Dtype::I64, shape: vec![], data: bytes(8, 1) });
    out.push(Owned { name: "ünïcode name \"quoted\"\n".into(), dtype: Dtype::U8, shape: vec![3], data: bytes(3, 2) });
    out
}

fn refs(m: &[Owned]) -> Vec<TensorRef<'_>> {
    m.iter().map(|t| TensorRef { name: &t.name, dtype: t.dtype, shape: &t.shape, data: &t.data }).collect()
}

/// Lends windows of one `AlignedBuf` per file by copying: a stand-in for the Python package's
/// mapped regions, checking the protocol (prepare once, windows inside their span).
#[derive(Default)]
struct CopyTargets {
    spans: Mutex<Vec<Vec<u8>>>,
}

impl DataTargets for CopyTargets {
    fn prepare(&self, spans: &[u64], align: usize) -> Result<()> {
        assert!(align.is_power_of_two() && align >= 4096);
        *self.spans.lock().expect("lock") = spans.iter().map(|&n| vec![0; n as usize]).collect();
        Ok(())
    }
    fn window(&self, file: usize, offset: u64, len: usize, align: usize) -> Result<AlignedBuf> {
        assert_eq!(offset % align as u64, 0);
        assert!(offset as usize + len <= self.spans.lock().expect("lock")[file].len());
        AlignedBuf::new(len, align)
    }
}

fn check_all(m: &[Owned], header: &Header, data: &[u8]) {
    assert_eq!(header.len(), m.len());
    for t in m {
        let info = header.get(&t.name).expect("tensor");
        assert_eq!((info.dtype, &info.shape), (t.dtype, &t.shape));
        assert_eq!(&data[info.data_offsets.0 as usize..info.data_offsets.1 as usize], &t.data[..], "{}", t.name);
    }
}

async fn round_trip(tier: Arc<dyn Tier>) {
    let m = model();
    let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let saved =
        save(tier.as_ref(), "m.safetensors", &refs(&m), Some(&meta), &SaveOptions::default().with_chunk_bytes(1 << 20))
            .await
            .expect("save");
    let f = SafetensorsFile::open(Arc::clone(&tier), "m.safetensors").await.expect("open");
    assert_eq!(f.header().file_size(), saved.size);
    assert_eq!(f.header().metadata(), Some(&meta));
    // One aligned buffer, small chunks so that many are in flight.
    let opts = ReadOptions::default().with_chunk_bytes(64 << 10).with_depth(8);
    let all = f.read_all(&opts).await.expect("read_all");
    assert_eq!(all.as_ptr() as usize % 4096, 0);
    check_all(&m, f.header(), all.as_slice());
    // Chunks to a callback.
    let span = f.data_span(read_alignment(tier.as_ref()));
    let mut copy = vec![0u8; span.len as usize];
    read_chunks(std::slice::from_ref(&f), &opts, |i, at, b| {
        assert_eq!(i, 0);
        copy[at as usize..at as usize + b.len()].copy_from_slice(b);
        Ok(())
    })
    .await
    .expect("chunks");
    check_all(&m, f.header(), &copy[span.data_offset as usize..]);
    // Part of the file: one tensor's range, read by the aligned chunks covering it and no more.
    let t = &m[m.len() / 2];
    let info = f.header().get(&t.name).expect("tensor").clone();
    let align = read_alignment(tier.as_ref()) as u64;
    let (lo, hi) = (info.data_offsets.0 + span.data_offset, info.data_offsets.1 + span.data_offset);
    let mut seen = 0u64;
    let mut got = vec![0u8; t.data.len()];
    let wanted = [std::ops::Range { start: info.data_offsets.0, end: info.data_offsets.1 }];
    read_chunks_of(std::slice::from_ref(&f), &wanted, &opts, |_, at, b| {
        assert!(at >= lo / align * align && at + b.len() as u64 <= hi.div_ceil(align) * align, "{at}+{}", b.len());
        seen += b.len() as u64;
        let (from, to) = (lo.max(at), hi.min(at + b.len() as u64));
        if from < to {
            got[(from - lo) as usize..(to - lo) as usize].copy_from_slice(&b[(from - at) as usize..(to - at) as usize]);
        }
        Ok(())
    })
    .await
    .expect("chunks of");
    assert_eq!(got, t.data, "{}", t.name);
    assert_eq!(seen, (hi.div_ceil(align) * align).min(span.len) - lo / align * align);
    // Nothing wanted: nothing read.
    let nothing = [std::ops::Range { start: 5u64, end: 5 }];
    read_chunks_of(std::slice::from_ref(&f), &nothing, &opts, |_, _, _| panic!("read")).await.expect("empty");
    read_chunks_of(std::slice::from_ref(&f), &[], &opts, |_, _, _| panic!("read")).await.expect("none");
    // Targets.
    let targets = CopyTargets::default();
    let spans = read_into_targets(std::slice::from_ref(&f), &targets, &opts).await.expect("targets");
    assert_eq!(spans, vec![span]);
    // Lazy access.
    for t in &m {
        assert_eq!(f.read_tensor(&t.name).await.expect("tensor").as_slice(), &t.data[..]);
    }
    assert_eq!(f.read_tensor("nope").await.expect_err("missing").kind(), ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_io_uring_posix_and_memory() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for engine in [Engine::Auto, Engine::Posix] {
        let sub = dir.path().join(engine.as_str());
        let t = open_dir_tier(&sub, DirTierOptions::default().with_engine(engine).with_create(true)).expect("tier");
        round_trip(t.tier).await;
    }
    round_trip(Arc::new(MemoryTier::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_write_the_same_bytes_and_the_same_as_a_plain_encoder() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let m = model();
    let mut files = Vec::new();
    for engine in [Engine::Auto, Engine::Posix] {
        let sub = dir.path().join(engine.as_str());
        let t = open_dir_tier(&sub, DirTierOptions::default().with_engine(engine).with_create(true)).expect("tier");
        save(t.tier.as_ref(), "a.safetensors", &refs(&m), None, &SaveOptions::default()).await.expect("save");
        files.push(std::fs::read(sub.join("a.safetensors")).expect("read"));
    }
    assert_eq!(files[0], files[1]);
    // The same bytes as header + data in the layout's order.
    let specs: Vec<TensorSpec> = m
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            byte_len: t.data.len() as u64,
        })
        .collect();
    let layout = Layout::plan(&specs, None).expect("plan");
    let mut want = layout.prefix.clone();
    for &i in &layout.order {
        want.extend_from_slice(&m[i].data);
    }
    assert_eq!(files[0], want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_save_and_load() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let t = open_dir_tier(dir.path(), DirTierOptions::default().with_create(true)).expect("tier").tier;
    let m = model();
    let saved = save_sharded(t.as_ref(), "sub/", "model", &refs(&m), None, 3 << 20, &SaveOptions::default())
        .await
        .expect("save");
    assert!(saved.files.len() >= 2, "{saved:?}");
    assert_eq!(saved.index.as_deref(), Some("sub/model.safetensors.index.json"));
    assert_eq!(saved.total_size, m.iter().map(|t| t.data.len() as u64).sum::<u64>());
    let model = Model::open(Arc::clone(&t), "sub/model.safetensors.index.json").await.expect("open");
    assert_eq!(model.files.len(), saved.files.len());
    assert_eq!(model.len(), m.len());
    let targets = CopyTargets::default();
    read_into_targets(&model.files, &targets, &ReadOptions::default()).await.expect("targets");
    for (i, f) in model.files.iter().enumerate() {
        let data = f.read_all(&ReadOptions::default()).await.expect("read");
        for ti in f.header().tensors() {
            let want = &m.iter().find(|o| o.name == ti.name).expect("known").data;
            assert_eq!(&data.as_slice()[ti.data_offsets.0 as usize..ti.data_offsets.1 as usize], &want[..]);
            assert_eq!(model.find(&ti.name).map(|(j, _)| j), Some(i));
        }
    }
    // One shard only: no index, `model.safetensors`.
    let one =
        save_sharded(t.as_ref(), "", "model", &refs(&m), None, u64::MAX, &SaveOptions::default()).await.expect("one");
    assert_eq!((one.files, one.index), (vec!["model.safetensors".to_string()], None));
    // An index naming a tensor its shard lacks.
    let idx =
        ShardIndex { total_size: None, weight_map: [("ghost".to_string(), "model.safetensors".to_string())].into() };
    ringtier_core::ops::put(t.as_ref(), "bad.index.json", &idx.to_json(), 1 << 20).await.expect("put");
    let e = Model::open(Arc::clone(&t), "bad.index.json").await.expect_err("ghost");
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_files_are_corrupt_errors_before_large_reads() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let t = open_dir_tier(dir.path(), DirTierOptions::default()).expect("tier").tier;
    let put = |name: &str, b: Vec<u8>| std::fs::write(dir.path().join(name), b).expect("write");
    let mut claim = 100_000_000u64.to_le_bytes().to_vec();
    claim.extend_from_slice(b"{}");
    put("claim", claim);
    let mut past = 4096u64.to_le_bytes().to_vec();
    past.extend_from_slice(&[b' '; 100]);
    put("past", past);
    put("tiny", vec![1, 2, 3]);
    let json = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut trunc = (json.len() as u64).to_le_bytes().to_vec();
    trunc.extend_from_slice(json);
    trunc.extend_from_slice(&[0; 4]);
    put("truncated", trunc);
    // A header larger than the first read (256 KiB) that parses: read a second time.
    let meta: BTreeMap<String, String> = [("pad".to_string(), "x".repeat(400_000))].into();
    let data = bytes(16, 0);
    let shape = [4u64];
    let big = [TensorRef { name: "a", dtype: Dtype::F32, shape: &shape, data: &data }];
    save(t.as_ref(), "bighead", &big, Some(&meta), &SaveOptions::default()).await.expect("save");
    for name in ["claim", "past", "tiny", "truncated"] {
        let e = SafetensorsFile::open(Arc::clone(&t), name).await.expect_err(name);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{name}: {e}");
        assert_eq!(e.key(), Some(name), "{e}");
    }
    let f = SafetensorsFile::open(Arc::clone(&t), "bighead").await.expect("large header");
    assert_eq!(f.read_tensor("a").await.expect("a").as_slice(), &data[..]);
}
