//! Recovery of the multipart uploads a killed process left under the tier's prefix: found
//! through the tier's upload markers (`uploads.rs`) and, where the server implements it,
//! `ListMultipartUploads` (AWS, moto, MinIO; not s3s-fs), which also catches a process
//! killed between creating an upload and writing its marker; every one not live in this
//! process is aborted, and only under the prefix.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::signed::encode;
use crate::tier::Inner;
use crate::uploads::{is_live, MARKER_DIR};
use crate::xml;

/// Most uploads one recovery lists (over all pages) before it gives up: a bound on what a
/// server's answers can make it hold.
const MAX_LISTED_UPLOADS: usize = 1_000_000;

/// What [`S3Tier::recover_uploads`](crate::S3Tier::recover_uploads) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UploadRecovery {
    /// Uploads aborted (found by marker or by listing).
    pub aborted: usize,
    /// Object keys whose uploads were aborted.
    pub keys: Vec<String>,
    /// Leftover uploads that could not be aborted (tried again by the next recovery).
    pub failed: usize,
    /// False where the server does not implement `ListMultipartUploads` (markers only).
    pub listed: bool,
}

/// Aborts every multipart upload under the tier's prefix that no writer of this process owns;
/// refused (`InvalidInput`) for a tier without a prefix, whose recovery would abort every
/// upload in the bucket, other tools' included.
pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<UploadRecovery> {
    if inner.root.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "refusing to recover multipart uploads in {}: the tier has no prefix, so recovery would abort every \
                 upload in the bucket, other tools' included; give the tier a prefix (s3://{}/PREFIX)",
                inner.cfg.url(),
                inner.cfg.bucket
            ),
        )
        .context(Operation::Open, "", &inner.cfg.name));
    }
    let me = Arc::clone(inner);
    inner
        .spawn(async move {
            let mut out = UploadRecovery::default();
            let mut seen = HashSet::new();
            // 1. Markers.
            let dir = Path::parse(format!("{}{MARKER_DIR}", me.root))
                .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("marker path: {e}")))?;
            let markers: Vec<_> = me
                .retry
                .run(|| async {
                    let mut s = me.store.list(Some(&dir));
                    let mut v = Vec::new();
                    while let Some(m) = s.next().await {
                        if v.len() == MAX_LISTED_UPLOADS {
                            return Err(Error::new(
                                ErrorKind::Io,
                                format!("more than {MAX_LISTED_UPLOADS} upload markers under {dir}"),
                            )
                            .context(Operation::Open, MARKER_DIR, &me.cfg.name));
                        }
                        v.push(m.map_err(|e| me.err(e, Operation::Open, MARKER_DIR))?.location);
                    }
                    Ok(v)
                })
                .await?;
            for marker in markers {
                let body = match me.store.get(&marker).await {
                    Ok(r) => {
                        let size = r.meta.size;
                        match xml::read_capped(r.into_stream(), Some(size), xml::MAX_MARKER_BYTES).await {
                            Ok(b) => Some(b),
                            Err(xml::ReadError::TooLong(_)) => None,
                            Err(e) => {
                                return Err(Error::new(ErrorKind::Io, format!("upload marker {marker}: {e}"))
                                    .set_temporary(true)
                                    .context(Operation::Open, marker.as_ref(), &me.cfg.name))
                            }
                        }
                    }
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(me.err(e, Operation::Open, marker.as_ref())),
                };
                // Only an upload under the tier's own prefix is ever aborted, whatever a
                // marker says.
                let parsed = body.as_deref().and_then(xml::parse_marker).filter(|(p, _)| p.starts_with(me.root.as_str()));
                let Some((p, id)) = parsed else {
                    tracing::warn!(%marker, "s3: unreadable upload marker (or one naming an upload outside the prefix), deleted");
                    let _ = me.store.delete(&marker).await;
                    continue;
                };
                let (p, id) = (p.as_str(), id.as_str());
                if is_live(id) {
                    continue;
                }
                let Ok(path) = Path::parse(p) else {
                    tracing::warn!(%marker, "s3: upload marker with a bad path, deleted");
                    let _ = me.store.delete(&marker).await;
                    continue;
                };
                if let Err(e) = abort_by_id(&me, &path, id).await {
                    // Kept: the next recovery tries again.
                    tracing::warn!(%marker, error = %e, "s3: cannot abort a leftover upload");
                    out.failed += 1;
                    continue;
                }
                let _ = me.store.delete(&marker).await;
                seen.insert(id.to_string());
                out.aborted += 1;
                out.keys.push(p.strip_prefix(me.root.as_str()).unwrap_or(p).to_string());
            }
            // 2. The server's own list, where it has one.
            if let Some(listed) = list_multipart_uploads(&me).await? {
                out.listed = true;
                for (key, id) in listed {
                    if seen.contains(&id) || is_live(&id) || !key.starts_with(me.root.as_str()) {
                        continue;
                    }
                    let path = Path::parse(&key).map_err(|e| Error::new(ErrorKind::Corrupt, format!("upload {key}: {e}")))?;
                    if let Err(e) = abort_by_id(&me, &path, &id).await {
                        tracing::warn!(%key, error = %e, "s3: cannot abort a leftover upload");
                        out.failed += 1;
                        continue;
                    }
                    out.aborted += 1;
                    out.keys.push(key.strip_prefix(me.root.as_str()).unwrap_or(&key).to_string());
                }
            }
            if out.aborted > 0 {
                tracing::info!(aborted = out.aborted, keys = ?out.keys, "s3: aborted multipart uploads left by an earlier process");
            }
            Ok(out)
        })
        .await?
}

