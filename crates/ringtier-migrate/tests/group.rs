//! The group commit: every rank's shard committed before the coordinator's manifest, a load
//! checked against it.

use std::sync::Arc;

use ringtier_core::{ErrorKind, MemoryTier, Tier};
use ringtier_migrate::group::{
    GroupCommit, GroupManifest, RankReport, RankShard, GROUP_PART, MAX_GROUP_MANIFEST_BYTES,
};
use ringtier_migrate::{CheckpointStore, Part, StoreConfig};

async fn store(tier: &Arc<dyn Tier>, prefix: &str) -> CheckpointStore {
    let cfg = StoreConfig::default().with_prefix(prefix.to_string()).with_keep_last(8);
    CheckpointStore::open(vec![tier.clone()], cfg).await.expect("open")
}

async fn shard(s: &CheckpointStore, rank: u32, step: u64, fill: u8) -> RankShard {
    let data = vec![fill; 100 + rank as usize];
    s.save(step, vec![Part::bytes("state", &data)]).await.expect("save shard");
    RankShard::committed(s, rank, step, data.len() as u64, None).await.expect("committed")
}

struct World {
    _tier: Arc<dyn Tier>,
    coord: CheckpointStore,
    ranks: Vec<CheckpointStore>,
}

async fn world(n: u32) -> World {
    let tier: Arc<dyn Tier> = Arc::new(MemoryTier::new().named("fast"));
    let coord = store(&tier, "ckpt/global").await;
    let mut ranks = Vec::new();
    for r in 0..n {
        ranks.push(store(&tier, &format!("ckpt/rank{r:05}")).await);
    }
    World { _tier: tier, coord, ranks }
}

#[tokio::test]
async fn committed_step_checks_and_every_shard_verifies() {
    let w = world(3).await;
    let mut reports = Vec::new();
    for (r, s) in (0u32..).zip(&w.ranks) {
        reports.push(RankReport::Durable(shard(s, r, 5, 7).await));
    }
    let g = GroupCommit::new(&w.coord);
    let m = g.commit(5, reports, vec![Part::bytes("metadata", b"extra")]).await.expect("commit");
    assert_eq!((m.step(), m.world_size(), m.ranks().len()), (5, 3, 3));
    assert_eq!(w.coord.read_part(5, "metadata").await.expect("extra part"), b"extra");
    let back = g.check(5, Some(3)).await.expect("check");
    assert_eq!(back, m);
    assert_eq!(back.ranks()[2].bytes(), 102);
    let stores: Vec<Option<&CheckpointStore>> = w.ranks.iter().map(Some).collect();
    assert!(back.missing(&stores).await.expect("missing").is_empty());
    for (r, s) in (0u32..).zip(&w.ranks) {
        back.verify_shard(r, s).await.expect("shard verifies");
    }
    // A report survives its trip to the coordinator.
    let rep = back.ranks()[1].to_bytes();
    assert_eq!(RankShard::parse_report(&rep).expect("parse"), back.ranks()[1]);
}

#[tokio::test]
async fn a_failed_rank_means_no_manifest() {
    let w = world(2).await;
    let r0 = shard(&w.ranks[0], 0, 1, 1).await;
    let reports = vec![RankReport::Durable(r0), RankReport::Failed { rank: 1, error: "disk full".into() }];
    let e = GroupCommit::new(&w.coord).commit(1, reports, vec![]).await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("rank(s) failed: [(1, \"disk full\")]"), "{e}");
    assert!(w.coord.list().await.expect("list").is_empty(), "nothing written");
    let e = GroupCommit::new(&w.coord).check(1, None).await.expect_err("not committed");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("is not committed"), "{e}");
}

