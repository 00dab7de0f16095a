//! One cold, shuffled pass over a dataset through an engine, measured.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ringtier_core::{BufferPool, MemoryTier, PoolConfig, PosixConfig, PosixTier, ReadBatch, Tier};
use ringtier_uring::{DirectIoPolicy, UringConfig, UringTier, UringTierOptions};
use serde::Serialize;

use crate::dataset::Dataset;
use crate::harness::{Meter, Rng};

/// The order a pass reads files in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Order {
    /// A seeded shuffle per pass, as a training epoch reads.
    Shuffled,
    /// Manifest order.
    Manifest,
    /// Directory-walk order, as fio's `--opendir` reads (for comparisons with fio).
    Readdir,
}

/// The order of one pass.
pub(crate) fn order_of(ds: &Dataset, order: Order, seed: u64) -> Result<Vec<u32>> {
    Ok(match order {
        Order::Shuffled => {
            let mut v: Vec<u32> = (0..ds.len() as u32).collect();
            Rng::new(seed).shuffle(&mut v);
            v
        }
        Order::Manifest => (0..ds.len() as u32).collect(),
        Order::Readdir => ds.readdir_order()?,
    })
}

/// How files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Engine {
    /// The memory tier, preloaded: the ceiling without storage.
    Memory,
    /// Buffered pread from a pool of N threads (tf.data / PyTorch workers).
    PosixThreads,
    /// io_uring, O_DIRECT, N requests in flight per ring.
    UringDirect,
    /// io_uring through the page cache.
    UringBuffered,
}

impl Engine {
    pub(crate) const ALL: [Engine; 4] =
        [Engine::Memory, Engine::PosixThreads, Engine::UringDirect, Engine::UringBuffered];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::PosixThreads => "posix-threads",
            Engine::UringDirect => "uring-direct",
            Engine::UringBuffered => "uring-buffered",
        }
    }

    /// What the concurrency number means for this engine.
    pub(crate) fn concurrency_unit(self) -> &'static str {
        match self {
            Engine::Memory => "tasks",
            Engine::PosixThreads => "threads",
            Engine::UringDirect | Engine::UringBuffered => "depth",
        }
    }

    pub(crate) fn is_uring(self) -> bool {
        matches!(self, Engine::UringDirect | Engine::UringBuffered)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Engine::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown engine {s:?} (memory, posix-threads, uring-direct, uring-buffered)"))
    }
}

/// What a pass does with a file that cannot be read as the manifest says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnError {
    /// Count it and go on.
    Skip,
    /// Stop with an error naming the file.
    Fail,
}

/// Largest read when `--read-size` is 0: files up to this size are read whole, larger ones
/// in reads of this size, so the buffer pool never grows with the largest file.
pub(crate) const DEFAULT_MAX_READ: usize = 8 << 20;

