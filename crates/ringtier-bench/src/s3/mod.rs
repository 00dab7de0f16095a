//! `ringtier bench s3`: the S3 tier against boto3 on the same S3 server on loopback.
//!
//! * `drain`: the checkpoint store's drain of one checkpoint part to S3 against boto3's
//!   `upload_file` (multipart, `TransferConfig.max_concurrency` swept) of the same file.
//! * `read`: many small objects read through the S3 tier over a concurrency sweep (one driver
//!   thread), a boto3 thread pool over a thread sweep, and a local file tier behind the
//!   throttled layer's per-request latency: the latency-bound regime of a remote store.
//!
//! The server is a separate process (s3s-fs run by this binary, or moto_server), so each
//! client's CPU time is its own. Baselines run `bench/s3/boto3_baseline.py`, built into the
//! binary and written to the run's work directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{AlignedBuf, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_s3::{S3Config, S3Tier, UploadVerify};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use crate::harness::scripts::Script;
use crate::harness::{filesystem, interleaved, write_json, Cold, ColdMethod, Machine, Meter, Rng, Summary, Table};
use crate::parse_size;
use crate::read::remote::{read_batches, ClientRun};
use crate::s3server::{ServerKind, ACCESS_KEY, SECRET_KEY};

mod drain;
use drain::drain;

/// Arguments of `ringtier bench s3`.
#[derive(Args, Debug)]
pub struct S3BenchArgs {
    #[command(subcommand)]
    action: S3BenchAction,
}

#[derive(Subcommand, Debug)]
enum S3BenchAction {
    /// Drain of one checkpoint part to S3 versus boto3 upload_file of the same file.
    Drain(DrainArgs),
    /// Small objects: the S3 tier's concurrency sweep, a boto3 thread pool, and a throttled
    /// file tier (per-request latency) showing the latency-bound regime.
    Read(ReadArgs),
    /// Serve S3 (s3s-fs) over a directory on 127.0.0.1 until killed (used by the benchmarks).
    #[command(hide = true)]
    Serve {
        /// Directory holding the buckets.
        #[arg(long)]
        root: PathBuf,
        /// Port.
        #[arg(long)]
        port: u16,
        /// Added to every request before it is served, in milliseconds.
        #[arg(long, default_value_t = 0.0)]
        latency_ms: f64,
        /// Ignore UploadPart checksums, as s3s-fs alone does (by default they are checked,
        /// as AWS S3 checks them).
        #[arg(long)]
        ignore_part_checksums: bool,
    },
}

#[derive(Args, Debug)]
struct Common {
    /// The S3 server both clients use, started on loopback for the run.
    #[arg(long, value_enum, default_value = "s3s-fs")]
    server: ServerKind,
    /// Work directory: the checkpoint's fast tier, the dataset, the server's files
    /// (default: a new temp dir, removed afterwards).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Repeats (interleaved: ringtier, then each baseline setting, per repeat).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The boto3 baseline script (default: the one built into this binary, written to the
    /// work directory).
    #[arg(long)]
    baseline: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct DrainArgs {
    #[command(flatten)]
    common: Common,
    /// Checkpoint part size, e.g. 1G.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Multipart part size of both clients, e.g. 8M.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    part_size: u64,
    /// Parts in flight for ringtier.
    #[arg(long, default_value_t = 8)]
    upload_concurrency: usize,
    /// Also run ringtier's other unsigned variants: read-back check with unsigned bodies, and
    /// unsigned bodies with no check at all. (Always run: the default, part checksums with
    /// unsigned bodies; and the read-back check with signed bodies, the default before.)
    #[arg(long)]
    unsigned_payload: bool,
    /// The s3s-fs server ignores UploadPart checksums (as s3s-fs alone does), so ringtier's
    /// default falls back to the read-back check; by default the server checks them, as AWS
    /// S3 does.
    #[arg(long)]
    server_ignores_part_checksums: bool,
    /// boto3 TransferConfig.max_concurrency values to sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    concurrency: Vec<usize>,
}

#[derive(Args, Debug)]
struct ReadArgs {
    #[command(flatten)]
    common: Common,
    /// Objects in the dataset.
    #[arg(long, default_value_t = 2048)]
    objects: usize,
    /// Object size, e.g. 112K (the paper's ImageNet median).
    #[arg(long, default_value = "112K", value_parser = parse_size)]
    object_size: u64,
    /// Requests in flight swept for the ringtier tiers.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    depths: Vec<usize>,
    /// boto3 pool threads swept.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    threads: Vec<usize>,
    /// Per-request latency of the throttled file tier, in milliseconds.
    #[arg(long, default_value_t = 4.0)]
    latency_ms: f64,
    /// Latency the S3 server adds to every request, in milliseconds (s3s-fs only): a remote
    /// endpoint's round trip, the same for ringtier and boto3.
    #[arg(long, default_value_t = 0.0)]
    server_latency_ms: f64,
}

/// A client at one setting over the repeats.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub(crate) client: String,
    pub(crate) setting: usize,
    pub(crate) mb_per_s: Summary,
    pub(crate) cpu_s_per_gib: Summary,
}

