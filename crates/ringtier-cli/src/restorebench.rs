//! The restore half of `ringtier bench ckpt`: how fast a crashed job gets its checkpoint back,
//! side by side in one run with the disk's own read speed of the same part files (`cat`,
//! cold) and with `cp` of them into a directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ringtier_migrate::{BufferSink, Part, RestoreOptions, StoreConfig};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use crate::ckpt::{open_store, restore_to_dir};
use crate::stats::{drop_caches, evict, process_cpu, write_json, Machine, Rng, Summary};

/// Settings of the restore benchmark.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RestoreBenchConfig {
    /// Working directory: `fast/`, `slow/` and the output directories go under it.
    pub base: PathBuf,
    /// Fast tier directory (default `base/fast`).
    pub fast_dir: Option<PathBuf>,
    /// Slow tier directory (default `base/slow`).
    pub slow_dir: Option<PathBuf>,
    /// Checkpoint size in bytes, split into `parts` parts.
    pub size: u64,
    pub parts: usize,
    pub repeats: usize,
    /// Read requests in flight and bytes per request of the restores.
    pub depth: usize,
    pub chunk: usize,
    pub json: Option<PathBuf>,
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

/// Resets the process's peak resident size to its current one (Linux 4.0+), so each pass's
/// peak is its own; returns the current resident bytes.
fn reset_peak_rss() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib("VmRSS:") * 1024
}

fn peak_rss() -> u64 {
    status_kib("VmHWM:") * 1024
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// CPU seconds of finished children (the `cat` and `cp` baselines).
fn children_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |ru| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(ru.user_time()) + t(ru.system_time())
    })
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Makes the next read of every file under `dirs` cold: the whole page cache as root,
/// `posix_fadvise(DONTNEED)` per file otherwise.
fn cold(dirs: &[&Path]) -> Result<&'static str> {
    if drop_caches().is_ok() {
        return Ok("drop_caches");
    }
    nix::unistd::sync();
    for d in dirs {
        for f in files_under(d) {
            evict(&f).with_context(|| format!("evicting {}", f.display()))?;
        }
    }
    Ok("posix_fadvise(DONTNEED)")
}

fn run_child(cmd: &mut Command) -> Result<(f64, f64)> {
    let cpu0 = children_cpu();
    let t = Instant::now();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let secs = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok((secs, children_cpu() - cpu0))
}

