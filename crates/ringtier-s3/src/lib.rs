#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod checksummed;
mod config;
mod error;
mod lease;
mod parts;
mod recovery;
mod signed;
mod tier;
mod uploads;
mod writer;
mod xml;

pub use config::{S3Config, UploadChecksum, UploadVerify, MAX_PARTS, MIN_PART_SIZE};
pub use recovery::UploadRecovery;
pub use tier::S3Tier;

use ringtier_core::Result;

impl S3Tier {
    /// Aborts every multipart upload under the tier's prefix that no writer of this process
    /// owns: those a killed process left behind. Run it on open, before writing, while
    /// holding the prefix's lease (the checkpoint store does, through [`Tier::lock`]).
    /// Found through the tier's upload markers and, where the server implements it,
    /// `ListMultipartUploads`; only uploads under the prefix are ever aborted. A tier without
    /// a prefix is refused (`InvalidInput`): its recovery would abort every upload in the
    /// bucket, other tools' included.
    ///
    /// [`Tier::lock`]: ringtier_core::Tier::lock
    pub async fn recover_uploads(&self) -> Result<UploadRecovery> {
        recovery::recover(&self.inner).await
    }

    /// Multipart uploads under the tier's prefix as (object path in the bucket, upload id),
    /// from `ListMultipartUploads`; `None` where the server does not implement it.
    pub async fn list_multipart_uploads(&self) -> Result<Option<Vec<(String, String)>>> {
        let inner = std::sync::Arc::clone(&self.inner);
        self.inner.spawn(async move { recovery::list_multipart_uploads(&inner).await }).await?
    }

    /// Creates the tier's bucket (setup and tests); a bucket the caller already owns is fine.
    pub async fn create_bucket(&self) -> Result<()> {
        let inner = std::sync::Arc::clone(&self.inner);
        self.inner.spawn(async move { inner.create_bucket().await }).await?
    }

    /// HTTP clients this tier has built for the requests it signs itself: 1 for its whole
    /// life, however many requests it sends (tests check it; not a stable API).
    #[doc(hidden)]
    pub fn signed_clients_built(&self) -> usize {
        self.inner.signed.clients_built()
    }
}

/// Hooks into this crate's private state for the test kit's S3 tests (feature `test-hooks`,
/// which no shipped crate enables; `ringtier-testkit` re-exports them). Not a stable API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod test_hooks {
    /// Simulates the death of this process for upload recovery: forgets which multipart
    /// uploads its writers own, so that [`S3Tier::recover_uploads`](crate::S3Tier::recover_uploads)
    /// treats them as left behind. Call it after `std::mem::forget`ting the writers that
    /// stand for the killed process.
    pub fn forget_live_uploads() {
        crate::uploads::forget_live_uploads();
    }
}

/// The parsers of what S3 servers send that this crate reads itself, for fuzz targets
/// (`fuzz/fuzz_targets/s3_xml.rs`). Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::lease::LeaseRecord;
    pub use crate::xml::{UploadsPage, XmlError};

    /// The fuzz target's body (the cargo-fuzz target and the stable short run both call it):
    /// every parser on `data`, panicking only where a bound is broken.
    pub fn xml(data: &[u8]) {
        if let Ok(page) = parse_uploads_page(data) {
            assert!(page.uploads.len() <= 10_000);
            assert!(page.uploads.iter().all(|(k, id)| k.len() <= 1024 && id.len() <= 1024));
        }
        let _ = parse_upload_id(data);
        let _ = parse_complete(data);
        let (code, message) = parse_error(data);
        assert!(code.len() < 1024 && message.len() < 1024);
        let _ = parse_marker(data);
        if let Some(lease) = parse_lease(data) {
            assert!(lease.timeout.as_secs() <= 24 * 3600);
        }
        if let Ok(s) = std::str::from_utf8(data) {
            let _ = parse_http_date(s);
        }
    }

    /// A ListMultipartUploads answer, bounded (see `xml.rs`).
    pub fn parse_uploads_page(body: &[u8]) -> Result<UploadsPage, XmlError> {
        crate::xml::parse_uploads_page(body)
    }

    /// The upload id of a CreateMultipartUpload answer.
    pub fn parse_upload_id(body: &[u8]) -> Result<Option<String>, XmlError> {
        crate::xml::parse_upload_id(body)
    }

    /// Whether a CompleteMultipartUpload answer is an error, and its object checksum.
    pub fn parse_complete(body: &[u8]) -> Result<(bool, Option<String>), XmlError> {
        crate::xml::parse_complete(body)
    }

    /// `Code` and `Message` of an error answer.
    pub fn parse_error(body: &[u8]) -> (String, String) {
        crate::xml::parse_error(body)
    }

    /// An upload marker's object path and upload id.
    pub fn parse_marker(body: &[u8]) -> Option<(String, String)> {
        crate::xml::parse_marker(body)
    }

    /// A lease object's body.
    pub fn parse_lease(body: &[u8]) -> Option<LeaseRecord> {
        crate::lease::parse_lease(body)
    }

    /// An HTTP date (`Date`, `Last-Modified`) as seconds since the epoch.
    pub fn parse_http_date(s: &str) -> Option<u64> {
        crate::lease::parse_http_date(s)
    }
}