#[tokio::test]
async fn no_report_without_a_committed_shard() {
    // The only way to a report with a digest is a committed shard: a manifest written before a
    // shard is visible cannot be built.
    let w = world(2).await;
    let e = RankShard::committed(&w.ranks[1], 1, 4, 10, None).await.expect_err("not committed");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    // A forged report (no digest) is refused on arrival.
    let e = RankShard::parse_report(br#"{"rank": 1, "bytes": 10}"#).expect_err("no digest");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let e = RankShard::parse_report(&vec![b' '; 8192]).expect_err("oversized");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    // Reports out of order are refused.
    let r0 = shard(&w.ranks[0], 0, 4, 1).await;
    let r1 = shard(&w.ranks[1], 1, 4, 1).await;
    let e = GroupCommit::new(&w.coord)
        .commit(4, vec![RankReport::Durable(r1), RankReport::Durable(r0)], vec![])
        .await
        .expect_err("out of order");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(w.coord.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_missing_rank_and_a_replaced_shard_are_found_on_load() {
    let w = world(2).await;
    let reports = vec![
        RankReport::Durable(shard(&w.ranks[0], 0, 2, 1).await),
        RankReport::Durable(shard(&w.ranks[1], 1, 2, 1).await),
    ];
    let g = GroupCommit::new(&w.coord);
    g.commit(2, reports, vec![]).await.expect("commit");
    w.ranks[1].delete(2).await.expect("delete rank 1's shard");
    let m = g.check(2, Some(2)).await.expect("manifest still there");
    let stores = [Some(&w.ranks[0]), Some(&w.ranks[1])];
    assert_eq!(m.missing(&stores).await.expect("missing"), vec![1]);
    assert_eq!(m.missing(&[Some(&w.ranks[0]), None]).await.expect("missing"), vec![1]);
    let e = m.verify_shard(1, &w.ranks[1]).await.expect_err("missing");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    // Another shard saved under the same step is not the committed one.
    w.ranks[1].save(2, vec![Part::bytes("state", b"other")]).await.expect("save");
    let e = m.verify_shard(1, &w.ranks[1]).await.expect_err("differs");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
}

#[tokio::test]
async fn a_wrong_world_size_is_refused() {
    let w = world(2).await;
    let reports = vec![
        RankReport::Durable(shard(&w.ranks[0], 0, 3, 1).await),
        RankReport::Durable(shard(&w.ranks[1], 1, 3, 1).await),
    ];
    let g = GroupCommit::new(&w.coord);
    g.commit(3, reports, vec![]).await.expect("commit");
    let e = g.check(3, Some(1)).await.expect_err("world size");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("saved by 2 ranks; this job has 1"), "{e}");
    assert!(g.check(3, None).await.is_ok());
}

#[tokio::test]
async fn a_corrupt_or_oversized_manifest_is_corrupt() {
    let w = world(1).await;
    let g = GroupCommit::new(&w.coord);
    let bad: [&[u8]; 7] = [
        b"not json",
        br#"{"format": "other", "version": 1, "step": 1, "world_size": 1, "ranks": [{"rank": 0, "bytes": 1}]}"#,
        br#"{"format": "ringtier-group", "version": 9, "step": 1, "world_size": 1, "ranks": [{"rank": 0, "bytes": 1}]}"#,
        br#"{"format": "ringtier-group", "version": 1, "step": 2, "world_size": 1, "ranks": [{"rank": 0, "bytes": 1}]}"#,
        br#"{"format": "ringtier-group", "version": 1, "step": 1, "world_size": 2, "ranks": [{"rank": 0, "bytes": 1}]}"#,
        br#"{"format": "ringtier-group", "version": 1, "step": 1, "world_size": 1, "ranks": [{"rank": 3, "bytes": 1}]}"#,
        br#"{"format": "ringtier-group", "version": 1, "step": 1, "world_size": 4294967295, "ranks": []}"#,
    ];
    for (i, doc) in bad.iter().enumerate() {
        assert_eq!(GroupManifest::parse(doc, 1).expect_err("bad").kind(), ErrorKind::Corrupt, "case {i}");
    }
    let big = vec![b' '; MAX_GROUP_MANIFEST_BYTES as usize + 1];
    assert_eq!(GroupManifest::parse(&big, 1).expect_err("big").kind(), ErrorKind::Corrupt);
    // Through the store: a step of the coordinator's holding a torn manifest, and one without.
    w.coord.save(1, vec![Part::bytes(GROUP_PART, b"{\"format\": \"ringtier-gr")]).await.expect("save");
    assert_eq!(g.check(1, None).await.expect_err("torn").kind(), ErrorKind::Corrupt);
    w.coord.save(2, vec![Part::bytes("other", b"x")]).await.expect("save");
    assert_eq!(g.check(2, None).await.expect_err("no manifest part").kind(), ErrorKind::Corrupt);
    // An oversized one is refused from its size, unread.
    let huge = vec![b' '; MAX_GROUP_MANIFEST_BYTES as usize + 1];
    w.coord.save(3, vec![Part::bytes(GROUP_PART, &huge)]).await.expect("save");
    let e = g.check(3, None).await.expect_err("oversized");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("more than one can hold"), "{e}");
    // The DCP writer's earlier world.json (no digests) still reads.
    let legacy = br#"{"format": "ringtier-dcp", "version": 1, "step": 4, "prefix": "dcp", "world_size": 1, "ranks": [{"rank": 0, "bytes": 16, "items": 1}]}"#;
    let m = GroupManifest::parse(legacy, 4).expect("legacy");
    assert_eq!((m.world_size(), m.ranks()[0].items(), m.ranks()[0].digest()), (1, Some(1), None));
}