/// Runs the restore benchmark, prints its table and returns the JSON report.
pub(crate) fn bench(cfg: &RestoreBenchConfig) -> Result<serde_json::Value> {
    if cfg.size == 0 || cfg.parts == 0 || cfg.repeats == 0 || cfg.depth == 0 || cfg.chunk == 0 {
        bail!("--restore-size, --restore-parts, --repeats, --restore-depth and --restore-chunk must be positive");
    }
    let fast = cfg.fast_dir.clone().unwrap_or_else(|| cfg.base.join("fast")).join("restore-bench");
    let slow = cfg.slow_dir.clone().unwrap_or_else(|| cfg.base.join("slow")).join("restore-bench");
    let out = cfg.base.join("restore-out");
    for d in [&fast, &slow, &out] {
        let _ = std::fs::remove_dir_all(d);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let part_sizes: Vec<u64> = (0..cfg.parts as u64)
        .map(|i| cfg.size / cfg.parts as u64 + u64::from(i < cfg.size % cfg.parts as u64))
        .collect();
    let names: Vec<String> = (0..cfg.parts).map(|i| format!("part{i}")).collect();
    eprintln!("restore: saving a {:.0} MB checkpoint of {} parts and draining it", cfg.size as f64 / 1e6, cfg.parts);
    let store_cfg = StoreConfig::default().with_keep_last(1);
    rt.block_on(async {
        let store =
            open_store(&[fast.clone(), slow.clone()], None, BufferedWrites::default(), store_cfg.clone(), false)
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
    let (fast_fs, slow_fs) =
        (ringtier_core::fs::fs_type_name(&fast_parts), ringtier_core::fs::fs_type_name(&slow_parts));
    let opts = RestoreOptions::default().with_depth(cfg.depth).with_chunk_bytes(cfg.chunk);
    // Destination buffers of the loads into memory: allocated and touched once, as a training
    // job's tensors are, and counted in the "before" of every pass.
    let mut dst: Vec<Vec<u8>> = part_sizes.iter().map(|&s| vec![1u8; s as usize]).collect();
    let stores = rt.block_on(async {
        let both =
            open_store(&[fast.clone(), slow.clone()], None, BufferedWrites::default(), store_cfg.clone(), true).await?;
        let slow_only =
            open_store(std::slice::from_ref(&slow), None, BufferedWrites::default(), store_cfg.clone(), true).await?;
        anyhow::Ok((both, slow_only))
    })?;
    let mut passes: Vec<Pass> = Vec::new();
    let mut how_cold = "";
    let cp_dir = cfg.base.join("cp-out");
    for repeat in 0..cfg.repeats {
        for mode in ["cat", "load", "restore_dir", "cp", "restore_nosync", "cp_sync", "cat_slow", "load_slow"] {
            let _ = std::fs::remove_dir_all(&out);
            let _ = std::fs::remove_dir_all(&cp_dir);
            how_cold = cold(&[&fast, &slow])?;
            let rss0 = reset_peak_rss();
            let cpu0 = process_cpu();
            let t = Instant::now();
            let (seconds, cpu, rss) = match mode {
                "cat" | "cat_slow" => {
                    let dir = if mode == "cat" { &fast_parts } else { &slow_parts };
                    let files = part_files(dir);
                    let (s, c) =
                        run_child(Command::new("sh").arg("-c").arg("cat \"$@\" > /dev/null").arg("sh").args(&files))?;
                    (s, c, None)
                }
                "cp" | "cp_sync" => {
                    std::fs::create_dir_all(&cp_dir)?;
                    let files = part_files(&fast_parts);
                    let script = if mode == "cp" { "cp \"$@\"" } else { "cp \"$@\" && sync" };
                    let (s, c) =
                        run_child(Command::new("sh").arg("-c").arg(script).arg("sh").args(&files).arg(&cp_dir))?;
                    (s, c, None)
                }
                "load" | "load_slow" => {
                    let store = if mode == "load" { &stores.0 } else { &stores.1 };
                    let buffers = names.iter().cloned().zip(dst.iter_mut().map(|v| v.as_mut_slice())).collect();
                    let mut sink = BufferSink::new(buffers);
                    let r = rt.block_on(store.restore(1, &mut sink, &opts))?;
                    if r.bytes != cfg.size {
                        bail!("load read {} of {} bytes", r.bytes, cfg.size);
                    }
                    let s = t.elapsed().as_secs_f64();
                    (s, (process_cpu() - cpu0).as_secs_f64(), Some(peak_rss().saturating_sub(rss0)))
                }
                _ => {
                    let sync = mode == "restore_dir";
                    let r = rt.block_on(restore_to_dir(&stores.0, 1, &out, &opts, sync))?;
                    if r.bytes != cfg.size {
                        bail!("restore wrote {} of {} bytes", r.bytes, cfg.size);
                    }
                    let s = t.elapsed().as_secs_f64();
                    (s, (process_cpu() - cpu0).as_secs_f64(), Some(peak_rss().saturating_sub(rss0)))
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
            passes.push(Pass { mode, repeat, seconds, cpu_seconds: cpu, peak_rss_above_bytes: rss });
        }
    }
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
    report(cfg, &passes, how_cold, fast_fs, slow_fs)
}

fn report(
    cfg: &RestoreBenchConfig,
    passes: &[Pass],
    how_cold: &str,
    fast_fs: &str,
    slow_fs: &str,
) -> Result<serde_json::Value> {
    let of = |mode: &str| passes.iter().filter(|p| p.mode == mode).collect::<Vec<_>>();
    let secs = |mode: &str| of(mode).iter().map(|p| p.seconds).collect::<Vec<_>>();
    // Ratios pair by pair (the same repeat), as speeds: baseline seconds / ours.
    let ratio = |ours: &str, base: &str| {
        Summary::of(&secs(base).iter().zip(secs(ours)).map(|(b, o)| b / o).collect::<Vec<_>>())
    };
    let gib = cfg.size as f64 / (1u64 << 30) as f64;
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
    println!("{:<34} {:>20}  {:>16}  {:>12}  {:>14}", "", "seconds", "MB/s (median)", "CPU s/GiB", "peak RSS +MiB");
    let mut modes = serde_json::Map::new();
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
        let cpu = Summary::of(&of(mode).iter().map(|p| p.cpu_seconds / gib).collect::<Vec<_>>());
        let rss = of(mode).iter().filter_map(|p| p.peak_rss_above_bytes).max();
        println!(
            "{what:<34} {:>6.2} {:>6.2} {:>6.2}  {:>16.0}  {:>12.2}  {:>14}",
            s.min,
            s.median,
            s.max,
            cfg.size as f64 / s.median / 1e6,
            cpu.median,
            rss.map_or("-".to_string(), |r| format!("{:.1}", r as f64 / (1 << 20) as f64))
        );
        modes.insert(
            mode.to_string(),
            serde_json::json!({"what": what, "seconds": s, "mb_per_sec_median": cfg.size as f64 / s.median / 1e6,
                               "cpu_seconds_per_gib": cpu, "peak_rss_above_bytes": rss}),
        );
    }
    let pairs = [
        ("load_over_cat", "load / cat (fast)           ", ratio("load", "cat"), "   (target >= 0.9)"),
        ("restore_dir_over_cp", "restore --out / cp          ", ratio("restore_dir", "cp"), ""),
        ("restore_dir_over_cp_sync", "restore --out / (cp + sync) ", ratio("restore_dir", "cp_sync"), ""),
        ("restore_nosync_over_cp", "restore --no-sync / cp      ", ratio("restore_nosync", "cp"), "   (target >= 1.0)"),
        ("load_slow_over_cat_slow", "load / cat (slow copy)      ", ratio("load_slow", "cat_slow"), ""),
    ];
    println!("speed ratios, pair by pair (min median max):");
    let mut ratios = serde_json::Map::new();
    for (key, what, s, note) in pairs {
        println!("  {what} {:.2} {:.2} {:.2}{note}", s.min, s.median, s.max);
        ratios.insert(key.to_string(), serde_json::json!(s));
    }
    let report = serde_json::json!({
        "schema": "ringtier.bench.restore/1",
        "machine": Machine::probe(),
        "config": cfg,
        "fast_filesystem": fast_fs,
        "slow_filesystem": slow_fs,
        "cold": how_cold,
        "modes": modes,
        "ratios": ratios,
        "passes": passes,
    });
    write_json(cfg.json.as_deref(), &report)?;
    Ok(report)
}
