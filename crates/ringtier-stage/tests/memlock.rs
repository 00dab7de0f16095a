//! mlock refused (RLIMIT_MEMLOCK too small, CAP_IPC_LOCK dropped): the pinned pool falls back
//! to unlocked memory, says so, and staging still works. Its own binary: it changes
//! process-wide limits.

#[test]
fn low_memlock_falls_back_to_unlocked_buffers() {
    caps::drop(None, caps::CapSet::Effective, caps::Capability::CAP_IPC_LOCK).expect("drop CAP_IPC_LOCK");
    let lim = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
    // SAFETY: lowering a limit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);
    let pool = ringtier_stage::PinnedPool::new(1 << 20, 4, ringtier_stage::Target::Host).expect("falls back");
    assert_eq!(pool.pinning(), ringtier_stage::Pinning::Unlocked);
    assert!(!pool.is_locked());
    let mut b = pool.pool().try_acquire().expect("buffer");
    b.fill_from(b"still usable").expect("fill");
    assert_eq!(b.as_slice(), b"still usable");
}
