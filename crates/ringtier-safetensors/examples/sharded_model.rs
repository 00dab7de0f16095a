//! Save a model as sharded safetensors through the engine, then load it back: the shards' data
//! read at depth (io_uring O_DIRECT where the kernel allows, the thread pool where not), each
//! file into one page-aligned buffer; the bytes checked against what was saved.
//!
//! `cargo run -p ringtier-safetensors --example sharded_model` (makes its data in a temp dir).

use std::sync::Arc;
use std::time::Instant;

use ringtier_safetensors::{save_sharded, Dtype, Model, ReadOptions, SaveOptions, TensorRef, INDEX_FILE};
use ringtier_uring::{open_dir_tier, DirTierOptions};

/// Deterministic bytes for tensor `seed`.
fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(167).wrapping_add(seed)).collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ringtier_core::Result<()> {
    let dir = tempfile::tempdir().map_err(ringtier_core::Error::from)?;
    let opened = open_dir_tier(dir.path(), DirTierOptions::default().with_create(true))?;
    println!("tier: {} ({})", dir.path().display(), opened.engine.describe());
    let tier = opened.tier;

    // A small transformer-shaped model: bf16 weights, fp32 norms, 8 layers.
    let mut owned: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    owned.push(("embed.weight".into(), Dtype::BF16, vec![4096, 256], bytes(4096 * 256 * 2, 1)));
    for l in 0..8u8 {
        for (part, rows) in [("attn.qkv", 768u64), ("mlp.up", 1024)] {
            let n = (rows * 256 * 2) as usize;
            owned.push((format!("layers.{l}.{part}.weight"), Dtype::BF16, vec![rows, 256], bytes(n, l + 2)));
        }
        owned.push((format!("layers.{l}.norm.weight"), Dtype::F32, vec![256], bytes(1024, l + 100)));
    }
    let tensors: Vec<TensorRef<'_>> =
        owned.iter().map(|(name, dtype, shape, data)| TensorRef { name, dtype: *dtype, shape, data }).collect();

    let t = Instant::now();
    let saved = save_sharded(tier.as_ref(), "", "model", &tensors, None, 3 << 20, &SaveOptions::default()).await?;
    println!(
        "saved {} tensors, {} bytes, in {} shards + {} ({:.1} ms, durable)",
        tensors.len(),
        saved.total_size,
        saved.files.len(),
        saved.index.as_deref().unwrap_or("no index"),
        t.elapsed().as_secs_f64() * 1e3
    );

    let t = Instant::now();
    let model = Model::open(Arc::clone(&tier), INDEX_FILE).await?;
    let opts = ReadOptions::default();
    let mut checked = 0;
    for f in &model.files {
        let data = f.read_all(&opts).await?;
        for info in f.header().tensors() {
            let got = &data.as_slice()[info.data_offsets.0 as usize..info.data_offsets.1 as usize];
            let want = &owned.iter().find(|o| o.0 == info.name).expect("a tensor we saved").3;
            assert_eq!(got, &want[..], "{}", info.name);
            checked += 1;
        }
    }
    println!(
        "loaded {} tensors ({} bytes) from {} files in {:.1} ms: every byte as saved",
        checked,
        model.data_len(),
        model.files.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(checked, tensors.len());
    Ok(())
}
