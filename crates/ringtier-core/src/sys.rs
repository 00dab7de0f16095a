//! Every system call of the core crate, each wrapped small and safe: the `*at` calls relative
//! to directory descriptors (`openat2`, `fstatat`, `mkdirat`, `unlinkat`, `renameat`,
//! `getdents` through `fdopendir`) that [`FsRoot`](crate::fs::FsRoot) builds its confinement
//! from, `flock`, `fsync`, `sync_file_range`, and the file-system queries
//! (`statx(STATX_DIOALIGN)`, `fstatfs`, `fstatvfs`, `statfs`), and what the host gives the
//! process (`getrlimit(RLIMIT_MEMLOCK)`, `uname`) for [`host`](crate::host). The only other
//! unsafe code of the crate is the aligned buffers' allocation (`buf.rs`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

/// A path or name as a C string; a NUL inside is `InvalidInput`.
pub(crate) fn c_name(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode, resolve)`.
pub(crate) fn openat2(dir: RawFd, path: &CStr, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
    // SAFETY: open_how is a plain C struct for which all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { u64::from(mode) } else { 0 };
    how.resolve = resolve;
    // SAFETY: dir is an open descriptor (or AT_FDCWD), path is NUL-terminated and how is a
    // valid open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `fstatat(dir, name, flags)`: `AT_SYMLINK_NOFOLLOW` in `flags` looks at a link itself.
pub(crate) fn fstatat(dir: RawFd, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    // SAFETY: stat is a plain C struct; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: dir is open, name NUL-terminated, st writable and of the right type.
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is a plain C struct; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and st writable and of the right type.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// `mkdirat(dir, name, 0o777)` (less the umask).
pub(crate) fn mkdirat(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: dir is open and name NUL-terminated.
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), 0o777) })
}

/// `unlinkat(dir, name, 0)`: a file or a link, never what a link points at.
pub(crate) fn unlinkat(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: dir is open and name NUL-terminated.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) })
}

/// `unlinkat(dir, name, AT_REMOVEDIR)`: an empty directory (a link is ENOTDIR, never followed).
pub(crate) fn rmdirat(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: dir is open and name NUL-terminated.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) })
}

/// `renameat(from_dir, from, to_dir, to)`: replaces `to` (a link itself, never its target).
pub(crate) fn renameat(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    // SAFETY: both descriptors are open and both names NUL-terminated.
    check(unsafe { libc::renameat(from_dir, from.as_ptr(), to_dir, to.as_ptr()) })
}

/// `fsync(fd)`, retried on EINTR.
pub(crate) fn fsync(fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: fsync on an open descriptor.
        match check(unsafe { libc::fsync(fd) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// `sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`: starts the writeback of every dirty
/// page of the file without waiting for it (a hint: durability still needs an fsync).
pub(crate) fn start_writeback(fd: RawFd) -> io::Result<()> {
    // SAFETY: sync_file_range on an open descriptor; it touches no memory of ours.
    check(unsafe { libc::sync_file_range(fd, 0, 0, libc::SYNC_FILE_RANGE_WRITE) })
}

/// `flock(fd, op)`.
pub(crate) fn flock(fd: RawFd, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on an open descriptor the caller owns; it touches no memory.
    check(unsafe { libc::flock(fd, op) })
}

/// Whether a `stat` mode is a symbolic link, a directory, a regular file.
pub(crate) fn is_link(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// See [`is_link`].
pub(crate) fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// See [`is_link`].
pub(crate) fn is_file(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// The modification time of a `stat`.
pub(crate) fn mtime(st: &libc::stat) -> Option<std::time::SystemTime> {
    let secs = u64::try_from(st.st_mtime).ok()?;
    let nanos = u32::try_from(st.st_mtime_nsec).ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(secs, nanos))
}

/// The names in the open directory `dir` (without `.` and `..`), read through a duplicate of
/// the descriptor so that `dir` stays open and usable.
pub(crate) fn read_dir_names(dir: RawFd) -> io::Result<Vec<CString>> {
    read_dir_entries(dir).map(|entries| entries.into_iter().map(|(name, _)| name).collect())
}

/// The entries of the open directory `dir` (without `.` and `..`) with their `d_type`
/// (`DT_REG`, `DT_DIR`, `DT_LNK`, ...; `DT_UNKNOWN` where the file system does not say), read
/// with `getdents64` through a duplicate of the descriptor so that `dir` stays open and usable.
pub(crate) fn read_dir_entries(dir: RawFd) -> io::Result<Vec<(CString, u8)>> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an open descriptor returns a new one or -1.
    let dup = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: dup is a fresh descriptor nothing else owns.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    // The duplicate shares the file offset: start from the beginning.
    // SAFETY: lseek on an open descriptor.
    if unsafe { libc::lseek(dup.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = dup.into_raw_fd();
    // SAFETY: raw is an open directory descriptor; on success the DIR owns it.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so raw is still ours to close.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(e);
    }
    let mut entries = Vec::new();
    let result = loop {
        // readdir reports errors only through errno.
        // SAFETY: __errno_location returns this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dirp is an open DIR that only this function uses.
        let ent = unsafe { libc::readdir64(dirp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 { Ok(()) } else { Err(e) };
        }
        // SAFETY: readdir returned an entry whose d_name is NUL-terminated and valid until the
        // next readdir on dirp; it and d_type are copied out at once.
        let (name, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
        let bytes = name.to_bytes();
        if bytes != b"." && bytes != b".." {
            entries.push((name.to_owned(), d_type));
        }
    };
    // SAFETY: dirp is open; closedir closes it and its descriptor.
    unsafe { libc::closedir(dirp) };
    result.map(|()| entries)
}

/// An all-zero `open_how` with `flags | O_CLOEXEC`, `mode` (only with `O_CREAT`) and
/// `resolve`.
pub(crate) fn open_how(flags: i32, mode: u32, resolve: u64) -> libc::open_how {
    // SAFETY: open_how is a plain C struct for which all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 { u64::from(mode) } else { 0 };
    how.resolve = resolve;
    how
}

/// Whether `pid` names a running process (or one this user may not signal): `kill(pid, 0)`.
pub(crate) fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN)`: `(mem_align, offset_align)`, `None` when
/// the file system does not report them.
pub(crate) fn statx_dio_align(fd: RawFd) -> io::Result<Option<(u32, u32)>> {
    // SAFETY: statx is a plain C struct; all-zero is valid.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: fd is open, the empty path with AT_EMPTY_PATH refers to fd itself, stx is
    // writable and of the right type.
    let rc = unsafe { libc::statx(fd, empty.as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align)))
}

