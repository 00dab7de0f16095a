//! `bench s3 drain`: a checkpoint saved to a local fast tier, drained to S3 by the store (each
//! upload check in turn), against boto3's `upload_file` of the same part.

use super::*;

pub(super) fn drain(d: DrainArgs) -> Result<()> {
    let (work, _tmp, script) = work_dir(d.common.work.as_deref(), d.common.baseline.as_deref())?;
    let server = crate::s3server::start(d.common.server, &work, 0.0, !d.server_ignores_part_checksums)?;
    let rt = crate::runtime(2)?;
    let cold = Cold::new();
    let mut cold_method = ColdMethod::Warm;
    let bucket = "bench";
    let part_size = usize::try_from(d.part_size)?;
    let make_slow = |prefix: &str, v: DrainVariant| -> Result<Arc<dyn Tier>> {
        let mut cfg = s3_config(server.endpoint(), bucket, prefix)
            .with_part_size(part_size)
            .with_upload_concurrency(d.upload_concurrency)
            .with_verify(v.verify)
            .named("s3");
        if let Some(u) = v.unsigned {
            cfg = cfg.with_unsigned_payload(u);
        }
        Ok(Arc::new(S3Tier::new(cfg)?))
    };
    rt.block_on(async { S3Tier::new(s3_config(server.endpoint(), bucket, ""))?.create_bucket().await })?;
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
    let mut variants = vec![DRAIN_DEFAULT, DRAIN_READBACK_SIGNED];
    if d.unsigned_payload {
        variants.extend(DRAIN_UNSIGNED);
    }
    let sides: Vec<DrainSide> = variants
        .into_iter()
        .enumerate()
        .map(|(i, v)| DrainSide::Ringtier(i, v))
        .chain(d.concurrency.iter().map(|&c| DrainSide::Boto3(c)))
        .collect();
    // The checkpoint of a repeat, saved to the fast tier only, before its first side runs; the
    // drain to S3 starts when the store opens with S3 as its next tier (recovery queues it).
    let cfg = |rep: usize| StoreConfig::default().with_prefix(format!("ck{rep}"));
    let fast =
        || crate::tiers::dir_tier(&fast_dir, "fast", None, BufferedWrites::default(), ringtier_uring::Engine::Auto);
    let part_file =
        |rep: usize| fast_dir.join(format!("ck{rep}")).join(format!("{:020}", 1)).join("parts").join("model");
    let mut saved: Option<usize> = None;
    let per_side = interleaved(d.common.repeats, &sides, true, |rep, side| {
        if saved != Some(rep) {
            if let Some(prev) = saved {
                std::fs::remove_dir_all(fast_dir.join(format!("ck{prev}"))).ok();
            }
            rt.block_on(async {
                let store = CheckpointStore::open(vec![fast()?], cfg(rep)).await?;
                store.save(1, vec![Part::bytes("model", &data)]).await?;
                anyhow::Ok(())
            })?;
            if !part_file(rep).exists() {
                bail!("the saved part is not at {}", part_file(rep).display());
            }
            saved = Some(rep);
        }
        cold_method = cold.pass([&part_file(rep)])?;
        let run = match *side {
            DrainSide::Ringtier(vi, v) => {
                let s3_prefix = format!("ringtier-{rep}-{vi}");
                let meter = Meter::start();
                rt.block_on(async {
                    let store = CheckpointStore::open(vec![fast()?, make_slow(&s3_prefix, v)?], cfg(rep)).await?;
                    store.drain().await?;
                    anyhow::Ok(())
                })?;
                let u = meter.stop();
                // Each upload is measured, then dropped: the disk holds one copy at a time.
                forget_uploaded(&server, bucket, &s3_prefix);
                ClientRun {
                    client: v.name.into(),
                    setting: d.upload_concurrency,
                    seconds: u.wall_seconds,
                    cpu_seconds: u.cpu_seconds,
                    bytes: d.size,
                }
            }
            DrainSide::Boto3(c) => {
                let key = format!("boto3/{rep}-{c}");
                let extra: Vec<String> = vec![
                    "upload".into(),
                    "--file".into(),
                    part_file(rep).display().to_string(),
                    "--key".into(),
                    key.clone(),
                    "--concurrency".into(),
                    c.to_string(),
                    "--chunk".into(),
                    d.part_size.to_string(),
                ];
                let (secs, cpu, bytes) = baseline(&script, server.endpoint(), bucket, &extra)?;
                if bytes != d.size {
                    bail!("boto3 uploaded {bytes} bytes, not {}", d.size);
                }
                forget_uploaded(&server, bucket, &key);
                ClientRun { client: "boto3 upload_file".into(), setting: c, seconds: secs, cpu_seconds: cpu, bytes }
            }
        };
        println!(
            "  rep {rep} {} ({}): {:.1} MB/s, {:.2} CPU s/GiB",
            run.client,
            run.setting,
            run.mb_per_sec(),
            run.cpu_seconds_per_gib()
        );
        Ok(run)
    })?;
    if let Some(prev) = saved {
        std::fs::remove_dir_all(fast_dir.join(format!("ck{prev}"))).ok();
    }
    let runs: Vec<ClientRun> = per_side.into_iter().flatten().collect();
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
    let report = S3Report {
        schema: "ringtier.bench.s3.drain/1",
        benchmark: "s3 drain",
        machine: Machine::probe(),
        server: d.common.server,
        storage: format!("fast tier and server files on {} ({})", work.display(), filesystem(&work)),
        cold: cold_method,
        config: RunSettings::Drain {
            size: d.size,
            part_size: d.part_size,
            upload_concurrency: d.upload_concurrency,
            boto3_concurrency: d.concurrency,
            repeats: d.common.repeats,
            server_checks_part_checksums: !d.server_ignores_part_checksums,
            cpu: "each client process's own user+system time; the server is another process",
        },
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
fn forget_uploaded(server: &crate::s3server::S3Server, bucket: &str, key_or_prefix: &str) {
    if let Some(root) = server.root() {
        let p = root.join(bucket).join(key_or_prefix);
        let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
    }
}

/// One side of `bench s3 drain`: a configuration of ringtier's drain (its index among the
/// variants names its S3 prefix), or boto3's `upload_file` at a `max_concurrency`.
#[derive(Debug, Clone, Copy)]
enum DrainSide {
    Ringtier(usize, DrainVariant),
    Boto3(usize),
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
