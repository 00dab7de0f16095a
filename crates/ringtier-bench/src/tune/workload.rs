//! What `tune` sweeps its configurations over (`--workload`):
//!
//! * `read`: the paper's read micro-benchmark, one cold shuffled pass over the files
//!   (`read::pass`); latency per read;
//! * `loader`: one cold epoch of the data loader (`ringtier_loader::Loader`, opened as
//!   `bench train` opens it, no compute), batches of raw samples in shuffled order; latency is
//!   each batch's wait, what a training step sees;
//! * `ckpt`: a checkpoint save (committed, fsynced) and a cold restore into memory through the
//!   checkpoint store (`ringtier_migrate`) on one io_uring tier over the directory; bandwidth
//!   is the round trip's (save bytes + restore bytes over both times), with save and restore
//!   apart as extra columns; a save is one operation, so there is no latency distribution.
//!
//! Every workload reads (and writes) through io_uring set up from the configuration's knobs:
//! the read micro-benchmark's [`reader`], the loader's and the store's tier by
//! [`uring_config`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtier_dataset::OnBadSample;
use ringtier_loader::LoaderConfig;
use ringtier_migrate::{BufferSink, CheckpointStore, Part, RestoreOptions, StoreConfig};
use ringtier_uring::{DirectIoPolicy, UringConfig};
use serde::Serialize;

use super::space::Config;
use super::trace::Tracer;
use crate::dataset::Dataset;
use crate::harness::{files_under, Cold, Meter, Rng, GIB};
use crate::read::pass::{order_of, quantile, Engine, Knobs, Order, PassResult, Reader};

/// The workload of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Workload {
    /// The paper's read micro-benchmark: one cold shuffled pass, each file read whole.
    Read,
    /// One cold loader epoch: shuffled batches of raw samples.
    Loader,
    /// A checkpoint save, then a cold restore into memory.
    Ckpt,
}

impl Workload {
    /// What the latency columns measure.
    pub(crate) fn latency_meaning(self) -> &'static str {
        match self {
            Workload::Read => "per read (submission to completion)",
            Workload::Loader => "per batch, the consumer's wait for it",
            Workload::Ckpt => "none (a save and a restore are one operation each)",
        }
    }

    /// What the IOPS column counts.
    pub(crate) fn ops_meaning(self) -> &'static str {
        match self {
            Workload::Read => "reads per second",
            Workload::Loader => "samples per second",
            Workload::Ckpt => "store requests per second (chunk writes + chunk reads)",
        }
    }
}

/// One measured pass of a workload at one configuration.
#[derive(Debug, Clone)]
pub(crate) struct WorkloadPass {
    /// Bytes moved (read, or written and read).
    pub(crate) bytes: u64,
    /// Requests (reads; samples; chunk writes and reads).
    pub(crate) ops: u64,
    pub(crate) wall_seconds: f64,
    /// User + system CPU seconds of the whole process during the pass.
    pub(crate) cpu_seconds: f64,
    /// Latency quantiles, milliseconds (NaN where the workload has no distribution).
    pub(crate) latency_p50_ms: f64,
    pub(crate) latency_p99_ms: f64,
    pub(crate) latency_p999_ms: f64,
    /// Latency at the quantiles 0, 0.01, ..., 1 (empty where none).
    pub(crate) latency_cdf_ms: Vec<f64>,
    /// Workload-specific figures (a column each).
    pub(crate) extra: Vec<(&'static str, f64)>,
}

impl WorkloadPass {
    pub(crate) fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.wall_seconds / 1e6
    }

    pub(crate) fn iops(&self) -> f64 {
        self.ops as f64 / self.wall_seconds
    }

    pub(crate) fn cpu_seconds_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / GIB)
    }

    fn with_latencies(mut self, mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        self.latency_p50_ms = quantile(&ms, 0.50);
        self.latency_p99_ms = quantile(&ms, 0.99);
        self.latency_p999_ms = quantile(&ms, 0.999);
        self.latency_cdf_ms =
            if ms.is_empty() { Vec::new() } else { (0..=100).map(|q| quantile(&ms, f64::from(q) / 100.0)).collect() };
        self
    }
}

impl From<PassResult> for WorkloadPass {
    fn from(r: PassResult) -> Self {
        WorkloadPass {
            bytes: r.bytes,
            ops: r.reads,
            wall_seconds: r.wall_seconds,
            cpu_seconds: r.cpu_seconds,
            latency_p50_ms: r.latency_p50_ms,
            latency_p99_ms: r.latency_p99_ms,
            latency_p999_ms: r.latency_p999_ms,
            latency_cdf_ms: r.latency_cdf_ms,
            extra: Vec::new(),
        }
    }
}

