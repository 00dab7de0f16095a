//! `ringtier-no-uring [--errno eperm|enosys] -- COMMAND [ARGS...]`: runs COMMAND with
//! `io_uring_setup` refused by a seccomp filter, as a container's default seccomp profile
//! (EPERM) or a sandbox such as gVisor (ENOSYS) refuses it. The filter is per process and
//! inherited by every child; nothing else is filtered. The tests of the engine fallback run
//! the CLI and Python under it (`engine="auto"` must fall back to the thread pool).

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// `io_uring_setup` on x86_64 and aarch64 (the same number on both since Linux 5.1).
const SYS_IO_URING_SETUP: u32 = 425;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut errno = libc::EPERM;
    if args.first().map(String::as_str) == Some("--errno") {
        errno = match args.get(1).map(String::as_str) {
            Some("eperm") => libc::EPERM,
            Some("enosys") => libc::ENOSYS,
            other => return usage(&format!("--errno takes eperm or enosys, not {other:?}")),
        };
        args.drain(..2);
    }
    if args.first().map(String::as_str) == Some("--") {
        args.remove(0);
    }
    let Some((program, rest)) = args.split_first() else {
        return usage("no command given");
    };
    if let Err(e) = deny_io_uring_setup(errno) {
        eprintln!("ringtier-no-uring: installing the seccomp filter failed: {e}");
        return ExitCode::from(2);
    }
    let e = Command::new(program).args(rest).exec();
    eprintln!("ringtier-no-uring: running {program}: {e}");
    ExitCode::from(127)
}

fn usage(why: &str) -> ExitCode {
    eprintln!("ringtier-no-uring: {why}\nusage: ringtier-no-uring [--errno eperm|enosys] -- COMMAND [ARGS...]");
    ExitCode::from(2)
}

/// Installs a seccomp filter on this process (and its future children) under which
/// `io_uring_setup` fails with `errno` and every other system call is allowed.
fn deny_io_uring_setup(errno: i32) -> std::io::Result<()> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
                                         // offsetof(struct seccomp_data, nr) and (.., arch).
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut program = [
        stmt(ld, ARCH),
        jump(jeq, AUDIT_ARCH, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(ld, NR),
        jump(jeq, SYS_IO_URING_SETUP, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA)),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only; it lets an unprivileged process
    // install a filter.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `program`, a valid BPF program that lives across the call (the
    // kernel copies it).
    let rc =
        unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog as *const libc::sock_fprog) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
