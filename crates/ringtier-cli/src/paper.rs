//! `ringtier paper`: the paper's three experiments in one command, with a report directory;
//! with `--remote` a fourth, the remote-storage regime (S3 on loopback, a latency-throttled
//! file tier; `crate::s3bench`).
//!
//! The experiments write their JSON; the report is rendered from that JSON alone (plus the few
//! facts of the run that no experiment records), and a field it needs that is missing or not
//! a number is an error naming the file and the field, never a 0 or a NaN in the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::dataset::{self, DatasetSpec, Format, Preset};
use crate::passes::{Engine, Knobs, OnError, Order};
use crate::{ckpt, readbench, train};

/// Settings of the paper run.
#[derive(Debug, Clone)]
pub(crate) struct PaperConfig {
    pub out: PathBuf,
    pub work: PathBuf,
    /// Why the work directory is where it is, when it is not where asked (for the report).
    pub work_note: Option<String>,
    pub full: bool,
    pub tiny: bool,
    pub repeats: usize,
    /// Also the remote-storage experiment (S3 on loopback, a latency-throttled file tier).
    pub remote: bool,
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

/// What the report needs that no experiment's JSON records.
#[derive(Debug, Clone)]
struct RunFacts {
    work: PathBuf,
    work_fs: String,
    work_note: Option<String>,
    caltech_files: usize,
    caltech_median_bytes: u64,
    total_seconds: f64,
}

/// The experiments' JSON, by file name.
#[derive(Debug, Clone)]
struct Results {
    read: Value,
    train_read: Value,
    train_decode: Value,
    ckpt: Value,
    /// `remote.json`, when the remote experiment ran.
    remote: Option<Value>,
}

/// Runs the three experiments (four with `remote`) and writes `OUT/report.md`, JSON and the
/// plot.
pub(crate) fn run(cfg: &PaperConfig) -> Result<()> {
    std::fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    std::fs::create_dir_all(&cfg.work).with_context(|| format!("creating {}", cfg.work.display()))?;
    let started = std::time::Instant::now();
    if cfg.remote {
        // Before the hour of the other experiments, not after.
        crate::s3bench::check_boto3()?;
    }
    let n = if cfg.remote { 4 } else { 3 };
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
    let files = if cfg.full {
        16_384
    } else if cfg.tiny {
        128
    } else {
        4_096
    };
    let spec = DatasetSpec { files, ..DatasetSpec::preset(Preset::Imagenet) };
    let ds = dataset::generate(&cfg.work.join("imagenet"), &spec, true, false)?;
    let rcfg = readbench::ReadBenchConfig {
        engines: vec![Engine::PosixThreads, uring],
        threads: vec![1, 2, 4, 8, 16, 32],
        depths: vec![1, 2, 4, 8, 16, 32],
        rings: vec![1],
        repeats: cfg.repeats,
        warm: false,
        drop_caches: false,
        knobs: Knobs {
            read_size: 0,
            sqpoll: false,
            register_buffers: true,
            register_files: false,
            verify: false,
            on_error: OnError::Fail,
            order: Order::Shuffled,
        },
        json: Some(cfg.out.join("read.json")),
        plot: Some(cfg.out.join("read.svg")),
        seed: 1000,
    };
    let read = readbench::run(&rcfg, &ds)?;
    let _ = std::fs::remove_dir_all(cfg.work.join("imagenet"));

    // 2. The AlexNet mini-app.
    eprintln!("== 2/{n}: AlexNet mini-app, prefetch on and off");
    let files = if cfg.full {
        9_144
    } else if cfg.tiny {
        64
    } else {
        2_048
    };
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
        size: if cfg.full {
            600_000_000
        } else if cfg.tiny {
            8 << 20
        } else {
            61_000_000 * 4
        },
        compute_secs: if cfg.tiny { 0.05 } else { 1.0 },
        ratios: if cfg.tiny { vec![1.0, 4.0] } else { vec![1.0, 4.0, 16.0] },
        repeats: cfg.repeats,
        buffered_writes: Default::default(),
        json: Some(cfg.out.join("ckpt.json")),
    };
    let ckpt = ckpt::bench(&kcfg)?;
    let _ = std::fs::remove_dir_all(cfg.work.join("ckpt"));

