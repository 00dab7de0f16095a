//! The restore half of `ringtier bench ckpt`: how fast a crashed job gets its checkpoint back,
//! side by side in one run with the disk's own read speed of the same part files (`cat`,
//! cold) and with `cp` of them into a directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};
use ringtier_migrate::{BufferSink, Part, RestoreOptions, StoreConfig};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use crate::harness::usage::run_child;
use crate::harness::{
    interleaved, peak_rss_bytes, reset_peak_rss, write_json, Cold, ColdMethod, Machine, Meter, Rng, Summary, Table, GIB,
};
use crate::tiers::{open_store, restore_to_dir};

/// Settings of the restore benchmark.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RestoreBenchConfig {
    /// Working directory: `fast/`, `slow/` and the output directories go under it.
    pub(crate) base: PathBuf,
    /// Fast tier directory (default `base/fast`).
    pub(crate) fast_dir: Option<PathBuf>,
    /// Slow tier directory (default `base/slow`).
    pub(crate) slow_dir: Option<PathBuf>,
    /// Checkpoint size in bytes, split into `parts` parts.
    pub(crate) size: u64,
    pub(crate) parts: usize,
    pub(crate) repeats: usize,
    /// Read requests in flight and bytes per request of the restores.
    pub(crate) depth: usize,
    pub(crate) chunk: usize,
    pub(crate) json: Option<PathBuf>,
    /// The engine the tiers are opened with (`auto`, `uring` or `posix`).
    #[serde(serialize_with = "crate::harness::display")]
    pub(crate) engine: ringtier_uring::Engine,
}

/// One timed pass.
#[derive(Debug, Clone, Serialize)]
struct Pass {
    mode: &'static str,
    repeat: usize,
    seconds: f64,
    cpu_seconds: f64,
    /// Peak resident memory of the process above what it held before the pass (destination
    /// buffers included in "before"); `None` for commands run as child processes.
    peak_rss_above_bytes: Option<u64>,
}

/// Streams deterministic bytes without holding them (the checkpoint is bigger than we want
/// resident while measuring memory).
struct Stream {
    rng: Rng,
    left: u64,
}

