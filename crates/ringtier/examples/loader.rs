//! Iterates shuffled, sharded epochs with prefetch: every rank of a world reads its share, and
//! together they read each sample exactly once per epoch.
//!
//! ```text
//! cargo run -p ringtier --example loader                          # 1,000 files in a temp dir
//! cargo run --release -p ringtier --example loader -- DIR [BATCH [PREFETCH [WORLD]]]
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ringtier::{Dataset, Loader, LoaderConfig, Tier, UringConfig, UringTier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let tmp = tempfile::tempdir()?;
    let dir = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => {
            for i in 0..1000 {
                std::fs::write(tmp.path().join(format!("{i:05}.jpg")), vec![i as u8; 2000 + 13 * i])?;
            }
            tmp.path().to_path_buf()
        }
    };
    let mut next = |default: usize| args.next().map(|a| a.parse()).transpose().map(|v| v.unwrap_or(default));
    let (batch_size, prefetch, world) = (next(32)?, next(2)?, next(2)?);

    let tier: Arc<dyn Tier> = Arc::new(UringTier::new(&dir, UringConfig::default())?);
    let dataset = Dataset::from_dir(tier, &dir).await?; // the `ringtier gen` manifest, or a listing
    println!("{} samples in {}, {world} ranks, batch {batch_size}, prefetch {prefetch}", dataset.len(), dir.display());
    for epoch in 0..2 {
        let mut seen = vec![0u32; dataset.len()];
        for rank in 0..world {
            let config = LoaderConfig::default()
                .with_batch_size(batch_size)
                .with_prefetch(prefetch)
                .with_seed(7)
                .with_rank(rank)
                .with_world(world);
            let loader = Loader::new(dataset.clone(), config)?;
            let mut batches = loader.epoch(epoch, 0)?;
            while let Some(batch) = batches.next().await {
                for &i in &batch?.indices {
                    seen[i as usize] += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await; // the training step
            }
            let s = batches.stats();
            println!(
                "epoch {epoch} rank {rank}: {} samples, {} bytes in {} batches, stalled {:.4} s ({:.4} s for the first)",
                s.samples, s.bytes, s.batches, s.stall_seconds, s.first_stall_seconds
            );
        }
        let once = seen.iter().all(|&n| n == 1);
        println!("epoch {epoch}: every sample read exactly once across ranks: {once}");
    }
    Ok(())
}
