//! Multipart uploads: start, complete, abort, and the check of what was stored.
//!
//! Every upload this tier starts is recorded twice: in a process-wide set of live upload ids
//! (so recovery never aborts what this process is still writing) and in a marker object
//! `PREFIX/.ringtier-uploads/HEX(UPLOAD_ID)` holding the object path and the upload id,
//! written right after the upload is created and deleted once it is completed or aborted.
//! [`S3Tier::recover_uploads`](crate::S3Tier::recover_uploads) (`recovery.rs`) aborts the
//! uploads of markers not live here. Uploads with CRC-32C checksums are created, sent and
//! completed by `checksummed.rs`; the others by object_store.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::checksummed::{complete_checked, composite_crc32c, create_checked};
use crate::tier::Inner;

/// Marker directory (a reserved key component: never listed as an object).
pub(crate) const MARKER_DIR: &str = ".ringtier-uploads";

fn live_set() -> &'static Mutex<HashSet<String>> {
    static LIVE: std::sync::OnceLock<Mutex<HashSet<String>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Whether upload `id` is one this process is writing (recovery leaves it alone).
pub(crate) fn is_live(id: &str) -> bool {
    live_set().lock().unwrap_or_else(|p| p.into_inner()).contains(id)
}

/// Marks upload `id` as one this process is writing (`true`), or no longer (`false`).
pub(crate) fn set_live(id: &str, live: bool) {
    let mut set = live_set().lock().unwrap_or_else(|p| p.into_inner());
    if live {
        set.insert(id.to_string());
    } else {
        set.remove(id);
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A multipart upload this process is writing.
#[derive(Debug)]
pub(crate) struct LiveUpload {
    id: String,
    marker: Path,
}

impl LiveUpload {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Forgets the upload: deletes its marker, drops it from the live set.
    pub(crate) async fn finish(self, inner: &Arc<Inner>) {
        let store = Arc::clone(&inner.store);
        let marker = self.marker.clone();
        let _ = inner
            .spawn(async move {
                if let Err(e) = store.delete(&marker).await {
                    tracing::warn!(%marker, error = %e, "s3: cannot delete an upload marker (recovery will)");
                }
            })
            .await;
        set_live(&self.id, false);
    }
}

fn marker_path(inner: &Inner, id: &str) -> Result<Path> {
    Path::parse(format!("{}{MARKER_DIR}/{}", inner.root, hex(id)))
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("marker path: {e}")))
}

/// Creates the multipart upload of `path` and its marker; `checked`: an upload whose parts
/// carry CRC-32C checksums ([`create_checked`]).
pub(crate) async fn start(inner: &Arc<Inner>, path: &Path, key: &str, checked: bool) -> Result<LiveUpload> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let id = if checked {
                me.retry.run(|| create_checked(&me, &path, &key)).await?
            } else {
                me.retry
                    .run(|| async {
                        me.store.create_multipart(&path).await.map_err(|e| me.err(e, Operation::Write, &key))
                    })
                    .await?
            };
            set_live(&id, true);
            let marker = marker_path(&me, &id)?;
            let body = format!("{path}\n{id}\n");
            let wrote = me
                .retry
                .run(|| async {
                    me.store
                        .put(&marker, PutPayload::from(body.clone().into_bytes()))
                        .await
                        .map_err(|e| me.err(e, Operation::Write, &key))
                })
                .await;
            let live = LiveUpload { id, marker };
            match wrote {
                Ok(_) => Ok(live),
                Err(e) => {
                    let _ = abort(&me, &path, &key, live).await;
                    Err(e)
                }
            }
        })
        .await?
}

/// Completes the upload with `parts` (in order; with `crcs`, the parts' CRC-32Cs, an upload
/// from [`create_checked`], completed by [`complete_checked`]). A retried completion that the
/// server says is gone (the first attempt did complete) is accepted when the object has
/// `size` bytes.
pub(crate) async fn complete(
    inner: &Arc<Inner>,
    path: &Path,
    key: &str,
    live: &LiveUpload,
    parts: Vec<PartId>,
    crcs: Option<Vec<u32>>,
    size: u64,
) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key, id) = (path.clone(), key.to_string(), live.id.clone());
    inner
        .spawn(async move {
            let mut retried = false;
            // The object's checksum, where the server answers with one.
            let reported: Mutex<Option<String>> = Mutex::new(None);
            me.retry
                .run(|| {
                    let first = !retried;
                    retried = true;
                    let (me, path, key, id, parts, crcs, reported) =
                        (&me, &path, &key, &id, parts.clone(), &crcs, &reported);
                    async move {
                        let res = match crcs {
                            Some(crcs) => {
                                let named: Vec<(String, u32)> =
                                    parts.into_iter().map(|p| p.content_id).zip(crcs.iter().copied()).collect();
                                complete_checked(me, path, id, &named, key)
                                    .await
                                    .map(|r| *reported.lock().unwrap_or_else(|p| p.into_inner()) = r)
                            }
                            None => me
                                .store
                                .complete_multipart(path, id, parts)
                                .await
                                .map(|_| ())
                                .map_err(|e| me.err(e, Operation::Commit, key)),
                        };
                        match res {
                            Ok(()) => Ok(()),
                            Err(e) => {
                                if !first && e.kind() == ErrorKind::NotFound {
                                    if let Ok(m) = me.store.head(path).await {
                                        if m.size == size {
                                            return Ok(());
                                        }
                                    }
                                }
                                Err(e)
                            }
                        }
                    }
                })
                .await?;
            // The server's checksum of the object (AWS: from the part checksums it checked;
            // moto: from the bytes it stored) must be ours; if not, the object goes.
            let reported = reported.into_inner().unwrap_or_else(|p| p.into_inner());
            if let (Some(reported), Some(crcs)) = (reported, &crcs) {
                let ours = composite_crc32c(crcs);
                if reported != ours {
                    let _ = me.store.delete(&path).await;
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "s3://{}/{path}: the server reports the object's checksum {reported}, not {ours} (the CRC-32C of the parts' CRC-32Cs); deleted",
                            me.cfg.bucket
                        ),
                    )
                    .set_temporary(true)
                    .context(Operation::Commit, &key, &me.cfg.name));
                }
            }
            Ok(())
        })
        .await?
}