/// The settings of a `bench s3` run, as its report records them.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum RunSettings {
    /// `bench s3 drain`.
    Drain {
        size: u64,
        part_size: u64,
        upload_concurrency: usize,
        boto3_concurrency: Vec<usize>,
        repeats: usize,
        server_checks_part_checksums: bool,
        cpu: &'static str,
    },
    /// `bench s3 read`.
    Read {
        objects: usize,
        object_size: u64,
        depths: Vec<usize>,
        threads: Vec<usize>,
        latency_ms: f64,
        server_latency_ms: f64,
        repeats: usize,
    },
}

/// The report of `bench s3 drain` and `bench s3 read` (`ringtier.bench.s3.drain/1`,
/// `ringtier.bench.s3.read/1`).
#[derive(Debug, Serialize)]
pub(crate) struct S3Report {
    pub(crate) schema: &'static str,
    pub(crate) benchmark: &'static str,
    pub(crate) machine: Machine,
    pub(crate) server: ServerKind,
    pub(crate) storage: String,
    /// How each pass was made cold.
    pub(crate) cold: ColdMethod,
    pub(crate) config: RunSettings,
    pub(crate) rows: Vec<Row>,
    pub(crate) runs: Vec<ClientRun>,
    /// ringtier's best median bandwidth over the baseline's best, and its CPU per GiB (at its
    /// best setting) over the baseline's (at the baseline's best setting).
    pub(crate) bandwidth_ratio: f64,
    pub(crate) cpu_per_gib_ratio: f64,
}

fn s3_config(endpoint: &str, bucket: &str, prefix: &str) -> S3Config {
    S3Config::new(bucket, prefix)
        .with_endpoint(endpoint)
        .with_credentials(ACCESS_KEY, SECRET_KEY)
        .with_region("us-east-1")
        .with_allow_http(true)
}

