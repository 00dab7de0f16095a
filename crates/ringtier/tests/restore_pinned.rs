//! A checkpoint restored straight into page-locked (pinned) host memory, where `ringtier-stage`
//! copies to a GPU from: the restore writes into a slice of a pinned pool's buffer, no
//! intermediate copy of the checkpoint in memory.

use std::sync::Arc;

use ringtier::checkpoint::{CheckpointStore, Part, StoreConfig};
use ringtier::stage::{PinnedPool, Target};
use ringtier::{MemoryTier, Tier};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_restores_into_a_pinned_buffer() {
    let fast: Arc<dyn Tier> = Arc::new(MemoryTier::new().named("fast"));
    let store = CheckpointStore::open(vec![fast], StoreConfig::default()).await.expect("open");
    let weights: Vec<u8> = (0..(3 << 20) + 123u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    store.save(5, vec![Part::bytes("weights", &weights)]).await.expect("save");

    // Page-locked where the memlock limit allows, plain host memory otherwise: the same code.
    let pinned = PinnedPool::new(4 << 20, 1, Target::Host).expect("pinned pool");
    let mut buf = pinned.pool().acquire().await;
    let dst = &mut buf.capacity_mut()[..weights.len()];
    let report = store.load_into(5, vec![("weights".to_string(), dst)]).await.expect("restore into pinned memory");
    assert_eq!(report.bytes, weights.len() as u64);
    assert!(buf.capacity_mut()[..weights.len()] == weights[..], "the part's bytes, in the pinned buffer");
}
