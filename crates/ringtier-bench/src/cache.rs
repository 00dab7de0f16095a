//! `ringtier bench cache`: cache policies (none, LRU, static, clairvoyant) in front of a slow
//! tier, with one read budget for all of them, 1 rank and the ranks of a node (loaders in one
//! process, sharing one node cache or each with its own), cache sizes as fractions of the
//! dataset; per policy: epoch time, the slow tier's bytes per epoch (read through the cache),
//! stall share and hit ratios, and ratios against the other policies pair by pair.
//!
//! The slow tier is the throttled layer (token-bucket bandwidth shared by the node's ranks,
//! latency per request batch) over ext4 files that stay in the page cache: it emulates a
//! parallel file system or object store; the page cache only makes the layer below it free.

mod node;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ringtier_cache::CachePolicy;
use serde::{Deserialize, Serialize};

use crate::harness::report::utc_now;
use crate::harness::{filesystem, interleaved, write_json, Machine, Meter, Rng, Summary, Table};

/// Which ranks share a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CacheScope {
    /// One cache for the node's ranks (one copy of a sample per node), of fraction c.
    Node,
    /// One cache per rank, each of c divided by the ranks (the same memory per node).
    Rank,
}

/// Arguments of `ringtier bench cache`.
#[derive(Args, Debug, Clone)]
pub struct CacheBenchArgs {
    /// Work directory: the dataset is generated in DIR/cache-dataset (kept and reused when it
    /// matches), cache directory levels go to DIR/cache-levels. Default: a new temp directory,
    /// removed at the end.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// Samples in the dataset.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) samples: usize,
    /// Bytes per sample.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) sample_bytes: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// The read budget, the same for every policy: samples each rank's loader keeps in flight
    /// (it reads IN_FLIGHT / BATCH batches at once), and the clairvoyant prefetcher's depth
    /// (ranks x IN_FLIGHT, of which the prefetcher only uses what the demand reads leave).
    #[arg(long, default_value_t = 256)]
    pub(crate) in_flight: usize,
    /// Emulated training step per batch, milliseconds.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) step_ms: f64,
    /// Slow tier: latency added to every request batch, milliseconds.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) latency_ms: f64,
    /// Slow tier: read bandwidth in MB/s, one token bucket shared by the node's ranks.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) bandwidth_mbs: f64,
    /// Cache sizes, as fractions of the dataset (per node).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.25")]
    pub(crate) fractions: Vec<f64>,
    /// Ranks per node (each a loader; all in one process).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) ranks: Vec<usize>,
    /// Nodes in the job: the world is NODES x RANKS ranks, and the benchmark runs the first
    /// node's ranks (the other nodes read their own shards from their own share of the slow
    /// tier; BANDWIDTH_MBS is this node's share).
    #[arg(long, default_value_t = 1)]
    pub(crate) nodes: usize,
    /// Which ranks share a cache: node (one cache per node) or rank (one per rank, c / ranks each).
    #[arg(long, value_enum, default_value_t = CacheScope::Node)]
    pub(crate) scope: CacheScope,
    /// Policies: none, lru, static, clairvoyant.
    #[arg(long, value_delimiter = ',', default_value = "none,lru,static,clairvoyant")]
    pub(crate) policies: Vec<String>,
    /// Epochs per run (epoch 0 starts cold; the later ones are the warm epochs).
    #[arg(long, default_value_t = 3)]
    pub(crate) epochs: u64,
    /// Repeats (every side once per repeat, the order rotated).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Seed of the shuffle (the same for every policy and rank).
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Clairvoyant: epochs of the future the placement looks at.
    #[arg(long, default_value_t = 3)]
    pub(crate) lookahead: u64,
    /// Clairvoyant: share of the cache kept for prefetched samples that the placement would not
    /// keep (each dropped once read). 0: the prefetcher only fills free room.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) prefetch_frac: f64,
    /// Cache in a directory level (files under --dir) instead of memory.
    #[arg(long)]
    pub(crate) cache_in_dir: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write the report as Markdown here.
    #[arg(long)]
    pub(crate) md: Option<PathBuf>,
    /// Run each rank of the node as its own process (as torchrun does). With `--scope node`
    /// the ranks share the cache as a directory (`--node-dir`, one copy per sample per node,
    /// `CachedTier::for_node_dir`); every policy goes through it. Each process gets its share
    /// (BANDWIDTH_MBS / RANKS) of the slow tier.
    #[arg(long)]
    pub(crate) processes: bool,
    /// The node cache's directory with `--processes --scope node` (on tmpfs it is memory).
    /// Default: DIR/node-cache.
    #[arg(long)]
    pub(crate) node_dir: Option<PathBuf>,
    /// Internal: run one side ("policy,fraction,ranks") and print its result as JSON.
    #[arg(long, hide = true)]
    pub(crate) worker: Option<String>,
    /// Internal: with --worker and --processes, the local rank this process runs.
    #[arg(long, hide = true)]
    pub(crate) local: Option<usize>,
    /// Internal: with --worker and --processes, the barrier directory of the side's ranks.
    #[arg(long, hide = true)]
    pub(crate) barrier: Option<PathBuf>,
}