    // 4. The remote-storage regime (optional).
    let remote = if cfg.remote {
        eprintln!("== 4/4: remote storage: S3 on loopback and a file tier with per-request latency");
        let dir = cfg.work.join("remote");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let sweep = crate::s3bench::ReadSweep {
            server: crate::s3bench::Server::S3sFs,
            baseline: crate::s3bench::write_baseline_script(&dir)?,
            work: Some(dir.clone()),
            repeats: cfg.repeats,
            json: Some(cfg.out.join("remote.json")),
            objects: if cfg.full {
                4_096
            } else if cfg.tiny {
                64
            } else {
                1_024
            },
            object_size: 112 << 10,
            depths: if cfg.tiny { vec![1, 8] } else { vec![1, 4, 16, 64, 128] },
            threads: if cfg.tiny { vec![1, 8] } else { vec![1, 4, 16, 64] },
            latency_ms: 4.0,
            server_latency_ms: 4.0,
        };
        let v = crate::s3bench::read(&sweep)?;
        let _ = std::fs::remove_dir_all(&dir);
        Some(v)
    } else {
        None
    };

    let facts = RunFacts {
        work: cfg.work.clone(),
        work_fs: work_fs.to_string(),
        work_note: cfg.work_note.clone(),
        caltech_files: cal.len(),
        caltech_median_bytes: cal.median_size(),
        total_seconds: started.elapsed().as_secs_f64(),
    };
    let md = render(&facts, &Results { read, train_read, train_decode, ckpt, remote })
        .context("writing the report from the experiments' JSON (kept in the report directory)")?;
    let path = cfg.out.join("report.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("\nreport: {}", path.display());
    Ok(())
}

/// The value at `path` (fields and array indices joined by dots, e.g. `points.3.mb_per_sec`)
/// in the JSON of experiment file `file`; an error naming both when it is missing or null.
fn get<'v>(v: &'v Value, file: &str, path: &str) -> Result<&'v Value> {
    let mut cur = v;
    for seg in path.split('.') {
        let next = match seg.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(seg),
        };
        cur = match next {
            Some(n) if !n.is_null() => n,
            Some(_) => bail!("{file}: field `{path}` is null (a measurement that was not made)"),
            None => bail!("{file}: field `{path}` is missing"),
        };
    }
    Ok(cur)
}

/// The number at `path` (see [`get`]).
fn num(v: &Value, file: &str, path: &str) -> Result<f64> {
    let x = get(v, file, path)?;
    x.as_f64().filter(|x| x.is_finite()).with_context(|| format!("{file}: field `{path}` is not a number: {x}"))
}

/// The string at `path` (see [`get`]).
fn text<'v>(v: &'v Value, file: &str, path: &str) -> Result<&'v str> {
    let x = get(v, file, path)?;
    x.as_str().with_context(|| format!("{file}: field `{path}` is not a string: {x}"))
}

/// The boolean at `path` (see [`get`]).
fn flag(v: &Value, file: &str, path: &str) -> Result<bool> {
    let x = get(v, file, path)?;
    x.as_bool().with_context(|| format!("{file}: field `{path}` is not true or false: {x}"))
}

/// The array at `path` (see [`get`]); an empty one is an error too (nothing to report).
fn list<'v>(v: &'v Value, file: &str, path: &str) -> Result<&'v [Value]> {
    let x = get(v, file, path)?;
    match x.as_array() {
        Some(a) if !a.is_empty() => Ok(a),
        Some(_) => bail!("{file}: `{path}` is empty"),
        None => bail!("{file}: field `{path}` is not a list: {x}"),
    }
}

