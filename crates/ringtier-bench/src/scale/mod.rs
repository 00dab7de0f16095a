//! `ringtier bench scale`: input at scale from the Rust loader (issue 37's cases, measured from
//! Python by `bench/scale/first_batch.py` and `bench/scale/ranks.py`). Over a directory of small
//! files, per pass (cold), R ranks each run as a separate process (the bench starts itself once
//! per rank with the rank and world as arguments and `LOCAL_WORLD_SIZE` in the environment, as a
//! launcher would), each rank a `Loader` over its shard for one epoch; every rank of a pass starts
//! together and is timed from the start of its work (engine, listing, loader, reads).
//!
//! Per (ranks, listing) it reports the time to the first batch (the slowest rank's), the node's
//! samples per second (all ranks' samples over the slowest rank's epoch), CPU seconds per 1,000
//! samples (every rank process whole, from `getrusage(RUSAGE_CHILDREN)`), peak RSS per rank and
//! the engine threads each rank fitted to its share of the cores. Listings: `cached` (the listing
//! cache beside the data, made once before the passes), `dirents` (no cache: directory entries,
//! no stat per file), `stat` (no cache, every file stat'd). `--verify` adds one untimed pass per
//! rank count in which each rank records every sample's key and CRC-32C; the parent checks that
//! every file of the directory (walked by the parent) was read exactly once across the ranks,
//! and with `--verify-bytes` that the bytes read are the bytes on disk (every file read again
//! and hashed by the parent after the passes).

mod make;
mod rank;
mod verify;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ringtier::open::Engine;
use serde::Serialize;

use crate::harness::report::utc_now;
use crate::harness::{interleaved, write_json, Cold, ColdMethod, Machine, Meter, Storage, Summary, Table};
use rank::{RankResult, RankRun};
use verify::{ExactlyOnce, FileSet, Records};

/// How each rank lists the data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Listing {
    /// The listing cache beside the data (`listing_cache` on; made once before the passes):
    /// the default from the second run of a data set on.
    Cached,
    /// No cache: directories read with `getdents` and `d_type`, no stat per file (`listing_cache`
    /// off): the first run of a new data set.
    Dirents,
    /// No cache, every file stat'd (`stat_files` on): what the loader did before issue 37.
    Stat,
}

impl Listing {
    fn as_str(self) -> &'static str {
        match self {
            Listing::Cached => "cached",
            Listing::Dirents => "dirents",
            Listing::Stat => "stat",
        }
    }
}