async fn abort_by_id(me: &Arc<Inner>, path: &Path, id: &str) -> Result<()> {
    me.retry
        .run(|| async {
            match me.store.abort_multipart(path, &id.to_string()).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    let e = me.err(e, Operation::Abort, path.as_ref());
                    if e.kind() == ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
            }
        })
        .await
}

/// `ListMultipartUploads` under the tier's prefix: (object path, upload id) pairs, or `None`
/// where the server does not implement it.
pub(crate) async fn list_multipart_uploads(inner: &Inner) -> Result<Option<Vec<(String, String)>>> {
    let mut out = Vec::new();
    let mut markers = (String::new(), String::new());
    let bad = |m: String| {
        Error::new(ErrorKind::Io, format!("listing multipart uploads of s3://{}/{}: {m}", inner.cfg.bucket, inner.root))
            .context(Operation::Open, &inner.root, &inner.cfg.name)
    };
    loop {
        let mut query = format!("prefix={}&uploads=", encode(&inner.root));
        if !markers.0.is_empty() {
            query = format!("key-marker={}&{query}&upload-id-marker={}", encode(&markers.0), encode(&markers.1));
        }
        let url = inner.signed.bucket_url(&query);
        let answer = inner.retry.run(|| inner.signed.send("GET", &url, &[], Bytes::new(), Operation::Open, "")).await?;
        match answer.status {
            200 => {}
            501 | 405 => return Ok(None),
            s if xml::parse_error(&answer.body).0 == "NotImplemented" => {
                tracing::debug!(status = s, "s3: server has no ListMultipartUploads");
                return Ok(None);
            }
            s => {
                let what = format!("listing multipart uploads of s3://{}/{}", inner.cfg.bucket, inner.root);
                return Err(inner.signed.answer_error(s, &answer.body, &what, Operation::Open, &inner.root));
            }
        }
        let page = xml::parse_uploads_page(&answer.body).map_err(|e| bad(format!("unreadable answer: {e}")))?;
        if out.len() + page.uploads.len() > MAX_LISTED_UPLOADS {
            return Err(bad(format!("more than {MAX_LISTED_UPLOADS} uploads listed; abort them first (an AWS lifecycle rule, AbortIncompleteMultipartUpload)")));
        }
        out.extend(page.uploads);
        // The next page must start past this one (a server that repeats a page would loop).
        if !page.truncated || page.next.0.is_empty() || page.next <= markers {
            break;
        }
        markers = page.next;
    }
    Ok(Some(out))
}
