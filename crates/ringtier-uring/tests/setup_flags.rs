//! Ring set-up flags: COOP_TASKRUN and DEFER_TASKRUN (+ SINGLE_ISSUER) read what was written,
//! through batches and an opened file, and a combination the kernel refuses is a clear
//! `InvalidInput` error naming the knobs, before any ring is made.

use std::sync::Arc;

use ringtier_core::{AlignedBuf, ErrorKind, ReadBatch, Tier};
use ringtier_uring::{UringConfig, UringTier};

fn ext4_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("setup-flags").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taskrun_modes_read_every_file_back() {
    for (name, config) in [
        ("default", UringConfig::default()),
        ("coop", UringConfig::default().with_coop_taskrun(true)),
        ("defer", UringConfig::default().with_defer_taskrun(true).with_queue_depth(4)),
        ("coop+defer", UringConfig::default().with_coop_taskrun(true).with_defer_taskrun(true).with_rings(2)),
    ] {
        let dir = ext4_dir();
        let files: Vec<Vec<u8>> = (0..40usize).map(|i| (0..(i * 4099 + 1)).map(|j| (i + j) as u8).collect()).collect();
        for (i, data) in files.iter().enumerate() {
            std::fs::write(dir.path().join(format!("f{i}")), data).expect("write");
        }
        let tier = Arc::new(UringTier::new(dir.path(), config).expect(name));
        let mut batch = ReadBatch::default();
        for (i, data) in files.iter().enumerate() {
            let buf = AlignedBuf::new((data.len() + 1).next_multiple_of(4096) + 4096, 4096).expect("buffer");
            batch.push(&format!("f{i}"), 0, data.len() + 1, buf);
        }
        let batch = tier.read_batch(batch).await;
        for ((_, entry), data) in batch.iter().zip(&files) {
            assert_eq!(entry.result().expect("ran").as_ref().copied().expect(name), data.len(), "{name}");
            assert_eq!(entry.buf().expect("buffer").as_slice(), &data[..], "{name}");
        }
        // Many single reads from several tasks at once: one submitter per ring still.
        let mut tasks = Vec::new();
        for i in 0..8usize {
            let tier = Arc::clone(&tier);
            let want = files[i * 5].clone();
            tasks.push(tokio::spawn(async move {
                let got = ringtier_core::ops::get(&*tier, &format!("f{}", i * 5)).await.expect("get");
                assert_eq!(got, want);
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
    }
}

#[test]
fn sqpoll_with_a_taskrun_mode_is_refused_with_the_knobs_named() {
    let dir = ext4_dir();
    for config in [
        UringConfig::default().with_sqpoll_idle_ms(10).with_coop_taskrun(true),
        UringConfig::default().with_sqpoll_idle_ms(10).with_defer_taskrun(true),
    ] {
        let err = UringTier::new(dir.path(), config).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("SQPOLL cannot be combined with"), "{err}");
    }
    assert!(UringConfig::default().validate().is_ok());
    assert!(UringConfig::default().with_defer_taskrun(true).with_coop_taskrun(true).validate().is_ok());
}