/// Arguments of `ringtier bench scale`.
#[derive(Args, Debug, Clone)]
pub struct ScaleBenchArgs {
    /// The data set: a directory of small files (`bench/scale/make_files.py DIR --files N`, or
    /// `--make N`).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Write N files of make_files.py's layout (1-3 KB each, in class directories) into DIR
    /// first; DIR must be missing or empty.
    #[arg(long, value_name = "N")]
    pub(crate) make: Option<usize>,
    /// Class directories of `--make`.
    #[arg(long, default_value_t = 1000)]
    pub(crate) classes: usize,
    /// Rank counts: each pass runs this many rank processes, each reading its shard.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) ranks: Vec<usize>,
    /// How ranks list the data set: cached (the listing cache beside the data), dirents (no
    /// cache), stat (no cache, every file stat'd).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cached,dirents,stat")]
    pub(crate) listings: Vec<Listing>,
    /// Passes per (ranks, listing), interleaved, the order rotated each repeat.
    #[arg(long, default_value_t = 2)]
    pub(crate) repeats: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    pub(crate) batch: usize,
    /// Batches each rank's loader reads ahead (the Python package's default, 2).
    #[arg(long, default_value_t = 2)]
    pub(crate) prefetch: usize,
    /// Seed of the shuffle (the same on every rank: the shards are one epoch's order dealt out).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// File engine: auto (io_uring where the kernel allows it), uring or posix.
    #[arg(long, default_value = "auto")]
    pub(crate) engine: Engine,
    /// Engine (runtime) threads of every rank, 1 to 64. Default: fitted to the rank's share of
    /// the cores (its affinity over LOCAL_WORLD_SIZE, at most 2), or RINGTIER_ENGINE_THREADS
    /// when set.
    #[arg(long)]
    pub(crate) engine_threads: Option<usize>,
    /// Warm passes: nothing evicted before a pass (the report says so).
    #[arg(long)]
    pub(crate) warm: bool,
    /// Fail unless the whole page cache, dentries and inodes can be dropped before each pass
    /// (root); without it, a machine where that fails evicts the files' pages instead
    /// (`posix_fadvise`), keeping dentries and inodes, and the report says which ran.
    #[arg(long)]
    pub(crate) drop_caches: bool,
    /// One more pass per rank count in which every rank records each sample's key and CRC-32C;
    /// every file of DIR must have been read exactly once across the ranks.
    #[arg(long)]
    pub(crate) verify: bool,
    /// With --verify: also read every file of DIR again after the passes and check that the
    /// bytes the ranks read are the bytes on disk.
    #[arg(long)]
    pub(crate) verify_bytes: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write the report's table as Markdown here.
    #[arg(long)]
    pub(crate) md: Option<PathBuf>,
    /// Internal: run as this rank (a child of the bench; with --world and one --listings).
    #[arg(long, hide = true)]
    pub(crate) rank: Option<usize>,
    /// Internal: the world of --rank.
    #[arg(long, hide = true)]
    pub(crate) world: Option<usize>,
    /// Internal: with --rank, write each sample's key, CRC-32C and size to this file.
    #[arg(long, hide = true)]
    pub(crate) record: Option<PathBuf>,
}

/// One pass: every rank of one (ranks, listing) side.
#[derive(Debug, Clone, Serialize)]
struct Pass {
    repeat: usize,
    ranks: usize,
    listing: Listing,
    cold: ColdMethod,
    /// Samples every rank read, all together.
    samples: u64,
    bytes: u64,
    skipped: u64,
    /// The slowest rank's first batch, seconds from the start of its work.
    first_batch_s: f64,
    /// The slowest rank's listing, seconds from the start of its work.
    listing_s: f64,
    /// The slowest rank's epoch, seconds from the start of its work.
    epoch_s: f64,
    /// All ranks' samples over the slowest rank's epoch.
    samples_per_s: f64,
    /// Seconds from the start signal until every rank process was reaped (the parent's clock).
    node_wall_s: f64,
    /// CPU seconds of every rank process, whole (`getrusage(RUSAGE_CHILDREN)` over the pass).
    cpu_s: f64,
    /// The same per 1,000 samples.
    cpu_s_per_1000: f64,
    /// The ranks' own CPU from the start of their work (process start-up left out), per 1,000.
    work_cpu_s_per_1000: f64,
    /// The largest rank's peak RSS, MiB.
    peak_rss_mib: f64,
    per_rank: Vec<RankResult>,
}

/// The summary of one (ranks, listing) over its passes.
#[derive(Debug, Clone, Serialize)]
struct Row {
    ranks: usize,
    listing: Listing,
    first_batch_s: Summary,
    listing_s: Summary,
    epoch_s: Summary,
    samples_per_s: Summary,
    /// samples/s over 1 rank's with the same listing, pass by pass (the same repeat).
    x_one_rank: Option<Summary>,
    cpu_s_per_1000: Summary,
    work_cpu_s_per_1000: Summary,
    peak_rss_mib_per_rank: Summary,
    engine_threads: Vec<usize>,
    engine_threads_from: String,
    engine: String,
    /// Every rank of every pass listed from the cache (false: none did).
    from_cache: bool,
    samples: u64,
    listing_bytes: usize,
}

/// The exactly-once verdict of one rank count.
#[derive(Debug, Clone, Serialize)]
struct Verified {
    ranks: usize,
    listing: Listing,
    samples_per_rank: Vec<u64>,
    result: ExactlyOnce,
}