/// An unnamed temporary file in the directory `dir` (`O_TMPFILE | O_RDWR`), gone when closed.
pub(crate) fn open_tmpfile(dir: RawFd) -> io::Result<OwnedFd> {
    let dot = c".";
    // SAFETY: dir is an open directory and "." a valid NUL-terminated path.
    let fd = unsafe { libc::openat(dir, dot.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `statfs(2)` `f_type` of the file system holding the open descriptor `fd`.
pub(crate) fn fstatfs_type(fd: RawFd) -> io::Result<i64> {
    // SAFETY: statfs is a plain C struct; all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open descriptor and st is writable and of the right type.
    check(unsafe { libc::fstatfs(fd, &mut st) })?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(st.f_type as i64)
}

/// `statfs(2)` `f_type` of the file system holding `path`.
pub(crate) fn statfs_type(path: &CStr) -> io::Result<i64> {
    // SAFETY: statfs is a plain C struct; all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st writable and of the right type.
    check(unsafe { libc::statfs(path.as_ptr(), &mut st) })?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(st.f_type as i64)
}

/// `(f_frsize, f_bavail, f_blocks)` of `fstatvfs(fd)`.
pub(crate) fn fstatvfs(fd: RawFd) -> io::Result<(u64, u64, u64)> {
    // SAFETY: statvfs is a plain C struct; all-zero is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open descriptor and st is writable and of the right type.
    check(unsafe { libc::fstatvfs(fd, &mut st) })?;
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ between targets
    Ok((st.f_frsize as u64, st.f_bavail as u64, st.f_blocks as u64))
}

/// `getrlimit(RLIMIT_MEMLOCK)`: `(soft, hard)` in bytes, `None` for `RLIM_INFINITY`.
pub(crate) fn memlock_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: rl is writable and of the type getrlimit fills.
    check(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) })?;
    let finite = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    #[allow(clippy::unnecessary_cast)] // rlim_t's width differs between targets
    Ok((finite(rl.rlim_cur).map(|v| v as u64), finite(rl.rlim_max).map(|v| v as u64)))
}

/// `uname(2)`: `(sysname, release, machine)`.
pub(crate) fn uname() -> io::Result<(String, String, String)> {
    // SAFETY: utsname is a plain C struct of byte arrays; all-zero is valid.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is writable and of the type uname fills.
    check(unsafe { libc::uname(&mut u) })?;
    // The kernel NUL-terminates each field; a field without one is read to its end.
    let text = |field: &[libc::c_char]| {
        #[allow(clippy::unnecessary_cast)] // c_char is i8 or u8 depending on the target
        let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok((text(&u.sysname), text(&u.release), text(&u.machine)))
}
