//! `ringtier paper`: the paper's three experiments in one command, with a report directory;
//! with `--remote` a fourth, the remote-storage regime (S3 on loopback, a latency-throttled
//! file tier; `crate::s3bench`); where a Python with TensorFlow and ringtier is at hand, the
//! three again inside TensorFlow (`tensorflow`).
//!
//! The experiments return their typed reports (and write them as JSON); the report is rendered
//! from those reports alone (plus the few facts of the run that no experiment records), and a
//! measurement it needs that was not made is an error naming the report and the measurement,
//! never a 0 or a NaN in the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::ckpt::{self, CkptReport};
use crate::dataset::{self, DatasetSpec, Format, Preset};
use crate::read::pass::{Engine, Knobs};
use crate::read::{self as readbench, ReadReport};
use crate::s3::S3Report;
use crate::train::{self, TrainReport};

mod render;
pub(crate) mod tensorflow;
use render::render;
use tensorflow::{TfMode, TfOutcome};

/// Settings of the paper run.
#[derive(Debug, Clone)]
pub(crate) struct PaperConfig {
    pub(crate) out: PathBuf,
    pub(crate) work: PathBuf,
    /// Why the work directory is where it is, when it is not where asked (for the report).
    pub(crate) work_note: Option<String>,
    pub(crate) full: bool,
    pub(crate) tiny: bool,
    pub(crate) repeats: usize,
    /// Also the remote-storage experiment (S3 on loopback, a latency-throttled file tier).
    pub(crate) remote: bool,
    /// The engine of the mini-app's and the burst buffer's tiers; `posix` also leaves io_uring
    /// out of the read sweep, `uring` makes a refused io_uring an error instead of a skip.
    pub(crate) engine: ringtier_uring::Engine,
    /// Whether the experiments also run inside TensorFlow, and with which Python.
    pub(crate) tensorflow: TfMode,
    pub(crate) python: PathBuf,
}