#[derive(Debug, Serialize)]
struct Report {
    schema: &'static str,
    date: String,
    commit: String,
    command: String,
    machine: Machine,
    storage: Storage,
    /// How each pass was made cold (`warm`: eviction skipped, asked for).
    cold: Vec<ColdMethod>,
    config: String,
    files: usize,
    rows: Vec<Row>,
    verify: Vec<Verified>,
    passes: Vec<Pass>,
}

pub(crate) fn command(a: ScaleBenchArgs) -> Result<()> {
    if let Some(rank) = a.rank {
        let (Some(world), [listing]) = (a.world, a.listings.as_slice()) else {
            bail!("--rank needs --world and one --listings (it is the bench's own child)");
        };
        return rank::main(&RankRun {
            dir: &a.dir,
            rank,
            world,
            listing: *listing,
            batch: a.batch,
            prefetch: a.prefetch,
            seed: a.seed,
            engine: a.engine,
            record: a.record.as_deref(),
        });
    }
    if a.ranks.is_empty() || a.ranks.contains(&0) || a.ranks.iter().any(|&r| r > 256) {
        bail!("--ranks must be from 1 to 256, not {:?}", a.ranks);
    }
    if a.listings.is_empty() || a.repeats == 0 || a.batch == 0 {
        bail!("--listings, --repeats and --batch must not be empty or 0");
    }
    if a.engine_threads.is_some_and(|n| !(1..=64).contains(&n)) {
        bail!("--engine-threads must be from 1 to 64");
    }
    if a.verify_bytes && !a.verify {
        bail!("--verify-bytes needs --verify");
    }
    if let Some(n) = a.make {
        make::make_files(&a.dir, n, a.classes, 37)?;
    }
    let set = FileSet::walk(&a.dir)?;
    if set.len() == 0 {
        bail!("no files in {}", a.dir.display());
    }
    let config = format!(
        "{} files in {}; ranks {:?}, each a process (LOCAL_WORLD_SIZE = ranks), one epoch each, batch {}, prefetch \
         {}, seed {}, engine {}, engine threads {}; listings {:?}; {} repeat(s), sides interleaved, order rotated; {}",
        set.len(),
        a.dir.display(),
        a.ranks,
        a.batch,
        a.prefetch,
        a.seed,
        a.engine,
        a.engine_threads.map_or("fitted per rank".to_string(), |n| n.to_string()),
        a.listings.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        a.repeats,
        if a.warm { "warm (no eviction)" } else { "cold before every pass" },
    );
    eprintln!("{config}");
    if a.listings.contains(&Listing::Cached) {
        make_listing_cache(&a.dir)?;
    }
    let exe = std::env::current_exe().context("finding the bench's own executable")?;
    let cold = Cold { warm: a.warm, require_drop_caches: a.drop_caches, ..Cold::new() };
    let sides: Vec<(usize, Listing)> = a.ranks.iter().flat_map(|&r| a.listings.iter().map(move |&l| (r, l))).collect();
    let mut colds = Vec::new();
    let runs = interleaved(a.repeats, &sides, true, |repeat, &(ranks, listing)| {
        let how = cold.pass(set.paths(&a.dir))?;
        colds.push(how);
        let pass = one_pass(&a, &exe, repeat, ranks, listing, how, None)?;
        eprintln!(
            "repeat {}/{} ranks {ranks} {:<7}: first batch {:6.2} s, epoch {:6.2} s, {:8.0} samples/s, {:.3} CPU s / \
             1,000, peak RSS {:.0} MiB/rank, engine threads {:?}, from cache {:?} ({how})",
            repeat + 1,
            a.repeats,
            listing.as_str(),
            pass.first_batch_s,
            pass.epoch_s,
            pass.samples_per_s,
            pass.cpu_s_per_1000,
            pass.peak_rss_mib,
            pass.per_rank.iter().map(|r| r.engine_threads).collect::<Vec<_>>(),
            pass.per_rank.iter().map(|r| r.from_cache).collect::<Vec<_>>(),
        );
        Ok(pass)
    })?;
    let passes: Vec<Pass> = runs.into_iter().flatten().collect();
    let verified = if a.verify { verify_passes(&a, &exe, &set)? } else { Vec::new() };
    let rows = summarize(&a, &sides, &passes);
    let report = Report {
        schema: "ringtier.bench.scale/1",
        date: utc_now(),
        commit: git_commit(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine::probe(),
        storage: Storage::of(&a.dir),
        cold: colds,
        config,
        files: set.len(),
        rows,
        verify: verified,
        passes,
    };
    let md = markdown(&report);
    println!("{md}");
    write_json(a.json.as_deref(), &report)?;
    if let Some(p) = &a.md {
        std::fs::write(p, &md).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(v) = report.verify.iter().find(|v| !v.result.ok) {
        bail!("exactly once failed at {} ranks: {}", v.ranks, v.result.text());
    }
    Ok(())
}

/// Makes the listing cache beside the data current before the passes: lists with the cache
/// until a listing comes from it (a directory changed within two seconds of a listing is not
/// cached: a fresh `--make` waits that long once).
fn make_listing_cache(dir: &Path) -> Result<()> {
    let rt = crate::runtime(0)?;
    rt.block_on(async {
        let options = ringtier::OpenOptions::dataset().with_metered(false);
        let listing = ringtier_core::ListOptions::default().with_skip_bad(true).with_stat_files(false).with_cache(true);
        for attempt in 0..4 {
            let tier = ringtier::open(dir, &options)?.tier;
            let ds = ringtier_dataset::Dataset::from_dir_with(tier, dir, listing).await?;
            if ds.from_cache() {
                return Ok(());
            }
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
            }
        }
        bail!(
            "the listing cache beside {} is not used (a read-only directory, or one still changing): leave out \
             --listings cached",
            dir.display()
        )
    })
}

/// Starts the ranks of one pass, starts them together, and gathers their results.
fn one_pass(
    a: &ScaleBenchArgs,
    exe: &Path,
    repeat: usize,
    ranks: usize,
    listing: Listing,
    cold: ColdMethod,
    records: Option<&Path>,
) -> Result<Pass> {
    let meter = Meter::start();
    let mut children: Vec<Child> = Vec::with_capacity(ranks);
    let spawned = (0..ranks).try_for_each(|rank| {
        let mut c = Command::new(exe);
        c.args(["bench", "scale", "--dir"])
            .arg(&a.dir)
            .arg(format!("--listings={}", listing.as_str()))
            .arg(format!("--batch={}", a.batch))
            .arg(format!("--prefetch={}", a.prefetch))
            .arg(format!("--seed={}", a.seed))
            .arg(format!("--engine={}", a.engine))
            .arg(format!("--rank={rank}"))
            .arg(format!("--world={ranks}"))
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_WORLD_SIZE", ranks.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(dir) = records {
            c.arg("--record").arg(dir.join(format!("rank-{rank}.tsv")));
        }
        if let Some(n) = a.engine_threads {
            c.env(rank::THREADS_ENV, n.to_string());
        }
        children.push(c.spawn().with_context(|| format!("starting rank {rank} of {ranks}"))?);
        anyhow::Ok(())
    });
    if let Err(e) = spawned {
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
        return Err(e);
    }
    // Every rank is started and waiting: the start signal to all of them at once.
    let t0 = Instant::now();
    for c in &mut children {
        if let Some(mut stdin) = c.stdin.take() {
            // A rank that died before reading it is reported when it is reaped.
            let _ = stdin.write_all(b"go\n");
        }
    }
    let mut per_rank = Vec::with_capacity(ranks);
    let mut failed = None;
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().with_context(|| format!("waiting for rank {rank}"))?;
        match serde_json::from_slice::<RankResult>(&out.stdout) {
            Ok(r) if out.status.success() => per_rank.push(r),
            _ => {
                failed.get_or_insert(format!("rank {rank} of {ranks} ({}) failed: {}", listing.as_str(), out.status));
            }
        }
    }
    let node_wall_s = t0.elapsed().as_secs_f64();
    let usage = meter.stop();
    if let Some(why) = failed {
        bail!("{why} (its error is above)");
    }
    let samples: u64 = per_rank.iter().map(|r| r.samples).sum();
    let slowest = |f: fn(&RankResult) -> f64| per_rank.iter().map(f).fold(0.0, f64::max);
    let epoch_s = slowest(|r| r.epoch_s);
    let per_1000 = |cpu: f64| cpu / samples.max(1) as f64 * 1000.0;
    Ok(Pass {
        repeat,
        ranks,
        listing,
        cold,
        samples,
        bytes: per_rank.iter().map(|r| r.bytes).sum(),
        skipped: per_rank.iter().map(|r| r.skipped).sum(),
        first_batch_s: slowest(|r| r.first_batch_s),
        listing_s: slowest(|r| r.listing_s),
        epoch_s,
        samples_per_s: samples as f64 / epoch_s,
        node_wall_s,
        cpu_s: usage.children_cpu_seconds,
        cpu_s_per_1000: per_1000(usage.children_cpu_seconds),
        work_cpu_s_per_1000: per_1000(per_rank.iter().map(|r| r.cpu_s).sum()),
        peak_rss_mib: per_rank.iter().map(|r| r.peak_rss_bytes as f64 / (1u64 << 20) as f64).fold(0.0, f64::max),
        per_rank,
    })
}

