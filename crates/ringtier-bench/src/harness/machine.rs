//! The machine and its storage, for every report: cores, memory, kernel, the io_uring
//! features the kernel offers, the file-system type of each path (one way: `statfs`, through
//! `ringtier_core::fs`) and the block device under it with every queue setting.

use std::path::Path;

use nix::unistd::{sysconf, SysconfVar};
use serde::Serialize;

use super::blockdev::{device_of, BlockDevice};

/// Machine facts for reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) memory_bytes: u64,
    pub(crate) kernel: String,
    /// What the kernel's io_uring offers (or why it is unavailable).
    pub(crate) io_uring: IoUringOffer,
    /// The engine file tiers open with under `auto`: `io_uring`, or `thread pool` and why.
    pub(crate) engine: String,
}

/// The io_uring features, set-up flags and opcodes of the running kernel.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub(crate) struct IoUringOffer {
    pub(crate) features: Vec<&'static str>,
    pub(crate) setup_flags: Vec<&'static str>,
    pub(crate) opcodes: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) missing_opcodes: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unavailable: Option<String>,
}

impl IoUringOffer {
    /// This kernel's.
    pub(crate) fn probe() -> IoUringOffer {
        match ringtier_uring::probe_kernel() {
            Ok(f) => IoUringOffer {
                features: f.features,
                setup_flags: f.setup_flags,
                opcodes: f.opcodes,
                missing_opcodes: f.missing_opcodes,
                unavailable: None,
            },
            Err(e) => IoUringOffer {
                unavailable: Some(ringtier_uring::UringRefusal::from_setup_error(&e).to_string()),
                ..IoUringOffer::default()
            },
        }
    }
}

impl Machine {
    /// This machine.
    pub(crate) fn probe() -> Machine {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let conf = |v| sysconf(v).ok().flatten().unwrap_or(0).max(0) as u64;
        let (pages, page) = (conf(SysconfVar::_PHYS_PAGES), conf(SysconfVar::PAGE_SIZE));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let engine = match (ringtier_uring::uring_availability(), ringtier_uring::engine::fallback_reason()) {
            (Err(why), _) | (Ok(()), Some(why)) => format!("thread pool ({why})"),
            (Ok(()), None) => "io_uring".to_string(),
        };
        Machine { cpus, memory_bytes: pages * page, kernel, io_uring: IoUringOffer::probe(), engine }
    }

    /// `io_uring: set-up flags ...; features ...` for reports.
    pub(crate) fn io_uring_text(&self) -> String {
        match &self.io_uring.unavailable {
            Some(why) => format!("io_uring unavailable: {why}; engine: {}", self.engine),
            None => format!(
                "io_uring set-up flags {}; features {}; engine: {}",
                self.io_uring.setup_flags.join(" "),
                self.io_uring.features.join(" "),
                self.engine
            ),
        }
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
    /// The block device under the path with every queue setting, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device: Option<BlockDevice>,
    /// Why there is no device record (tmpfs, no sysfs, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device_note: Option<String>,
}

impl Storage {
    /// `path`, its file system and its block device (from `/sys`).
    pub(crate) fn of(path: &Path) -> Storage {
        let (device, device_note) = match device_of(path, Path::new("/sys")) {
            Ok(d) => (Some(d), None),
            Err(why) => (None, Some(why)),
        };
        Storage { path: path.display().to_string(), filesystem: filesystem(path).to_string(), device, device_note }
    }

    /// `vda (virtio_blk), scheduler mq-deadline, nr_requests 256, ...` for reports.
    pub(crate) fn device_text(&self) -> String {
        match &self.device {
            None => format!("no block device: {}", self.device_note.as_deref().unwrap_or("unknown")),
            Some(d) => {
                let mut s = d.name.clone();
                let what: Vec<&str> =
                    [d.model.as_deref(), d.vendor.as_deref(), d.driver.as_deref()].into_iter().flatten().collect();
                if !what.is_empty() {
                    s.push_str(&format!(" ({})", what.join(", ")));
                }
                for k in ["scheduler", "nr_requests", "read_ahead_kb", "nomerges", "rq_affinity", "max_sectors_kb"] {
                    if let Some(v) = d.queue.get(k) {
                        let v = if k == "scheduler" { d.scheduler().unwrap_or_default() } else { v.clone() };
                        s.push_str(&format!(", {k} {v}"));
                    }
                }
                s
            }
        }
    }
}
