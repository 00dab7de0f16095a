//! Uploads whose parts carry CRC-32C checksums (`verify = checksums`, docs/S3.md, "How an
//! upload is checked as stored"): created with `x-amz-checksum-algorithm: CRC32C`, each
//! part (or the single PUT of a small object) sent with its CRC-32C in a signed
//! `x-amz-checksum-crc32c` header, completed naming every part by its ETag and CRC-32C, the
//! object's checksum in the answer compared with ours; and the probe of whether a server
//! checks part checksums at all. object_store 0.14 can send none of these for CRC-32C: they
//! are the tier's own requests ([`SignedClient`](crate::signed::SignedClient)).

use std::sync::Arc;

use bytes::Bytes;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use ringtier_core::{Error, ErrorKind, Operation, Result};

use crate::signed::encode;
use crate::tier::Inner;
use crate::uploads::{set_live, MARKER_DIR};
use crate::xml;

/// Standard base64 of `bytes` (the `x-amz-checksum-*` header encoding).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Creates a multipart upload of `path` whose parts carry CRC-32C checksums
/// (`x-amz-checksum-algorithm: CRC32C`: AWS refuses a part checksum the upload was not
/// created for, and then wants every part's checksum in the completion). Returns its id.
pub(crate) async fn create_checked(inner: &Inner, path: &Path, key: &str) -> Result<String> {
    let url = format!("{}?uploads=", inner.signed.object_url(path));
    let headers = [("x-amz-checksum-algorithm", "CRC32C".to_string())];
    let answer = inner.signed.send("POST", &url, &headers, Bytes::new(), Operation::Write, key).await?;
    let id = xml::parse_upload_id(&answer.body).map_err(|e| {
        Error::new(ErrorKind::Io, format!("POST {url}: unreadable answer: {e}")).context(
            Operation::Write,
            key,
            &inner.cfg.name,
        )
    })?;
    match id {
        Some(id) if answer.status == 200 => Ok(id),
        _ => Err(answer_error(inner, &answer, path, key, Operation::Write)),
    }
}

/// Completes an upload made by [`create_checked`], naming every part by its ETag and CRC-32C
/// (`parts`: in order). Returns the object's checksum where the server answers with one.
pub(crate) async fn complete_checked(
    inner: &Inner,
    path: &Path,
    upload_id: &str,
    parts: &[(String, u32)],
    key: &str,
) -> Result<Option<String>> {
    let mut xml = String::from("<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (i, (etag, crc)) in parts.iter().enumerate() {
        let etag = etag.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        xml.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag><ChecksumCRC32C>{}</ChecksumCRC32C></Part>",
            i + 1,
            base64(&crc.to_be_bytes())
        ));
    }
    xml.push_str("</CompleteMultipartUpload>");
    let url = format!("{}?uploadId={}", inner.signed.object_url(path), encode(upload_id));
    let answer = inner.signed.send("POST", &url, &[], Bytes::from(xml), Operation::Commit, key).await?;
    let (is_error, sum) = xml::parse_complete(&answer.body).map_err(|e| {
        Error::new(ErrorKind::Io, format!("POST {url}: unreadable answer: {e}")).context(
            Operation::Commit,
            key,
            &inner.cfg.name,
        )
    })?;
    if answer.status != 200 || is_error {
        return Err(answer_error(inner, &answer, path, key, Operation::Commit));
    }
    Ok(sum)
}

/// The checksum S3 gives an object uploaded in parts with CRC-32C checksums: the CRC-32C of
/// the parts' CRC-32Cs (big-endian, concatenated), base64, `-` the number of parts.
pub(crate) fn composite_crc32c(crcs: &[u32]) -> String {
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_be_bytes()).collect();
    format!("{}-{}", base64(&crc32c::crc32c(&bytes).to_be_bytes()), crcs.len())
}