impl std::io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        self.rng.fill(&mut buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

/// Runs the restore benchmark, prints its table and returns the JSON report.
pub(crate) fn bench(cfg: &RestoreBenchConfig) -> Result<RestoreReport> {
    if cfg.size == 0 || cfg.parts == 0 || cfg.repeats == 0 || cfg.depth == 0 || cfg.chunk == 0 {
        bail!("--restore-size, --restore-parts, --repeats, --restore-depth and --restore-chunk must be positive");
    }
    let fast = cfg.fast_dir.clone().unwrap_or_else(|| cfg.base.join("fast")).join("restore-bench");
    let slow = cfg.slow_dir.clone().unwrap_or_else(|| cfg.base.join("slow")).join("restore-bench");
    let out = cfg.base.join("restore-out");
    for d in [&fast, &slow, &out] {
        let _ = std::fs::remove_dir_all(d);
    }
    let rt = crate::runtime(2)?;
    let part_sizes: Vec<u64> = (0..cfg.parts as u64)
        .map(|i| cfg.size / cfg.parts as u64 + u64::from(i < cfg.size % cfg.parts as u64))
        .collect();
    let names: Vec<String> = (0..cfg.parts).map(|i| format!("part{i}")).collect();
    eprintln!("restore: saving a {:.0} MB checkpoint of {} parts and draining it", cfg.size as f64 / 1e6, cfg.parts);
    let store_cfg = StoreConfig::default().with_keep_last(1);
    rt.block_on(async {
        let store = open_store(
            &[fast.clone(), slow.clone()],
            None,
            BufferedWrites::default(),
            store_cfg.clone(),
            false,
            cfg.engine,
        )
        .await?;
        let parts = names
            .iter()
            .zip(&part_sizes)
            .enumerate()
            .map(|(i, (n, &size))| {
                Part::reader(n.clone(), Stream { rng: Rng::new(100 + i as u64), left: size }, Some(size))
            })
            .collect();
        store.save(1, parts).await?;
        store.drain().await?;
        anyhow::Ok(())
    })?;
    let parts_dir = |root: &Path| root.join(format!("ckpt/{:020}/parts", 1));
    let (fast_parts, slow_parts) = (parts_dir(&fast), parts_dir(&slow));
    let part_files = |dir: &Path| names.iter().map(|n| dir.join(n)).collect::<Vec<_>>();
    let (fast_fs, slow_fs) = (crate::harness::filesystem(&fast_parts), crate::harness::filesystem(&slow_parts));
    let opts = RestoreOptions::default().with_depth(cfg.depth).with_chunk_bytes(cfg.chunk);
    // Destination buffers of the loads into memory: allocated and touched once, as a training
    // job's tensors are, and counted in the "before" of every pass.
    let mut dst: Vec<Vec<u8>> = part_sizes.iter().map(|&s| vec![1u8; s as usize]).collect();
    let stores = rt.block_on(async {
        let both = open_store(
            &[fast.clone(), slow.clone()],
            None,
            BufferedWrites::default(),
            store_cfg.clone(),
            true,
            cfg.engine,
        )
        .await?;
        let slow_only = open_store(
            std::slice::from_ref(&slow),
            None,
            BufferedWrites::default(),
            store_cfg.clone(),
            true,
            cfg.engine,
        )
        .await?;
        anyhow::Ok((both, slow_only))
    })?;
    let mut how_cold = ColdMethod::Warm;
    let cp_dir = cfg.base.join("cp-out");
    // Every way of reading the checkpoint back once per repeat, in this order (the harness's
    // interleaving), each pass cold.
    const MODES: [&str; 8] = ["cat", "load", "restore_dir", "cp", "restore_nosync", "cp_sync", "cat_slow", "load_slow"];
    let per_mode = interleaved(cfg.repeats, &MODES, false, |repeat, &mode| {
        let _ = std::fs::remove_dir_all(&out);
        let _ = std::fs::remove_dir_all(&cp_dir);
        how_cold = Cold::new().pass_dirs(&[&fast, &slow])?;
        let rss0 = reset_peak_rss();
        let meter = Meter::start();
        let (seconds, cpu, rss) = match mode {
            "cat" | "cat_slow" => {
                let dir = if mode == "cat" { &fast_parts } else { &slow_parts };
                let files = part_files(dir);
                let u = run_child(Command::new("sh").arg("-c").arg("cat \"$@\" > /dev/null").arg("sh").args(&files))?;
                (u.wall_seconds, u.children_cpu_seconds, None)
            }
            "cp" | "cp_sync" => {
                std::fs::create_dir_all(&cp_dir)?;
                let files = part_files(&fast_parts);
                let script = if mode == "cp" { "cp \"$@\"" } else { "cp \"$@\" && sync" };
                let u = run_child(Command::new("sh").arg("-c").arg(script).arg("sh").args(&files).arg(&cp_dir))?;
                (u.wall_seconds, u.children_cpu_seconds, None)
            }
            "load" | "load_slow" => {
                let store = if mode == "load" { &stores.0 } else { &stores.1 };
                let buffers = names.iter().cloned().zip(dst.iter_mut().map(|v| v.as_mut_slice())).collect();
                let mut sink = BufferSink::new(buffers);
                let r = rt.block_on(store.restore(1, &mut sink, &opts))?;
                if r.bytes != cfg.size {
                    bail!("load read {} of {} bytes", r.bytes, cfg.size);
                }
                let u = meter.stop();
                (u.wall_seconds, u.cpu_seconds, Some(peak_rss_bytes().saturating_sub(rss0)))
            }
            _ => {
                let sync = mode == "restore_dir";
                let r = rt.block_on(restore_to_dir(&stores.0, 1, &out, &opts, sync, cfg.engine))?;
                if r.bytes != cfg.size {
                    bail!("restore wrote {} of {} bytes", r.bytes, cfg.size);
                }
                let u = meter.stop();
                (u.wall_seconds, u.cpu_seconds, Some(peak_rss_bytes().saturating_sub(rss0)))
            }
        };
        eprintln!(
            "  repeat {}/{} {mode:<12} {:>6.3} s {:>7.0} MB/s{}",
            repeat + 1,
            cfg.repeats,
            seconds,
            cfg.size as f64 / seconds / 1e6,
            rss.map_or(String::new(), |r| format!(", peak RSS +{:.1} MiB", r as f64 / (1 << 20) as f64))
        );
        Ok(Pass { mode, repeat, seconds, cpu_seconds: cpu, peak_rss_above_bytes: rss })
    })?;
    let passes: Vec<Pass> = per_mode.into_iter().flatten().collect();
    // The loads must have read the right bytes: check the last one's against the saved stream.
    for (i, (d, &size)) in dst.iter().zip(&part_sizes).enumerate() {
        let mut want = vec![0u8; size as usize];
        Rng::new(100 + i as u64).fill(&mut want);
        if *d != want {
            bail!("part{i} loaded wrong bytes");
        }
    }
    drop(dst);
    for d in [&fast, &slow, &out, &cp_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
    report(cfg, passes, how_cold, fast_fs, slow_fs)
}

/// One way of getting the checkpoint back, over the repeats.
#[derive(Debug, Clone, Serialize)]
struct Mode {
    what: &'static str,
    seconds: Summary,
    mb_per_sec_median: f64,
    cpu_seconds_per_gib: Summary,
    peak_rss_above_bytes: Option<u64>,
}

/// The report of the restore half of `bench ckpt` (`ringtier.bench.restore/1`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RestoreReport {
    schema: &'static str,
    machine: Machine,
    config: RestoreBenchConfig,
    fast_filesystem: &'static str,
    slow_filesystem: &'static str,
    cold: ColdMethod,
    modes: BTreeMap<&'static str, Mode>,
    /// Speed ratios pair by pair (the same repeat): the baseline's seconds over ours.
    ratios: BTreeMap<&'static str, Summary>,
    passes: Vec<Pass>,
}

fn report(
    cfg: &RestoreBenchConfig,
    passes: Vec<Pass>,
    how_cold: ColdMethod,
    fast_fs: &'static str,
    slow_fs: &'static str,
) -> Result<RestoreReport> {
    let of = |mode: &str| passes.iter().filter(|p| p.mode == mode).collect::<Vec<_>>();
    let secs = |mode: &str| of(mode).iter().map(|p| p.seconds).collect::<Vec<_>>();
    let ratio = |ours: &str, base: &str| Summary::ratio(&secs(base), &secs(ours));
    let gib = cfg.size as f64 / GIB;
    println!();
    println!(
        "restore of a {:.0} MB checkpoint ({} parts); fast tier {fast_fs}, slow tier {slow_fs}; depth {} x {} KiB \
         reads; cold ({how_cold}) before every pass; {} repeats, interleaved; min/median/max",
        cfg.size as f64 / 1e6,
        cfg.parts,
        cfg.depth,
        cfg.chunk >> 10,
        cfg.repeats
    );
    let mut table = Table::new(["", "seconds", "MB/s (median)", "CPU s/GiB", "peak RSS +MiB"]);
    let mut modes = BTreeMap::new();
    let label = [
        ("cat", "cat of the fast part files"),
        ("load", "ringtier load into memory (fast)"),
        ("cp", "cp of the part files into a dir"),
        ("cp_sync", "cp + sync"),
        ("restore_dir", "ringtier restore --out (fsynced)"),
        ("restore_nosync", "ringtier restore --out --no-sync"),
        ("cat_slow", "cat of the slow part files"),
        ("load_slow", "ringtier load from the slow copy"),
    ];
    for (mode, what) in label {
        let s = Summary::of(&secs(mode));
        let cpu = Summary::by(of(mode), |p| p.cpu_seconds / gib);
        let rss = of(mode).iter().filter_map(|p| p.peak_rss_above_bytes).max();
        let mb = cfg.size as f64 / s.median / 1e6;
        table.row([
            what.to_string(),
            format!("{:.2} {:.2} {:.2}", s.min, s.median, s.max),
            format!("{mb:.0}"),
            format!("{:.2}", cpu.median),
            rss.map_or("-".to_string(), |r| format!("{:.1}", r as f64 / (1 << 20) as f64)),
        ]);
        modes.insert(
            mode,
            Mode { what, seconds: s, mb_per_sec_median: mb, cpu_seconds_per_gib: cpu, peak_rss_above_bytes: rss },
        );
    }
    print!("{}", table.text());
    let pairs = [
        ("load_over_cat", "load / cat (fast)           ", ratio("load", "cat"), "   (target >= 0.9)"),
        ("restore_dir_over_cp", "restore --out / cp          ", ratio("restore_dir", "cp"), ""),
        ("restore_dir_over_cp_sync", "restore --out / (cp + sync) ", ratio("restore_dir", "cp_sync"), ""),
        ("restore_nosync_over_cp", "restore --no-sync / cp      ", ratio("restore_nosync", "cp"), "   (target >= 1.0)"),
        ("load_slow_over_cat_slow", "load / cat (slow copy)      ", ratio("load_slow", "cat_slow"), ""),
    ];
    println!("speed ratios, pair by pair (min median max):");
    let mut ratios = BTreeMap::new();
    for (key, what, s, note) in pairs {
        println!("  {what} {:.2} {:.2} {:.2}{note}", s.min, s.median, s.max);
        ratios.insert(key, s);
    }
    let report = RestoreReport {
        schema: "ringtier.bench.restore/1",
        machine: Machine::probe(),
        config: cfg.clone(),
        fast_filesystem: fast_fs,
        slow_filesystem: slow_fs,
        cold: how_cold,
        modes,
        ratios,
        passes,
    };
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}
