//! The group commit: one checkpoint step saved by many ranks, each into its own store, made
//! visible at once by a group manifest the coordinator writes last.
//!
//! The protocol (the "metadata last" rule of `torch.distributed.checkpoint`):
//!
//! 1. Each rank saves its shard of step `S` into its own [`CheckpointStore`] and proves it
//!    visible with [`RankShard::committed`], which reads the shard's committed manifest back
//!    and records a digest of its parts (names, sizes, checksums). A shard that is not
//!    committed has no `RankShard`.
//! 2. The ranks' reports reach the coordinator (a collective outside this crate).
//!    [`GroupCommit::commit`] refuses the step when any rank failed or reported no committed
//!    shard, and otherwise saves the [`GroupManifest`] (world size, every rank's bytes and
//!    digest) as part [`GROUP_PART`] of the coordinator's own store, through the store's
//!    durable protocol (data, fsync, manifest, rename, directory fsync): the step is committed
//!    once that store holds it.
//! 3. A load calls [`GroupCommit::check`] (the manifest exists and parses, bounded; the world
//!    size matches when one is given) and then [`GroupManifest::verify_shard`] or
//!    [`GroupManifest::missing`] for the shards it reads: each must be committed on a tier the
//!    loader sees, and match the manifest's digest. A step whose manifest reached a tier
//!    before a rank's shard did (the stores drain on their own) is thus refused, never read
//!    half.
//!
//! The manifest is hostile input: at most [`MAX_GROUP_MANIFEST_BYTES`], a world of at most
//! [`MAX_WORLD_SIZE`] ranks, each named once and in order; anything else is `Corrupt`.

use std::fmt::Write as _;

use ringtier_core::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::{CheckpointManifest, CheckpointStore, Part};

/// The group manifest's format name.
pub const GROUP_FORMAT: &str = "ringtier-group";
/// The format name of the DCP writer's `world.json` before the group commit; the same fields,
/// still read.
pub const LEGACY_DCP_FORMAT: &str = "ringtier-dcp";
/// The group manifest version written and read.
pub const GROUP_VERSION: u32 = 1;
/// The part of the coordinator's step holding the group manifest.
pub const GROUP_PART: &str = "world.json";
/// The largest group manifest read (about 100,000 ranks); a larger part is refused unread.
pub const MAX_GROUP_MANIFEST_BYTES: u64 = 16 << 20;
/// The most ranks a group manifest may name.
pub const MAX_WORLD_SIZE: u32 = 1 << 20;
/// The largest rank report parsed (one rank's JSON line).
const MAX_REPORT_BYTES: usize = 4096;

/// One rank's shard of a step, as its own store committed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankShard {
    rank: u32,
    bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    items: Option<u64>,
    /// The digest of the shard's committed manifest; absent only in manifests written before
    /// the group commit (then only the shard's being committed is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<u32>,
}

/// The digest of a shard: CRC-32C over its parts' names, sizes and checksums, in save order.
pub fn shard_digest(m: &CheckpointManifest) -> u32 {
    let mut crc = crc32c::crc32c(&m.step.to_le_bytes());
    for p in &m.parts {
        crc = crc32c::crc32c_append(crc, p.name.as_bytes());
        crc = crc32c::crc32c_append(crc, &[0]);
        crc = crc32c::crc32c_append(crc, &p.size.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &p.crc32c.to_le_bytes());
    }
    crc
}

impl RankShard {
    /// Proves rank `rank`'s shard of `step` committed in `store` (its manifest read back) and
    /// records it with the caller's count of `bytes` (and `items`). `NotFound` when the shard
    /// is not committed: no report, so no group manifest, without it.
    pub async fn committed(
        store: &CheckpointStore,
        rank: u32,
        step: u64,
        bytes: u64,
        items: Option<u64>,
    ) -> Result<RankShard> {
        let m = store.committed_manifest(step).await.map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                Error::new(ErrorKind::NotFound, format!("checkpoint {step}: rank {rank}'s shard is not committed"))
            } else {
                e
            }
        })?;
        Ok(RankShard { rank, bytes, items, digest: Some(shard_digest(&m)) })
    }

    /// The rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The bytes the rank reported.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The items the rank reported, where it counts them.
    pub fn items(&self) -> Option<u64> {
        self.items
    }

    /// The shard's digest ([`shard_digest`]), absent in legacy manifests.
    pub fn digest(&self) -> Option<u32> {
        self.digest
    }

    /// The report as sent to the coordinator (one JSON object).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A report received from a rank: bounded and parsed; it must carry a digest.
    pub fn parse_report(bytes: &[u8]) -> Result<RankShard> {
        let bad = |why: String| Error::new(ErrorKind::InvalidInput, format!("a rank's shard report: {why}"));
        if bytes.len() > MAX_REPORT_BYTES {
            return Err(bad(format!("{} bytes, more than a report can hold ({MAX_REPORT_BYTES})", bytes.len())));
        }
        let r: RankShard = serde_json::from_slice(bytes).map_err(|e| bad(format!("not a report: {e}")))?;
        if r.digest.is_none() {
            return Err(bad(format!("rank {} reported no committed shard (no digest)", r.rank)));
        }
        Ok(r)
    }
}

