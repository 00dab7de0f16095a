//! `ringtier paper`: the paper's three experiments in one command, with a report directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::dataset::{self, DatasetSpec, Format, Preset};
use crate::passes::{Engine, Knobs, OnError, Order};
use crate::{ckpt, readbench, train};

/// Settings of the paper run.
#[derive(Debug, Clone)]
pub(crate) struct PaperConfig {
    pub out: PathBuf,
    pub work: PathBuf,
    pub full: bool,
    pub tiny: bool,
    pub repeats: usize,
}

fn med(v: &serde_json::Value) -> f64 {
    v["median"].as_f64().unwrap_or(f64::NAN)
}

/// Runs the three experiments and writes `OUT/report.md`, JSON and the plot.
pub(crate) fn run(cfg: &PaperConfig) -> Result<()> {
    std::fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    std::fs::create_dir_all(&cfg.work).with_context(|| format!("creating {}", cfg.work.display()))?;
    let started = std::time::Instant::now();
    let mut md = String::new();
    let _ = writeln!(md, "# ringtier: the experiments of *Characterizing Deep-Learning I/O Workloads in TensorFlow*\n");
    let m = crate::stats::Machine::probe();
    let _ = writeln!(
        md,
        "Machine: {} CPUs, {:.0} GiB, kernel {}. Work directory: `{}` ({}). {} repeats per point; figures are \
         medians with min..max.\n",
        m.cpus,
        m.memory_bytes as f64 / (1u64 << 30) as f64,
        m.kernel,
        cfg.work.display(),
        ringtier_core::fs::fs_type_name(&cfg.work),
        cfg.repeats
    );

    // 1. The read micro-benchmark.
    eprintln!("== 1/3: read micro-benchmark");
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
        engines: vec![Engine::PosixThreads, Engine::UringDirect],
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
    let _ = writeln!(md, "## 1. Read micro-benchmark: threads and queue depth\n");
    let _ = writeln!(
        md,
        "{} ImageNet-like files ({:.0} MB, median {:.0} KB), read cold (every file evicted first) in a \
         shuffled order, whole files, concurrency swept. Plot: `read.svg`; data: `read.json`.\n",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        ds.median_size() as f64 / 1e3
    );
    let _ = writeln!(
        md,
        "| engine | concurrency | MB/s | speedup over 1 | CPU s/GiB | p99 ms |\n|---|---|---|---|---|---|"
    );
    let mut best_speedup = std::collections::BTreeMap::new();
    for p in read["points"].as_array().into_iter().flatten() {
        let engine = p["engine"].as_str().unwrap_or("");
        let sp = med(&p["speedup_vs_concurrency_1"]);
        let e = best_speedup.entry(engine.to_string()).or_insert(0.0f64);
        *e = e.max(sp);
        let _ = writeln!(
            md,
            "| {engine} | {} | {:.0} ({:.0}..{:.0}) | {:.2} | {:.2} | {:.2} |",
            p["concurrency"],
            med(&p["mb_per_sec"]),
            p["mb_per_sec"]["min"].as_f64().unwrap_or(0.0),
            p["mb_per_sec"]["max"].as_f64().unwrap_or(0.0),
            sp,
            med(&p["cpu_seconds_per_gib"]),
            med(&p["latency_p99_ms"])
        );
    }
    let _ = writeln!(
        md,
        "\n**Paper:** more reader threads raised bandwidth up to 2.3x (workstation) and 7.8x (Lustre node). \
         **Here:** the thread pool's best speedup is {:.2}x; io_uring with one thread reaches {:.2}x by queue depth \
         alone, at {:.2} of the thread pool's CPU per GiB.\n",
        best_speedup.get("posix-threads").copied().unwrap_or(f64::NAN),
        best_speedup.get("uring-direct").copied().unwrap_or(f64::NAN),
        med(&read["headline"]["cpu_per_gib_uring_direct_over_posix"])
    );
    let _ = std::fs::remove_dir_all(cfg.work.join("imagenet"));

    // 2. The AlexNet mini-app.
    eprintln!("== 2/3: AlexNet mini-app, prefetch on and off");
    let files = if cfg.full {
        9_144
    } else if cfg.tiny {
        256
    } else {
        2_048
    };
    let spec = DatasetSpec { files, format: Format::Jpeg, ..DatasetSpec::preset(Preset::Caltech101) };
    let cal = dataset::generate(&cfg.work.join("caltech"), &spec, true, false)?;
    let batch = 64;
    let base = train::TrainConfig {
        dir: cal.root.clone(),
        batch,
        epochs: 2,
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
    let tr_read = train::run(&base)?;
    // Reading and decoding: on a small machine the decode's CPU, not storage, sets the pace.
    let tcfg = train::TrainConfig { decode: true, json: Some(cfg.out.join("train-decode.json")), ..base };
    let tr = train::run(&tcfg)?;
    let _ = writeln!(md, "## 2. AlexNet mini-app: prefetch hides I/O\n");
    let _ = writeln!(
        md,
        "{} Caltech-101-like JPEGs (median {:.0} KB), two epochs in batches of {batch}, {:.1} ms of emulated \
         accelerator compute per batch (AlexNet on a K80-class GPU, about 830 images/s). First the batches are \
         read only (`train-read.json`), then also decoded and resized to 224x224 on two threads \
         (`train-decode.json`).\n",
        cal.len(),
        cal.median_size() as f64 / 1e3,
        tcfg.compute_ms
    );
    let _ = writeln!(
        md,
        "| input | prefetch | step time s | stall s | stall % of time | stall % after the first batch | images/s |\n|---|---|---|---|---|---|---|"
    );
    for (label, report) in [("read", &tr_read), ("read + decode", &tr)] {
        for p in report["points"].as_array().into_iter().flatten() {
            let _ = writeln!(
                md,
                "| {label} | {} | {:.4} | {:.3} | {:.2} | {:.2} | {:.0} |",
                p["prefetch"],
                med(&p["step_seconds"]),
                med(&p["stall_seconds"]),
                med(&p["stall_percent_of_time"]),
                med(&p["stall_percent_after_first_batch"]),
                med(&p["images_per_sec"])
            );
        }
    }
    let _ = writeln!(
        md,
        "\n**Paper:** with a prefetcher, input and compute fully overlap. **Here:** with prefetch 2 the stall \
         after the first batch is the share above; without prefetch every read (and decode) is waited for. When \
         the decode's CPU cannot keep up with the step (two cores here), prefetch hides only what the CPU allows.\n"
    );
    let _ = std::fs::remove_dir_all(cfg.work.join("caltech"));

    // 3. The burst buffer.
    eprintln!("== 3/3: burst buffer");
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
    let ck = ckpt::bench(&kcfg)?;
    let _ = writeln!(md, "## 3. Burst buffer: checkpoints to fast storage, drained to slow\n");
    let _ = writeln!(
        md,
        "3 checkpoints of {:.0} MB, one per {} s of emulated training; fast tier: ext4 directory (raw write \
         {:.0} MB/s); slow tier: the throttled layer over ext4 at the fast tier's bandwidth divided by the \
         slowdown. Data: `ckpt.json`.\n",
        kcfg.size as f64 / 1e6,
        kcfg.compute_secs,
        ck["fast"]["raw_write_mb_per_sec"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(
        md,
        "| slowdown | raw write s | direct blocking s | burst blocking s | burst/raw | speedup | drain MB/s (cap) |\n\
         |---|---|---|---|---|---|---|"
    );
    for p in ck["points"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {}x | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.0} ({:.0}) |",
            p["slowdown"],
            med(&p["raw_write_seconds"]),
            med(&p["direct_blocking_seconds"]),
            med(&p["burst_blocking_seconds"]),
            med(&p["burst_blocking_over_raw_write"]),
            med(&p["speedup_blocking"]),
            med(&p["drain_mb_per_sec"]),
            p["slow_mb_per_sec"].as_f64().unwrap_or(0.0)
        );
    }
    let _ = writeln!(md, "\n**Paper:** 2.6x faster checkpointing through the burst buffer. **Here:** the speedup at each slowdown above.\n");
    let _ = std::fs::remove_dir_all(cfg.work.join("ckpt"));
    let _ = writeln!(md, "Total time: {:.0} s.", started.elapsed().as_secs_f64());
    let path = cfg.out.join("report.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("\nreport: {}", path.display());
    Ok(())
}

/// The default report directory: `ringtier-report` in the current directory.
pub(crate) fn default_out() -> PathBuf {
    Path::new("ringtier-report").to_path_buf()
}
