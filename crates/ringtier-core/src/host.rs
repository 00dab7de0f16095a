//! What the host gives this process, as the engine sees it: the locked-memory limit
//! (`RLIMIT_MEMLOCK`) and whether the process is held to it (`CAP_IPC_LOCK`), and the running
//! kernel. `ringtier doctor` reports them.
//!
//! The limit matters to the io_uring engine twice: registered (fixed) buffers lock the whole
//! buffer pool, and on some kernels a ring's own memory is charged to it. Where the limit is
//! too small, registration falls back to plain buffers and rings are retried smaller.

use crate::error::{Error, Result};
use crate::sys;

/// The locked-memory limit (`RLIMIT_MEMLOCK`) of this process in bytes; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockLimit {
    /// The soft limit: what `mlock` and buffer registration are held to (`ulimit -l`).
    pub soft: Option<u64>,
    /// The hard limit: how far an unprivileged process may raise the soft one.
    pub hard: Option<u64>,
}

impl MemlockLimit {
    /// Whether `bytes` more can be locked under the soft limit by a process without
    /// `CAP_IPC_LOCK` that has locked nothing yet.
    pub fn allows(&self, bytes: u64) -> bool {
        self.soft.is_none_or(|soft| bytes <= soft)
    }
}

/// This process's locked-memory limit (`getrlimit(RLIMIT_MEMLOCK)`).
pub fn memlock_limit() -> Result<MemlockLimit> {
    let (soft, hard) = sys::memlock_limit().map_err(Error::from)?;
    Ok(MemlockLimit { soft, hard })
}

/// The credentials of this process that decide whether the locked-memory limit binds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// The effective user id (0: root).
    pub euid: u32,
    /// Whether `CAP_IPC_LOCK` is in the effective capability set: locking memory is then not
    /// held to `RLIMIT_MEMLOCK`. Root usually has it; root in a container may not.
    pub cap_ipc_lock: bool,
}

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// This process's credentials, read from `/proc/self/status`; `None` where it cannot be read.
pub fn credentials() -> Option<Credentials> {
    parse_proc_status(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The credentials a `/proc/PID/status` text states: the effective uid (the second field of
/// `Uid:`) and `CAP_IPC_LOCK` in `CapEff:` (hexadecimal). `None` where either line is missing
/// or malformed.
pub fn parse_proc_status(text: &str) -> Option<Credentials> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let euid = field("Uid:")?.split_whitespace().nth(1)?.parse().ok()?;
    let cap_eff = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some(Credentials { euid, cap_ipc_lock: cap_eff & (1 << CAP_IPC_LOCK) != 0 })
}

/// The running kernel, as `uname` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The operating system (`Linux`).
    pub sysname: String,
    /// The release (`6.8.0-49-generic`).
    pub release: String,
    /// The hardware (`x86_64`).
    pub machine: String,
}

impl Kernel {
    /// The release's major and minor version (`6.8.0-49-generic`: `(6, 8)`); `None` where it
    /// does not start with them.
    pub fn version(&self) -> Option<(u32, u32)> {
        let mut parts = self.release.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    }
}

/// The running kernel (`uname`).
pub fn kernel() -> Result<Kernel> {
    let (sysname, release, machine) = sys::uname().map_err(Error::from)?;
    Ok(Kernel { sysname, release, machine })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_gives_euid_and_cap_ipc_lock() {
        let root = "Name:\tx\nUid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_proc_status(root), Some(Credentials { euid: 0, cap_ipc_lock: true }));
        // A user whose real uid differs from its effective one; CAP_IPC_LOCK (bit 14) off.
        let user = "Uid:\t1000\t1001\t1000\t1000\nGid:\t1000\nCapEff:\t0000000000000000\n";
        assert_eq!(parse_proc_status(user), Some(Credentials { euid: 1001, cap_ipc_lock: false }));
        // Only CAP_IPC_LOCK.
        let only = "Uid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000004000\n";
        assert_eq!(parse_proc_status(only).map(|c| c.cap_ipc_lock), Some(true));
        assert_eq!(parse_proc_status("Uid:\t0\t0\t0\t0\n"), None);
        assert_eq!(parse_proc_status("Uid:\t0\nCapEff:\tzz\n"), None);
    }

    #[test]
    fn this_process_has_a_limit_and_a_kernel() {
        let limit = memlock_limit().expect("getrlimit");
        if let (Some(soft), Some(hard)) = (limit.soft, limit.hard) {
            assert!(soft <= hard, "{limit:?}");
        }
        assert!(limit.allows(0));
        assert!(MemlockLimit { soft: None, hard: None }.allows(u64::MAX));
        assert!(!MemlockLimit { soft: Some(65_536), hard: Some(65_536) }.allows(65_537));
        let k = kernel().expect("uname");
        assert_eq!(k.sysname, "Linux");
        assert!(k.version().is_some_and(|(major, _)| major >= 5), "{k:?}");
        assert!(credentials().is_some());
    }

    #[test]
    fn kernel_versions_parse() {
        let k = |r: &str| Kernel { sysname: "Linux".into(), release: r.into(), machine: "x86_64".into() };
        assert_eq!(k("6.8.0-49-generic").version(), Some((6, 8)));
        assert_eq!(k("6.18.44-fc-v1272").version(), Some((6, 18)));
        assert_eq!(k("5.15").version(), Some((5, 15)));
        assert_eq!(k("weird").version(), None);
    }
}
