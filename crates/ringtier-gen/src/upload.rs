//! A generated dataset copied to an S3 prefix, one object per file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ringtier_s3::S3Tier;

/// Uploads the dataset generated in `local` to `tier`, one object per file, keys relative to
/// `local`, 32 puts in flight; every file but the manifest, whose `.ringtier` name is reserved:
/// the objects are the dataset. Returns (objects, bytes). Runs on a tokio runtime.
pub async fn upload_dir(local: &Path, tier: &S3Tier) -> Result<(usize, u64)> {
    let mut files: Vec<PathBuf> = crate::files_under(local)?
        .into_iter()
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".ringtier")))
        .collect();
    files.sort();
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
}