/// What a rank reports to the coordinator after saving its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankReport {
    /// The shard is committed in the rank's store.
    Durable(RankShard),
    /// The rank's save failed, with its error.
    Failed {
        /// The rank.
        rank: u32,
        /// What went wrong there.
        error: String,
    },
}

/// A committed step's group manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupManifest {
    format: String,
    version: u32,
    step: u64,
    world_size: u32,
    ranks: Vec<RankShard>,
}

impl GroupManifest {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The number of ranks that saved it.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Every rank's shard, by rank.
    pub fn ranks(&self) -> &[RankShard] {
        &self.ranks
    }

    /// The manifest's bytes (pretty JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parses and checks a group manifest read for `step` (hostile input: bounded; every
    /// failure is `Corrupt`).
    pub fn parse(bytes: &[u8], step: u64) -> Result<GroupManifest> {
        let corrupt = |why: String| Error::new(ErrorKind::Corrupt, format!("checkpoint {step}: group manifest {why}"));
        if bytes.len() as u64 > MAX_GROUP_MANIFEST_BYTES {
            return Err(corrupt(format!(
                "of {} bytes, more than one can hold ({MAX_GROUP_MANIFEST_BYTES})",
                bytes.len()
            )));
        }
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("is not JSON: {e}")))?;
        let format = v.get("format").and_then(|f| f.as_str());
        if format != Some(GROUP_FORMAT) && format != Some(LEGACY_DCP_FORMAT) {
            return Err(corrupt(format!("is not a {GROUP_FORMAT} document")));
        }
        match v.get("version").and_then(|x| x.as_u64()) {
            Some(1) => {}
            other => return Err(corrupt(format!("has version {other:?}; this build reads {GROUP_VERSION}"))),
        }
        let m: GroupManifest = serde_json::from_value(v).map_err(|e| corrupt(format!("has bad fields: {e}")))?;
        if m.step != step {
            return Err(corrupt(format!("says step {}", m.step)));
        }
        if m.world_size == 0 || m.world_size > MAX_WORLD_SIZE {
            return Err(corrupt(format!("names a world of {} ranks (1 to {MAX_WORLD_SIZE})", m.world_size)));
        }
        if m.ranks.len() != m.world_size as usize {
            return Err(corrupt(format!("names {} ranks for a world of {}", m.ranks.len(), m.world_size)));
        }
        if let Some((i, r)) = m.ranks.iter().enumerate().find(|(i, r)| r.rank as usize != *i) {
            return Err(corrupt(format!("names a bad rank {} at position {i}", r.rank)));
        }
        Ok(m)
    }

    /// The entry of `rank`.
    fn entry(&self, rank: u32) -> Result<&RankShard> {
        self.ranks.get(rank as usize).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("checkpoint {} was saved by {} ranks: there is no rank {rank}", self.step, self.world_size),
            )
        })
    }

    /// Checks that `rank`'s shard is committed in `store` (on a tier it sees) and is the one
    /// the manifest names: `NotFound` when it is not committed, `Corrupt` when it differs.
    pub async fn verify_shard(&self, rank: u32, store: &CheckpointStore) -> Result<()> {
        let want = self.entry(rank)?;
        let m = match store.committed_manifest(self.step).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "checkpoint {} is committed but rank {rank}'s shard is on no tier this process sees",
                        self.step
                    ),
                ))
            }
            Err(e) => return Err(e),
        };
        match want.digest {
            Some(d) if d != shard_digest(&m) => Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "checkpoint {}: rank {rank}'s shard is not the one its group manifest names (digest {:08x}, \
                     manifest {d:08x})",
                    self.step,
                    shard_digest(&m)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The ranks whose shard is not committed where this process looks: `shards[r]` is rank
    /// `r`'s store, `None` where none can be opened. A shard that is committed but differs
    /// from the manifest's is an error (`Corrupt`), not missing.
    pub async fn missing(&self, shards: &[Option<&CheckpointStore>]) -> Result<Vec<u32>> {
        if shards.len() != self.world_size as usize {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("checkpoint {} has {} ranks; {} stores given", self.step, self.world_size, shards.len()),
            ));
        }
        let mut missing = Vec::new();
        for (r, store) in (0u32..).zip(shards) {
            let Some(store) = store else {
                missing.push(r);
                continue;
            };
            match self.verify_shard(r, store).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => missing.push(r),
                Err(e) => return Err(e),
            }
        }
        Ok(missing)
    }
}