impl CacheBenchArgs {
    /// Batches each loader reads ahead so that IN_FLIGHT samples are in flight (the loader
    /// keeps its prefetch plus one batches in flight).
    pub(crate) fn loader_prefetch(&self) -> usize {
        (self.in_flight / self.batch.max(1)).max(2) - 1
    }
}

/// One epoch of one side (all its ranks).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EpochResult {
    pub(crate) epoch: u64,
    /// The slowest rank's time (ranks start each epoch together, as a job's ranks do).
    pub(crate) seconds: f64,
    /// Stall over epoch time, mean over ranks.
    pub(crate) stall_share: f64,
    /// Bytes read from the slow tier during the epoch through the cache(s): readers' misses,
    /// the caches' own fetches and prefetches.
    pub(crate) slow_bytes: u64,
    pub(crate) accesses: u64,
    pub(crate) hits: u64,
    pub(crate) reuse_hits: u64,
    pub(crate) late_prefetches: u64,
    pub(crate) prefetched_bytes: u64,
    pub(crate) prefetched_unused_bytes: u64,
    /// With a node directory shared across processes: the reads the node's plan serves from a
    /// copy this epoch (what the cache gets if every copy is there in time).
    #[serde(default)]
    pub(crate) planned_hits: u64,
}

/// One side's run: a policy, a cache size and a rank count, every epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SideResult {
    pub(crate) policy: String,
    pub(crate) fraction: f64,
    pub(crate) ranks: usize,
    pub(crate) capacity_bytes: u64,
    /// Most bytes the cache(s) held at once (checked against the capacity after every batch).
    pub(crate) max_used_bytes: u64,
    pub(crate) peak_rss_bytes: u64,
    pub(crate) epochs: Vec<EpochResult>,
}

/// A side's run with its cost and repeat.
#[derive(Debug, Clone, Serialize)]
struct Run {
    repeat: usize,
    cpu_seconds: f64,
    wall_seconds: f64,
    result: SideResult,
}

/// Summary of one (fraction, ranks, policy) over repeats, warm epochs (1 and later).
#[derive(Debug, Clone, Serialize)]
struct Row {
    policy: String,
    fraction: f64,
    ranks: usize,
    warm_epoch_seconds: Summary,
    first_epoch_seconds: Summary,
    warm_slow_mb: Summary,
    warm_stall_share: Summary,
    warm_hit_ratio: Summary,
    warm_reuse_hit_ratio: Summary,
    /// This side's warm epoch time over the best of none, LRU and static in the same repeat.
    time_vs_best_baseline: Summary,
    /// This side's warm epoch time over static's, pair by pair.
    time_vs_static: Summary,
    /// This side's slow-tier bytes per warm epoch over static's, pair by pair.
    slow_bytes_vs_static: Summary,
    cpu_seconds_per_gib: Summary,
    peak_rss_mib: Summary,
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    date: String,
    machine: Machine,
    load_average: String,
    storage: String,
    config: String,
    command: String,
    rows: Vec<Row>,
    runs: Vec<Run>,
}