/// The verify passes (untimed, not cold): one per rank count, every rank recording what it
/// read; then the checks, with the bytes on disk when asked.
fn verify_passes(a: &ScaleBenchArgs, exe: &Path, set: &FileSet) -> Result<Vec<Verified>> {
    let listing = if a.listings.contains(&Listing::Cached) { Listing::Cached } else { a.listings[0] };
    let mut recorded = Vec::new();
    for &ranks in &a.ranks {
        let dir = tempfile::Builder::new().prefix("ringtier-scale-verify").tempdir()?;
        let pass = one_pass(a, exe, 0, ranks, listing, ColdMethod::Warm, Some(dir.path()))?;
        let files: Vec<PathBuf> = (0..ranks).map(|r| dir.path().join(format!("rank-{r}.tsv"))).collect();
        let records = Records::read(set, &files)?;
        recorded.push((ranks, pass.per_rank.iter().map(|r| r.samples).collect::<Vec<_>>(), records));
    }
    let disk = if a.verify_bytes {
        let t0 = Instant::now();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
        let disk = set.hash_on_disk(&a.dir, threads);
        eprintln!("read and hashed {} files on disk in {:.1} s", set.len(), t0.elapsed().as_secs_f64());
        Some(disk)
    } else {
        None
    };
    let mut out = Vec::new();
    for (ranks, samples_per_rank, records) in recorded {
        let result = records.check(set, disk.as_deref());
        eprintln!("exactly once, {ranks} ranks: {}", result.text());
        out.push(Verified { ranks, listing, samples_per_rank, result });
    }
    Ok(out)
}

