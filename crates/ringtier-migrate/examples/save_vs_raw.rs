//! Blocking time of `CheckpointStore::save` on one tier against the raw write of the same
//! bytes (O_DIRECT where the filesystem takes it, one 8 MiB write at a time, fsync), with the
//! uring tier's two buffered-write paths, interleaved.
//!
//! ```text
//! cargo run --release -p ringtier-migrate --example save_vs_raw -- /dev/shm/ringtier-save [MB] [REPEATS]
//! ```

use std::error::Error;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ringtier_core::{AlignedBuf, Tier};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};
use ringtier_uring::{BufferedWrites, UringConfig, UringTier, UringTierOptions};

fn raw_write(path: &Path, data: &[u8], buf: &mut AlignedBuf) -> Result<f64, Box<dyn Error>> {
    let start = Instant::now();
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(path)?;
    for piece in data.chunks(buf.capacity()) {
        let padded = piece.len().next_multiple_of(4096);
        buf.capacity_mut()[..piece.len()].copy_from_slice(piece);
        buf.capacity_mut()[piece.len()..padded].fill(0);
        buf.set_window(0, padded)?;
        f.write_all(buf.as_slice())?;
    }
    f.set_len(data.len() as u64)?;
    f.sync_all()?;
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(secs)
}

fn summary(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    println!("{name:<30} min {:.3}  median {:.3}  max {:.3}", v[0], v[v.len() / 2], v[v.len() - 1]);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: save_vs_raw DIR [MB] [REPEATS]")?);
    let mb: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(244);
    let repeats: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(9);
    std::fs::create_dir_all(&dir)?;
    let paths = [BufferedWrites::Threads, BufferedWrites::Ring];
    let mut stores = Vec::new();
    for bw in paths {
        let root = dir.join(bw.as_str());
        let _ = std::fs::remove_dir_all(&root);
        let options = UringTierOptions::default().with_create_root(true);
        let config = UringConfig::default().with_buffered_writes(bw);
        let tier: Arc<dyn Tier> = Arc::new(UringTier::with_options(&root, config, options)?);
        println!("{bw}: {} ({})", root.display(), ringtier_core::fs::fs_type_name(&root));
        stores.push((root, CheckpointStore::open(vec![tier], StoreConfig::default()).await?));
    }
    let mut data = vec![0u8; mb * 1_000_000];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    let mut buf = AlignedBuf::new(StoreConfig::default().chunk_bytes, 4096)?; // as the store allocates its own
    let (mut raw, mut saves, mut ratios) = (Vec::new(), vec![Vec::new(); 2], vec![Vec::new(); 2]);
    for step in 0..repeats as u64 {
        let r = raw_write(&dir.join("raw-write.bin"), &data, &mut buf)?;
        raw.push(r);
        for (i, (root, store)) in stores.iter().enumerate() {
            let t = Instant::now();
            store.save(step, vec![Part::bytes("model", &data)]).await?;
            let s = t.elapsed().as_secs_f64();
            std::fs::remove_dir_all(root.join(format!("ckpt/{step:020}")))?;
            saves[i].push(s);
            ratios[i].push(s / r);
        }
    }
    println!("{mb} MB, {repeats} interleaved repeats, seconds:");
    summary("raw write", raw);
    for (i, bw) in paths.iter().enumerate() {
        summary(&format!("save, buffered writes {bw}"), saves[i].clone());
        summary(&format!("  over raw ({bw})"), ratios[i].clone());
    }
    Ok(())
}
