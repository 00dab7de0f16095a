//! `ringtier bench cache`: cache policies (none, LRU, static, clairvoyant) in front of a slow
//! tier that is the bottleneck, one rank and several ranks (processes, each with its own cache
//! and shard, the same seed), cache sizes as fractions of the dataset; epoch time, stall share
//! of step time and hit ratio per policy, with the bound c (one reader) beside the hit ratios.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{PosixConfig, PosixTier, Tier};
use ringtier_loader::{CacheConfig, CacheLevel, CachePolicy, CacheStats, Dataset, Loader, LoaderConfig};
use serde::{Deserialize, Serialize};

use crate::harness::report::utc_now;
use crate::harness::{filesystem, write_json, Machine, Rng, Summary};

/// Arguments of `ringtier bench cache`.
#[derive(Args, Debug, Clone)]
pub struct CacheBenchArgs {
    /// Work directory: the dataset is generated in DIR/cache-dataset (kept and reused when it
    /// matches), cache directory levels go to DIR/cache-levels. Default: a new temp directory.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Samples in the dataset.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) samples: usize,
    /// Bytes per sample.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) sample_bytes: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// Batches the loader reads ahead (its own prefetch, the same for every policy).
    #[arg(long, default_value_t = 2)]
    pub(crate) loader_prefetch: usize,
    /// Emulated training step per batch, milliseconds.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) step_ms: f64,
    /// Slow tier: latency added to every request (one per batch of requests), milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) latency_ms: f64,
    /// Slow tier: read bandwidth in MB/s, shared by the ranks (each process gets its share).
    #[arg(long, default_value_t = 400.0)]
    pub(crate) bandwidth_mbs: f64,
    /// Cache sizes, as fractions of the dataset.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.25")]
    pub(crate) fractions: Vec<f64>,
    /// Rank counts (each rank a process with its own cache and shard).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) ranks: Vec<usize>,
    /// Policies: none, lru, static, clairvoyant.
    #[arg(long, value_delimiter = ',', default_value = "none,lru,static,clairvoyant")]
    pub(crate) policies: Vec<String>,
    /// Epochs per run.
    #[arg(long, default_value_t = 3)]
    pub(crate) epochs: u64,
    /// Repeats (policies interleaved within each repeat).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Seed of the shuffle (the same for every policy and rank).
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Clairvoyant: epochs of lookahead for the placement.
    #[arg(long, default_value_t = 3)]
    pub(crate) lookahead: u64,
    /// Clairvoyant: share of the cache the prefetcher may fill with samples it does not place.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) prefetch_frac: f64,
    /// Clairvoyant: samples in flight from the slow tier.
    #[arg(long, default_value_t = 256)]
    pub(crate) prefetch_depth: usize,
    /// Cache in a directory level (files under --dir) instead of memory.
    #[arg(long)]
    pub(crate) cache_in_dir: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write the report as Markdown here.
    #[arg(long)]
    pub(crate) md: Option<PathBuf>,
    /// Internal: run one rank ("policy,fraction,rank,world") and print its result as JSON.
    #[arg(long, hide = true)]
    pub(crate) worker: Option<String>,
}

/// One epoch of one rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EpochResult {
    epoch: u64,
    seconds: f64,
    stall_seconds: f64,
    accesses: u64,
    hits: u64,
    reuse_hits: u64,
    prefetch_hits: u64,
    misses: u64,
    late_prefetches: u64,
    prefetched_bytes: u64,
    prefetched_unused_bytes: u64,
    mean_prefetch_lead_seconds: f64,
}

/// One rank's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankResult {
    policy: String,
    fraction: f64,
    rank: usize,
    world: usize,
    capacity_bytes: u64,
    max_used_bytes: u64,
    epochs: Vec<EpochResult>,
}

/// One (policy, fraction, world) run of all its ranks, one repeat.
#[derive(Debug, Clone, Serialize)]
struct PolicyRun {
    repeat: usize,
    policy: String,
    fraction: f64,
    world: usize,
    /// Per epoch: the slowest rank's time (ranks of a job wait for each other at the step).
    epoch_seconds: Vec<f64>,
    /// Per epoch: stall over epoch time, mean over ranks.
    stall_share: Vec<f64>,
    /// Per epoch: hits over accesses, all ranks together.
    hit_ratio: Vec<f64>,
    /// Per epoch: reuse hits (no prefetch) over accesses.
    reuse_hit_ratio: Vec<f64>,
    prefetched_unused_bytes: u64,
    mean_prefetch_lead_seconds: f64,
    ranks: Vec<RankResult>,
}