fn summarize(a: &ScaleBenchArgs, sides: &[(usize, Listing)], passes: &[Pass]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(ranks, listing) in sides {
        let mine: Vec<&Pass> = passes.iter().filter(|p| p.ranks == ranks && p.listing == listing).collect();
        let Some(first) = mine.first() else { continue };
        let base: Vec<&Pass> = passes.iter().filter(|p| p.ranks == 1 && p.listing == listing).collect();
        let x_one_rank = (a.ranks.contains(&1) && !base.is_empty()).then(|| {
            let ours: Vec<f64> =
                (0..a.repeats).filter_map(|r| mine.iter().find(|p| p.repeat == r).map(|p| p.samples_per_s)).collect();
            let theirs: Vec<f64> =
                (0..a.repeats).filter_map(|r| base.iter().find(|p| p.repeat == r).map(|p| p.samples_per_s)).collect();
            Summary::ratio(&ours, &theirs)
        });
        rows.push(Row {
            ranks,
            listing,
            first_batch_s: Summary::by(&mine, |p| p.first_batch_s),
            listing_s: Summary::by(&mine, |p| p.listing_s),
            epoch_s: Summary::by(&mine, |p| p.epoch_s),
            samples_per_s: Summary::by(&mine, |p| p.samples_per_s),
            x_one_rank,
            cpu_s_per_1000: Summary::by(&mine, |p| p.cpu_s_per_1000),
            work_cpu_s_per_1000: Summary::by(&mine, |p| p.work_cpu_s_per_1000),
            peak_rss_mib_per_rank: Summary::by(&mine, |p| p.peak_rss_mib),
            engine_threads: first.per_rank.iter().map(|r| r.engine_threads).collect(),
            engine_threads_from: first.per_rank.first().map(|r| r.engine_threads_from.clone()).unwrap_or_default(),
            engine: first.per_rank.first().map(|r| r.engine.clone()).unwrap_or_default(),
            from_cache: mine.iter().all(|p| p.per_rank.iter().all(|r| r.from_cache)),
            samples: first.samples,
            listing_bytes: first.per_rank.first().map_or(0, |r| r.listing_bytes),
        });
    }
    rows
}