pub(crate) fn policy_of(s: &str) -> Result<CachePolicy> {
    s.parse::<CachePolicy>().map_err(|e| anyhow::anyhow!("{e}"))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub(crate) fn command(a: CacheBenchArgs) -> Result<()> {
    if let Some(w) = &a.worker {
        return node::worker(&a, w);
    }
    for p in &a.policies {
        policy_of(p)?;
    }
    if a.fractions.iter().any(|&f| !(f > 0.0 && f <= 1.0)) {
        bail!("cache fractions must be in (0, 1]: {:?}", a.fractions);
    }
    if a.ranks.contains(&0) || a.repeats == 0 || a.epochs == 0 || a.samples == 0 || a.batch == 0 || a.nodes == 0 {
        bail!("ranks, nodes, repeats, epochs, samples and batch must be at least 1");
    }
    if a.in_flight < a.batch {
        bail!("--in-flight ({}) must be at least one batch ({})", a.in_flight, a.batch);
    }
    if !(0.0..1.0).contains(&a.prefetch_frac) {
        bail!("--prefetch-frac must be in [0, 1)");
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
        "{} samples x {} bytes ({:.0} MB), batch {}, step {} ms, {} epochs, seed {}; job of {} node(s), this node's \
         ranks run as loaders in {}; cache scope: {:?}; read budget: {} samples in flight per rank for every \
         policy (loader prefetch {} batches + 1; clairvoyant prefetcher depth {} x {}, only what demand reads leave); \
         cache in {}; clairvoyant: lookahead {} epochs{}, staged prefetch budget {:.0}% of the cache",
        a.samples,
        a.sample_bytes,
        (a.samples * a.sample_bytes) as f64 / 1e6,
        a.batch,
        a.step_ms,
        a.epochs,
        a.seed,
        a.nodes,
        if a.processes { "one process each (sharing the node cache as a directory)" } else { "one process" },
        a.scope,
        a.in_flight,
        a.loader_prefetch(),
        if a.processes { "1 (each process its own rank's)" } else { "ranks" },
        a.in_flight,
        if a.processes && a.scope == CacheScope::Node {
            "the node directory (--node-dir)"
        } else if a.cache_in_dir {
            "a directory (files)"
        } else {
            "memory"
        },
        a.lookahead,
        if a.processes && a.scope == CacheScope::Node {
            " (the node directory's plan: the whole job, its epochs known)"
        } else {
            ""
        },
        a.prefetch_frac * 100.0,
    );
    eprintln!("{config}");
    let mut sides = Vec::new();
    for &fraction in &a.fractions {
        for &ranks in &a.ranks {
            for policy in &a.policies {
                sides.push((policy.clone(), fraction, ranks));
            }
        }
    }
    let results = interleaved(a.repeats, &sides, true, |repeat, (policy, fraction, ranks)| {
        let meter = Meter::start();
        let procs = if a.processes { *ranks } else { 1 };
        let barrier = dir.join(format!("barrier-{repeat}-{policy}-{fraction}-{ranks}"));
        let _ = std::fs::remove_dir_all(&barrier);
        std::fs::create_dir_all(&barrier)?;
        let mut children = Vec::new();
        for local in 0..procs {
            let mut c = Command::new(&exe);
            c.args(["bench", "cache"])
                .args(forwarded(&a, &dir))
                .arg("--worker")
                .arg(format!("{policy},{fraction},{ranks}"))
                .stdout(Stdio::piped());
            if a.processes {
                c.arg(format!("--local={local}")).arg(format!("--barrier={}", barrier.display()));
            }
            children.push(c.spawn().context("starting a side")?);
        }
        let mut parts = Vec::new();
        for child in children {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!("{policy} at c={fraction} x {ranks} ranks failed ({})", out.status);
            }
            parts.push(serde_json::from_slice::<SideResult>(&out.stdout).context("a side's result")?);
        }
        let _ = std::fs::remove_dir_all(&barrier);
        let usage = meter.stop();
        let result = node::merge(parts)?;
        eprintln!(
            "repeat {repeat} c={fraction} ranks={ranks} {policy:>11}: epochs {:?} s, slow MB {:?}, reuse hits {:?} \
             (planned {:?})",
            result.epochs.iter().map(|e| (e.seconds * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            result.epochs.iter().map(|e| (e.slow_bytes as f64 / 1e5).round() / 10.0).collect::<Vec<_>>(),
            result.epochs.iter().map(|e| e.reuse_hits).collect::<Vec<_>>(),
            result.epochs.iter().map(|e| e.planned_hits).collect::<Vec<_>>(),
        );
        Ok(Run { repeat, cpu_seconds: usage.children_cpu_seconds, wall_seconds: usage.wall_seconds, result })
    })?;
    let runs: Vec<Run> = results.into_iter().flatten().collect();
    let rows = summarize(&a, &runs);
    let report = Report {
        schema: "ringtier.bench.cache/2",
        date: utc_now(),
        machine: Machine::probe(),
        load_average: load_average(),
        storage: format!(
            "dataset files on {} (in the page cache) behind the throttled layer: {} MB/s shared by the node's ranks, \
             {} ms per request batch{}",
            filesystem(&dir),
            a.bandwidth_mbs,
            a.latency_ms,
            if a.processes {
                format!(
                    "; ranks as separate processes, each with its share of the bandwidth; the node cache is the \
                     directory {} on {}",
                    a.node_dir.clone().unwrap_or_else(|| dir.join("node-cache")).display(),
                    filesystem(a.node_dir.as_deref().unwrap_or(&dir))
                )
            } else {
                String::new()
            }
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

/// The arguments a side's process needs.
fn forwarded(a: &CacheBenchArgs, dir: &Path) -> Vec<String> {
    vec![
        format!("--dir={}", dir.display()),
        format!("--samples={}", a.samples),
        format!("--sample-bytes={}", a.sample_bytes),
        format!("--batch={}", a.batch),
        format!("--in-flight={}", a.in_flight),
        format!("--step-ms={}", a.step_ms),
        format!("--latency-ms={}", a.latency_ms),
        format!("--bandwidth-mbs={}", a.bandwidth_mbs),
        format!("--nodes={}", a.nodes),
        format!("--scope={}", if a.scope == CacheScope::Node { "node" } else { "rank" }),
        format!("--epochs={}", a.epochs),
        format!("--seed={}", a.seed),
        format!("--lookahead={}", a.lookahead),
        format!("--prefetch-frac={}", a.prefetch_frac),
    ]
    .into_iter()
    .chain(a.cache_in_dir.then(|| "--cache-in-dir".to_string()))
    .chain(a.processes.then(|| "--processes".to_string()))
    .chain(a.node_dir.as_ref().map(|d| format!("--node-dir={}", d.display())))
    .collect()
}

pub(crate) fn sample_key(i: usize) -> String {
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

/// Mean over the warm epochs (1 and later; epoch 0 when there is only one).
fn warm(r: &SideResult, f: impl Fn(&EpochResult) -> f64) -> f64 {
    let e = if r.epochs.len() > 1 { &r.epochs[1..] } else { &r.epochs[..] };
    if e.is_empty() {
        return f64::NAN;
    }
    e.iter().map(f).sum::<f64>() / e.len() as f64
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn summarize(a: &CacheBenchArgs, runs: &[Run]) -> Vec<Row> {
    let mut rows = Vec::new();
    let data_gib = (a.samples * a.sample_bytes) as f64 * a.epochs as f64 / crate::harness::GIB;
    for &fraction in &a.fractions {
        for &ranks in &a.ranks {
            let side = |p: &str, repeat: usize| {
                runs.iter().find(|r| {
                    r.repeat == repeat
                        && r.result.fraction == fraction
                        && r.result.ranks == ranks
                        && r.result.policy == p
                })
            };
            for policy in &a.policies {
                let mine: Vec<&Run> = (0..a.repeats).filter_map(|k| side(policy, k)).collect();
                let time = |r: &Run| warm(&r.result, |e| e.seconds);
                let bytes = |r: &Run| warm(&r.result, |e| e.slow_bytes as f64);
                let vs = |f: &dyn Fn(&Run) -> f64, base: &[&str]| -> Summary {
                    Summary::of(
                        &mine
                            .iter()
                            .filter_map(|r| {
                                let best =
                                    base.iter().filter_map(|p| side(p, r.repeat).map(f)).fold(f64::INFINITY, f64::min);
                                best.is_finite().then(|| f(r) / best)
                            })
                            .collect::<Vec<_>>(),
                    )
                };
                rows.push(Row {
                    policy: policy.clone(),
                    fraction,
                    ranks,
                    warm_epoch_seconds: Summary::by(&mine, |r| time(r)),
                    first_epoch_seconds: Summary::by(&mine, |r| r.result.epochs[0].seconds),
                    warm_slow_mb: Summary::by(&mine, |r| bytes(r) / 1e6),
                    warm_stall_share: Summary::by(&mine, |r| warm(&r.result, |e| e.stall_share)),
                    warm_hit_ratio: Summary::by(&mine, |r| warm(&r.result, |e| ratio(e.hits, e.accesses))),
                    warm_reuse_hit_ratio: Summary::by(&mine, |r| warm(&r.result, |e| ratio(e.reuse_hits, e.accesses))),
                    time_vs_best_baseline: vs(&time, &["none", "lru", "static"]),
                    time_vs_static: vs(&time, &["static"]),
                    slow_bytes_vs_static: vs(&bytes, &["static"]),
                    cpu_seconds_per_gib: Summary::by(&mine, |r| r.cpu_seconds / data_gib),
                    peak_rss_mib: Summary::by(&mine, |r| r.result.peak_rss_bytes as f64 / (1 << 20) as f64),
                });
            }
        }
    }
    rows
}

fn markdown(r: &Report) -> String {
    let mut t = Table::new([
        "c",
        "ranks",
        "policy",
        "warm epoch s",
        "epoch 0 s",
        "slow-tier MB / warm epoch",
        "time / best of none,LRU,static",
        "time / static",
        "slow bytes / static",
        "reuse hit ratio",
        "hit ratio",
        "stall share",
        "CPU s / GiB",
        "peak RSS MiB",
    ]);
    for row in &r.rows {
        t.row([
            format!("{:.2}", row.fraction),
            row.ranks.to_string(),
            row.policy.clone(),
            row.warm_epoch_seconds.text(3),
            row.first_epoch_seconds.text(3),
            row.warm_slow_mb.text(1),
            row.time_vs_best_baseline.text(3),
            row.time_vs_static.text(3),
            row.slow_bytes_vs_static.text(3),
            row.warm_reuse_hit_ratio.text(3),
            row.warm_hit_ratio.text(3),
            row.warm_stall_share.text(3),
            row.cpu_seconds_per_gib.text(2),
            row.peak_rss_mib.text(0),
        ]);
    }
    format!(
        "# ringtier bench cache\n\n{}\n\nMachine: {} CPUs, {:.1} GiB, kernel {}; load average at the end {}. \
         Storage: {}.\n\nConfiguration: {}.\n\nCommand: `{}`\n\n\
         Warm = epochs 1 and later (epoch 0 starts with an empty cache). Each cell: median (min..max) over repeats; \
         ratios are taken pair by pair within a repeat (sides interleaved, order rotated). Epoch time is the slowest \
         rank's. Slow-tier bytes are every byte read from the slow tier through the cache (readers' misses, the cache's own fetches and prefetches; policy none is the same layer keeping nothing). \
         The reuse hit ratio counts reads served by a copy that was kept, not prefetched for that read. CPU is the \
         side's process (all its ranks) per GiB the loaders delivered.\n\n{}",
        r.date,
        r.machine.cpus,
        r.machine.memory_bytes as f64 / (1u64 << 30) as f64,
        r.machine.kernel,
        r.load_average,
        r.storage,
        r.config,
        r.command,
        t.markdown()
    )
}
