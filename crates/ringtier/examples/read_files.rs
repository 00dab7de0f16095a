//! Reads every file under a directory through the io_uring tier, a batch at a time (one
//! submission per batch; O_DIRECT where the file system allows), and says what it read.
//!
//! ```text
//! cargo run -p ringtier --example read_files                      # 256 files in a temp dir
//! cargo run --release -p ringtier --example read_files -- DIR [BATCH]
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use ringtier::uring::{UringConfig, UringTier, UringTierOptions};
use ringtier::{BufferPool, PoolConfig, ReadBatch, Tier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let tmp = tempfile::tempdir()?;
    let dir = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => {
            for i in 0..256 {
                std::fs::write(tmp.path().join(format!("{i:04}.jpg")), vec![i as u8; 4096 + 397 * i])?;
            }
            tmp.path().to_path_buf()
        }
    };
    let batch_size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);

    // Keys and sizes first: the buffer pool is sized to the largest file, then given to the tier
    // that reads (registered once as fixed buffers).
    let files = UringTier::new(&dir, UringConfig::default())?.list("").await?;
    let largest = files.iter().map(|f| f.size).max().ok_or("no files to read")?;
    if largest > 64 << 20 {
        return Err(format!("a file of {largest} bytes: read large files with UringTier::open_file").into());
    }
    let pool = BufferPool::new(PoolConfig::default().with_buf_size(largest as usize).with_count(batch_size))?;
    let options = UringTierOptions::default().with_pool(pool.clone());
    let tier = UringTier::with_options(&dir, UringConfig::default(), options)?;

    let start = Instant::now();
    let (mut bytes, mut errors) = (0u64, 0usize);
    let mut batch = ReadBatch::with_capacity(batch_size, batch_size * 32);
    for chunk in files.chunks(batch_size) {
        for f in chunk {
            batch.push(&f.key, 0, f.size as usize, pool.acquire().await);
        }
        batch = tier.read_batch(batch).await; // handed back, with each request's result and buffer
        for (key, _offset, result, _buf) in batch.drain() {
            match result {
                Ok(n) => bytes += n as u64,
                Err(e) => {
                    errors += 1;
                    eprintln!("{key}: {e}");
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read {} files, {bytes} bytes from {} ({}) in {secs:.3} s, {errors} errors",
        files.len(),
        dir.display(),
        tier.filesystem()
    );
    println!("{:?}", tier.stats());
    Ok(())
}