/// The report, from the experiments' JSON and the run's facts.
fn render(facts: &RunFacts, r: &Results) -> Result<String> {
    let mut md = String::new();
    let _ = writeln!(md, "# ringtier: the experiments of *Characterizing Deep-Learning I/O Workloads in TensorFlow*\n");
    let (read, rj) = (&r.read, "read.json");
    let _ = writeln!(
        md,
        "Machine: {} CPUs, {:.0} GiB, kernel {}. Work directory: `{}` ({}){}. {} per point; figures are medians \
         with min..max.\n",
        num(read, rj, "machine.cpus")?,
        num(read, rj, "machine.memory_bytes")? / (1u64 << 30) as f64,
        text(read, rj, "machine.kernel")?,
        facts.work.display(),
        facts.work_fs,
        facts.work_note.as_ref().map(|n| format!(": {n}")).unwrap_or_default(),
        match num(read, rj, "repeats")? {
            1.0 => "1 repeat".to_string(),
            n => format!("{n} repeats"),
        }
    );
    read_section(&mut md, read)?;
    train_section(&mut md, facts, &r.train_read, &r.train_decode)?;
    ckpt_section(&mut md, &r.ckpt)?;
    if let Some(remote) = &r.remote {
        remote_section(&mut md, remote)?;
    }
    let _ = writeln!(md, "Total time: {:.0} s.", facts.total_seconds);
    Ok(md)
}

