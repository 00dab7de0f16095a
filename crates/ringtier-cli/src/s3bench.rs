//! `ringtier bench s3`: the S3 tier against boto3 on the same S3 server on loopback.
//!
//! * `drain`: the checkpoint store's drain of one checkpoint part to S3 against boto3's
//!   `upload_file` (multipart, `TransferConfig.max_concurrency` swept) of the same file.
//! * `read`: many small objects read through the S3 tier over a concurrency sweep (one driver
//!   thread), a boto3 thread pool over a thread sweep, and a local file tier behind the
//!   throttled layer's per-request latency: the latency-bound regime of a remote store.
//!
//! The server is a separate process (s3s-fs run by this binary, or moto_server), so each
//! client's CPU time is its own. Baselines run `bench/s3/boto3_baseline.py`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use ringtier_core::layers::{Throttle, Throttled};
use ringtier_core::{AlignedBuf, ReadBatch, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_s3::testing::{ACCESS_KEY, SECRET_KEY};
use ringtier_s3::{S3Config, S3Tier, UploadVerify};
use ringtier_uring::BufferedWrites;
use serde::Serialize;

use crate::args::parse_size;
use crate::stats::{drop_caches, process_cpu, write_json, Machine, Rng, Summary};

const GIB: f64 = (1u64 << 30) as f64;

/// Arguments of `ringtier bench s3`.
#[derive(Args, Debug)]
pub(crate) struct S3BenchArgs {
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

#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
pub(crate) enum Server {
    /// s3s-fs (Rust, files under the work directory), a child process of this binary.
    S3sFs,
    /// moto_server (Python, objects in memory).
    Moto,
}

#[derive(Args, Debug)]
struct Common {
    /// The S3 server both clients use, started on loopback for the run.
    #[arg(long, value_enum, default_value = "s3s-fs")]
    server: Server,
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
    /// The boto3 baseline script.
    #[arg(long, default_value = "bench/s3/boto3_baseline.py")]
    baseline: PathBuf,
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

/// One measured run.
#[derive(Debug, Clone, Serialize)]
struct Run {
    client: String,
    setting: usize,
    seconds: f64,
    cpu_seconds: f64,
    bytes: u64,
}

/// A client at one setting over the repeats.
#[derive(Debug, Clone, Serialize)]
struct Row {
    client: String,
    setting: usize,
    mb_per_s: Summary,
    cpu_s_per_gib: Summary,
}

#[derive(Debug, Serialize)]
struct Report {
    benchmark: &'static str,
    machine: Machine,
    server: Server,
    storage: String,
    config: serde_json::Value,
    rows: Vec<Row>,
    runs: Vec<Run>,
    /// ringtier's best median bandwidth over the baseline's best, and its CPU per GiB (at its
    /// best setting) over the baseline's (at the baseline's best setting).
    bandwidth_ratio: f64,
    cpu_per_gib_ratio: f64,
}

/// The S3 server for a run: a child process, killed when dropped.
struct ServerProc {
    child: Child,
    endpoint: String,
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

fn start_server(kind: Server, work: &Path, latency_ms: f64, part_checks: bool) -> Result<ServerProc> {
    if latency_ms > 0.0 && !matches!(kind, Server::S3sFs) {
        bail!("a server latency needs the s3s-fs server");
    }
    let port = free_port()?;
    let mut cmd = match kind {
        Server::S3sFs => {
            let root = work.join("s3");
            std::fs::create_dir_all(&root)?;
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["bench", "s3", "serve", "--port", &port.to_string(), "--latency-ms", &latency_ms.to_string()]);
            c.arg("--root").arg(&root);
            if !part_checks {
                c.arg("--ignore-part-checksums");
            }
            c
        }
        Server::Moto => {
            let mut c = Command::new("moto_server");
            c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            c
        }
    };
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("starting the S3 server")?;
    let server = ServerProc { child, endpoint: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("the S3 server did not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
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

fn summarize(runs: &[Run]) -> Vec<Row> {
    let mut keys: Vec<(String, usize)> = runs.iter().map(|r| (r.client.clone(), r.setting)).collect();
    keys.dedup();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(client, setting)| {
            let rs: Vec<&Run> = runs.iter().filter(|r| r.client == client && r.setting == setting).collect();
            let bw: Vec<f64> = rs.iter().map(|r| r.bytes as f64 / r.seconds / 1e6).collect();
            let cpu: Vec<f64> = rs.iter().map(|r| r.cpu_seconds / (r.bytes as f64 / GIB)).collect();
            Row { client, setting, mb_per_s: Summary::of(&bw), cpu_s_per_gib: Summary::of(&cpu) }
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
    println!("{:<42} {:>8} {:>28} {:>26}", "client", setting_name, "MB/s min/median/max", "CPU s/GiB min/median/max");
    for r in rows {
        println!(
            "{:<42} {:>8} {:>9.1}/{:>8.1}/{:>8.1} {:>8.2}/{:>7.2}/{:>7.2}",
            r.client,
            r.setting,
            r.mb_per_s.min,
            r.mb_per_s.median,
            r.mb_per_s.max,
            r.cpu_s_per_gib.min,
            r.cpu_s_per_gib.median,
            r.cpu_s_per_gib.max
        );
    }
}

fn storage_of(path: &Path) -> String {
    let out = Command::new("df").args(["--output=fstype,source"]).arg(path).output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => String::new(),
    }
}

/// Runs `ringtier bench s3`.
pub(crate) fn command(a: S3BenchArgs) -> Result<()> {
    match a.action {
        S3BenchAction::Serve { root, port, latency_ms, ignore_part_checksums } => {
            let latency = Duration::from_secs_f64(latency_ms.max(0.0) / 1000.0);
            let _server = ringtier_s3::testing::S3sFsServer::start_with(&root, port, latency, !ignore_part_checksums)?;
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
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
    pub server: Server,
    /// Work directory (default: a new temp dir, removed afterwards).
    pub work: Option<PathBuf>,
    pub repeats: usize,
    /// Write the report as JSON here.
    pub json: Option<PathBuf>,
    /// The boto3 baseline script.
    pub baseline: PathBuf,
    pub objects: usize,
    pub object_size: u64,
    /// Requests in flight swept for the ringtier tiers.
    pub depths: Vec<usize>,
    /// boto3 pool threads swept.
    pub threads: Vec<usize>,
    /// Per-request latency of the throttled file tier, in milliseconds.
    pub latency_ms: f64,
    /// Latency the S3 server adds to every request, in milliseconds (s3s-fs only).
    pub server_latency_ms: f64,
}

/// The boto3 baseline script, built into the binary (for `ringtier paper --remote`, which
/// may run anywhere): written to `dir` and its path returned.
pub(crate) fn write_baseline_script(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("boto3_baseline.py");
    std::fs::write(&path, include_str!("../../../bench/s3/boto3_baseline.py"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
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

fn work_dir(work: Option<&Path>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    Ok(match work {
        Some(w) => {
            std::fs::create_dir_all(w)?;
            (w.to_path_buf(), None)
        }
        None => {
            let t = tempfile::Builder::new().prefix("ringtier-s3bench").tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    })
}

fn drain(d: DrainArgs) -> Result<()> {
    let (work, _tmp) = work_dir(d.common.work.as_deref())?;
    let server = start_server(d.common.server, &work, 0.0, !d.server_ignores_part_checksums)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bucket = "bench";
    let part_size = usize::try_from(d.part_size)?;
    let make_slow = |prefix: &str, v: DrainVariant| -> Result<Arc<dyn Tier>> {
        let mut cfg = s3_config(&server.endpoint, bucket, prefix)
            .with_part_size(part_size)
            .with_upload_concurrency(d.upload_concurrency)
            .with_verify(v.verify)
            .named("s3");
        if let Some(u) = v.unsigned {
            cfg = cfg.with_unsigned_payload(u);
        }
        Ok(Arc::new(S3Tier::new(cfg)?))
    };
    rt.block_on(async { S3Tier::new(s3_config(&server.endpoint, bucket, ""))?.create_bucket().await })?;
    let fast_dir = work.join("fast");
    let size = usize::try_from(d.size)?;
    println!(
        "bench s3 drain: {} MB part, {} MB parts, ringtier {} parts in flight, boto3 max_concurrency {:?}, server {:?}, {} repeats",
        d.size / 1_000_000,
        d.part_size / 1_000_000,
        d.upload_concurrency,
        d.concurrency,
        d.common.server,
        d.common.repeats
    );
    let mut data = vec![0u8; size];
    Rng::new(7).fill(&mut data);
    let mut runs = Vec::new();
    for rep in 0..d.common.repeats {
        // The checkpoint, saved to the fast tier only; the drain to S3 starts when the store
        // opens with S3 as its next tier (recovery queues it).
        let prefix = format!("ck{rep}");
        let cfg = || StoreConfig::default().with_prefix(prefix.clone());
        let fast = || crate::ckpt::dir_tier(&fast_dir, "fast", None, BufferedWrites::default());
        rt.block_on(async {
            let store = CheckpointStore::open(vec![fast()?], cfg()).await?;
            store.save(1, vec![Part::bytes("model", &data)]).await?;
            anyhow::Ok(())
        })?;
        let part_file = fast_dir.join(&prefix).join(format!("{:020}", 1)).join("parts").join("model");
        if !part_file.exists() {
            bail!("the saved part is not at {}", part_file.display());
        }
        let mut variants = vec![DRAIN_DEFAULT, DRAIN_READBACK_SIGNED];
        if d.unsigned_payload {
            variants.extend(DRAIN_UNSIGNED);
        }
        for (vi, v) in variants.into_iter().enumerate() {
            let _ = drop_caches();
            let s3_prefix = format!("ringtier-{rep}-{vi}");
            let (t0, c0) = (Instant::now(), process_cpu());
            rt.block_on(async {
                let store = CheckpointStore::open(vec![fast()?, make_slow(&s3_prefix, v)?], cfg()).await?;
                store.drain().await?;
                anyhow::Ok(())
            })?;
            let (secs, cpu) = (t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64());
            let client = v.name;
            println!(
                "  rep {rep} {client}: {:.1} MB/s, {:.2} CPU s/GiB",
                d.size as f64 / secs / 1e6,
                cpu / (d.size as f64 / GIB)
            );
            runs.push(Run {
                client: client.into(),
                setting: d.upload_concurrency,
                seconds: secs,
                cpu_seconds: cpu,
                bytes: d.size,
            });
            // Each upload is measured, then dropped: the disk holds one copy at a time.
            forget_uploaded(d.common.server, &work, bucket, &s3_prefix);
        }
        for &c in &d.concurrency {
            let _ = drop_caches();
            let extra: Vec<String> = vec![
                "upload".into(),
                "--file".into(),
                part_file.display().to_string(),
                "--key".into(),
                format!("boto3/{rep}-{c}"),
                "--concurrency".into(),
                c.to_string(),
                "--chunk".into(),
                d.part_size.to_string(),
            ];
            let (secs, cpu, bytes) = baseline(&d.common.baseline, &server.endpoint, bucket, &extra)?;
            if bytes != d.size {
                bail!("boto3 uploaded {bytes} bytes, not {}", d.size);
            }
            println!(
                "  rep {rep} boto3 upload_file c={c}: {:.1} MB/s, {:.2} CPU s/GiB",
                d.size as f64 / secs / 1e6,
                cpu / (d.size as f64 / GIB)
            );
            runs.push(Run { client: "boto3 upload_file".into(), setting: c, seconds: secs, cpu_seconds: cpu, bytes });
            forget_uploaded(d.common.server, &work, bucket, &format!("boto3/{rep}-{c}"));
        }
        std::fs::remove_dir_all(fast_dir.join(&prefix)).ok();
    }
    let rows = summarize(&runs);
    print_rows(&rows, "inflight");
    let (rb, rc, _) = best(&rows, DRAIN_DEFAULT.name);
    let (bb, bc, bs) = best(&rows, "boto3 upload_file");
    for v in [DRAIN_READBACK_SIGNED].iter().chain(DRAIN_UNSIGNED.iter()) {
        let (ub, uc, _) = best(&rows, v.name);
        if ub.is_finite() {
            println!("{} vs boto3 at its best: {:.2}x bandwidth, {:.2}x CPU per GiB", v.name, ub / bb, uc / bc);
        }
    }
    println!(
        "{} vs boto3 at its best (max_concurrency {bs}): {:.2}x bandwidth, {:.2}x CPU per GiB (targets: at least 1.0x, at most 0.5x)",
        DRAIN_DEFAULT.name,
        rb / bb,
        rc / bc,
    );
    let report = Report {
        benchmark: "s3 drain",
        machine: Machine::probe(),
        server: d.common.server,
        storage: format!("fast tier and server files on {} ({})", work.display(), storage_of(&work)),
        config: serde_json::json!({"size": d.size, "part_size": d.part_size, "upload_concurrency": d.upload_concurrency, "boto3_concurrency": d.concurrency, "repeats": d.common.repeats, "server_checks_part_checksums": !d.server_ignores_part_checksums, "cpu": "each client process's own user+system time; the server is another process"}),
        rows,
        runs,
        bandwidth_ratio: rb / bb,
        cpu_per_gib_ratio: rc / bc,
    };
    write_json(d.common.json.as_deref(), &report)
}

/// Removes what a measured upload left in the s3s-fs server's directory (objects are files
/// there), so a long run holds one uploaded copy at a time on disk; moto keeps objects in
/// memory, where they go with the server.
fn forget_uploaded(server: Server, work: &Path, bucket: &str, key_or_prefix: &str) {
    if matches!(server, Server::S3sFs) {
        let p = work.join("s3").join(bucket).join(key_or_prefix);
        let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
    }
}

/// One configuration of ringtier's drain in `bench s3 drain`.
#[derive(Debug, Clone, Copy)]
struct DrainVariant {
    name: &'static str,
    verify: UploadVerify,
    /// `None`: the tier's default (checksummed parts unsigned, the rest signed).
    unsigned: Option<bool>,
}

const DRAIN_DEFAULT: DrainVariant =
    DrainVariant { name: "ringtier drain (part checksums, default)", verify: UploadVerify::Checksums, unsigned: None };
const DRAIN_READBACK_SIGNED: DrainVariant =
    DrainVariant { name: "ringtier drain (read-back, signed)", verify: UploadVerify::ReadBack, unsigned: Some(false) };
const DRAIN_UNSIGNED: [DrainVariant; 2] = [
    DrainVariant { name: "ringtier drain (read-back, unsigned)", verify: UploadVerify::ReadBack, unsigned: Some(true) },
    DrainVariant { name: "ringtier drain (unsigned, no check)", verify: UploadVerify::Off, unsigned: Some(true) },
];

/// Reads every key through `tier` in batches of `depth` requests (one batch in flight at a
/// time, each of its requests concurrent): returns bytes read.
async fn read_all(tier: &dyn Tier, keys: &[String], size: usize, depth: usize) -> Result<u64> {
    let mut bufs: Vec<AlignedBuf> =
        (0..depth).map(|_| AlignedBuf::new(size + 4096, 4096)).collect::<ringtier_core::Result<_>>()?;
    let objects: Vec<(&str, usize)> = keys.iter().map(|k| (k.as_str(), size)).collect();
    read_batches(tier, &objects, depth, &mut bufs).await
}

/// Reads `objects` (key, bytes) through `tier`, `depth` requests per batch (one batch in
/// flight at a time), into `bufs` (at least `depth` buffers, each large enough): bytes read.
pub(crate) async fn read_batches(
    tier: &dyn Tier,
    objects: &[(&str, usize)],
    depth: usize,
    bufs: &mut Vec<AlignedBuf>,
) -> Result<u64> {
    let mut total = 0u64;
    let mut batch = ReadBatch::with_capacity(depth, depth * 64);
    for chunk in objects.chunks(depth) {
        for &(k, size) in chunk {
            let Some(b) = bufs.pop() else { bail!("buffer pool empty") };
            batch.push(k, 0, size, b);
        }
        batch = tier.read_batch(batch).await;
        for (key, _, res, buf) in batch.drain() {
            total += res.with_context(|| format!("reading {key}"))? as u64;
            if let Some(b) = buf {
                bufs.push(b);
            }
        }
    }
    Ok(total)
}

/// Runs the read sweep; prints the table, writes the JSON if asked, returns it.
pub(crate) fn read(r: &ReadSweep) -> Result<serde_json::Value> {
    let (work, _tmp) = work_dir(r.work.as_deref())?;
    let server = start_server(r.server, &work, r.server_latency_ms, true)?;
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
    let setup = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    setup.block_on(async {
        let tier = S3Tier::new(s3_config(&server.endpoint, bucket, "").with_upload_concurrency(32))?;
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
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let latency = Duration::from_secs_f64(r.latency_ms / 1000.0);
    let mut runs = Vec::new();
    for rep in 0..r.repeats {
        for &depth in &r.depths {
            let tier: Arc<dyn Tier> = Arc::new(S3Tier::new(
                s3_config(&server.endpoint, bucket, "").with_io_threads(1).with_read_concurrency(depth),
            )?);
            // Warm the connection pool, as the boto3 pool is warmed.
            rt.block_on(read_all(tier.as_ref(), &keys[..depth.min(keys.len())], size, depth))?;
            let _ = drop_caches();
            let (t0, c0) = (Instant::now(), process_cpu());
            let bytes = rt.block_on(read_all(tier.as_ref(), &keys, size, depth))?;
            let (secs, cpu) = (t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64());
            println!("  rep {rep} ringtier S3 depth {depth}: {:.1} MB/s", bytes as f64 / secs / 1e6);
            runs.push(Run {
                client: "ringtier S3 tier".into(),
                setting: depth,
                seconds: secs,
                cpu_seconds: cpu,
                bytes,
            });

            let file_tier = crate::ckpt::dir_tier(&ds_dir, "pfs", None, BufferedWrites::default())?;
            let slow: Arc<dyn Tier> =
                Arc::new(Throttled::new(file_tier, Throttle::bandwidth(u64::MAX).with_latency(latency)));
            let _ = drop_caches();
            let (t0, c0) = (Instant::now(), process_cpu());
            let bytes = rt.block_on(read_all(slow.as_ref(), &keys, size, depth))?;
            let (secs, cpu) = (t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64());
            println!("  rep {rep} ringtier throttled files depth {depth}: {:.1} MB/s", bytes as f64 / secs / 1e6);
            runs.push(Run {
                client: format!("ringtier files +{}ms/request", r.latency_ms),
                setting: depth,
                seconds: secs,
                cpu_seconds: cpu,
                bytes,
            });
        }
        for &threads in &r.threads {
            let _ = drop_caches();
            let extra: Vec<String> = vec![
                "read".into(),
                "--keys-file".into(),
                keys_file.display().to_string(),
                "--threads".into(),
                threads.to_string(),
            ];
            let (secs, cpu, bytes) = baseline(&r.baseline, &server.endpoint, bucket, &extra)?;
            println!("  rep {rep} boto3 pool threads {threads}: {:.1} MB/s", bytes as f64 / secs / 1e6);
            runs.push(Run {
                client: "boto3 thread pool".into(),
                setting: threads,
                seconds: secs,
                cpu_seconds: cpu,
                bytes,
            });
        }
    }
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
    let report = Report {
        benchmark: "s3 read",
        machine: Machine::probe(),
        server: r.server,
        storage: format!("dataset files and server files on {} ({})", work.display(), storage_of(&work)),
        config: serde_json::json!({"objects": r.objects, "object_size": r.object_size, "depths": r.depths, "threads": r.threads, "latency_ms": r.latency_ms, "server_latency_ms": r.server_latency_ms, "repeats": r.repeats}),
        rows,
        runs,
        bandwidth_ratio: rb / bb,
        cpu_per_gib_ratio: rc / bc,
    };
    write_json(r.json.as_deref(), &report)?;
    Ok(serde_json::to_value(&report)?)
}

/// The tier for an `s3://` dataset URL (settings in the URL; credentials, and the endpoint
/// where the URL names none, from the AWS environment variables).
fn dataset_tier(url: &str, depth: usize) -> Result<S3Tier> {
    let cfg = S3Config::from_url(url)?.with_io_threads(1).with_read_concurrency(depth);
    Ok(S3Tier::new(cfg)?)
}

/// `ringtier gen --dir s3://...`: uploads the dataset generated in `local` (every file but the
/// manifest, whose `.ringtier` name is reserved; keys relative to `local`) to the S3 prefix;
/// returns (objects, bytes).
pub(crate) fn upload_dir(local: &Path, url: &str) -> Result<(usize, u64)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else if !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".ringtier")) {
                // The manifest (a reserved name) stays local: the objects are the dataset.
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(local, &mut files)?;
    files.sort();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let tier = S3Tier::open(S3Config::from_url(url)?).await.with_context(|| format!("opening {url}"))?;
        let (mut tasks, mut bytes) = (Vec::new(), 0u64);
        for f in &files {
            let key = f.strip_prefix(local)?.to_string_lossy().into_owned();
            let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            bytes += data.len() as u64;
            let t = tier.clone();
            tasks.push(tokio::spawn(async move { t.put_object(&key, data.into()).await.map(|_| ()) }));
            if tasks.len() >= 32 {
                for t in tasks.drain(..) {
                    t.await??;
                }
            }
        }
        for t in tasks {
            t.await??;
        }
        Ok((files.len(), bytes))
    })
}

/// One point of the S3 dataset sweep.
#[derive(Debug, Serialize)]
struct DatasetPoint {
    depth: usize,
    mb_per_sec: Summary,
    files_per_sec: Summary,
    cpu_seconds_per_gib: Summary,
    /// Per repeat: this depth's MB/s over depth 1's (when depth 1 is in the sweep).
    speedup_vs_depth_1: Option<Summary>,
    runs: Vec<Run>,
}

/// `ringtier bench read --dir s3://bucket/prefix[?endpoint=...]`: one shuffled epoch over
/// every object under the prefix per pass, through the S3 tier's concurrent `read_batch` (one
/// driver thread: a current-thread runtime, and one I/O worker), `depth` requests in flight,
/// depths swept, repeats interleaved.
pub(crate) fn read_dataset(url: &str, a: &crate::args::ReadArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The dataset: every object under the prefix (empty ones left out).
    let objects: Vec<(String, usize)> = rt.block_on(async {
        let tier = S3Tier::open(S3Config::from_url(url)?).await.with_context(|| format!("opening {url}"))?;
        let listed = tier.list("").await.with_context(|| format!("listing {url}"))?;
        listed
            .into_iter()
            .filter(|m| m.size > 0)
            .map(|m| Ok((m.key, usize::try_from(m.size)?)))
            .collect::<Result<Vec<_>>>()
    })?;
    if objects.is_empty() {
        bail!("{url} holds no objects (upload a dataset with `ringtier gen --dir {url}`)");
    }
    let make = |depth: usize| -> Result<Arc<dyn Tier>> { Ok(Arc::new(dataset_tier(url, depth)?)) };
    sweep_tier(&rt, url, "S3 tier", serde_json::json!({"url": url, "tier": "s3"}), &objects, &make, a)
}

/// `ringtier bench read --dir DIR --latency-ms MS`: a local dataset read through the
/// throttled layer with a per-request latency (a parallel file system's round trip), the same
/// sweep as an S3 dataset's (one driver thread, `--depths` through `read_batch`).
pub(crate) fn read_files_throttled(a: &crate::args::ReadArgs, latency_ms: f64) -> Result<()> {
    if !latency_ms.is_finite() || latency_ms < 0.0 {
        bail!("--latency-ms must be a number of milliseconds, at least 0");
    }
    let ds = crate::dataset::Dataset::open(&a.dir)?;
    let objects: Vec<(String, usize)> = ds
        .manifest
        .entries
        .iter()
        .filter(|e| e.size > 0)
        .map(|e| Ok((e.key.clone(), usize::try_from(e.size)?)))
        .collect::<Result<_>>()?;
    if objects.is_empty() {
        bail!("{} holds no files", a.dir.display());
    }
    let latency = Duration::from_secs_f64(latency_ms / 1000.0);
    let make = |_depth: usize| -> Result<Arc<dyn Tier>> {
        let files = crate::ckpt::dir_tier(&ds.root, "pfs", None, BufferedWrites::default())?;
        Ok(Arc::new(Throttled::new(files, Throttle::bandwidth(u64::MAX).with_latency(latency))))
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let label = format!("files +{latency_ms} ms/request");
    let storage = serde_json::json!({"path": ds.root.display().to_string(), "tier": "files, throttled layer", "latency_ms": latency_ms, "filesystem": storage_of(&ds.root)});
    sweep_tier(&rt, &ds.root.display().to_string(), &label, storage, &objects, &make, a)
}

/// The depth sweep over `objects` through tiers from `make(depth)` (see [`read_dataset`]).
fn sweep_tier(
    rt: &tokio::runtime::Runtime,
    name: &str,
    label: &str,
    storage: serde_json::Value,
    objects: &[(String, usize)],
    make: &dyn Fn(usize) -> Result<Arc<dyn Tier>>,
    a: &crate::args::ReadArgs,
) -> Result<()> {
    let depths = a.depths.clone().unwrap_or_else(|| a.concurrency.clone());
    if depths.is_empty() || depths.contains(&0) {
        bail!("--depths must be at least 1");
    }
    if a.io.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let total: u64 = objects.iter().map(|o| o.1 as u64).sum();
    let max = objects.iter().map(|o| o.1).max().unwrap_or(0);
    let mut sizes: Vec<usize> = objects.iter().map(|o| o.1).collect();
    sizes.sort_unstable();
    println!(
        "bench read {name}: {} objects, {:.1} MB (median {:.0} KB), {label}, one driver thread, depths {depths:?}, {} repeats",
        objects.len(),
        total as f64 / 1e6,
        sizes[sizes.len() / 2] as f64 / 1e3,
        a.io.repeats
    );
    let mut runs: Vec<Vec<Run>> = depths.iter().map(|_| Vec::new()).collect();
    for rep in 0..a.io.repeats {
        let mut order: Vec<usize> = (0..objects.len()).collect();
        Rng::new(a.seed + rep as u64).shuffle(&mut order);
        for (i, &depth) in depths.iter().enumerate() {
            let tier = make(depth)?;
            let mut bufs: Vec<AlignedBuf> =
                (0..depth).map(|_| AlignedBuf::new(max + 4096, 4096)).collect::<ringtier_core::Result<_>>()?;
            let mut pass = |keys: &[usize]| -> Result<u64> {
                let wanted: Vec<(&str, usize)> = keys.iter().map(|&k| (objects[k].0.as_str(), objects[k].1)).collect();
                rt.block_on(read_batches(tier.as_ref(), &wanted, depth, &mut bufs))
            };
            // Warm the connection pool (not measured).
            pass(&order[..depth.min(order.len())])?;
            if a.io.drop_caches {
                drop_caches().context("dropping the page cache (needs root)")?;
            }
            let (t0, c0) = (Instant::now(), process_cpu());
            let bytes = pass(&order)?;
            let (secs, cpu) = (t0.elapsed().as_secs_f64(), (process_cpu() - c0).as_secs_f64());
            if bytes != total {
                bail!("a pass read {bytes} bytes of {total}");
            }
            eprintln!(
                "  repeat {}/{}: depth {depth:>4} {:>8.1} MB/s {:>8.0} objects/s {:>6.2} CPU s/GiB",
                rep + 1,
                a.io.repeats,
                bytes as f64 / secs / 1e6,
                objects.len() as f64 / secs,
                cpu / (bytes as f64 / GIB)
            );
            runs[i].push(Run {
                client: format!("ringtier {label}"),
                setting: depth,
                seconds: secs,
                cpu_seconds: cpu,
                bytes,
            });
        }
    }
    let base = depths.iter().position(|&d| d == 1);
    let mb = |r: &Run| r.bytes as f64 / r.seconds / 1e6;
    let points: Vec<DatasetPoint> = depths
        .iter()
        .enumerate()
        .map(|(i, &depth)| {
            let s = |f: &dyn Fn(&Run) -> f64| Summary::of(&runs[i].iter().map(f).collect::<Vec<_>>());
            DatasetPoint {
                depth,
                mb_per_sec: s(&mb),
                files_per_sec: s(&|r| objects.len() as f64 / r.seconds),
                cpu_seconds_per_gib: s(&|r| r.cpu_seconds / (r.bytes as f64 / GIB)),
                speedup_vs_depth_1: base.map(|b| {
                    Summary::of(&runs[i].iter().zip(&runs[b]).map(|(x, y)| mb(x) / mb(y)).collect::<Vec<_>>())
                }),
                runs: runs[i].clone(),
            }
        })
        .collect();
    println!(
        "{:>6} {:>26} {:>12} {:>26} {:>10}",
        "depth", "MB/s min/median/max", "objects/s", "CPU s/GiB min/median/max", "vs depth 1"
    );
    for p in &points {
        println!(
            "{:>6} {:>8.1}/{:>8.1}/{:>8.1} {:>12.0} {:>8.2}/{:>7.2}/{:>7.2} {:>10}",
            p.depth,
            p.mb_per_sec.min,
            p.mb_per_sec.median,
            p.mb_per_sec.max,
            p.files_per_sec.median,
            p.cpu_seconds_per_gib.min,
            p.cpu_seconds_per_gib.median,
            p.cpu_seconds_per_gib.max,
            p.speedup_vs_depth_1.as_ref().map_or("-".to_string(), |s| format!("{:.2}x", s.median))
        );
    }
    // The URL's settings may name the endpoint; credentials never appear in it.
    let report = serde_json::json!({
        "schema": "ringtier.bench.read.s3/1",
        "machine": Machine::probe(),
        "storage": storage,
        "dataset": {"objects": objects.len(), "bytes": total, "median_object_bytes": sizes[sizes.len() / 2], "max_object_bytes": max},
        "repeats": a.io.repeats,
        "driver_threads": 1,
        "seed": a.seed,
        "points": points,
    });
    write_json(a.io.json.as_deref(), &report)
}
