//! fio against ringtier at the best configuration of a sweep, the passes interleaved: one big
//! file (random reads of the read size for a fixed time, as `bench randread`) and the
//! dataset's files (each read whole, cold, as a pass of `bench read`). fio runs twice per
//! repeat (submitting in batches as ringtier does, and one I/O at a time) and its better job
//! of the repeat is the baseline; fio's buffers are on huge pages, as ringtier's, while it
//! runs ([`thp`]).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::harness::{interleaved, Cold, Summary};
use crate::read::pass::{order_of, Order};
use crate::tune::space::Config;
use crate::tune::sysfs::thp;
use crate::tune::{fio, workload, Cleanup, TuneArgs};

/// fio against ringtier at one configuration on one target.
#[derive(Debug, Serialize)]
pub(crate) struct FioComparison {
    pub(crate) target: String,
    pub(crate) config: String,
    pub(crate) job_file: String,
    pub(crate) fio_mb_per_sec: Summary,
    pub(crate) ringtier_mb_per_sec: Summary,
    /// ringtier / fio, pair by pair.
    pub(crate) ratio: Summary,
    pub(crate) fio_clat_p99_ms: f64,
    pub(crate) fio_cpu_seconds_per_gib: Summary,
    /// The memory fio's buffers were on (huge pages or not), against ringtier's.
    pub(crate) memory: String,
}

/// The two sides of a fio comparison, interleaved (the order rotated by the repeat).
#[derive(Debug, Clone, Copy)]
enum FioSide {
    Ringtier,
    /// fio submitting in batches, as ringtier does.
    Fio,
    /// fio's own one-at-a-time submission: the baseline's better setting on some runs.
    FioUnbatched,
}

const FIO_SIDES: [FioSide; 3] = [FioSide::Ringtier, FioSide::Fio, FioSide::FioUnbatched];

/// One pass of a fio comparison: bandwidth, and for fio its CPU per GiB and completion p99.
#[derive(Debug, Clone, Copy)]
struct FioPass {
    mb_per_sec: f64,
    cpu_seconds_per_gib: f64,
    clat_p99_ms: f64,
}

impl FioPass {
    fn ours(mb_per_sec: f64) -> Self {
        FioPass { mb_per_sec, cpu_seconds_per_gib: f64::NAN, clat_p99_ms: f64::NAN }
    }

    fn fio(f: &fio::FioResult, gib: f64) -> Self {
        FioPass { mb_per_sec: f.mb_per_sec, cpu_seconds_per_gib: f.cpu_seconds / gib, clat_p99_ms: f.clat_p99_ms }
    }

    /// ringtier's bandwidths, fio's at its better job of the repeat (batched or not), that
    /// job's CPU per GiB (pass by pass) and fio's last p99.
    fn split(per_side: &[Vec<FioPass>]) -> (Vec<f64>, Vec<f64>, Vec<f64>, f64) {
        let ours = per_side[0].iter().map(|p| p.mb_per_sec).collect();
        let best: Vec<FioPass> = per_side[1]
            .iter()
            .zip(&per_side[2])
            .map(|(a, b)| if b.mb_per_sec > a.mb_per_sec { *b } else { *a })
            .collect();
        let theirs = best.iter().map(|p| p.mb_per_sec).collect();
        let cpu = best.iter().map(|p| p.cpu_seconds_per_gib).collect();
        let p99 = best.last().map_or(f64::NAN, |p| p.clat_p99_ms);
        (ours, theirs, cpu, p99)
    }
}