fn read_section(md: &mut String, read: &Value) -> Result<()> {
    let rj = "read.json";
    let points = list(read, rj, "points")?;
    let engines: Vec<&str> = points.iter().filter_map(|p| p["engine"].as_str()).collect();
    let uring = ["uring-direct", "uring-buffered"]
        .into_iter()
        .find(|e| engines.contains(e))
        .with_context(|| format!("{rj}: no io_uring points (engines {engines:?})"))?;
    let fs = text(read, rj, "storage.filesystem")?;
    let _ = writeln!(md, "## 1. Read micro-benchmark: threads and queue depth\n");
    let _ = writeln!(
        md,
        "{} ImageNet-like files ({:.0} MB, median {:.0} KB) on {fs}, read cold (every file evicted first) in a \
         shuffled order, whole files, concurrency swept. Plot: `read.svg`; data: `read.json`.\n",
        num(read, rj, "dataset.files")?,
        num(read, rj, "dataset.bytes")? / 1e6,
        num(read, rj, "dataset.median_file_bytes")? / 1e3
    );
    if uring == "uring-buffered" {
        let _ = writeln!(
            md,
            "The work directory's file system ({fs}) has no direct I/O, so the io_uring engine reads through the \
             page cache (uring-buffered) instead of with O_DIRECT.{}\n",
            if fs == "tmpfs" {
                " tmpfs holds the files in memory: \"cold\" reads here are memory copies, not storage reads."
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        md,
        "| engine | concurrency | MB/s | speedup over 1 | CPU s/GiB | p99 ms |\n|---|---|---|---|---|---|"
    );
    let mut best_speedup: BTreeMap<&str, f64> = BTreeMap::new();
    for i in 0..points.len() {
        let f = |field: &str| num(read, rj, &format!("points.{i}.{field}"));
        let engine = text(read, rj, &format!("points.{i}.engine"))?;
        let sp = f("speedup_vs_concurrency_1.median")?;
        let e = best_speedup.entry(engine).or_insert(0.0f64);
        *e = e.max(sp);
        let _ = writeln!(
            md,
            "| {engine} | {} | {:.0} ({:.0}..{:.0}) | {sp:.2} | {:.2} | {:.2} |",
            f("concurrency")?,
            f("mb_per_sec.median")?,
            f("mb_per_sec.min")?,
            f("mb_per_sec.max")?,
            f("cpu_seconds_per_gib.median")?,
            f("latency_p99_ms.median")?
        );
    }
    let posix = best_speedup.get("posix-threads").with_context(|| format!("{rj}: no posix-threads points"))?;
    let cpu_key = format!("headline.cpu_per_gib_{}_over_posix.median", uring.replace('-', "_"));
    let _ = writeln!(
        md,
        "\n**Paper:** more reader threads raised bandwidth up to 2.3x (workstation) and 7.8x (Lustre node). \
         **Here:** the thread pool's best speedup is {posix:.2}x; io_uring ({uring}) with one thread reaches {:.2}x by \
         queue depth alone, at {:.2} of the thread pool's CPU per GiB.\n",
        best_speedup[uring],
        num(read, rj, &cpu_key)?
    );
    Ok(())
}

fn train_section(md: &mut String, facts: &RunFacts, tr_read: &Value, tr: &Value) -> Result<()> {
    let (tj, dj) = ("train-read.json", "train-decode.json");
    let _ = writeln!(md, "## 2. AlexNet mini-app: prefetch hides I/O\n");
    let epochs = num(tr_read, tj, "config.epochs")?;
    let _ = writeln!(
        md,
        "{} Caltech-101-like JPEGs (median {:.0} KB) on {}, {epochs} epoch{} in batches of {}, {:.1} ms of emulated \
         accelerator compute per batch (AlexNet on a K80-class GPU, about 830 images/s). First the batches are \
         read only (`{tj}`), then also decoded and resized to 224x224 on {} threads (`{dj}`).\n",
        facts.caltech_files,
        facts.caltech_median_bytes as f64 / 1e3,
        text(tr_read, tj, "storage.filesystem")?,
        if epochs == 1.0 { "" } else { "s" },
        num(tr_read, tj, "config.batch")?,
        num(tr_read, tj, "config.compute_ms")?,
        num(tr, dj, "config.decode_threads")?
    );
    let _ = writeln!(
        md,
        "| input | prefetch | step time s | stall s | stall % of time | stall % after the first batch | images/s |\n|---|---|---|---|---|---|---|"
    );
    for (label, report, file) in [("read", tr_read, tj), ("read + decode", tr, dj)] {
        for i in 0..list(report, file, "points")?.len() {
            let f = |field: &str| num(report, file, &format!("points.{i}.{field}"));
            let _ = writeln!(
                md,
                "| {label} | {} | {:.4} | {:.3} | {:.2} | {:.2} | {:.0} |",
                f("prefetch")?,
                f("step_seconds.median")?,
                f("stall_seconds.median")?,
                f("stall_percent_of_time.median")?,
                f("stall_percent_after_first_batch.median")?,
                f("images_per_sec.median")?
            );
        }
    }
    let _ = writeln!(
        md,
        "\n**Paper:** with a prefetcher, input and compute fully overlap. **Here:** with prefetch 2 the stall \
         after the first batch is the share above; without prefetch every read (and decode) is waited for. When \
         the decode's CPU cannot keep up with the step ({} CPUs here), prefetch hides only what the CPU allows.\n",
        num(tr, dj, "machine.cpus")?
    );
    Ok(())
}

fn ckpt_section(md: &mut String, ck: &Value) -> Result<()> {
    let cj = "ckpt.json";
    let _ = writeln!(md, "## 3. Burst buffer: checkpoints to fast storage, drained to slow\n");
    let _ = writeln!(
        md,
        "{} checkpoints of {:.0} MB, one per {} s of emulated training; fast tier: a {} directory (raw {} write + \
         fsync {:.0} MB/s); slow tier: {}, on {}. Data: `{cj}`.\n",
        num(ck, cj, "config.count")?,
        num(ck, cj, "config.size")? / 1e6,
        num(ck, cj, "config.compute_secs")?,
        text(ck, cj, "fast.filesystem")?,
        if flag(ck, cj, "fast.raw_write_direct")? { "O_DIRECT" } else { "buffered" },
        num(ck, cj, "fast.raw_write_mb_per_sec")?,
        text(ck, cj, "slow.kind")?,
        text(ck, cj, "slow.filesystem")?
    );
    let _ = writeln!(
        md,
        "| slowdown | raw write s | direct blocking s | burst blocking s | burst/raw | speedup | drain MB/s (cap) |\n\
         |---|---|---|---|---|---|---|"
    );
    for i in 0..list(ck, cj, "points")?.len() {
        let f = |field: &str| num(ck, cj, &format!("points.{i}.{field}"));
        let _ = writeln!(
            md,
            "| {:.1}x | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.0} ({:.0}) |",
            f("slowdown")?,
            f("raw_write_seconds.median")?,
            f("direct_blocking_seconds.median")?,
            f("burst_blocking_seconds.median")?,
            f("burst_blocking_over_raw_write.median")?,
            f("speedup_blocking.median")?,
            f("drain_mb_per_sec.median")?,
            f("slow_mb_per_sec")?
        );
    }
    let _ = writeln!(
        md,
        "\n**Paper:** 2.6x faster checkpointing through the burst buffer. **Here:** the speedup at each slowdown above.\n"
    );
    Ok(())
}

fn remote_section(md: &mut String, rv: &Value) -> Result<()> {
    let rj = "remote.json";
    let rows = list(rv, rj, "rows")?;
    let _ = writeln!(md, "## 4. Remote storage: the latency-bound regime\n");
    let latency = num(rv, rj, "config.latency_ms")?;
    let server_latency = num(rv, rj, "config.server_latency_ms")?;
    let _ = writeln!(
        md,
        "{} objects of {:.0} KB, read cold three ways: from an S3 server on loopback (s3s-fs, a separate process, \
         answering each request {server_latency} ms late, as a remote endpoint's round trip) by ringtier's S3 tier with one driver thread and the requests in flight swept, and by a boto3 \
         `ThreadPoolExecutor` (what a Python user would write) with its threads swept; and the same bytes from \
         local files through ringtier's file tier behind the throttled layer adding {latency} ms per request, \
         as a parallel file system's round trip does. Storage: {}. CPU: the client process's user+system time. \
         Data: `{rj}`.\n",
        num(rv, rj, "config.objects")?,
        num(rv, rj, "config.object_size")? / 1e3,
        text(rv, rj, "storage")?,
    );
    let _ = writeln!(md, "| client | in flight | MB/s | speedup over 1 | CPU s/GiB |\n|---|---|---|---|---|");
    // Per client: (MB/s median at the lowest setting, best MB/s median, CPU s/GiB there).
    let mut by_client: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for i in 0..rows.len() {
        let f = |field: &str| num(rv, rj, &format!("rows.{i}.{field}"));
        let client = text(rv, rj, &format!("rows.{i}.client"))?.to_string();
        let mb = f("mb_per_s.median")?;
        let cpu = f("cpu_s_per_gib.median")?;
        let e = by_client.entry(client.clone()).or_insert((mb, 0.0, f64::NAN));
        if mb > e.1 {
            (e.1, e.2) = (mb, cpu);
        }
        let _ = writeln!(
            md,
            "| {client} | {} | {mb:.1} ({:.1}..{:.1}) | {:.1} | {cpu:.2} |",
            f("setting")?,
            f("mb_per_s.min")?,
            f("mb_per_s.max")?,
            mb / e.0,
        );
    }
    let get = |prefix: &str| {
        by_client
            .iter()
            .find(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .with_context(|| format!("{rj}: no rows of `{prefix}`"))
    };
    let (s3_lo, s3_best, s3_cpu) = get("ringtier S3")?;
    let (_, boto_best, boto_cpu) = get("boto3")?;
    let (files_lo, files_best, _) = get("ringtier files")?;
    let _ = writeln!(
        md,
        "\n**Paper:** on a Lustre node, where every request pays a network round trip, more reader threads raised \
         bandwidth 7.8x. **Here:** with {latency} ms per request, more requests in flight raise the file tier's \
         bandwidth {:.1}x from one driver thread; on S3 {:.1}x. ringtier's S3 tier (one driver thread) at its best \
         reaches {:.2}x the boto3 pool's best bandwidth at {:.2}x its CPU per GiB.\n",
        files_best / files_lo,
        s3_best / s3_lo,
        s3_best / boto_best,
        s3_cpu / boto_cpu
    );
    Ok(())
}

/// The default report directory: `ringtier-report` in the current directory.
pub(crate) fn default_out() -> PathBuf {
    Path::new("ringtier-report").to_path_buf()
}

/// `ringtier paper` (and `ringtier` with no command).
pub(crate) fn command(a: crate::args::PaperArgs) -> anyhow::Result<()> {
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
    };
    run(&cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(x: f64) -> Value {
        json!({"min": x * 0.9, "median": x, "max": x * 1.1})
    }

    fn machine() -> Value {
        json!({"cpus": 7, "memory_bytes": 8u64 << 30, "kernel": "6.1.0-test"})
    }

    /// Experiment JSON of the shapes the experiments write, with only what the report reads
    /// and a few fields it does not.
    fn results(uring: &str) -> Results {
        let point = |engine: &str, c: u64, mb: f64| {
            json!({"engine": engine, "concurrency": c, "mb_per_sec": summary(mb),
                   "speedup_vs_concurrency_1": summary(mb / 100.0), "cpu_seconds_per_gib": summary(1.5),
                   "latency_p99_ms": summary(2.0), "files_per_sec": summary(9.0), "runs": []})
        };
        let read = json!({
            "schema": "ringtier.bench.read/1", "machine": machine(), "repeats": 3,
            "storage": {"path": "/w/imagenet", "filesystem": "xfs"},
            "dataset": {"files": 4096, "bytes": 548_000_000u64, "median_file_bytes": 110_000, "checksums": true},
            "points": [point("posix-threads", 1, 100.0), point("posix-threads", 8, 230.0),
                       point(uring, 1, 120.0), point(uring, 8, 400.0)],
            "headline": {format!("cpu_per_gib_{}_over_posix", uring.replace('-', "_")): summary(0.25)},
        });
        let train = |decode: bool| {
            json!({
                "schema": "ringtier.bench.train/1", "machine": machine(),
                "storage": {"path": "/w/caltech", "filesystem": "xfs"},
                "config": {"epochs": 2, "batch": 64, "compute_ms": 76.8, "decode": decode, "decode_threads": 2},
                "points": ([0, 2].iter().map(|&p| json!({"prefetch": p, "step_seconds": summary(0.08),
                    "stall_seconds": summary(0.5), "stall_percent_of_time": summary(3.0),
                    "stall_percent_after_first_batch": summary(2.0), "images_per_sec": summary(800.0)}))
                    .collect::<Vec<_>>()),
            })
        };
        let ckpt = json!({
            "schema": "ringtier.bench.ckpt/1", "machine": machine(),
            "config": {"count": 3, "size": 244_000_000u64, "compute_secs": 1.0},
            "fast": {"filesystem": "xfs", "raw_write_direct": true, "raw_write_mb_per_sec": 1500.0},
            "slow": {"filesystem": "xfs", "kind": "throttled layer (token bucket)"},
            "points": ([1.0, 4.0].iter().map(|&s| json!({"slowdown": s, "slow_mb_per_sec": 1500.0 / s,
                "raw_write_seconds": summary(0.2), "direct_blocking_seconds": summary(0.2 * s),
                "burst_blocking_seconds": summary(0.2), "burst_blocking_over_raw_write": summary(1.0),
                "speedup_blocking": summary(s), "drain_mb_per_sec": summary(1000.0 / s)}))
                .collect::<Vec<_>>()),
        });
        let row = |client: &str, setting: u64, mb: f64, cpu: f64| json!({"client": client, "setting": setting, "mb_per_s": summary(mb), "cpu_s_per_gib": summary(cpu)});
        let remote = json!({
            "benchmark": "s3 read", "machine": machine(), "server": "S3sFs",
            "storage": "dataset files and server files on /w/remote (xfs /dev/x)",
            "config": {"objects": 1024, "object_size": 114_688, "latency_ms": 4.0, "server_latency_ms": 4.0},
            "rows": [row("boto3 thread pool", 1, 3.0, 28.0), row("boto3 thread pool", 64, 40.0, 20.0),
                     row("ringtier S3 tier", 1, 2.5, 5.0), row("ringtier S3 tier", 64, 80.0, 2.0),
                     row("ringtier files +4ms/request", 1, 20.0, 2.0),
                     row("ringtier files +4ms/request", 64, 300.0, 0.3)],
            "runs": [], "bandwidth_ratio": 2.0, "cpu_per_gib_ratio": 0.1,
        });
        Results { read, train_read: train(false), train_decode: train(true), ckpt, remote: Some(remote) }
    }

    fn facts() -> RunFacts {
        RunFacts {
            work: PathBuf::from("/w"),
            work_fs: "xfs".into(),
            work_note: Some("the temp dir /tmp (tmpfs) has no direct I/O".into()),
            caltech_files: 2048,
            caltech_median_bytes: 10_000,
            total_seconds: 300.0,
        }
    }

    #[test]
    fn the_report_states_what_it_measured() {
        let md = render(&facts(), &results("uring-direct")).expect("render");
        assert!(md.contains("Machine: 7 CPUs, 8 GiB, kernel 6.1.0-test"), "{md}");
        assert!(md.contains("(xfs): the temp dir /tmp (tmpfs) has no direct I/O"), "{md}");
        assert!(md.contains("on xfs, read cold"), "{md}");
        assert!(md.contains("(7 CPUs here)"), "the core count measured, not fixed text: {md}");
        assert!(md.contains("fast tier: a xfs directory (raw O_DIRECT write"), "{md}");
        assert!(md.contains("io_uring (uring-direct) with one thread reaches 4.00x"), "{md}");
        assert!(md.contains("at 0.25 of the thread pool's CPU"), "{md}");
        assert!(!md.contains("NaN") && !md.contains("ext4"), "{md}");
        assert!(md.contains("## 4. Remote storage"), "{md}");
        assert!(md.contains("adding 4 ms per request"), "{md}");
        assert!(md.contains("answering each request 4 ms late"), "{md}");
        assert!(md.contains("raise the file tier's bandwidth 15.0x from one driver thread; on S3 32.0x"), "{md}");
        assert!(md.contains("reaches 2.00x the boto3 pool's best bandwidth at 0.10x its CPU per GiB"), "{md}");
        assert!(md.contains("| ringtier S3 tier | 64 | 80.0 (72.0..88.0) | 32.0 | 2.00 |"), "{md}");
        let without = render(&facts(), &Results { remote: None, ..results("uring-direct") }).expect("render");
        assert!(!without.contains("## 4."), "no remote section unless it ran: {without}");
        let md = render(&facts(), &results("uring-buffered")).expect("render buffered");
        assert!(md.contains("reads through the page cache (uring-buffered)"), "{md}");
        assert!(md.contains("io_uring (uring-buffered) with one thread"), "{md}");
    }

    /// Every leaf of every experiment's JSON, as a dotted path.
    fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
        let join = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
        match v {
            Value::Object(m) => m.iter().for_each(|(k, x)| leaves(x, &join(k), out)),
            Value::Array(a) if !a.is_empty() => {
                a.iter().enumerate().for_each(|(i, x)| leaves(x, &join(&i.to_string()), out))
            }
            _ => out.push(prefix.to_string()),
        }
    }

    fn set_at(v: &mut Value, path: &str, to: Option<Value>) {
        let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
        let mut cur = v;
        for seg in parent.split('.').filter(|s| !s.is_empty()) {
            cur = match seg.parse::<usize>() {
                Ok(i) => &mut cur[i],
                Err(_) => &mut cur[seg],
            };
        }
        match (to, cur) {
            (Some(x), cur) => cur[last] = x,
            (None, Value::Object(m)) => {
                m.remove(last);
            }
            (None, other) => panic!("cannot remove {path} from {other}"),
        }
    }

    #[test]
    fn a_missing_or_null_field_fails_loudly_naming_it() {
        let full = render(&facts(), &results("uring-direct")).expect("render");
        let mut failed = 0;
        for which in 0..5 {
            let base = results("uring-direct");
            let (file, v) = match which {
                0 => ("read.json", &base.read),
                1 => ("train-read.json", &base.train_read),
                2 => ("train-decode.json", &base.train_decode),
                3 => ("ckpt.json", &base.ckpt),
                _ => ("remote.json", base.remote.as_ref().expect("remote")),
            };
            let mut paths = Vec::new();
            leaves(v, "", &mut paths);
            for path in paths.iter().filter(|p| !p.chars().last().is_some_and(|c| c.is_ascii_digit())) {
                for to in [None, Some(Value::Null)] {
                    let mut r = results("uring-direct");
                    let v = match which {
                        0 => &mut r.read,
                        1 => &mut r.train_read,
                        2 => &mut r.train_decode,
                        3 => &mut r.ckpt,
                        _ => r.remote.as_mut().expect("remote"),
                    };
                    set_at(v, path, to.clone());
                    match render(&facts(), &r) {
                        // A field the report does not read changes nothing.
                        Ok(md) => assert_eq!(md, full, "{file}: {path} set to {to:?} changed the report silently"),
                        Err(e) => {
                            let msg = format!("{e:#}");
                            assert!(msg.contains(file) && msg.contains(path), "{file} {path}: {msg}");
                            failed += 1;
                        }
                    }
                }
            }
        }
        assert!(failed > 100, "the report reads most of these fields: {failed} failures");
        // A field that is there but is not a number.
        let mut r = results("uring-direct");
        r.ckpt["points"][1]["speedup_blocking"]["median"] = json!("fast");
        let e = render(&facts(), &r).expect_err("not a number");
        assert!(
            format!("{e:#}").contains("ckpt.json: field `points.1.speedup_blocking.median` is not a number"),
            "{e:#}"
        );
    }
}