/// The commit of the working directory's repository (empty outside one).
fn git_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn mmm(s: &Summary, digits: usize) -> String {
    if digits == 0 {
        let f = |x: f64| {
            let v = x.round() as i64;
            let (n, mut out) = (v.abs().to_string(), String::new());
            for (i, ch) in n.chars().enumerate() {
                if i > 0 && (n.len() - i) % 3 == 0 {
                    out.push(',');
                }
                out.push(ch);
            }
            if v < 0 {
                format!("-{out}")
            } else {
                out
            }
        };
        format!("{} / {} / {}", f(s.min), f(s.median), f(s.max))
    } else {
        format!("{:.d$} / {:.d$} / {:.d$}", s.min, s.median, s.max, d = digits)
    }
}

fn markdown(r: &Report) -> String {
    let mut t = Table::new([
        "ranks",
        "listing",
        "first batch s (min / median / max)",
        "listing s (median)",
        "node samples/s (min / median / max)",
        "x 1 rank (median)",
        "CPU s / 1,000 (median)",
        "peak RSS per rank MiB (median)",
        "engine threads",
        "from cache",
    ]);
    for row in &r.rows {
        t.row([
            row.ranks.to_string(),
            row.listing.as_str().to_string(),
            mmm(&row.first_batch_s, 2),
            format!("{:.2}", row.listing_s.median),
            mmm(&row.samples_per_s, 0),
            row.x_one_rank.map_or("-".to_string(), |x| format!("{:.2}", x.median)),
            format!("{:.3}", row.cpu_s_per_1000.median),
            format!("{:.0}", row.peak_rss_mib_per_rank.median),
            format!("{:?}", row.engine_threads),
            if row.from_cache { "yes" } else { "no" }.to_string(),
        ]);
    }
    let mut colds: Vec<&str> = r.cold.iter().map(|c| c.as_str()).collect();
    colds.dedup();
    let mut out = format!(
        "# ringtier bench scale\n\n{} files in `{}` ({}; {}). Machine: {}; {}.\n\nConfiguration: {}.\n\nCold: {}.\n\n\
         Command: `{}`{}\n\n\
         Each pass starts every rank as its own process and times each from the start of its work (engine, \
         listing, loader, reads); first batch and listing are the slowest rank's, node samples/s is all ranks' \
         samples over the slowest rank's epoch, CPU is every rank process whole (getrusage of the children) per \
         1,000 samples, peak RSS the largest rank's. Ratios against 1 rank are pass by pass (the same repeat, the \
         same listing).\n\n{}",
        r.files,
        r.storage.path,
        r.storage.filesystem,
        r.storage.device_text(),
        r.machine.text(),
        r.machine.io_uring_text(),
        r.config,
        colds.join(", "),
        r.command,
        if r.commit.is_empty() { String::new() } else { format!(" (commit {})", r.commit) },
        t.markdown()
    );
    for v in &r.verify {
        out.push_str(&format!(
            "\nexactly once, {} ranks ({} listing, samples per rank {:?}): {}\n",
            v.ranks,
            v.listing.as_str(),
            v.samples_per_rank,
            v.result.text()
        ));
    }
    out
}