/// fio and ringtier at the configuration `c`, interleaved over the repeats: one big file
/// (random reads of the read size), then the dataset's files, each read whole, cold.
pub(crate) fn fio_comparisons(
    a: &TuneArgs,
    c: &Config,
    ds: &Dataset,
    direct_ok: bool,
    repeats: usize,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<FioComparison>> {
    let mut out = Vec::new();
    // fio's buffers on huge pages, as ringtier's, while the comparison runs.
    let (_thp, memory) = thp::huge_pages_for_fio(Path::new(thp::THP_ENABLED), !a.fio_small_pages);
    eprintln!("tune: fio comparison: {memory}");
    // One big file: random reads of the read size (128 KiB when whole files) at the depth.
    let big = a.dir.join("ringtier-tune-bigfile");
    let _rm = Cleanup((!a.keep).then(|| big.clone()));
    let runtime_secs = if a.quick { 2.0 } else { 5.0 };
    let bs = match c.num("read_size") {
        0 => 128 << 10,
        n => n as usize,
    };
    let cfg = crate::randread::RandReadConfig {
        file: big.join("big.bin"),
        size: a.fio_file_size.next_multiple_of(4096),
        block_size: bs,
        depth: c.num("depth").max(1) as u32,
        runtime_secs,
        repeats: 1,
        direct: if c.get("io") == Some("buffered") || !direct_ok {
            ringtier_uring::DirectIoPolicy::Off
        } else {
            ringtier_uring::DirectIoPolicy::Required
        },
        register_files: c.flag("register_files"),
        register_buffers: c.flag("register_buffers"),
        sqpoll: c.sqpoll().is_some(),
        seed: 1,
    };
    crate::randread::prepare_file(&cfg.file, cfg.size)?;
    let target = fio::Target::BigFile { path: cfg.file.clone(), runtime_secs };
    let (job, plain) = (fio::job(c, &target), fio::job_with(c, &target, false));
    let (job_path, plain_path) = (a.out.join("fio-bigfile.fio"), a.out.join("fio-bigfile-unbatched.fio"));
    let per_side = interleaved(repeats.max(3), &FIO_SIDES, true, |r, side| match side {
        FioSide::Ringtier => {
            Ok(FioPass::ours(crate::randread::run(&RandSeed(&cfg, r as u64).cfg())?.median_mb_per_sec()))
        }
        FioSide::Fio | FioSide::FioUnbatched => {
            let f = match side {
                FioSide::Fio => fio::run(&job, &job_path)?,
                _ => fio::run(&plain, &plain_path)?,
            };
            let gib = f.mb_per_sec * 1e6 * runtime_secs / crate::harness::GIB;
            Ok(FioPass::fio(&f, gib))
        }
    })?;
    let (ours, theirs, fio_cpu, p99) = FioPass::split(&per_side);
    out.push(FioComparison {
        target: format!("one {} MiB file, random {} KiB reads", cfg.size >> 20, bs >> 10),
        config: c.label(),
        job_file: format!(
            "{} (fio batched as ringtier) and {} (fio one I/O at a time); fio is the better per repeat",
            job_path.display(),
            plain_path.display()
        ),
        fio_mb_per_sec: Summary::of(&theirs),
        ringtier_mb_per_sec: Summary::of(&ours),
        ratio: Summary::ratio(&ours, &theirs),
        fio_clat_p99_ms: p99,
        fio_cpu_seconds_per_gib: Summary::of(&fio_cpu),
        memory: memory.clone(),
    });
    // The dataset's files, each read whole, cold.
    let target = fio::Target::Files {
        dir: ds.root.clone(),
        files: ds.len(),
        min_file_bytes: ds.manifest.entries.iter().map(|e| e.size).min().unwrap_or(0),
    };
    let (job, plain) = (fio::job(c, &target), fio::job_with(c, &target, false));
    let (job_path, plain_path) = (a.out.join("fio-files.fio"), a.out.join("fio-files-unbatched.fio"));
    let files: Vec<PathBuf> = ds.manifest.entries.iter().map(|f| ds.root.join(&f.key)).collect();
    // fio stats every file before its timed phase: the files' pages are dropped, their inodes
    // kept, so that both sides open files with warm metadata.
    let cold = Cold { keep_metadata: true, ..Cold::new() };
    let per_side = interleaved(repeats, &FIO_SIDES, true, |r, side| {
        cold.pass(&files)?;
        match side {
            FioSide::Ringtier => {
                let reader = workload::reader(c, ds, direct_ok)?;
                let order = order_of(ds, Order::Readdir, r as u64)?;
                Ok(FioPass::ours(rt.block_on(reader.pass(ds, &order))?.mb_per_sec()))
            }
            FioSide::Fio => {
                Ok(FioPass::fio(&fio::run(&job, &job_path)?, ds.total_bytes() as f64 / crate::harness::GIB))
            }
            FioSide::FioUnbatched => {
                Ok(FioPass::fio(&fio::run(&plain, &plain_path)?, ds.total_bytes() as f64 / crate::harness::GIB))
            }
        }
    })?;
    let (ours, theirs, fio_cpu, p99) = FioPass::split(&per_side);
    out.push(FioComparison {
        target: format!(
            "{} files (median {} KB), cold (pages dropped, metadata warm on both sides: fio stats every file \
             first); ringtier reads each whole, fio in {} KiB blocks",
            ds.len(),
            ds.median_size() / 1000,
            fio::files_block_size(ds.manifest.entries.iter().map(|e| e.size).min().unwrap_or(0)) >> 10
        ),
        config: c.label(),
        job_file: format!(
            "{} (fio batched as ringtier) and {} (fio one I/O at a time); fio is the better per repeat",
            job_path.display(),
            plain_path.display()
        ),
        fio_mb_per_sec: Summary::of(&theirs),
        ringtier_mb_per_sec: Summary::of(&ours),
        ratio: Summary::ratio(&ours, &theirs),
        fio_clat_p99_ms: p99,
        fio_cpu_seconds_per_gib: Summary::of(&fio_cpu),
        memory: memory.clone(),
    });
    Ok(out)
}

/// A randread configuration with its own seed per repeat.
struct RandSeed<'a>(&'a crate::randread::RandReadConfig, u64);

impl RandSeed<'_> {
    fn cfg(&self) -> crate::randread::RandReadConfig {
        crate::randread::RandReadConfig { seed: self.0.seed + self.1, ..self.0.clone() }
    }
}
