#![doc = include_str!("../README.md")]

mod config;
mod error;
mod parts;
mod tier;
mod uploads;
mod writer;

pub use config::{S3Config, UploadChecksum, UploadVerify, MAX_PARTS, MIN_PART_SIZE};
pub use tier::S3Tier;
pub use uploads::UploadRecovery;

use ringtier_core::Result;

impl S3Tier {
    /// Aborts every multipart upload under the tier's prefix that no writer of this process
    /// owns: those a killed process left behind. Run it on open, before writing (the
    /// checkpoint store does). Found through the tier's upload markers and, where the server
    /// implements it, `ListMultipartUploads`.
    pub async fn recover_uploads(&self) -> Result<UploadRecovery> {
        uploads::recover(&self.inner).await
    }

    /// Multipart uploads under the tier's prefix as (object path in the bucket, upload id),
    /// from `ListMultipartUploads`; `None` where the server does not implement it.
    pub async fn list_multipart_uploads(&self) -> Result<Option<Vec<(String, String)>>> {
        let inner = std::sync::Arc::clone(&self.inner);
        self.inner.spawn(async move { uploads::list_multipart_uploads(&inner).await }).await?
    }

    /// Creates the tier's bucket (setup and tests); a bucket the caller already owns is fine.
    pub async fn create_bucket(&self) -> Result<()> {
        let inner = std::sync::Arc::clone(&self.inner);
        self.inner.spawn(async move { uploads::create_bucket(&inner).await }).await?
    }
}

#[cfg(feature = "testing")]
pub mod testing;