/// A new temp work directory, preferably where direct I/O works so the read experiment
/// measures storage: the temp dir (`TMPDIR`) when its file system has direct I/O, else the
/// current directory when its has (tmpfs, the default `/tmp` on Fedora, Arch and Debian 13,
/// has none), else the temp dir anyway (the read experiment then reads buffered and the report
/// says so). Returns the directory (removed when dropped) and, when it is not in the temp dir
/// or has no direct I/O, a sentence saying why.
pub(crate) fn temp_work_dir() -> Result<(tempfile::TempDir, Option<String>)> {
    let make = |base: &Path| tempfile::Builder::new().prefix("ringtier-paper-").tempdir_in(base);
    let tmp = std::env::temp_dir();
    let in_tmp = make(&tmp);
    if let Ok(dir) = &in_tmp {
        if ringtier_core::fs::dir_supports_direct_io(dir.path()) == Some(true) {
            return in_tmp.map(|d| (d, None)).map_err(Into::into);
        }
    }
    let tmp_fs = ringtier_core::fs::fs_type_name(&tmp);
    let why_not_tmp = match &in_tmp {
        Ok(_) => format!("the temp dir {} ({tmp_fs}) has no direct I/O", tmp.display()),
        Err(e) => format!("the temp dir {} cannot be used ({e})", tmp.display()),
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    match make(&cwd) {
        Ok(here) if ringtier_core::fs::dir_supports_direct_io(here.path()) == Some(true) => {
            let note = format!("{why_not_tmp}, so the data is generated in {} instead", here.path().display());
            eprintln!("note: {note} (removed after)");
            Ok((here, Some(note)))
        }
        here => {
            drop(here);
            let dir = in_tmp.with_context(|| {
                format!("creating a work directory in {} or in the current directory", tmp.display())
            })?;
            let note = format!("{why_not_tmp}, and neither has the current directory");
            eprintln!("note: {note}: the read experiment reads buffered");
            Ok((dir, Some(note)))
        }
    }
}

/// One of three sizes: the paper's (`--full`), the quick default, or the tests' (`--tiny`).
pub(crate) fn sized<T>(full: bool, tiny: bool, paper: T, quick: T, tiny_size: T) -> T {
    if full {
        paper
    } else if tiny {
        tiny_size
    } else {
        quick
    }
}

/// What the report needs that no experiment's JSON records.
#[derive(Debug, Clone)]
struct RunFacts {
    work: PathBuf,
    work_fs: String,
    work_note: Option<String>,
    caltech_files: usize,
    caltech_median_bytes: u64,
    total_seconds: f64,
    /// The engine asked for (`--engine`).
    engine: ringtier_uring::Engine,
}

/// The experiments' reports (each also written as JSON, named after the field).
#[derive(Debug)]
struct Results {
    read: ReadReport,
    train_read: TrainReport,
    train_decode: TrainReport,
    ckpt: CkptReport,
    /// `remote.json`, when the remote experiment ran.
    remote: Option<S3Report>,
    /// The experiments inside TensorFlow: run, or why not; `None` with `--tensorflow off`.
    tensorflow: Option<TfOutcome>,
}

/// Runs the three experiments (four with `remote`) and writes `OUT/report.md`, JSON and the
/// plot.
pub(crate) fn run(cfg: &PaperConfig) -> Result<()> {
    let started = std::time::Instant::now();
    if cfg.remote {
        // Before the hour of the other experiments, not after.
        crate::s3::check_boto3()?;
    }
    // Whether the TensorFlow section can run, known before the other experiments: `on` fails
    // here where it cannot; `auto` carries the reason into the report.
    let tf_ready = match cfg.tensorflow {
        TfMode::Off => None,
        TfMode::On => Some(Ok(tensorflow::probe(&cfg.python).map_err(|why| {
            anyhow::anyhow!("--tensorflow on: {why}; install them (`pip install tensorflow-cpu ringtier`) or name a Python that has them with --python")
        })?)),
        TfMode::Auto => Some(tensorflow::probe(&cfg.python)),
    };
    if cfg.engine == ringtier_uring::Engine::Uring {
        ringtier_uring::engine::uring_availability()
            .map_err(|why| anyhow::anyhow!("--engine uring: {why}; {}, or use --engine auto", why.remedy()))?;
    }
    // Directories only once every check that refuses the run has passed: a refused run leaves
    // no empty report directory behind.
    std::fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    std::fs::create_dir_all(&cfg.work).with_context(|| format!("creating {}", cfg.work.display()))?;
    let tf_runs = matches!(tf_ready, Some(Ok(_)));
    let n = 3 + usize::from(cfg.remote) + usize::from(tf_runs);
    let work_fs = ringtier_core::fs::fs_type_name(&cfg.work);
    // O_DIRECT reads where the file system has them; buffered io_uring reads otherwise.
    let uring = if ringtier_core::fs::dir_supports_direct_io(&cfg.work) == Some(true) {
        Engine::UringDirect
    } else {
        eprintln!(
            "note: {} ({work_fs}) has no direct I/O: the read experiment's io_uring engine reads buffered (uring-buffered)",
            cfg.work.display()
        );
        Engine::UringBuffered
    };

    // 1. The read micro-benchmark.
    eprintln!("== 1/{n}: read micro-benchmark");
    let files = sized(cfg.full, cfg.tiny, 16_384, 4_096, 128);
    let spec = DatasetSpec { files, ..DatasetSpec::preset(Preset::Imagenet) };
    let ds = dataset::generate(&cfg.work.join("imagenet"), &spec, true, false)?;
    let rcfg = readbench::ReadBenchConfig {
        engines: if cfg.engine == ringtier_uring::Engine::Posix {
            vec![Engine::PosixThreads]
        } else {
            vec![Engine::PosixThreads, uring]
        },
        threads: vec![1, 2, 4, 8, 16, 32],
        depths: vec![1, 2, 4, 8, 16, 32],
        rings: vec![1],
        repeats: cfg.repeats,
        warm: false,
        drop_caches: false,
        knobs: Knobs::default(),
        json: Some(cfg.out.join("read.json")),
        plot: Some(cfg.out.join("read.svg")),
        seed: 1000,
    };
    let mut read = readbench::run(&rcfg, &ds)?;
    if cfg.engine == ringtier_uring::Engine::Posix {
        // Not a measurement that failed: the report says io_uring was left out on purpose.
        read.skipped_engines
            .push(crate::read::SkippedEngine { engine: uring, reason: "left out by --engine posix".into() });
        crate::harness::write_json(rcfg.json.as_deref(), &read)?;
    }
    let _ = std::fs::remove_dir_all(cfg.work.join("imagenet"));

    // 2. The AlexNet mini-app.
    eprintln!("== 2/{n}: AlexNet mini-app, prefetch on and off");
    let files = sized(cfg.full, cfg.tiny, 9_144, 2_048, 64);
    let spec = DatasetSpec { files, format: Format::Jpeg, ..DatasetSpec::preset(Preset::Caltech101) };
    let cal = dataset::generate(&cfg.work.join("caltech"), &spec, true, false)?;
    // Tiny: four small batches in one epoch (decoding is slow in a debug build).
    let (batch, epochs) = if cfg.tiny { (16, 1) } else { (64, 2) };
    let base = train::TrainConfig {
        dir: cal.root.clone(),
        batch,
        epochs,
        prefetch: vec![2, 0],
        compute_ms: train::DEFAULT_COMPUTE_MS_PER_IMAGE * batch as f64,
        decode: false,
        decode_threads: 2,
        ckpt_every: 0,
        ckpt_bytes: 0,
        ckpt_dirs: None,
        ckpt_slow_bytes_per_sec: None,
        repeats: cfg.repeats,
        json: Some(cfg.out.join("train-read.json")),
        engine: cfg.engine,
    };
    // Reading only: storage is far faster than the step consumes, the case the paper describes.
    let train_read = train::run(&base)?;
    // Reading and decoding: on a small machine the decode's CPU, not storage, sets the pace.
    let tcfg = train::TrainConfig { decode: true, json: Some(cfg.out.join("train-decode.json")), ..base };
    let train_decode = train::run(&tcfg)?;
    let _ = std::fs::remove_dir_all(cfg.work.join("caltech"));

    // 3. The burst buffer.
    eprintln!("== 3/{n}: burst buffer");
    let kcfg = ckpt::CkptBenchConfig {
        base: cfg.work.join("ckpt"),
        fast_dir: None,
        slow_dir: None,
        slow_kernel_bps: None,
        keep_last: 1,
        count: 3,
        size: sized(cfg.full, cfg.tiny, 600_000_000, 61_000_000 * 4, 8 << 20),
        compute_secs: if cfg.tiny { 0.05 } else { 1.0 },
        ratios: if cfg.tiny { vec![1.0, 4.0] } else { vec![1.0, 4.0, 16.0] },
        repeats: cfg.repeats,
        buffered_writes: Default::default(),
        json: Some(cfg.out.join("ckpt.json")),
        engine: cfg.engine,
    };
    let ckpt = ckpt::bench(&kcfg)?;
    let _ = std::fs::remove_dir_all(cfg.work.join("ckpt"));

    // 4. The remote-storage regime (optional).
    let remote = if cfg.remote {
        eprintln!("== 4/{n}: remote storage: S3 on loopback and a file tier with per-request latency");
        let dir = cfg.work.join("remote");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let sweep = crate::s3::ReadSweep {
            server: crate::s3server::ServerKind::S3sFs,
            baseline: None,
            work: Some(dir.clone()),
            repeats: cfg.repeats,
            json: Some(cfg.out.join("remote.json")),
            objects: sized(cfg.full, cfg.tiny, 4_096, 1_024, 64),
            object_size: 112 << 10,
            depths: if cfg.tiny { vec![1, 8] } else { vec![1, 4, 16, 64, 128] },
            threads: if cfg.tiny { vec![1, 8] } else { vec![1, 4, 16, 64] },
            latency_ms: 4.0,
            server_latency_ms: 4.0,
        };
        let v = crate::s3::read(&sweep)?;
        let _ = std::fs::remove_dir_all(&dir);
        Some(v)
    } else {
        None
    };

    // 5. The experiments inside TensorFlow (where a Python has it).
    let tensorflow = match tf_ready {
        None => None,
        Some(Err(why)) => {
            eprintln!("note: the experiments inside TensorFlow do not run: {why}");
            Some(TfOutcome::NotRun(why))
        }
        Some(Ok(versions)) => {
            eprintln!("== {n}/{n}: the experiments inside TensorFlow ({versions})");
            let tcfg = tensorflow::TfConfig {
                python: cfg.python.clone(),
                work: cfg.work.clone(),
                out: cfg.out.clone(),
                full: cfg.full,
                tiny: cfg.tiny,
                repeats: cfg.repeats,
            };
            match tensorflow::run(&tcfg, versions) {
                Ok(r) => Some(TfOutcome::Ran(Box::new(r))),
                // `on` asked for them: a failure is the command's; `auto` reports it and goes on.
                Err(e) if cfg.tensorflow == TfMode::On => return Err(e.context("the experiments inside TensorFlow")),
                Err(e) => {
                    eprintln!("warning: the experiments inside TensorFlow failed: {e:#}");
                    Some(TfOutcome::NotRun(format!("they failed: {e:#}")))
                }
            }
        }
    };

    let facts = RunFacts {
        work: cfg.work.clone(),
        work_fs: work_fs.to_string(),
        work_note: cfg.work_note.clone(),
        caltech_files: cal.len(),
        caltech_median_bytes: cal.median_size(),
        total_seconds: started.elapsed().as_secs_f64(),
        engine: cfg.engine,
    };
    let md = render(&facts, &Results { read, train_read, train_decode, ckpt, remote, tensorflow })
        .context("writing the report from the experiments' reports (their JSON is kept in the report directory)")?;
    let path = cfg.out.join("report.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("\nreport: {}", path.display());
    Ok(())
}

/// The default report directory: `ringtier-report` in the current directory.
pub(crate) fn default_out() -> PathBuf {
    Path::new("ringtier-report").to_path_buf()
}

/// `ringtier paper` (and `ringtier` with no command).
pub(crate) fn command(a: PaperArgs) -> Result<()> {
    let tmp;
    let (work, work_note) = match a.work {
        Some(w) => (w, None),
        None => {
            let (dir, note) = temp_work_dir()?;
            tmp = dir;
            (tmp.path().to_path_buf(), note)
        }
    };
    let cfg = PaperConfig {
        out: a.out.unwrap_or_else(default_out),
        work,
        work_note,
        full: a.full,
        tiny: a.tiny,
        repeats: a.repeats.max(1),
        remote: a.remote,
        engine: a.engine,
        tensorflow: a.tensorflow,
        python: a.python,
    };
    run(&cfg)
}

/// Arguments of `ringtier paper` (and of `ringtier` alone).
#[derive(Args, Debug)]
pub struct PaperArgs {
    /// Report directory (created; default ./ringtier-report).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Work directory for generated data (default: a new directory in the temp dir, or in the
    /// current directory when the temp dir has no direct I/O (tmpfs); removed after).
    #[arg(long)]
    pub(crate) work: Option<PathBuf>,
    /// The paper's sizes (16,384 and 9,144 files, 600 MB checkpoints) instead of the quick ones.
    #[arg(long)]
    pub(crate) full: bool,
    /// Repeats per point.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Tiny sizes, for tests of the command itself (not meaningful figures).
    #[arg(long, hide = true)]
    pub(crate) tiny: bool,
    /// Also the remote-storage experiment (a fourth report section): small objects read from
    /// an S3 server on loopback by ringtier's S3 tier (one driver thread, requests in flight
    /// swept) and by a boto3 thread pool (threads swept), and from a file tier with 4 ms per
    /// request (the latency-bound regime of a parallel file system). Needs python3 with boto3.
    #[arg(long)]
    pub(crate) remote: bool,
    /// Engine: `auto` (io_uring where the kernel allows it, the thread pool where it is
    /// refused, with one warning and the report saying why), `uring` (an error where io_uring
    /// is refused) or `posix` (the thread pool only: the read sweep leaves io_uring out, the
    /// mini-app and the burst buffer run on the thread pool).
    #[arg(long, default_value = "auto")]
    pub(crate) engine: ringtier_uring::Engine,
    /// The three experiments again inside TensorFlow (a last report section: tf.data against
    /// ringtier.tensorflow.dataset, the mini-app in Keras, TensorFlow's saver with and without
    /// the burst buffer): `auto` where `--python` imports tensorflow and ringtier.tensorflow
    /// (the report says why not otherwise), `on` (an error before any experiment where it
    /// cannot), `off`.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) tensorflow: TfMode,
    /// The Python for the TensorFlow experiments.
    #[arg(long, default_value = "python3")]
    pub(crate) python: PathBuf,
}