fn baseline(script: &Path, endpoint: &str, bucket: &str, extra: &[String]) -> Result<(f64, f64, u64)> {
    let out = Command::new("python3")
        .arg(script)
        .args(extra)
        .args(["--endpoint", endpoint, "--bucket", bucket, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .output()
        .context("running the boto3 baseline (python3 with boto3)")?;
    if !out.status.success() {
        bail!("boto3 baseline failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("boto3 baseline output")?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok((f("seconds"), f("cpu_seconds"), v["bytes"].as_u64().unwrap_or(0)))
}

fn summarize(runs: &[ClientRun]) -> Vec<Row> {
    let mut keys: Vec<(String, usize)> = runs.iter().map(|r| (r.client.clone(), r.setting)).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(client, setting)| {
            let rs: Vec<&ClientRun> = runs.iter().filter(|r| r.client == client && r.setting == setting).collect();
            let mb_per_s = Summary::by(&rs, |r| r.mb_per_sec());
            Row { client, setting, mb_per_s, cpu_s_per_gib: Summary::by(&rs, |r| r.cpu_seconds_per_gib()) }
        })
        .collect()
}

/// (best median bandwidth, CPU per GiB at that setting) of the rows of `client`.
fn best(rows: &[Row], client: &str) -> (f64, f64, usize) {
    rows.iter()
        .filter(|r| r.client == client)
        .max_by(|a, b| a.mb_per_s.median.total_cmp(&b.mb_per_s.median))
        .map_or((f64::NAN, f64::NAN, 0), |r| (r.mb_per_s.median, r.cpu_s_per_gib.median, r.setting))
}

fn print_rows(rows: &[Row], setting_name: &str) {
    let mut t = Table::new(["client", setting_name, "MB/s min/median/max", "CPU s/GiB min/median/max"]);
    for r in rows {
        let (m, c) = (r.mb_per_s, r.cpu_s_per_gib);
        t.row([
            r.client.clone(),
            r.setting.to_string(),
            format!("{:.1}/{:.1}/{:.1}", m.min, m.median, m.max),
            format!("{:.2}/{:.2}/{:.2}", c.min, c.median, c.max),
        ]);
    }
    print!("{}", t.text());
}

/// Runs `ringtier bench s3`.
pub(crate) fn command(a: S3BenchArgs) -> Result<()> {
    match a.action {
        S3BenchAction::Serve { root, port, latency_ms, ignore_part_checksums } => {
            crate::s3server::serve(&root, port, latency_ms, !ignore_part_checksums)
        }
        S3BenchAction::Drain(d) => drain(d),
        S3BenchAction::Read(r) => {
            let sweep = ReadSweep {
                server: r.common.server,
                work: r.common.work,
                repeats: r.common.repeats,
                json: r.common.json,
                baseline: r.common.baseline,
                objects: r.objects,
                object_size: r.object_size,
                depths: r.depths,
                threads: r.threads,
                latency_ms: r.latency_ms,
                server_latency_ms: r.server_latency_ms,
            };
            read(&sweep).map(|_| ())
        }
    }
}

/// The remote-storage read experiment's settings (`ringtier bench s3 read`, and
/// `ringtier paper --remote`).
#[derive(Debug, Clone)]
pub(crate) struct ReadSweep {
    /// The S3 server, started on loopback for the run.
    pub(crate) server: ServerKind,
    /// Work directory (default: a new temp dir, removed afterwards).
    pub(crate) work: Option<PathBuf>,
    pub(crate) repeats: usize,
    /// Write the report as JSON here.
    pub(crate) json: Option<PathBuf>,
    /// The boto3 baseline script (default: the built-in one).
    pub(crate) baseline: Option<PathBuf>,
    pub(crate) objects: usize,
    pub(crate) object_size: u64,
    /// Requests in flight swept for the ringtier tiers.
    pub(crate) depths: Vec<usize>,
    /// boto3 pool threads swept.
    pub(crate) threads: Vec<usize>,
    /// Per-request latency of the throttled file tier, in milliseconds.
    pub(crate) latency_ms: f64,
    /// Latency the S3 server adds to every request, in milliseconds (s3s-fs only).
    pub(crate) server_latency_ms: f64,
}

/// Checks that `python3` can import boto3 (the baseline's client), with a message saying how
/// to get it when it cannot.
pub(crate) fn check_boto3() -> Result<()> {
    let out = Command::new("python3").args(["-c", "import boto3"]).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => bail!(
            "the remote experiment's baseline needs boto3 in python3 (`pip install boto3`): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => bail!("the remote experiment's baseline needs python3 with boto3: {e}"),
    }
}

/// The work directory (a new temp dir unless given) and the baseline script in it.
fn work_dir(work: Option<&Path>, script: Option<&Path>) -> Result<(PathBuf, Option<tempfile::TempDir>, PathBuf)> {
    let (work, tmp) = match work {
        Some(w) => {
            std::fs::create_dir_all(w)?;
            (w.to_path_buf(), None)
        }
        None => {
            let t = tempfile::Builder::new().prefix("ringtier-s3bench").tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let script = match script {
        Some(s) => s.to_path_buf(),
        None => Script::Boto3Baseline.write_to(&work)?,
    };
    Ok((work, tmp, script))
}

/// One side of `bench s3 read`: the S3 tier or the throttled file tier at a depth, or the
/// boto3 pool at a thread count.
#[derive(Debug, Clone, Copy)]
enum ReadSide {
    S3(usize),
    Files(usize),
    Boto3(usize),
}

/// Reads every key through `tier` in batches of `depth` requests (one batch in flight at a
/// time, each of its requests concurrent): returns bytes read.
async fn read_all(tier: &dyn Tier, keys: &[String], size: usize, depth: usize) -> Result<u64> {
    let mut bufs: Vec<AlignedBuf> =
        (0..depth).map(|_| AlignedBuf::new(size + 4096, 4096)).collect::<ringtier_core::Result<_>>()?;
    let objects: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), size)).collect();
    read_batches(tier, &objects, depth, &mut bufs).await
}

/// Runs the read sweep; prints the table, writes the JSON if asked, returns it.
pub(crate) fn read(r: &ReadSweep) -> Result<S3Report> {
    let (work, _tmp, script) = work_dir(r.work.as_deref(), r.baseline.as_deref())?;
    let server = crate::s3server::start(r.server, &work, r.server_latency_ms, true)?;
    let bucket = "bench";
    let size = usize::try_from(r.object_size)?;
    let keys: Vec<String> = (0..r.objects).map(|i| format!("ds/{i:06}.bin")).collect();
    let ds_dir = work.join("ds-files");
    std::fs::create_dir_all(ds_dir.join("ds"))?;
    println!(
        "bench s3 read: {} objects of {} KB, server {:?}, depths {:?}, boto3 threads {:?}, throttled file tier {} ms per request, server latency {} ms, {} repeats",
        r.objects,
        r.object_size / 1000,
        r.server,
        r.depths,
        r.threads,
        r.latency_ms,
        r.server_latency_ms,
        r.repeats
    );
    // The dataset: the same bytes on S3 and in local files.
    let setup = crate::runtime(2)?;
    setup.block_on(async {
        let tier = S3Tier::new(s3_config(server.endpoint(), bucket, "").with_upload_concurrency(32))?;
        tier.create_bucket().await?;
        let mut rng = Rng::new(11);
        let mut tasks = Vec::new();
        for k in &keys {
            let mut data = vec![0u8; size];
            rng.fill(&mut data);
            std::fs::write(ds_dir.join(k), &data)?;
            let t = tier.clone();
            let k = k.clone();
            tasks.push(tokio::spawn(async move { t.put_object(&k, data.into()).await }));
            if tasks.len() >= 32 {
                for t in tasks.drain(..) {
                    t.await??;
                }
            }
        }
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    })?;
    drop(setup);
    let keys_file = work.join("keys.txt");
    std::fs::write(&keys_file, keys.join("\n"))?;
    // One driver thread: the caller's runtime is single-threaded and the S3 tier's own I/O
    // runtime has one worker.
    let rt = crate::runtime(0)?;
    let latency = Duration::from_secs_f64(r.latency_ms / 1000.0);
    // Cold: the server's files (objects are files on s3s-fs) and the local copy.
    let cold = Cold::new();
    let mut cold_method = ColdMethod::Warm;
    let sides: Vec<ReadSide> = r
        .depths
        .iter()
        .flat_map(|&d| [ReadSide::S3(d), ReadSide::Files(d)])
        .chain(r.threads.iter().map(|&t| ReadSide::Boto3(t)))
        .collect();
    let per_side = interleaved(r.repeats, &sides, true, |rep, side| {
        let run = match *side {
            ReadSide::S3(depth) => {
                let tier: Arc<dyn Tier> = Arc::new(S3Tier::new(
                    s3_config(server.endpoint(), bucket, "").with_io_threads(1).with_read_concurrency(depth),
                )?);
                // Warm the connection pool, as the boto3 pool is warmed.
                rt.block_on(read_all(tier.as_ref(), &keys[..depth.min(keys.len())], size, depth))?;
                cold_method = cold.pass_dirs(&[&work])?;
                let meter = Meter::start();
                let bytes = rt.block_on(read_all(tier.as_ref(), &keys, size, depth))?;
                let u = meter.stop();
                ClientRun {
                    client: "ringtier S3 tier".into(),
                    setting: depth,
                    seconds: u.wall_seconds,
                    cpu_seconds: u.cpu_seconds,
                    bytes,
                }
            }
            ReadSide::Files(depth) => {
                let file_tier = crate::tiers::dir_tier(
                    &ds_dir,
                    "pfs",
                    None,
                    BufferedWrites::default(),
                    ringtier_uring::Engine::Auto,
                )?;
                let slow: Arc<dyn Tier> =
                    Arc::new(Throttled::new(file_tier, Throttle::bandwidth(u64::MAX).with_latency(latency)));
                cold_method = cold.pass_dirs(&[&work])?;
                let meter = Meter::start();
                let bytes = rt.block_on(read_all(slow.as_ref(), &keys, size, depth))?;
                let u = meter.stop();
                ClientRun {
                    client: format!("ringtier files +{}ms/request", r.latency_ms),
                    setting: depth,
                    seconds: u.wall_seconds,
                    cpu_seconds: u.cpu_seconds,
                    bytes,
                }
            }
            ReadSide::Boto3(threads) => {
                cold_method = cold.pass_dirs(&[&work])?;
                let extra: Vec<String> = vec![
                    "read".into(),
                    "--keys-file".into(),
                    keys_file.display().to_string(),
                    "--threads".into(),
                    threads.to_string(),
                ];
                let (secs, cpu, bytes) = baseline(&script, server.endpoint(), bucket, &extra)?;
                ClientRun {
                    client: "boto3 thread pool".into(),
                    setting: threads,
                    seconds: secs,
                    cpu_seconds: cpu,
                    bytes,
                }
            }
        };
        println!("  rep {rep} {} ({}): {:.1} MB/s", run.client, run.setting, run.mb_per_sec());
        Ok(run)
    })?;
    let runs: Vec<ClientRun> = per_side.into_iter().flatten().collect();
    let rows = summarize(&runs);
    print_rows(&rows, "depth");
    let (rb, rc, rs) = best(&rows, "ringtier S3 tier");
    let (bb, bc, bs) = best(&rows, "boto3 thread pool");
    println!(
        "ringtier S3 (one driver thread, best depth {rs}) vs the boto3 pool at its best ({bs} threads): {:.2}x bandwidth, {:.2}x CPU per GiB",
        rb / bb,
        rc / bc
    );
    let file_rows: Vec<&Row> = rows.iter().filter(|r| r.client.starts_with("ringtier files")).collect();
    if let (Some(lo), Some(hi)) = (file_rows.first(), file_rows.last()) {
        println!(
            "throttled file tier: depth {} -> {}: {:.1}x bandwidth (latency-bound: in-flight requests hide the per-request latency)",
            lo.setting,
            hi.setting,
            hi.mb_per_s.median / lo.mb_per_s.median
        );
    }
    let report = S3Report {
        schema: "ringtier.bench.s3.read/1",
        benchmark: "s3 read",
        machine: Machine::probe(),
        server: r.server,
        storage: format!("dataset files and server files on {} ({})", work.display(), filesystem(&work)),
        cold: cold_method,
        config: RunSettings::Read {
            objects: r.objects,
            object_size: r.object_size,
            depths: r.depths.clone(),
            threads: r.threads.clone(),
            latency_ms: r.latency_ms,
            server_latency_ms: r.server_latency_ms,
            repeats: r.repeats,
        },
        rows,
        runs,
        bandwidth_ratio: rb / bb,
        cpu_per_gib_ratio: rc / bc,
    };
    write_json(r.json.as_deref(), &report)?;
    Ok(report)
}