/// Knobs shared by every point of a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Knobs {
    /// Largest single read (fio's --bs); 0 reads each file with one read up to
    /// [`DEFAULT_MAX_READ`] and larger files in reads of that size.
    pub(crate) read_size: usize,
    pub(crate) sqpoll: bool,
    /// SQPOLL's idle time before its kernel thread sleeps, milliseconds.
    pub(crate) sqpoll_idle_ms: u32,
    /// `IORING_SETUP_COOP_TASKRUN`.
    pub(crate) coop_taskrun: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` with `SINGLE_ISSUER`.
    pub(crate) defer_taskrun: bool,
    pub(crate) register_buffers: bool,
    pub(crate) register_files: bool,
    pub(crate) verify: bool,
    pub(crate) on_error: OnError,
    pub(crate) order: Order,
}

impl Default for Knobs {
    /// Whole files, registered buffers, no checks, shuffled, stop at the first bad file: the
    /// paper's read experiment.
    fn default() -> Knobs {
        Knobs {
            read_size: 0,
            sqpoll: false,
            sqpoll_idle_ms: 50,
            coop_taskrun: false,
            defer_taskrun: false,
            register_buffers: true,
            register_files: false,
            verify: false,
            on_error: OnError::Fail,
            order: Order::Shuffled,
        }
    }
}

/// An engine set up over a dataset, reusable across passes.
pub(crate) struct Reader {
    pub(crate) engine: Engine,
    pub(crate) concurrency: usize,
    pub(crate) rings: usize,
    knobs: Knobs,
    tier: Arc<dyn Tier>,
    pool: BufferPool,
    batch_size: usize,
}

/// Measurements of one pass.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PassResult {
    pub(crate) bytes: u64,
    pub(crate) files: u64,
    pub(crate) skipped: u64,
    pub(crate) wall_seconds: f64,
    pub(crate) cpu_seconds: f64,
    /// Per-file service time percentiles, milliseconds.
    pub(crate) latency_p50_ms: f64,
    pub(crate) latency_p99_ms: f64,
    pub(crate) latency_p999_ms: f64,
    /// Read requests issued (pieces of files).
    pub(crate) reads: u64,
    /// Per-read latency at the quantiles 0, 0.01, ..., 1 (for CDF plots; not in JSON).
    #[serde(skip)]
    pub(crate) latency_cdf_ms: Vec<f64>,
    /// The first few errors of skipped files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) errors: Vec<String>,
}

impl PassResult {
    pub(crate) fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.wall_seconds / 1e6
    }

    pub(crate) fn files_per_sec(&self) -> f64 {
        self.files as f64 / self.wall_seconds
    }

    pub(crate) fn cpu_seconds_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

/// The `q` quantile (0..=1) of sorted samples.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The size of the reads a pass issues: `read_size` rounded down to 4 KiB (at least 4 KiB),
/// or, for 0, the largest file capped at [`DEFAULT_MAX_READ`].
pub(crate) fn chunk_size(read_size: usize, max_file: u64) -> usize {
    if read_size == 0 {
        (max_file.max(1) as usize).min(DEFAULT_MAX_READ)
    } else {
        (read_size / 4096 * 4096).max(4096)
    }
}

/// Bytes of one pooled buffer for reads of `chunk` bytes: the chunk plus one byte (to notice a
/// file that grew), rounded up to 4 KiB, plus 4 KiB for an unaligned start.
pub(crate) fn buffer_size(chunk: usize) -> usize {
    (chunk + 1).next_multiple_of(4096) + 4096
}

/// One read of a pass: a piece of one file.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Manifest index of the file.
    file: u32,
    offset: u64,
    len: usize,
    /// The file's last piece (asks for one byte more, to notice a file that grew).
    last: bool,
}

/// The reads of a pass over `order`: each file in pieces of at most `chunk` bytes, in order.
fn pieces(ds: &Dataset, order: &[u32], chunk: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(order.len());
    for &file in order {
        let size = ds.manifest.entries[file as usize].size;
        let mut offset = 0u64;
        loop {
            let rest = size - offset;
            if rest <= chunk as u64 {
                out.push(Piece { file, offset, len: rest as usize + 1, last: true });
                break;
            }
            out.push(Piece { file, offset, len: chunk, last: false });
            offset += chunk as u64;
        }
    }
    out
}

/// The file a pass is in the middle of: bytes and CRC so far, and the first error.
#[derive(Debug)]
struct FileProgress {
    file: u32,
    bytes: u64,
    crc: u32,
    error: Option<String>,
}

impl Reader {
    /// Sets up `engine` with `concurrency` (threads or depth) and `rings` over `ds`.
    pub(crate) fn new(engine: Engine, concurrency: usize, rings: usize, ds: &Dataset, knobs: Knobs) -> Result<Reader> {
        let concurrency = concurrency.max(1);
        // Two batches in flight, each large enough to keep every thread or ring slot busy.
        let batch_size = (concurrency * rings.max(1)).max(16);
        // The pool is 2 x batch x read size, whatever the largest file: a larger file is read
        // in pieces that reuse the pooled buffers.
        let buf_size = buffer_size(chunk_size(knobs.read_size, ds.max_size()));
        let pool =
            BufferPool::new(PoolConfig::new(buf_size, 2 * batch_size, 4096)).context("allocating the buffer pool")?;
        let tier: Arc<dyn Tier> = match engine {
            Engine::Memory => {
                let mem = MemoryTier::new().named(engine.as_str());
                let src = PosixTier::new(PosixConfig::new(&ds.root).with_follow_links(true))
                    .context("opening the dataset")?;
                crate::runtime(0)?
                    .block_on(async {
                        for f in &ds.manifest.entries {
                            let data = ringtier_core::ops::get(&src, &f.key).await?;
                            ringtier_core::ops::put(&mem, &f.key, &data, 1 << 20).await?;
                        }
                        Ok::<_, ringtier_core::Error>(())
                    })
                    .context("loading the dataset into memory")?;
                Arc::new(mem)
            }
            Engine::PosixThreads => Arc::new(
                PosixTier::new(
                    PosixConfig::new(&ds.root)
                        .with_threads(concurrency)
                        .with_read_chunk(knobs.read_size)
                        .with_follow_links(true)
                        .with_name(engine.as_str().to_string()),
                )
                .context("opening the posix tier")?,
            ),
            Engine::UringDirect | Engine::UringBuffered => {
                let config = UringConfig::default()
                    .with_queue_depth(concurrency as u32)
                    .with_rings(rings.max(1))
                    .with_sqpoll_idle_ms(knobs.sqpoll.then_some(knobs.sqpoll_idle_ms))
                    .with_coop_taskrun(knobs.coop_taskrun)
                    .with_defer_taskrun(knobs.defer_taskrun)
                    .with_register_buffers(knobs.register_buffers)
                    .with_register_files(knobs.register_files)
                    .with_direct_io(if engine == Engine::UringDirect {
                        DirectIoPolicy::Required
                    } else {
                        DirectIoPolicy::Off
                    })
                    .with_max_read_bytes(knobs.read_size as u32);
                // A read-only dataset tier: files and class folders that are links are read
                // through them.
                let options = UringTierOptions::default()
                    .with_pool(pool.clone())
                    .with_name(engine.as_str().to_string())
                    .with_follow_links(true);
                Arc::new(UringTier::with_options(&ds.root, config, options).context("opening the io_uring tier")?)
            }
        };
        // Every operation is metered (no-ops when no recorder is installed).
        let tier: Arc<dyn Tier> = Arc::new(ringtier_core::layers::Metered::new(tier));
        Ok(Reader { engine, concurrency, rings: rings.max(1), knobs, tier, pool, batch_size })
    }

    /// One pass over the files of `ds` in `order` (manifest indices); the caller makes it
    /// cold first.
    pub(crate) async fn pass(&self, ds: &Dataset, order: &[u32]) -> Result<PassResult> {
        let skip = self.knobs.on_error == OnError::Skip;
        let chunk = chunk_size(self.knobs.read_size, ds.max_size());
        let pieces = pieces(ds, order, chunk);
        let mut latencies: Vec<f64> = Vec::with_capacity(pieces.len());
        let (mut bytes, mut files, mut skipped) = (0u64, 0u64, 0u64);
        let mut errors = Vec::new();
        let verify = self.knobs.verify && ds.has_checksums;
        let meter = Meter::start();
        // (batch handle, its pieces); batches complete in order, so the pieces of a file
        // (consecutive in `pieces`) are seen in order even across batches.
        let mut in_flight: VecDeque<(tokio::task::JoinHandle<ReadBatch>, &[Piece])> = VecDeque::new();
        let mut spare: Vec<ReadBatch> =
            (0..2).map(|_| ReadBatch::with_capacity(self.batch_size, self.batch_size * 32)).collect();
        let mut chunks = pieces.chunks(self.batch_size);
        let mut current: Option<FileProgress> = None;
        loop {
            while in_flight.len() < 2 {
                let Some(chunk) = chunks.next() else { break };
                let mut batch = spare.pop().unwrap_or_default();
                for p in chunk {
                    let f = &ds.manifest.entries[p.file as usize];
                    batch.push(&f.key, p.offset, p.len, self.pool.acquire().await);
                }
                let tier = Arc::clone(&self.tier);
                in_flight.push_back((tokio::spawn(async move { tier.read_batch(batch).await }), chunk));
            }
            let Some((h, chunk)) = in_flight.pop_front() else { break };
            let mut batch = h.await.context("reader task failed")?;
            for ((_, entry), p) in batch.iter().zip(chunk) {
                let f = &ds.manifest.entries[p.file as usize];
                let prog = current.get_or_insert(FileProgress { file: p.file, bytes: 0, crc: 0, error: None });
                debug_assert_eq!(prog.file, p.file);
                // Every piece but the last must come back full; the last must end the file.
                let want = if p.last { f.size - p.offset } else { p.len as u64 };
                match entry.result() {
                    _ if prog.error.is_some() => {}
                    Some(Ok(n)) if *n as u64 != want => {
                        prog.error = Some(format!(
                            "{}: size mismatch, the manifest says {} bytes, read {}{}",
                            f.key,
                            f.size,
                            p.offset + *n as u64,
                            if (*n as u64) > want { " or more" } else { "" }
                        ))
                    }
                    Some(Ok(n)) => {
                        prog.bytes += *n as u64;
                        if verify {
                            if let Some(b) = entry.buf() {
                                prog.crc = crc32c::crc32c_append(prog.crc, b.as_slice());
                            }
                        }
                        if let Some(l) = entry.latency() {
                            latencies.push(l.as_secs_f64() * 1e3);
                        }
                    }
                    Some(Err(e)) => prog.error = Some(format!("{}: {e} (at byte {})", f.key, p.offset)),
                    None => prog.error = Some(format!("{}: not executed", f.key)),
                }
                if !p.last {
                    continue;
                }
                let Some(mut prog) = current.take() else { continue };
                if prog.error.is_none() && verify && prog.crc != f.crc32c {
                    prog.error = Some(format!("{}: checksum mismatch against the manifest", f.key));
                }
                match prog.error {
                    None => {
                        bytes += prog.bytes;
                        files += 1;
                    }
                    Some(msg) if skip => {
                        skipped += 1;
                        if errors.len() < 5 {
                            errors.push(msg);
                        }
                    }
                    Some(msg) => bail!(
                        "reading {} through {}: {msg} (use --on-error skip to go on)",
                        ds.root.display(),
                        self.engine
                    ),
                }
            }
            batch.clear();
            spare.push(batch);
        }
        let usage = meter.stop();
        latencies.sort_by(|a, b| a.total_cmp(b));
        Ok(PassResult {
            bytes,
            files,
            skipped,
            wall_seconds: usage.wall_seconds,
            cpu_seconds: usage.cpu_seconds,
            latency_p50_ms: quantile(&latencies, 0.50),
            latency_p99_ms: quantile(&latencies, 0.99),
            latency_p999_ms: quantile(&latencies, 0.999),
            reads: pieces.len() as u64,
            latency_cdf_ms: (0..=100).map(|q| quantile(&latencies, f64::from(q) / 100.0)).collect(),
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_larger_than_the_read_size_are_read_in_pieces_and_verified() {
        use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry};
        let dir = tempfile::tempdir().expect("tempdir");
        // O_DIRECT where the temp dir has it (not on tmpfs).
        let direct = ringtier_core::fs::dir_supports_direct_io(dir.path()) != Some(false);
        let uring = if direct { Engine::UringDirect } else { Engine::UringBuffered };
        let sizes = [0usize, 1, 4096, 16 * 1024, 16 * 1024 + 1, 300_007, 1_000_000];
        let mut entries = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|j| (j * 13 + i) as u8).collect();
            let key = format!("f{i}");
            std::fs::write(dir.path().join(&key), &data).expect("write");
            entries.push(ManifestEntry { key, size: n as u64, crc32c: checksum(&data) });
        }
        let ds = Dataset { root: dir.path().to_path_buf(), manifest: Manifest { entries }, has_checksums: true };
        let knobs = Knobs {
            read_size: 16 * 1024,
            sqpoll: false,
            sqpoll_idle_ms: 50,
            coop_taskrun: false,
            defer_taskrun: false,
            register_buffers: true,
            register_files: false,
            verify: true,
            on_error: OnError::Fail,
            order: Order::Shuffled,
        };
        assert_eq!(buffer_size(chunk_size(knobs.read_size, ds.max_size())), 16 * 1024 + 8192);
        assert_eq!(chunk_size(0, 100), 100);
        assert_eq!(chunk_size(0, 1 << 40), DEFAULT_MAX_READ);
        let order: Vec<u32> = (0..sizes.len() as u32).rev().collect();
        let rt = crate::runtime(0).expect("runtime");
        for engine in [Engine::PosixThreads, uring, Engine::UringBuffered] {
            let reader = Reader::new(engine, 4, 1, &ds, knobs).expect("reader");
            assert_eq!(reader.pool.buf_size(), 16 * 1024 + 8192, "{engine}: the pool follows the read size");
            let res = rt.block_on(reader.pass(&ds, &order)).expect("pass");
            assert_eq!((res.files, res.skipped), (sizes.len() as u64, 0), "{engine}");
            assert_eq!(res.bytes, sizes.iter().sum::<usize>() as u64, "{engine}");
        }
        // A byte changed in the middle of the large file: its checksum, assembled over the
        // pieces, no longer matches.
        let mut data = std::fs::read(dir.path().join("f6")).expect("read");
        data[500_000] ^= 1;
        std::fs::write(dir.path().join("f6"), &data).expect("write");
        let reader = Reader::new(uring, 4, 1, &ds, knobs).expect("reader");
        let err = rt.block_on(reader.pass(&ds, &order)).expect_err("corrupt");
        assert!(err.to_string().contains("f6: checksum mismatch"), "{err}");
        let skip = Knobs { on_error: OnError::Skip, ..knobs };
        let reader = Reader::new(uring, 4, 1, &ds, skip).expect("reader");
        let res = rt.block_on(reader.pass(&ds, &order)).expect("pass");
        assert_eq!((res.files, res.skipped), (sizes.len() as u64 - 1, 1));
    }

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
