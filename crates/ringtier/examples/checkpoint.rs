//! Saves checkpoints through a burst buffer: durable on the fast tier when `save` returns,
//! drained to the slow tier in the background; then lists them and restores the latest.
//!
//! ```text
//! cargo run -p ringtier --example checkpoint       # temp dirs; the slow tier throttled to 50 MB/s
//! cargo run --release -p ringtier --example checkpoint -- FAST_DIR SLOW_DIR [MB]
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use ringtier::layers::{Throttle, Throttled};
use ringtier::{CheckpointStore, Part, PosixConfig, PosixTier, StoreConfig, Tier, UringConfig, UringTier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tmp = tempfile::tempdir()?;
    let (fast_dir, slow_dir, emulated) = match &args[..] {
        [fast, slow, ..] => (PathBuf::from(fast), PathBuf::from(slow), false),
        _ => (tmp.path().join("fast"), tmp.path().join("slow"), true),
    };
    let mb: usize = args.get(2).map(|a| a.parse()).transpose()?.unwrap_or(16);
    std::fs::create_dir_all(&fast_dir)?;
    std::fs::create_dir_all(&slow_dir)?;

    let fast: Arc<dyn Tier> = Arc::new(UringTier::new(&fast_dir, UringConfig::default())?);
    let mut slow: Arc<dyn Tier> = Arc::new(PosixTier::new(PosixConfig::new(&slow_dir))?);
    if emulated {
        // Both temp dirs sit on one disk: a token bucket makes the second one slow.
        slow = Arc::new(Throttled::new(slow, Throttle::bandwidth(50_000_000)));
    }
    let config = StoreConfig::default().with_keep_last(1);
    let store = CheckpointStore::open(vec![fast, slow], config).await?;

    let first = store.latest().await?.map_or(1, |s| s + 1);
    let mut model = vec![0u8; mb << 20];
    let r = store.save_direct(first, vec![Part::bytes("model", &model)]).await?;
    println!("save step {first} straight to {}: {:.3} s (the baseline)", r.tier, r.blocking.as_secs_f64());
    for step in first + 1..first + 4 {
        model.fill(step as u8);
        let r = store.save(step, vec![Part::bytes("model", &model), Part::bytes("step", &step.to_le_bytes())]).await?;
        println!("save step {step}: {} bytes on {} in {:.3} s", r.bytes, r.tier, r.blocking.as_secs_f64());
    }
    store.drain().await?;
    println!("drained {} bytes", store.drain_stats().bytes);
    for c in store.list().await? {
        println!("step {}: {} bytes on {:?}", c.step, c.bytes, c.tiers);
    }
    let restored = store.load_latest().await?.ok_or("no checkpoint")?;
    println!(
        "restored step {} from {} ({} parts, checksums verified)",
        restored.step,
        restored.tier,
        restored.parts.len()
    );
    // Large checkpoints go straight into memory the caller holds (a model's tensors, a pinned
    // pool's slices), streamed with reads in flight and in bounded memory; one rank reads only
    // a byte range of a part (its shard).
    let last = restored.step;
    let r = store.load_into(last, vec![("model".to_string(), model.as_mut_slice())]).await?;
    println!("loaded part model of step {last} into the model's buffer: {} bytes in {:.3} s", r.bytes, r.seconds);
    let mut shard = vec![0u8; 4096];
    store.read_part_range(last, "model", 8192, &mut shard).await?;
    assert!(shard.iter().all(|&b| b == last as u8), "the shard's bytes");
    println!("read bytes 8192..12288 of part model alone");
    Ok(())
}
