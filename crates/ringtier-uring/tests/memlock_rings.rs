//! The dataset depth (256 requests in flight) on two rings under a small memlock limit, without
//! CAP_IPC_LOCK: the rings' memory counts against the limit, the first ring (retried smaller on
//! its own) takes most of it and the second cannot be made at any size. The tier opens on the
//! rings it got and reads; it used to fail with ENOMEM "at every ring size" (a `ringtier.Loader`
//! under `ulimit -l 64`). Its own binary: it lowers RLIMIT_MEMLOCK and drops CAP_IPC_LOCK for
//! the process, and the limit is counted per user (one test, no other rings beside it).

use ringtier_core::ops;
use ringtier_testkit::pattern;
use ringtier_uring::{UringConfig, UringTier, UringTierOptions};

#[test]
fn dataset_depth_on_two_rings_opens_on_the_rings_the_limit_allows() {
    caps::drop(None, caps::CapSet::Effective, caps::Capability::CAP_IPC_LOCK).expect("drop CAP_IPC_LOCK");
    // 56 KiB: a ring of 512 entries (52 KiB) and no second ring of any size beside it.
    let lim = libc::rlimit { rlim_cur: 56 << 10, rlim_max: 56 << 10 };
    // SAFETY: setrlimit with a valid rlimit struct; lowering a limit needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);

    let dir = tempfile::Builder::new().prefix("memlock").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for i in 0..64u64 {
        std::fs::write(dir.path().join(format!("f{i}")), pattern(i, 3000)).expect("write");
    }
    let config = UringConfig::dataset().with_rings(2).with_register_buffers(false);
    let tier = UringTier::with_options(dir.path(), config, UringTierOptions::default()).expect("tier opens");
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        for i in 0..64u64 {
            assert_eq!(ops::get(&tier, &format!("f{i}")).await.expect("get"), pattern(i, 3000));
        }
    });
}