/// Summary of one (policy, fraction, world) over repeats, warm epochs (1 and later).
#[derive(Debug, Clone, Serialize)]
struct Row {
    policy: String,
    fraction: f64,
    world: usize,
    bound_c: f64,
    warm_epoch_seconds: Summary,
    first_epoch_seconds: Summary,
    warm_stall_share: Summary,
    warm_hit_ratio: Summary,
    warm_reuse_hit_ratio: Summary,
    /// LRU's warm epoch time over this one's, pair by pair (same repeat).
    speedup_vs_lru: Summary,
    /// Static's warm epoch time over this one's.
    speedup_vs_static: Summary,
    /// This one's warm hit ratio over static's.
    hit_ratio_vs_static: Summary,
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    date: String,
    machine: Machine,
    storage: String,
    config: String,
    command: String,
    rows: Vec<Row>,
    runs: Vec<PolicyRun>,
}

fn policy_of(s: &str) -> Result<CachePolicy> {
    s.parse::<CachePolicy>().map_err(|e| anyhow::anyhow!("{e}"))
}

pub(crate) fn command(a: CacheBenchArgs) -> Result<()> {
    if let Some(w) = &a.worker {
        return worker(&a, w);
    }
    for p in &a.policies {
        policy_of(p)?;
    }
    if a.fractions.iter().any(|&f| !(f > 0.0 && f <= 1.0)) {
        bail!("cache fractions must be in (0, 1]: {:?}", a.fractions);
    }
    if a.ranks.contains(&0) || a.repeats == 0 || a.epochs == 0 || a.samples == 0 || a.batch == 0 {
        bail!("ranks, repeats, epochs, samples and batch must be at least 1");
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("ringtier-cachebench").tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    generate(&dir.join("cache-dataset"), a.samples, a.sample_bytes)?;
    let exe = std::env::current_exe()?;
    let config = format!(
        "{} samples x {} bytes ({:.0} MB), batch {}, loader prefetch {}, step {} ms, {} epochs, seed {}; slow tier: \
         throttled layer over ext4 files (page cache warm), {} ms per request batch, {} MB/s shared by the ranks; \
         cache in {}; clairvoyant: lookahead {} epochs, prefetch budget {:.0}% of the cache, {} samples in flight",
        a.samples,
        a.sample_bytes,
        (a.samples * a.sample_bytes) as f64 / 1e6,
        a.batch,
        a.loader_prefetch,
        a.step_ms,
        a.epochs,
        a.seed,
        a.latency_ms,
        a.bandwidth_mbs,
        if a.cache_in_dir { "a directory (files)" } else { "memory" },
        a.lookahead,
        a.prefetch_frac * 100.0,
        a.prefetch_depth
    );
    eprintln!("{config}");
    let mut runs = Vec::new();
    for repeat in 0..a.repeats {
        for &fraction in &a.fractions {
            for &world in &a.ranks {
                for policy in &a.policies {
                    let mut children = Vec::new();
                    for rank in 0..world {
                        let mut c = Command::new(&exe);
                        c.args(["bench", "cache"])
                            .args(forwarded(&a, &dir))
                            .arg("--worker")
                            .arg(format!("{policy},{fraction},{rank},{world}"));
                        c.stdout(std::process::Stdio::piped());
                        children.push(c.spawn().context("starting a rank")?);
                    }
                    let mut ranks = Vec::new();
                    for child in children {
                        let out = child.wait_with_output()?;
                        if !out.status.success() {
                            bail!("a rank of {policy} at {fraction} x {world} failed ({})", out.status);
                        }
                        ranks.push(serde_json::from_slice::<RankResult>(&out.stdout).context("a rank's result")?);
                    }
                    let run = combine(repeat, policy, fraction, world, ranks, a.epochs as usize);
                    eprintln!(
                        "repeat {repeat} c={fraction} ranks={world} {policy:>11}: epochs {:?} s, stall {:?}, hit ratio {:?}",
                        run.epoch_seconds.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                        run.stall_share.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                        run.hit_ratio.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>()
                    );
                    runs.push(run);
                }
            }
        }
    }
    let rows = summarize(&a, &runs);
    let report = Report {
        schema: "ringtier.bench.cache/1",
        date: utc_now(),
        machine: Machine::probe(),
        storage: format!(
            "dataset files on {} (read through the page cache), behind the throttled layer ({} ms per request batch, {} \
             MB/s shared)",
            filesystem(&dir),
            a.latency_ms,
            a.bandwidth_mbs
        ),
        config,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        rows,
        runs,
    };
    let md = markdown(&report);
    println!("{md}");
    write_json(a.json.as_deref(), &report)?;
    if let Some(p) = &a.md {
        std::fs::write(p, &md).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// The arguments a rank process needs.
fn forwarded(a: &CacheBenchArgs, dir: &Path) -> Vec<String> {
    vec![
        format!("--dir={}", dir.display()),
        format!("--samples={}", a.samples),
        format!("--sample-bytes={}", a.sample_bytes),
        format!("--batch={}", a.batch),
        format!("--loader-prefetch={}", a.loader_prefetch),
        format!("--step-ms={}", a.step_ms),
        format!("--latency-ms={}", a.latency_ms),
        format!("--bandwidth-mbs={}", a.bandwidth_mbs),
        format!("--epochs={}", a.epochs),
        format!("--seed={}", a.seed),
        format!("--lookahead={}", a.lookahead),
        format!("--prefetch-frac={}", a.prefetch_frac),
        format!("--prefetch-depth={}", a.prefetch_depth),
    ]
    .into_iter()
    .chain(a.cache_in_dir.then(|| "--cache-in-dir".to_string()))
    .collect()
}

fn sample_key(i: usize) -> String {
    format!("s{i:06}.bin")
}

/// Writes the dataset once (kept when every file is there with its size).
fn generate(root: &Path, samples: usize, bytes: usize) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let mut rng = Rng::new(0x5eed);
    let mut buf = vec![0u8; bytes];
    for i in 0..samples {
        let p = root.join(sample_key(i));
        if std::fs::metadata(&p).is_ok_and(|m| m.len() == bytes as u64) {
            continue;
        }
        rng.fill(&mut buf);
        std::fs::write(&p, &buf).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// One rank: its own slow-tier share, cache and shard; prints its result as JSON.
fn worker(a: &CacheBenchArgs, spec: &str) -> Result<()> {
    let parts: Vec<&str> = spec.split(',').collect();
    let [policy, fraction, rank, world] = parts[..] else { bail!("bad --worker {spec}") };
    let policy = policy_of(policy)?;
    let fraction: f64 = fraction.parse()?;
    let (rank, world): (usize, usize) = (rank.parse()?, world.parse()?);
    let dir = a.dir.clone().context("--worker needs --dir")?;
    let rt = crate::runtime(2)?;
    let result = rt.block_on(async {
        let files: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(dir.join("cache-dataset")))?);
        let share = a.bandwidth_mbs * 1e6 / world as f64;
        let throttle = Throttle {
            read_bytes_per_sec: Some(share as u64),
            write_bytes_per_sec: None,
            latency: Duration::from_secs_f64(a.latency_ms / 1000.0),
            burst_bytes: None,
        };
        let slow: Arc<dyn Tier> = Arc::new(Throttled::new(Arc::clone(&files), throttle));
        // Sizes from the files directly (not through the throttle), then read through it.
        let ds = Dataset::from_keys(files, (0..a.samples).map(sample_key)).await?.with_tier(slow);
        let total = (a.samples * a.sample_bytes) as u64;
        let capacity = ((total as f64 * fraction) as u64).max(1);
        let level = if a.cache_in_dir {
            CacheLevel::dir(dir.join("cache-levels"), capacity)
        } else {
            CacheLevel::memory(capacity)
        };
        let cache = CacheConfig::new(policy, vec![level])
            .with_lookahead_epochs(a.lookahead)
            .with_prefetch_bytes(((capacity as f64 * a.prefetch_frac) as u64).min(capacity.saturating_sub(1)))
            .with_prefetch_depth(a.prefetch_depth);
        let cfg = LoaderConfig::default()
            .with_batch_size(a.batch)
            .with_prefetch(a.loader_prefetch)
            .with_seed(a.seed)
            .with_rank(rank)
            .with_world(world)
            .with_cache(cache);
        let loader = Loader::new(ds, cfg)?;
        let cached = loader.cache().context("the loader has its cache")?.clone();
        let step = Duration::from_secs_f64(a.step_ms / 1000.0);
        let mut epochs = Vec::new();
        let mut max_used = 0u64;
        for e in 0..a.epochs {
            let before = cached.stats();
            let t = Instant::now();
            let mut epoch = loader.epoch(e, 0)?;
            while let Some(batch) = epoch.next().await {
                let batch = batch?;
                if !batch.skipped.is_empty() {
                    bail!("samples skipped: {:?}", batch.skipped);
                }
                max_used = max_used.max(cached.stats().levels.iter().map(|l| l.used_bytes).sum());
                drop(batch);
                tokio::time::sleep(step).await; // the training step
            }
            let seconds = t.elapsed().as_secs_f64();
            let d: CacheStats = cached.stats().since(&before);
            epochs.push(EpochResult {
                epoch: e,
                seconds,
                stall_seconds: epoch.stats().stall_seconds,
                accesses: d.accesses(),
                hits: d.hits(),
                reuse_hits: d.reuse_hits(),
                prefetch_hits: d.hits() - d.reuse_hits(),
                misses: d.misses,
                late_prefetches: d.late_prefetches,
                prefetched_bytes: d.prefetched_bytes,
                prefetched_unused_bytes: d.unused_evicted_bytes,
                mean_prefetch_lead_seconds: d.mean_prefetch_lead_seconds(),
            });
        }
        let capacity_bytes = if policy == CachePolicy::None { 0 } else { capacity };
        if max_used > capacity_bytes {
            bail!("the cache held {max_used} bytes, over its capacity of {capacity_bytes}");
        }
        Ok(RankResult {
            policy: policy.to_string(),
            fraction,
            rank,
            world,
            capacity_bytes,
            max_used_bytes: max_used,
            epochs,
        })
    })?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn combine(
    repeat: usize,
    policy: &str,
    fraction: f64,
    world: usize,
    ranks: Vec<RankResult>,
    epochs: usize,
) -> PolicyRun {
    let per = |f: &dyn Fn(&EpochResult) -> f64| -> Vec<Vec<f64>> {
        (0..epochs).map(|e| ranks.iter().map(|r| f(&r.epochs[e])).collect()).collect()
    };
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let epoch_seconds = per(&|e| e.seconds).iter().map(|v| v.iter().copied().fold(0.0, f64::max)).collect();
    let stall_share = per(&|e| e.stall_seconds / e.seconds.max(1e-9)).iter().map(|v| sum(v) / v.len() as f64).collect();
    let hits = per(&|e| e.hits as f64);
    let reuse = per(&|e| e.reuse_hits as f64);
    let acc = per(&|e| e.accesses as f64);
    let hit_ratio = hits.iter().zip(&acc).map(|(h, a)| sum(h) / sum(a).max(1.0)).collect();
    let reuse_hit_ratio = reuse.iter().zip(&acc).map(|(h, a)| sum(h) / sum(a).max(1.0)).collect();
    let prefetched_unused_bytes = ranks.iter().flat_map(|r| &r.epochs).map(|e| e.prefetched_unused_bytes).sum();
    let leads: Vec<f64> = ranks
        .iter()
        .flat_map(|r| &r.epochs)
        .filter(|e| e.prefetch_hits > 0)
        .map(|e| e.mean_prefetch_lead_seconds)
        .collect();
    let mean_prefetch_lead_seconds = if leads.is_empty() { 0.0 } else { sum(&leads) / leads.len() as f64 };
    PolicyRun {
        repeat,
        policy: policy.to_string(),
        fraction,
        world,
        epoch_seconds,
        stall_share,
        hit_ratio,
        reuse_hit_ratio,
        prefetched_unused_bytes,
        mean_prefetch_lead_seconds,
        ranks,
    }
}

fn warm(v: &[f64]) -> f64 {
    if v.len() <= 1 {
        return v.first().copied().unwrap_or(f64::NAN);
    }
    v[1..].iter().sum::<f64>() / (v.len() - 1) as f64
}

fn summarize(a: &CacheBenchArgs, runs: &[PolicyRun]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &fraction in &a.fractions {
        for &world in &a.ranks {
            for policy in &a.policies {
                let mine: Vec<&PolicyRun> =
                    runs.iter().filter(|r| r.fraction == fraction && r.world == world && &r.policy == policy).collect();
                let other = |p: &str, repeat: usize| {
                    runs.iter()
                        .find(|r| r.fraction == fraction && r.world == world && r.policy == p && r.repeat == repeat)
                };
                let pair = |p: &str, f: &dyn Fn(&PolicyRun, &PolicyRun) -> f64| -> Summary {
                    Summary::of(&mine.iter().filter_map(|r| other(p, r.repeat).map(|o| f(r, o))).collect::<Vec<_>>())
                };
                rows.push(Row {
                    policy: policy.clone(),
                    fraction,
                    world,
                    bound_c: fraction,
                    warm_epoch_seconds: Summary::of(&mine.iter().map(|r| warm(&r.epoch_seconds)).collect::<Vec<_>>()),
                    first_epoch_seconds: Summary::of(&mine.iter().map(|r| r.epoch_seconds[0]).collect::<Vec<_>>()),
                    warm_stall_share: Summary::of(&mine.iter().map(|r| warm(&r.stall_share)).collect::<Vec<_>>()),
                    warm_hit_ratio: Summary::of(&mine.iter().map(|r| warm(&r.hit_ratio)).collect::<Vec<_>>()),
                    warm_reuse_hit_ratio: Summary::of(
                        &mine.iter().map(|r| warm(&r.reuse_hit_ratio)).collect::<Vec<_>>(),
                    ),
                    speedup_vs_lru: pair("lru", &|r, o| warm(&o.epoch_seconds) / warm(&r.epoch_seconds)),
                    speedup_vs_static: pair("static", &|r, o| warm(&o.epoch_seconds) / warm(&r.epoch_seconds)),
                    hit_ratio_vs_static: pair("static", &|r, o| warm(&r.hit_ratio) / warm(&o.hit_ratio)),
                });
            }
        }
    }
    rows
}

fn fmt_s(s: &Summary, digits: usize) -> String {
    format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max, d = digits)
}

fn markdown(r: &Report) -> String {
    let mut s = format!(
        "# ringtier bench cache\n\n{}\n\nMachine: {} CPUs, {:.1} GiB, kernel {}. Storage: {}.\n\nConfiguration: {}.\n\n\
         Command: `{}`\n\n\
         Warm = epochs 1 and later (epoch 0 starts with an empty cache). Each cell: median (min-max) over repeats; \
         ratios are taken pair by pair within a repeat (policies interleaved). Epoch time is the slowest rank's. \
         Hit ratio counts every access served from the cache; the reuse hit ratio leaves out first reads of \
         prefetched copies (the hits a cache without prefetch can have, which no policy can raise above c for one \
         reader). A read that waited for a prefetch still in flight counts as a miss.\n\n\
         | c | ranks | policy | warm epoch s | epoch 0 s | warm stall share | warm hit ratio | reuse hit ratio | bound c | \
         vs LRU (time) | vs static (time) | hit ratio vs static |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.date,
        r.machine.cpus,
        r.machine.memory_bytes as f64 / (1u64 << 30) as f64,
        r.machine.kernel,
        r.storage,
        r.config,
        r.command
    );
    for row in &r.rows {
        s.push_str(&format!(
            "| {:.2} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} |\n",
            row.fraction,
            row.world,
            row.policy,
            fmt_s(&row.warm_epoch_seconds, 3),
            fmt_s(&row.first_epoch_seconds, 3),
            fmt_s(&row.warm_stall_share, 3),
            fmt_s(&row.warm_hit_ratio, 3),
            fmt_s(&row.warm_reuse_hit_ratio, 3),
            row.bound_c,
            fmt_s(&row.speedup_vs_lru, 2),
            fmt_s(&row.speedup_vs_static, 2),
            fmt_s(&row.hit_ratio_vs_static, 2),
        ));
    }
    s
}