/// The io_uring set-up of a configuration (every knob of the `uring` layer but `io` =
/// buffered on a file system without direct I/O, which the caller passes as `direct_ok`).
pub(crate) fn uring_config(c: &Config, direct_ok: bool) -> UringConfig {
    let direct = c.get("io") != Some("buffered") && direct_ok;
    UringConfig::default()
        .with_queue_depth(c.num("depth").max(1) as u32)
        .with_rings(c.num("rings").max(1) as usize)
        .with_sqpoll_idle_ms(c.sqpoll())
        .with_coop_taskrun(c.flag("coop_taskrun"))
        .with_defer_taskrun(c.flag("defer_taskrun"))
        .with_register_buffers(c.flag("register_buffers"))
        .with_register_files(c.flag("register_files"))
        .with_max_read_bytes(u32::try_from(c.num("read_size")).unwrap_or(u32::MAX))
        .with_direct_io(if direct { DirectIoPolicy::Auto } else { DirectIoPolicy::Off })
}

/// The read micro-benchmark's engine at a configuration: io_uring, buffered where `io` =
/// buffered or where the file system has no direct I/O (`direct_ok` false).
pub(crate) fn read_engine(c: &Config, direct_ok: bool) -> Engine {
    if c.get("io") == Some("buffered") || !direct_ok {
        Engine::UringBuffered
    } else {
        Engine::UringDirect
    }
}

/// The read micro-benchmark's engine knobs at a configuration.
pub(crate) fn read_knobs(c: &Config) -> Knobs {
    Knobs {
        read_size: c.num("read_size") as usize,
        sqpoll: c.sqpoll().is_some(),
        sqpoll_idle_ms: c.sqpoll().unwrap_or(50),
        coop_taskrun: c.flag("coop_taskrun"),
        defer_taskrun: c.flag("defer_taskrun"),
        register_buffers: c.flag("register_buffers"),
        register_files: c.flag("register_files"),
        ..Knobs::default()
    }
}

/// The read micro-benchmark's reader over `ds`, set up with the configuration.
pub(crate) fn reader(c: &Config, ds: &Dataset, direct_ok: bool) -> Result<Reader> {
    Reader::new(
        read_engine(c, direct_ok),
        c.num("depth").max(1) as usize,
        c.num("rings").max(1) as usize,
        ds,
        read_knobs(c),
    )
}

/// One pass of the read workload at a configuration: the files of `ds` in a shuffled order
/// (from `seed`), each read whole; a tracer (if any) follows the reader's new threads. The
/// caller makes the files cold first.
pub(crate) fn read_pass(
    rt: &tokio::runtime::Runtime,
    ds: Option<&Dataset>,
    c: &Config,
    direct_ok: bool,
    seed: u64,
    tracer: Option<&Tracer>,
) -> Result<PassResult> {
    let ds = ds.context("the read workload needs a dataset")?;
    let reader = reader(c, ds, direct_ok).with_context(|| format!("setting up {c}"))?;
    if let Some(t) = tracer {
        t.follow_new_threads();
    }
    let order = order_of(ds, Order::Shuffled, seed)?;
    rt.block_on(reader.pass(ds, &order))
}

/// The loader workload's shape.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct LoaderShape {
    pub(crate) batch: usize,
    pub(crate) prefetch: usize,
}

