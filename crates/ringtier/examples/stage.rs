//! Stages batches into page-locked memory: the io_uring tier reads each batch into pinned
//! buffers and the copy to the target starts at once, overlapping the next batch's read.
//! Host memory here; `Target::Cuda(N)` with feature `cuda` on a machine with a GPU.
//!
//! ```text
//! cargo run -p ringtier --example stage                           # 256 files in a temp dir
//! cargo run --release -p ringtier --example stage -- DIR [BATCH]
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use ringtier::stage::{PinnedPool, StagedBatch, Stager, Target};
use ringtier::uring::{UringConfig, UringTier, UringTierOptions};
use ringtier::Tier;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let tmp = tempfile::tempdir()?;
    let dir = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => {
            for i in 0..256 {
                std::fs::write(tmp.path().join(format!("{i:04}.bin")), vec![i as u8; 50_000 + 100 * i])?;
            }
            tmp.path().to_path_buf()
        }
    };
    let batch_size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);

    let files = UringTier::new(&dir, UringConfig::default())?.list("").await?;
    let largest = files.iter().map(|f| f.size).max().ok_or("no files to stage")? as usize;
    // Pinned buffers for two batches: the one being read and the one being copied.
    let pinned = PinnedPool::new(largest, 2 * batch_size, Target::Host)?;
    println!("pinned pool: {} buffers of {} bytes, {:?}", 2 * batch_size, pinned.pool().buf_size(), pinned.pinning());
    let options = UringTierOptions::default().with_pool(pinned.pool().clone());
    let tier = Arc::new(UringTier::with_options(&dir, UringConfig::default(), options)?);
    let stager = Stager::new(tier, pinned, Target::Host)?;

    let requests: Vec<(String, usize)> = files.into_iter().map(|f| (f.key, f.size as usize)).collect();
    let (mut samples, mut bytes, mut previous) = (0, 0, None::<StagedBatch>);
    for chunk in requests.chunks(batch_size).map(Some).chain([None]) {
        // This batch is read into pinned buffers and its copy launched while the previous
        // batch's copy may still run; then the previous one is waited for.
        let batch = match chunk {
            Some(chunk) => Some(stager.stage(chunk).await?),
            None => None,
        };
        if let Some(done) = std::mem::replace(&mut previous, batch) {
            bytes += done.bytes();
            samples += done.wait().await?.len();
        }
    }
    println!("staged {samples} samples, {bytes} bytes from {} into host memory", dir.display());
    Ok(())
}
