//! The writer's part checksums (CRC-32C taken block by block as bytes are copied in) against
//! the bytes sent, on every path that fills a part: appends in odd sizes across part
//! boundaries, a rewrite inside the part being filled, writes ahead of the end, a gap left at
//! commit, a single PUT. The test kit's s3s-fs refuses a part whose `x-amz-checksum-crc32c`
//! does not match its body (BadDigest), and `verify=readback` compares the object's CRC-32C
//! with the one the writer combined from its parts: a wrong checksum fails either way.

use ringtier_core::{ops, AlignedBuf, Tier};
use ringtier_s3::{S3Tier, UploadVerify, MIN_PART_SIZE};
use ringtier_testkit::pattern;
use ringtier_testkit::s3::{test_config, S3sFsServer};

const PART: usize = MIN_PART_SIZE;

async fn write(w: &mut Box<dyn ringtier_core::ObjectWriter>, off: usize, data: &[u8]) {
    let mut b = AlignedBuf::new(data.len().max(1), 1).expect("buf");
    b.fill_from(data).expect("fill");
    w.write_at(off as u64, b).await.0.expect("write");
}

/// Writes through every path; returns what the object must hold.
async fn odd_writes(tier: &S3Tier, key: &str) -> Vec<u8> {
    let mut want = pattern(7, 2 * PART + 300_001);
    let mut w = tier.create(key).await.expect("create");
    // In order, in odd sizes crossing the first part boundary.
    let mut off = 0;
    for n in [1, 4095, 262_145, 3 << 20, 1_000_003] {
        write(&mut w, off, &want[off..off + n]).await;
        off += n;
    }
    // A rewrite inside the part being filled (already appended bytes change).
    let back = off - 5000;
    let fresh = pattern(8, 3000);
    want[back..back + 3000].copy_from_slice(&fresh);
    write(&mut w, back, &fresh).await;
    // Ahead of the end, then the bytes before it (the kept-aside write joins when reached).
    let ahead = off + 200_000;
    let end = 2 * PART + 100_000;
    write(&mut w, ahead, &want[ahead..end]).await;
    write(&mut w, off, &want[off..ahead]).await;
    // A gap left at commit reads as zeros.
    let last = end + 1000;
    want[end..last].fill(0);
    write(&mut w, last, &want[last..]).await;
    w.commit().await.expect("commit");
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn part_checksums_match_the_bytes_on_every_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = S3sFsServer::start(dir.path()).expect("s3s-fs");
    server.create_bucket("bkt").expect("bucket");
    for verify in [UploadVerify::Checksums, UploadVerify::ReadBack] {
        let cfg = test_config(&server.endpoint(), "bkt", verify.as_str()).with_part_size(PART).with_verify(verify);
        let tier = S3Tier::new(cfg).expect("tier");
        let want = odd_writes(&tier, "multi").await;
        assert!(ops::get(&tier, "multi").await.expect("get") == want, "{verify:?}: multipart object differs");
        // One PUT: a small object with a rewrite inside it.
        let mut w = tier.create("small").await.expect("create");
        let mut small = pattern(9, 70_000);
        write(&mut w, 0, &small).await;
        small[10..20].fill(3);
        write(&mut w, 10, &small[10..20]).await;
        w.commit().await.expect("commit small");
        assert!(ops::get(&tier, "small").await.expect("get") == small, "{verify:?}: small object differs");
    }
}