/// One cold loader epoch over the dataset in `root` (a manifest there), no compute: the
/// loader opened with the configuration's io_uring set-up (outside the timing), then every
/// batch taken as fast as it comes.
pub(crate) fn loader_epoch(
    rt: &tokio::runtime::Runtime,
    root: &Path,
    c: &Config,
    direct_ok: bool,
    shape: LoaderShape,
    seed: u64,
) -> Result<WorkloadPass> {
    if shape.batch == 0 {
        bail!("--loader-batch must be at least 1");
    }
    let lcfg = LoaderConfig::default()
        .with_batch_size(shape.batch)
        .with_prefetch(shape.prefetch)
        .with_seed(seed)
        .with_read_size(c.num("read_size") as usize)
        .with_on_bad(OnBadSample::Fail);
    rt.block_on(async {
        let loader =
            crate::train::open_loader(root, ringtier_uring::Engine::Uring, uring_config(c, direct_ok), lcfg).await?;
        let meter = Meter::start();
        let mut epoch = loader.epoch(0, 0)?;
        let mut waits = Vec::new();
        loop {
            let t = Instant::now();
            match epoch.next().await {
                Some(batch) => {
                    drop(batch.context("a loader batch")?);
                    waits.push(t.elapsed().as_secs_f64() * 1e3);
                }
                None => break,
            }
        }
        let usage = meter.stop();
        let st = epoch.stats();
        if st.skipped > 0 {
            bail!("the loader skipped {} samples", st.skipped);
        }
        Ok(WorkloadPass {
            bytes: st.bytes,
            ops: st.samples,
            wall_seconds: usage.wall_seconds,
            cpu_seconds: usage.cpu_seconds,
            latency_p50_ms: f64::NAN,
            latency_p99_ms: f64::NAN,
            latency_p999_ms: f64::NAN,
            latency_cdf_ms: Vec::new(),
            extra: vec![("batches", st.batches as f64)],
        }
        .with_latencies(waits))
    })
}

/// The checkpoint workload: its bytes (held in memory, as a model's are), the buffers a
/// restore fills (allocated and touched once), and the directory of the store.
pub(crate) struct CkptWorkload {
    dir: PathBuf,
    parts: Vec<(String, Vec<u8>)>,
    restored: Vec<Vec<u8>>,
}

impl CkptWorkload {
    /// `bytes` of seeded random data in `parts` parts, saved under `dir/ringtier-tune-ckpt`.
    pub(crate) fn new(dir: &Path, bytes: u64, parts: usize) -> Result<Self> {
        if bytes == 0 || parts == 0 || bytes < parts as u64 {
            bail!("--ckpt-size must be at least --ckpt-parts bytes, both positive");
        }
        let mut rng = Rng::new(29);
        let parts: Vec<(String, Vec<u8>)> = (0..parts as u64)
            .map(|i| {
                let n = bytes / parts as u64 + u64::from(i < bytes % parts as u64);
                let mut v = vec![0u8; n as usize];
                rng.fill(&mut v);
                (format!("part{i}"), v)
            })
            .collect();
        let restored = parts.iter().map(|(_, v)| vec![1u8; v.len()]).collect();
        Ok(CkptWorkload { dir: dir.join("ringtier-tune-ckpt"), parts, restored })
    }