/// Aborts the upload (a missing one counts as aborted) and forgets it.
pub(crate) async fn abort(inner: &Arc<Inner>, path: &Path, key: &str, live: LiveUpload) -> Result<()> {
    let me = Arc::clone(inner);
    let (p, k, id) = (path.clone(), key.to_string(), live.id.clone());
    let res = inner
        .spawn(async move {
            me.retry
                .run(|| async {
                    match me.store.abort_multipart(&p, &id).await {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            let e = me.err(e, Operation::Abort, &k);
                            if e.kind() == ErrorKind::NotFound {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        }
                    }
                })
                .await
        })
        .await
        .and_then(|r| r);
    if res.is_ok() {
        live.finish(inner).await;
    } else {
        // Keep the marker: the next recovery aborts it.
        set_live(&live.id, false);
    }
    res
}

/// Checks that the object at `path` has `size` bytes (HEAD); on a mismatch deletes it and
/// fails with a temporary `Corrupt` error.
pub(crate) async fn check_size(inner: &Arc<Inner>, path: &Path, key: &str, size: u64) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let stored = me
                .retry
                .run(|| async { me.store.head(&path).await.map_err(|e| me.err(e, Operation::Commit, &key)) })
                .await?;
            if stored.size == size {
                return Ok(());
            }
            let _ = me.store.delete(&path).await;
            Err(Error::new(
                ErrorKind::Corrupt,
                format!("s3://{}/{path} holds {} bytes, not the {size} written; deleted", me.cfg.bucket, stored.size),
            )
            .set_temporary(true)
            .context(Operation::Commit, &key, &me.cfg.name))
        })
        .await?
}

/// Reads the object at `path` back (ranges of a part, several at once, in order) and checks
/// its size and CRC-32C; on a mismatch deletes it and fails with a temporary `Corrupt` error.
pub(crate) async fn verify(inner: &Arc<Inner>, path: &Path, key: &str, size: u64, crc: u32) -> Result<()> {
    let me = Arc::clone(inner);
    let (path, key) = (path.clone(), key.to_string());
    inner
        .spawn(async move {
            let step = me.cfg.part_size as u64;
            let ranges: Vec<_> = (0..size.div_ceil(step)).map(|i| i * step..((i + 1) * step).min(size)).collect();
            let stored = me.retry.run(|| async { me.store.head(&path).await.map_err(|e| me.err(e, Operation::Commit, &key)) }).await?;
            let (mut got, mut read) = (0u32, 0u64);
            if stored.size == size {
                let mut reads = futures::stream::iter(ranges)
                    .map(|r| {
                        let (me, path, key) = (&me, &path, &key);
                        async move {
                            // The body is checked chunk by chunk as it arrives, never gathered
                            // into one buffer (a fresh part-sized allocation per range cost more
                            // CPU in page faults than the CRC).
                            me.retry
                                .run(|| async {
                                    let opts = GetOptions::new().with_range(Some(GetRange::Bounded(r.clone())));
                                    let res = me.store.get_opts(path, opts).await;
                                    let mut body = res.map_err(|e| me.err(e, Operation::Commit, key))?.into_stream();
                                    let (mut crc, mut len) = (0u32, 0u64);
                                    while let Some(chunk) = body.next().await {
                                        let chunk = chunk.map_err(|e| me.err(e, Operation::Commit, key))?;
                                        crc = crc32c::crc32c_append(crc, &chunk);
                                        len += chunk.len() as u64;
                                    }
                                    Ok((crc, len))
                                })
                                .await
                        }
                    })
                    .buffered(me.cfg.upload_concurrency);
                while let Some(range) = reads.next().await {
                    let (range_crc, len) = range?;
                    got = crc32c::crc32c_combine(got, range_crc, usize::try_from(len).unwrap_or(usize::MAX));
                    read += len;
                }
            }
            if stored.size == size && read == size && got == crc {
                return Ok(());
            }
            let _ = me.store.delete(&path).await;
            Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "s3://{}/{path} does not hold what was written (the server lists {} bytes, read back {read} bytes, crc32c {got:08x}; wrote {size} bytes, crc32c {crc:08x}); deleted",
                    me.cfg.bucket, stored.size
                ),
            )
            .set_temporary(true)
            .context(Operation::Commit, &key, &me.cfg.name))
        })
        .await?
}

/// Forgets every live upload of this process, as its death would (tests of recovery).
#[cfg(feature = "test-hooks")]
pub(crate) fn forget_live_uploads() {
    live_set().lock().unwrap_or_else(|p| p.into_inner()).clear();
}
