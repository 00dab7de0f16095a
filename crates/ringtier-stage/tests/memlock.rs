//! mlock refused (RLIMIT_MEMLOCK too small, CAP_IPC_LOCK dropped): the pinned pool falls back
//! to unlocked memory, says so, and staging still works. Its own binary: it changes
//! process-wide limits.

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[test]
fn low_memlock_falls_back_to_unlocked_buffers() {
    let mut hdr = CapHeader { version: 0x2008_0522, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data structs; drops CAP_IPC_LOCK (14).
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()), 0);
        data[0].effective &= !(1 << 14);
        assert_eq!(libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()), 0);
    }
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