    /// Where the store lives (removed by [`CkptWorkload::remove`]).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.parts.iter().map(|(_, v)| v.len() as u64).sum()
    }

    /// Its parts.
    pub(crate) fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Removes the store's directory.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// One pass: a fresh store (the directory emptied first, outside the timing), the save
    /// (returns once committed), every file of the store made cold, the restore into the
    /// buffers (checksums checked on the way) with the configuration's depth of reads in
    /// flight, and the restored bytes compared with the saved ones (outside the timing).
    pub(crate) fn pass(
        &mut self,
        rt: &tokio::runtime::Runtime,
        c: &Config,
        direct_ok: bool,
        cold: &Cold,
    ) -> Result<WorkloadPass> {
        self.remove();
        let store_cfg = StoreConfig::default().with_keep_last(1);
        let restore = RestoreOptions::default().with_depth(c.num("depth").max(1) as usize);
        let (write_chunk, read_chunk) = (store_cfg.chunk_bytes.max(1) as u64, restore.chunk_bytes.max(1) as u64);
        let tier = crate::tiers::uring_dir_tier(&self.dir, "fast", None, uring_config(c, direct_ok))?;
        let (parts, restored) = (&self.parts, &mut self.restored);
        let (save, load) = rt.block_on(async {
            let store = CheckpointStore::open(vec![tier], store_cfg).await?;
            let m = Meter::start();
            store.save(1, parts.iter().map(|(n, v)| Part::bytes(n.clone(), v)).collect()).await?;
            let save = m.stop();
            cold.pass(files_under(&self.dir)?)?;
            let bufs = parts.iter().map(|(n, _)| n.clone()).zip(restored.iter_mut().map(Vec::as_mut_slice)).collect();
            let m = Meter::start();
            store.restore(1, &mut BufferSink::new(bufs), &restore).await?;
            anyhow::Ok((save, m.stop()))
        })?;
        for ((name, saved), got) in self.parts.iter().zip(&self.restored) {
            if saved != got {
                bail!("checkpoint part {name} restored different bytes");
            }
        }
        let bytes = self.bytes();
        let ops: u64 = self.parts.iter().map(|(_, v)| (v.len() as u64).div_ceil(write_chunk)).sum::<u64>()
            + self.parts.iter().map(|(_, v)| (v.len() as u64).div_ceil(read_chunk)).sum::<u64>();
        Ok(WorkloadPass {
            bytes: 2 * bytes,
            ops,
            wall_seconds: save.wall_seconds + load.wall_seconds,
            cpu_seconds: save.cpu_seconds + load.cpu_seconds,
            latency_p50_ms: f64::NAN,
            latency_p99_ms: f64::NAN,
            latency_p999_ms: f64::NAN,
            latency_cdf_ms: Vec::new(),
            extra: vec![
                ("save MB/s", bytes as f64 / save.wall_seconds / 1e6),
                ("restore MB/s", bytes as f64 / load.wall_seconds / 1e6),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DatasetSpec, Preset};

    fn config(pairs: &[(&'static str, &str)]) -> Config {
        Config(pairs.iter().map(|(k, v)| (*k, v.to_string())).collect())
    }

    #[test]
    fn a_loader_epoch_reads_every_sample_at_tiny_scale() {
        let dir = tempfile::Builder::new().prefix("tune-loader").tempdir().expect("tempdir");
        let mut spec = DatasetSpec::preset(Preset::Small);
        spec.files = 50;
        let ds = crate::dataset::generate(dir.path(), &spec, true, false).expect("generate");
        let rt = crate::runtime(0).expect("runtime");
        let shape = LoaderShape { batch: 8, prefetch: 2 };
        for c in [config(&[("depth", "4")]), config(&[("depth", "16"), ("defer_taskrun", "true")])] {
            let p = loader_epoch(&rt, &ds.root, &c, true, shape, 3).expect("epoch");
            assert_eq!(p.bytes, ds.total_bytes(), "{c}");
            assert_eq!(p.ops, 50);
            assert_eq!(p.extra, [("batches", 7.0)]);
            assert!(p.mb_per_sec() > 0.0 && p.cpu_seconds_per_gib().is_finite());
            assert!(p.latency_p50_ms > 0.0 && p.latency_p50_ms <= p.latency_p99_ms, "{p:?}");
            assert_eq!(p.latency_cdf_ms.len(), 101);
        }
        // A batch of 0 is refused.
        let c = config(&[("depth", "4")]);
        assert!(loader_epoch(&rt, &ds.root, &c, true, LoaderShape { batch: 0, prefetch: 1 }, 1).is_err());
        // A file cut short fails the epoch (the workload fails, it does not skip).
        let victim = ds.root.join(&ds.manifest.entries[0].key);
        std::fs::write(&victim, b"short").expect("truncate");
        assert!(loader_epoch(&rt, &ds.root, &c, true, shape, 3).is_err());
    }

    #[test]
    fn a_checkpoint_saves_and_restores_at_tiny_scale() {
        let dir = tempfile::Builder::new().prefix("tune-ckpt").tempdir().expect("tempdir");
        assert!(CkptWorkload::new(dir.path(), 0, 1).is_err());
        assert!(CkptWorkload::new(dir.path(), 3, 4).is_err());
        let mut w = CkptWorkload::new(dir.path(), (3 << 20) + 5, 3).expect("workload");
        assert_eq!((w.bytes(), w.parts()), ((3 << 20) + 5, 3));
        let rt = crate::runtime(0).expect("runtime");
        for c in [config(&[("depth", "2")]), config(&[("depth", "8"), ("io", "buffered")])] {
            let p = w.pass(&rt, &c, true, &Cold::new()).expect("pass");
            assert_eq!(p.bytes, 2 * w.bytes());
            // 3 parts of 1 MiB: one 32 MiB write chunk and one 4 MiB read chunk each.
            assert_eq!(p.ops, 6);
            assert!(p.latency_p99_ms.is_nan() && p.latency_cdf_ms.is_empty());
            let names: Vec<&str> = p.extra.iter().map(|(n, _)| *n).collect();
            assert_eq!(names, ["save MB/s", "restore MB/s"]);
            assert!(p.extra.iter().all(|(_, v)| *v > 0.0), "{p:?}");
            assert!(w.restored.iter().zip(&w.parts).all(|(r, (_, s))| r == s));
        }
        w.remove();
        assert!(!w.dir().exists());
    }
}
