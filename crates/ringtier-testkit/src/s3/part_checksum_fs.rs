//! [`PartChecksumFs`]: s3s-fs with AWS S3's checks of part checksums and its atomic
//! conditional writes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// s3s-fs with AWS S3's conditional writes made atomic (`If-None-Match: *` and `If-Match`
/// on PutObject, `If-Match` on DeleteObject, which s3s-fs 0.14 ignores) and with AWS S3's
/// check of UploadPart checksums: a part whose body does not match its
/// `x-amz-checksum-crc32|crc32c|sha1|sha256|crc64nvme` header is refused with `BadDigest`
/// (400), and an accepted part's response carries the checksum the server computed, as AWS
/// does; as AWS, a part checksum of a kind the upload was not created with
/// (`x-amz-checksum-algorithm`) is refused, and the completion of such an upload must name
/// every part's checksum. s3s-fs 0.14 checks these headers on PutObject but ignores them on
/// UploadPart. Every other operation is s3s-fs's own.
#[derive(Debug)]
pub struct PartChecksumFs {
    inner: s3s_fs::FileSystem,
    check: bool,
    /// The checksum algorithm each multipart upload was created with (upload id to
    /// lower-case name), as AWS keeps it: a part checksum of another kind is refused, and the
    /// completion must name every part's checksum.
    /// Kept in files under the server's root (`.checksum-algorithm-UPLOAD_ID`), so a
    /// restarted server knows them, as s3s-fs keeps its uploads.
    root: PathBuf,
    /// Held across every conditional write (PutObject with `If-None-Match`/`If-Match`,
    /// DeleteObject with `If-Match`): its check and its write are one step, as on AWS.
    /// s3s-fs 0.14 checks the PutObject conditions, but apart from the write (two racing
    /// `If-None-Match: *` creates can both succeed), and ignores `If-Match` on DeleteObject.
    conditional: tokio::sync::Mutex<()>,
}

impl PartChecksumFs {
    /// s3s-fs `inner` over `root`, checking part checksums where `check`.
    pub(super) fn new(inner: s3s_fs::FileSystem, check: bool, root: PathBuf) -> Self {
        PartChecksumFs { inner, check, root, conditional: tokio::sync::Mutex::new(()) }
    }

    fn algorithm_file(&self, upload_id: &str) -> Option<PathBuf> {
        let ok = !upload_id.is_empty() && upload_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        ok.then(|| self.root.join(format!(".checksum-algorithm-{upload_id}")))
    }

    fn algorithm_of(&self, upload_id: &str) -> Option<String> {
        std::fs::read_to_string(self.algorithm_file(upload_id)?).ok().map(|s| s.trim().to_string())
    }

    fn set_algorithm(&self, upload_id: &str, alg: &str) {
        if let Some(f) = self.algorithm_file(upload_id) {
            let _ = std::fs::write(f, alg);
        }
    }
}

impl PartChecksumFs {
    /// The body of `range` of the object in `path` in 1 MiB reads, where it is the
    /// `content_length` bytes s3s-fs announced; None (s3s-fs's own body stays) where the file
    /// cannot be opened or has changed size since.
    fn block_body(
        &self,
        path: &std::path::Path,
        range: Option<s3s::dto::Range>,
        content_length: Option<i64>,
    ) -> Option<super::file_body::FileBody> {
        let file = std::fs::File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        let span = match range {
            Some(r) => r.check(len).ok()?,
            None => 0..len,
        };
        let n = span.end - span.start;
        (u64::try_from(content_length?).ok()? == n).then(|| super::file_body::FileBody::new(file, span.start, n))
    }
}

impl PartChecksumFs {
    /// Gives each listed object the `ETag` (its HeadObject's) and `StorageClass` (`STANDARD`)
    /// that AWS lists and s3s-fs 0.14 leaves out: clients that require them (the CRT's
    /// ListObjectsV2 parser: "Missing field ETag") failed on every listing. `who` is the
    /// listing's credentials and URI, for the HeadObject requests.
    async fn complete_listing(
        &self,
        bucket: &str,
        who: (Option<s3s::auth::Credentials>, http::Uri),
        objects: &mut [s3s::dto::Object],
    ) -> s3s::S3Result<()> {
        use s3s::S3;
        for o in objects.iter_mut() {
            if o.storage_class.is_none() {
                o.storage_class =
                    Some(s3s::dto::ObjectStorageClass::from_static(s3s::dto::ObjectStorageClass::STANDARD));
            }
            let Some(key) = o.key.clone().filter(|_| o.e_tag.is_none()) else { continue };
            let head = s3s::S3Request {
                input: s3s::dto::HeadObjectInput::builder()
                    .bucket(bucket.to_string())
                    .key(key)
                    .build()
                    .map_err(|e| s3s::s3_error!(InternalError, "head input: {e}"))?,
                method: http::Method::HEAD,
                uri: who.1.clone(),
                headers: http::HeaderMap::new(),
                extensions: http::Extensions::new(),
                credentials: who.0.clone(),
                region: None,
                service: None,
                trailing_headers: None,
            };
            // An object deleted since it was listed keeps no ETag (as a racing listing).
            if let Ok(r) = self.inner.head_object(head).await {
                o.e_tag = r.output.e_tag;
            }
        }
        Ok(())
    }
}

