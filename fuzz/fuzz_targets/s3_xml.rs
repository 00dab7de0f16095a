//! What an S3 server sends that ringtier-s3 parses itself: ListMultipartUploads,
//! CreateMultipartUpload and CompleteMultipartUpload answers, error bodies, upload markers,
//! lease objects and HTTP dates (see `ringtier_s3::fuzzing`). Every parser is bounded; none
//! may panic or allocate past its bounds on any input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringtier_s3::fuzzing as f;

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = f::parse_uploads_page(data) {
        assert!(page.uploads.len() <= 10_000);
        assert!(page.uploads.iter().all(|(k, id)| k.len() <= 1024 && id.len() <= 1024));
    }
    let _ = f::parse_upload_id(data);
    let _ = f::parse_complete(data);
    let (code, message) = f::parse_error(data);
    assert!(code.len() < 1024 && message.len() < 1024);
    let _ = f::parse_marker(data);
    if let Some(lease) = f::parse_lease(data) {
        assert!(lease.timeout.as_secs() <= 24 * 3600);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = f::parse_http_date(s);
    }
});