/// The coordinator's side of the group commit, over its own store.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommit<'a> {
    coordinator: &'a CheckpointStore,
}

impl<'a> GroupCommit<'a> {
    /// The group commit whose manifests live in `coordinator`.
    pub fn new(coordinator: &'a CheckpointStore) -> Self {
        GroupCommit { coordinator }
    }

    /// Commits `step` from every rank's report (`reports[r]` is rank `r`'s; the world size is
    /// their count): refuses (`InvalidInput`, nothing written) when any rank failed or
    /// reported no committed shard, or the reports are not ranks `0..n` in order; otherwise
    /// saves the group manifest, with the caller's `extra` parts (DCP's metadata) beside it,
    /// as `step` of the coordinator's store, durable when this returns.
    pub async fn commit(&self, step: u64, reports: Vec<RankReport>, extra: Vec<Part<'_>>) -> Result<GroupManifest> {
        let refuse =
            |why: String| Error::new(ErrorKind::InvalidInput, format!("checkpoint {step} not committed: {why}"));
        let n = u32::try_from(reports.len()).ok().filter(|n| (1..=MAX_WORLD_SIZE).contains(n));
        let Some(world_size) = n else {
            return Err(refuse(format!("{} reports (1 to {MAX_WORLD_SIZE} ranks)", reports.len())));
        };
        let mut failed = String::new();
        let mut ranks = Vec::with_capacity(reports.len());
        for (r, report) in (0u32..).zip(reports) {
            match report {
                RankReport::Failed { rank, error } => {
                    let sep = if failed.is_empty() { "" } else { ", " };
                    let _ = write!(failed, "{sep}({rank}, {error:?})");
                }
                RankReport::Durable(s) if s.rank != r => {
                    return Err(refuse(format!("report {r} is rank {}'s", s.rank)));
                }
                RankReport::Durable(s) if s.digest.is_none() => {
                    return Err(refuse(format!("rank {r} reported no committed shard")));
                }
                RankReport::Durable(s) => ranks.push(s),
            }
        }
        if !failed.is_empty() {
            return Err(refuse(format!("rank(s) failed: [{failed}]")));
        }
        let m = GroupManifest { format: GROUP_FORMAT.to_string(), version: GROUP_VERSION, step, world_size, ranks };
        let bytes = m.to_bytes();
        let mut parts = vec![Part::bytes(GROUP_PART, &bytes)];
        parts.extend(extra);
        self.coordinator.save(step, parts).await?;
        Ok(m)
    }

    /// The group manifest of committed `step`: `NotFound` when the coordinator's store holds
    /// no committed copy of it, `Corrupt` when its manifest is torn, oversized or malformed,
    /// `InvalidInput` when `world_size` is given and differs. The shards are checked by the
    /// caller ([`GroupManifest::verify_shard`], [`GroupManifest::missing`]) where it can see
    /// them.
    pub async fn check(&self, step: u64, world_size: Option<u32>) -> Result<GroupManifest> {
        let cm = match self.coordinator.committed_manifest(step).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "checkpoint {step} is not committed (no group manifest: not every rank's shard was durable)"
                    ),
                ))
            }
            Err(e) => return Err(e),
        };
        let Some(part) = cm.parts.iter().find(|p| p.name == GROUP_PART) else {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("checkpoint {step}: the coordinator's step holds no group manifest ({GROUP_PART})"),
            ));
        };
        if part.size > MAX_GROUP_MANIFEST_BYTES {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "checkpoint {step}: group manifest of {} bytes, more than one can hold ({MAX_GROUP_MANIFEST_BYTES})",
                    part.size
                ),
            ));
        }
        let bytes = self.coordinator.read_part(step, GROUP_PART).await?;
        let m = GroupManifest::parse(&bytes, step)?;
        if let Some(n) = world_size {
            if n != m.world_size {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "checkpoint {step} was saved by {} ranks; this job has {n}: loading it needs the same world \
                         size (resharding is not supported)",
                        m.world_size
                    ),
                ));
            }
        }
        Ok(m)
    }
}