/// Sends `data` as part `idx` (0-based) of upload `upload_id` (`Some`, an upload from
/// [`create_checked`]), or as the whole object (`None`: a PutObject), with its CRC-32C in a
/// signed `x-amz-checksum-crc32c` header (the body signed or not as
/// [`SignedClient::send`](crate::signed::SignedClient::send) says).
/// Returns the part's ETag and whether the server answered with the same checksum (a server
/// that checks part checksums does; one that ignores them does not). A body the server
/// refuses as not matching (`BadDigest`) is a temporary `Corrupt` error: sent again, it may
/// arrive whole.
pub(crate) async fn put_checked(
    inner: &Inner,
    path: &Path,
    part: Option<(&str, usize)>,
    data: Bytes,
    crc: u32,
    key: &str,
    op: Operation,
) -> Result<(PartId, bool)> {
    let url = match part {
        Some((id, idx)) => {
            format!("{}?partNumber={}&uploadId={}", inner.signed.object_url(path), idx + 1, encode(id))
        }
        None => inner.signed.object_url(path),
    };
    let sum = base64(&crc.to_be_bytes());
    let answer = inner.signed.send("PUT", &url, &[("x-amz-checksum-crc32c", sum.clone())], data, op, key).await?;
    if !(200..300).contains(&answer.status) {
        return Err(answer_error(inner, &answer, path, key, op));
    }
    let Some(etag) = answer.etag() else {
        return Err(Error::new(ErrorKind::Io, format!("PUT {url}: the answer has no ETag"))
            .set_temporary(true)
            .context(op, key, &inner.cfg.name));
    };
    let echoed = answer.header("x-amz-checksum-crc32c");
    Ok((PartId { content_id: etag }, echoed.as_deref() == Some(sum.as_str())))
}

/// Whether the server checks part checksums: sends one small part with a wrong
/// `x-amz-checksum-crc32c` to a throwaway upload (aborted after) and expects `BadDigest`.
/// Asked once per tier, the answer kept.
pub(crate) async fn server_checks_parts(inner: &Arc<Inner>) -> Result<bool> {
    let me = Arc::clone(inner);
    inner
        .part_checks
        .get_or_try_init(|| async move {
            let spawned = Arc::clone(&me);
            me.spawn(async move {
                let me = spawned;
                let path = Path::parse(format!("{}{MARKER_DIR}/checksum-probe-{}", me.root, std::process::id()))
                    .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("probe path: {e}")))?;
                let key = "(part checksum probe)";
                let id = me.retry.run(|| create_checked(&me, &path, key)).await?;
                // Live: a recovery running meanwhile leaves it alone.
                set_live(&id, true);
                let body = Bytes::from_static(b"ringtier: does this server check part checksums?");
                let wrong = crc32c::crc32c(&body) ^ 1;
                let res = me
                    .retry
                    .run(|| async {
                        match put_checked(&me, &path, Some((&id, 0)), body.clone(), wrong, key, Operation::Write).await
                        {
                            Err(e) if e.kind() == ErrorKind::Corrupt => Ok(true),
                            Err(e) => Err(e),
                            Ok(_) => Ok(false),
                        }
                    })
                    .await;
                let _ = me.store.abort_multipart(&path, &id).await;
                set_live(&id, false);
                let checks = res?;
                if !checks {
                    tracing::info!(
                        tier = %me.cfg.name,
                        "s3: the server does not check part checksums; uploads are read back to check them"
                    );
                }
                Ok(checks)
            })
            .await?
        })
        .await
        .copied()
}

/// The error for an error answer to a request on the object at `path`.
fn answer_error(inner: &Inner, answer: &crate::signed::Answer, path: &Path, key: &str, op: Operation) -> Error {
    let what = format!("s3://{}/{path}", inner.cfg.bucket);
    inner.signed.answer_error(answer.status, &answer.body, &what, op, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_the_composite_checksum() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        // As AWS computes it: the CRC-32C of the parts' CRC-32Cs, big-endian, `-N`.
        let crcs = [crc32c::crc32c(b"a"), crc32c::crc32c(b"b")];
        let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_be_bytes()).collect();
        assert_eq!(composite_crc32c(&crcs), format!("{}-2", base64(&crc32c::crc32c(&bytes).to_be_bytes())));
    }
}