macro_rules! part_checksum_fs {
    ($($op:ident: $input:ident => $output:ident),* $(,)?) => {
        #[async_trait::async_trait]
        impl s3s::S3 for PartChecksumFs {
            $(
                async fn $op(
                    &self,
                    req: s3s::S3Request<s3s::dto::$input>,
                ) -> s3s::S3Result<s3s::S3Response<s3s::dto::$output>> {
                    self.inner.$op(req).await
                }
            )*

            async fn create_multipart_upload(
                &self,
                req: s3s::S3Request<s3s::dto::CreateMultipartUploadInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::CreateMultipartUploadOutput>> {
                let alg = req.input.checksum_algorithm.as_ref().map(|a| a.as_str().to_ascii_lowercase());
                let resp = self.inner.create_multipart_upload(req).await?;
                if let (Some(alg), Some(id)) = (alg, resp.output.upload_id.as_deref()) {
                    self.set_algorithm(id, &alg);
                }
                Ok(resp)
            }

            async fn complete_multipart_upload(
                &self,
                req: s3s::S3Request<s3s::dto::CompleteMultipartUploadInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::CompleteMultipartUploadOutput>> {
                if self.check {
                    if let Some(alg) = self.algorithm_of(&req.input.upload_id) {
                        let parts = req.input.multipart_upload.as_ref().and_then(|m| m.parts.as_ref());
                        for (n, p) in parts.into_iter().flatten().enumerate() {
                            let has = match alg.as_str() {
                                "crc32" => p.checksum_crc32.is_some(),
                                "crc32c" => p.checksum_crc32c.is_some(),
                                "sha1" => p.checksum_sha1.is_some(),
                                "sha256" => p.checksum_sha256.is_some(),
                                "crc64nvme" => p.checksum_crc64nvme.is_some(),
                                _ => true,
                            };
                            if !has {
                                return Err(s3s::s3_error!(
                                    InvalidRequest,
                                    "The upload was created using a {alg} checksum. The complete request must include the checksum for each part. It was missing for part {} in the request.",
                                    n + 1
                                ));
                            }
                        }
                    }
                }
                let id = req.input.upload_id.clone();
                let resp = self.inner.complete_multipart_upload(req).await?;
                if let Some(f) = self.algorithm_file(&id) {
                    let _ = std::fs::remove_file(f);
                }
                Ok(resp)
            }

            async fn list_objects(
                &self,
                mut req: s3s::S3Request<s3s::dto::ListObjectsInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::ListObjectsOutput>> {
                // AWS: an empty `delimiter=` is no delimiter. s3s-fs 0.14 groups every key
                // into a common prefix of its first character instead (CRT clients, such as
                // s3torchconnector's, send `delimiter=`: they listed nothing).
                req.input.delimiter = req.input.delimiter.filter(|d| !d.is_empty());
                let (bucket, who) = (req.input.bucket.clone(), (req.credentials.clone(), req.uri.clone()));
                let mut resp = self.inner.list_objects(req).await?;
                self.complete_listing(&bucket, who, resp.output.contents.as_deref_mut().unwrap_or_default()).await?;
                Ok(resp)
            }

            async fn list_objects_v2(
                &self,
                mut req: s3s::S3Request<s3s::dto::ListObjectsV2Input>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::ListObjectsV2Output>> {
                // As in list_objects: an empty delimiter is none.
                req.input.delimiter = req.input.delimiter.filter(|d| !d.is_empty());
                let (bucket, who) = (req.input.bucket.clone(), (req.credentials.clone(), req.uri.clone()));
                let mut resp = self.inner.list_objects_v2(req).await?;
                self.complete_listing(&bucket, who, resp.output.contents.as_deref_mut().unwrap_or_default()).await?;
                Ok(resp)
            }

            async fn get_object(
                &self,
                req: s3s::S3Request<s3s::dto::GetObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::GetObjectOutput>> {
                // s3s-fs answers (checks, headers, ranges); its body, 4 KiB reads through
                // tokio's blocking pool, is replaced by 1 MiB reads of the same file.
                let (range, file) = (req.input.range, super::file_body::object_file(&self.root, &req.input.bucket, &req.input.key));
                let mut resp = self.inner.get_object(req).await?;
                if let Some(body) = file.and_then(|path| self.block_body(&path, range, resp.output.content_length)) {
                    resp.output.body = Some(s3s::dto::StreamingBlob::new(body));
                }
                Ok(resp)
            }

            async fn put_object(
                &self,
                req: s3s::S3Request<s3s::dto::PutObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::PutObjectOutput>> {
                // AWS: a PutObject into a missing bucket is NoSuchBucket; s3s-fs 0.14 creates
                // the bucket's directory instead.
                if !self.root.join(&req.input.bucket).is_dir() {
                    return Err(s3s::s3_error!(NoSuchBucket));
                }
                if req.input.if_none_match.is_none() && req.input.if_match.is_none() {
                    return self.inner.put_object(req).await;
                }
                // s3s-fs checks the conditions; held here, no other conditional write comes
                // between its check and its write.
                let _one = self.conditional.lock().await;
                self.inner.put_object(req).await
            }

            async fn delete_object(
                &self,
                req: s3s::S3Request<s3s::dto::DeleteObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::DeleteObjectOutput>> {
                let Some(want) = req.input.if_match.clone() else {
                    return self.inner.delete_object(req).await;
                };
                let _one = self.conditional.lock().await;
                let head = s3s::S3Request {
                    input: s3s::dto::HeadObjectInput::builder()
                        .bucket(req.input.bucket.clone())
                        .key(req.input.key.clone())
                        .build()
                        .map_err(|e| s3s::s3_error!(InternalError, "head input: {e}"))?,
                    method: http::Method::HEAD,
                    uri: req.uri.clone(),
                    headers: http::HeaderMap::new(),
                    extensions: http::Extensions::new(),
                    credentials: req.credentials.clone(),
                    region: req.region.clone(),
                    service: req.service.clone(),
                    trailing_headers: None,
                };
                // AWS: 412 when the object's ETag differs, 404 when there is no object.
                let etag = match self.inner.head_object(head).await {
                    Ok(r) => r.output.e_tag,
                    Err(e) if *e.code() == s3s::S3ErrorCode::NoSuchKey => return Err(s3s::s3_error!(NoSuchKey)),
                    Err(e) => return Err(e),
                };
                let matches = match (&want, &etag) {
                    (s3s::dto::ETagCondition::Any, Some(_)) => true,
                    (s3s::dto::ETagCondition::ETag(w), Some(have)) => have.strong_cmp(w),
                    _ => false,
                };
                if !matches {
                    return Err(s3s::s3_error!(PreconditionFailed, "At least one of the pre-conditions you specified did not hold"));
                }
                self.inner.delete_object(req).await
            }

            async fn upload_part(
                &self,
                mut req: s3s::S3Request<s3s::dto::UploadPartInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::UploadPartOutput>> {
                use futures::TryStreamExt;
                let i = &req.input;
                let want = (
                    i.checksum_crc32.clone(),
                    i.checksum_crc32c.clone(),
                    i.checksum_sha1.clone(),
                    i.checksum_sha256.clone(),
                    i.checksum_crc64nvme.clone(),
                );
                if !self.check || want == (None, None, None, None, None) {
                    return self.inner.upload_part(req).await;
                }
                // AWS: "Checksum Type mismatch occurred, expected checksum Type: null, actual
                // checksum Type: crc32c" for a part checksum the upload was not created for.
                let sent = [("crc32", want.0.is_some()), ("crc32c", want.1.is_some()), ("sha1", want.2.is_some()), ("sha256", want.3.is_some()), ("crc64nvme", want.4.is_some())]
                    .iter()
                    .find(|(_, on)| *on)
                    .map(|(n, _)| *n)
                    .unwrap_or("");
                let expected = self.algorithm_of(&i.upload_id);
                if expected.as_deref() != Some(sent) {
                    return Err(s3s::s3_error!(
                        InvalidRequest,
                        "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {sent}",
                        expected.as_deref().unwrap_or("null")
                    ));
                }
                let mut hasher = s3s::checksum::ChecksumHasher::default();
                if want.0.is_some() {
                    hasher.crc32 = Some(Default::default());
                }
                if want.1.is_some() {
                    hasher.crc32c = Some(Default::default());
                }
                if want.2.is_some() {
                    hasher.sha1 = Some(Default::default());
                }
                if want.3.is_some() {
                    hasher.sha256 = Some(Default::default());
                }
                if want.4.is_some() {
                    hasher.crc64nvme = Some(Default::default());
                }
                let hasher = Arc::new(Mutex::new(Some(hasher)));
                if let Some(body) = req.input.body.take() {
                    let h = Arc::clone(&hasher);
                    let body = body
                        .inspect_ok(move |b| {
                            if let Some(h) = h.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                                h.update(b);
                            }
                        })
                        .map_err(std::io::Error::other);
                    req.input.body = Some(s3s::dto::StreamingBlob::wrap(body));
                }
                let mut resp = self.inner.upload_part(req).await?;
                let got = hasher.lock().unwrap_or_else(|p| p.into_inner()).take().map(|h| h.finalize()).unwrap_or_default();
                let have = (
                    got.checksum_crc32.clone(),
                    got.checksum_crc32c.clone(),
                    got.checksum_sha1.clone(),
                    got.checksum_sha256.clone(),
                    got.checksum_crc64nvme.clone(),
                );
                if have != want {
                    // The part's file stays under the upload until it is overwritten, completed
                    // without it (a client never lists a refused part) or aborted.
                    return Err(s3s::s3_error!(BadDigest, "the part's checksum does not match its body"));
                }
                let o = &mut resp.output;
                (o.checksum_crc32, o.checksum_crc32c, o.checksum_sha1, o.checksum_sha256, o.checksum_crc64nvme) = have;
                Ok(resp)
            }
        }
    };
}

part_checksum_fs!(
    create_bucket: CreateBucketInput => CreateBucketOutput,
    copy_object: CopyObjectInput => CopyObjectOutput,
    delete_bucket: DeleteBucketInput => DeleteBucketOutput,
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput,
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput,
    head_bucket: HeadBucketInput => HeadBucketOutput,
    head_object: HeadObjectInput => HeadObjectOutput,
    list_buckets: ListBucketsInput => ListBucketsOutput,
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput,
    list_parts: ListPartsInput => ListPartsOutput,
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput,
);

#[cfg(test)]
mod tests {
    use s3s::S3;

    use super::*;

    fn request<T>(input: T) -> s3s::S3Request<T> {
        s3s::S3Request {
            input,
            method: http::Method::GET,
            uri: http::Uri::from_static("/"),
            headers: http::HeaderMap::new(),
            extensions: http::Extensions::new(),
            credentials: None,
            region: None,
            service: None,
            trailing_headers: None,
        }
    }

    #[test]
    fn an_empty_delimiter_lists_keys_as_none_does() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bkt/wds")).expect("mkdir");
        for k in ["wds/shard-0.tar", "wds/shard-1.tar", "other"] {
            std::fs::write(dir.path().join("bkt").join(k), b"x").expect("write");
        }
        let fs = PartChecksumFs::new(s3s_fs::FileSystem::new(dir.path()).expect("fs"), true, dir.path().to_path_buf());
        rt.block_on(async {
            for delimiter in [Some(String::new()), None] {
                let input = s3s::dto::ListObjectsV2Input::builder()
                    .bucket("bkt".into())
                    .prefix(Some("wds/".into()))
                    .delimiter(delimiter.clone())
                    .build()
                    .expect("input");
                let out = fs.list_objects_v2(request(input)).await.expect("list v2").output;
                let contents = out.contents.unwrap_or_default();
                // As AWS lists them: each with its ETag (the one HeadObject gives) and class.
                for o in &contents {
                    let head = s3s::dto::HeadObjectInput::builder()
                        .bucket("bkt".into())
                        .key(o.key.clone().expect("key"))
                        .build()
                        .expect("head input");
                    let etag = fs.head_object(request(head)).await.expect("head").output.e_tag;
                    assert!(etag.is_some() && o.e_tag == etag, "{o:?}");
                    assert_eq!(o.storage_class.as_ref().map(|c| c.as_str()), Some("STANDARD"));
                }
                let keys: Vec<_> = contents.into_iter().filter_map(|o| o.key).collect();
                assert_eq!(keys, ["wds/shard-0.tar", "wds/shard-1.tar"], "delimiter {delimiter:?}");
                assert!(out.common_prefixes.unwrap_or_default().is_empty(), "delimiter {delimiter:?}");
                let input = s3s::dto::ListObjectsInput::builder()
                    .bucket("bkt".into())
                    .prefix(Some("wds/".into()))
                    .delimiter(delimiter.clone())
                    .build()
                    .expect("input");
                let out = fs.list_objects(request(input)).await.expect("list v1").output;
                assert_eq!(out.contents.unwrap_or_default().len(), 2, "v1, delimiter {delimiter:?}");
            }
        });
    }
}
