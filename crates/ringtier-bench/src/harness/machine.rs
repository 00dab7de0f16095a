//! The machine and its storage, for every report: cores, memory, kernel, and the file-system
//! type of each path (one way: `statfs`, through `ringtier_core::fs`).

use std::path::Path;

use nix::unistd::{sysconf, SysconfVar};
use serde::Serialize;

/// Machine facts for reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) memory_bytes: u64,
    pub(crate) kernel: String,
}

impl Machine {
    /// This machine.
    pub(crate) fn probe() -> Machine {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let conf = |v| sysconf(v).ok().flatten().unwrap_or(0).max(0) as u64;
        let (pages, page) = (conf(SysconfVar::_PHYS_PAGES), conf(SysconfVar::PAGE_SIZE));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        Machine { cpus, memory_bytes: pages * page, kernel }
    }

    /// `N CPUs, M GiB, kernel K`.
    pub(crate) fn text(&self) -> String {
        format!("{} CPUs, {:.0} GiB, kernel {}", self.cpus, self.memory_bytes as f64 / (1u64 << 30) as f64, self.kernel)
    }
}

/// The file-system type of `path` (`ext4`, `tmpfs`, `xfs`, ...).
pub(crate) fn filesystem(path: &Path) -> &'static str {
    ringtier_core::fs::fs_type_name(path)
}

/// A path and its file-system type.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Storage {
    pub(crate) path: String,
    pub(crate) filesystem: String,
}

impl Storage {
    /// `path` and its file system.
    pub(crate) fn of(path: &Path) -> Storage {
        Storage { path: path.display().to_string(), filesystem: filesystem(path).to_string() }
    }
}
