//! `ringtier gen`: a synthetic dataset with a manifest (deterministic from a seed), on the
//! library alone: the generator is `ringtier::gen`; an `s3://` destination is generated in a
//! temporary directory, then uploaded to the S3 tier the front door opens
//! (`ringtier::open::s3_tier`).

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use ringtier::gen::Format;
use ringtier::manifest::{Manifest, MANIFEST_FILE};
use ringtier::open::OpenOptions;

use crate::args::GenArgs;

/// `ringtier gen`.
pub(crate) fn command(a: GenArgs) -> Result<()> {
    if let Some(url) = ringtier::open::is_s3_url(&a.dir).then(|| a.dir.to_string_lossy().into_owned()) {
        // Generated in a temporary directory, then uploaded, then removed.
        let tmp = tempfile::Builder::new().prefix("ringtier-gen-").tempdir().context("creating a temp dir")?;
        let local = tmp.path().join("ds");
        command(GenArgs { dir: local.clone(), force: true, ..a })?;
        let t0 = Instant::now();
        let (n, bytes) = upload(&local, &url)?;
        println!("uploaded {n} objects, {:.1} MB, to {url} in {:.1} s", bytes as f64 / 1e6, t0.elapsed().as_secs_f64());
        return Ok(());
    }
    let spec = a.shape.spec(a.preset)?;
    let t0 = Instant::now();
    if matches!(spec.format, Format::Tfrecord | Format::Wds) {
        let (shards, bytes) = ringtier::gen::generate_shards(&a.dir, &spec, a.shards, a.force)?;
        println!(
            "wrote {} samples as {shards} {:?} shards, {:.1} MB, in {:.1} s",
            spec.files,
            spec.format,
            bytes as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let manifest = ringtier::gen::generate(&a.dir, &spec, a.force, std::io::stderr().is_terminal())?;
    println!(
        "wrote {} files, {:.1} MB (median {:.0} KB, max {:.0} KB), manifest {} in {:.1} s",
        manifest.entries.len(),
        manifest.total_bytes() as f64 / 1e6,
        median_size(&manifest) as f64 / 1e3,
        manifest.max_size() as f64 / 1e3,
        a.dir.join(MANIFEST_FILE).display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Uploads the dataset generated in `local` to the S3 prefix `url` (its bucket checked first);
/// returns (objects, bytes).
fn upload(local: &Path, url: &str) -> Result<(usize, u64)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building a tokio runtime")?;
    rt.block_on(async {
        let tier = ringtier::open::s3_tier(url, &OpenOptions::store())?;
        tier.check().await.with_context(|| format!("opening {url}"))?;
        ringtier::gen::upload_dir(local, &tier).await
    })
}

/// The median of the files' sizes (the upper one of an even count).
fn median_size(manifest: &Manifest) -> u64 {
    let mut s: Vec<u64> = manifest.entries.iter().map(|e| e.size).collect();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}
