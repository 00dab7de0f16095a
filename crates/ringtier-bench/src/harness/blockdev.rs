//! The block device under a path, read from sysfs: its name, model, driver and every
//! setting of its request queue (`queue/*`). Reports record it so a result names the
//! block-layer settings it ran under; `ringtier tune` changes some of them (`tune/block.rs`).
//! Read only here.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Longest sysfs value read (every queue attribute is a short line).
const MAX_VALUE: u64 = 4096;

/// A block device and its queue settings.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct BlockDevice {
    /// Kernel name (`vda`, `nvme0n1`, `loop3`); the whole disk when the path is on a partition.
    pub(crate) name: String,
    /// `major:minor` of the device the file system is on.
    pub(crate) dev: String,
    /// `device/model` where the driver has one (SCSI, NVMe, ...).
    pub(crate) model: Option<String>,
    /// `device/vendor` where the driver has one.
    pub(crate) vendor: Option<String>,
    /// The driver bound to the device (`virtio_blk`, `nvme`, ...).
    pub(crate) driver: Option<String>,
    /// Every readable attribute under `queue/`, trimmed (`scheduler` as `none [mq-deadline]`).
    pub(crate) queue: BTreeMap<String, String>,
    /// The `queue/` directory (under the sysfs root used).
    #[serde(skip)]
    pub(crate) queue_dir: PathBuf,
}

impl BlockDevice {
    /// The active scheduler, `mq-deadline` out of `none [mq-deadline] kyber`.
    pub(crate) fn scheduler(&self) -> Option<String> {
        active_choice(self.queue.get("scheduler")?)
    }
}

/// The bracketed choice of a sysfs multiple-choice value (`none [mq-deadline] kyber`), or the
/// value itself when it has no brackets.
pub(crate) fn active_choice(v: &str) -> Option<String> {
    match (v.find('['), v.find(']')) {
        (Some(a), Some(b)) if a < b => Some(v[a + 1..b].to_string()),
        _ => (!v.is_empty()).then(|| v.to_string()),
    }
}

/// Reads a short sysfs file, trimmed; `None` when missing, unreadable or too long.
pub(crate) fn read_value(path: &Path) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut s = String::new();
    f.take(MAX_VALUE + 1).read_to_string(&mut s).ok()?;
    if s.len() as u64 > MAX_VALUE {
        return None;
    }
    Some(s.trim().to_string())
}

/// The block device holding `path`, from the sysfs tree at `sysfs` (normally `/sys`); an
/// error saying why there is none (tmpfs, overlay, a network file system, no sysfs).
pub(crate) fn device_of(path: &Path, sysfs: &Path) -> Result<BlockDevice, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dev = md.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    if major == 0 {
        return Err(format!(
            "{} is on a file system without a block device ({}, device {major}:{minor})",
            path.display(),
            super::filesystem(path)
        ));
    }
    device_by_number(major, minor, sysfs)
}

/// The block device `major:minor` under `sysfs`; a partition resolves to its disk.
pub(crate) fn device_by_number(major: u64, minor: u64, sysfs: &Path) -> Result<BlockDevice, String> {
    let link = sysfs.join(format!("dev/block/{major}:{minor}"));
    let mut dir = std::fs::canonicalize(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    if dir.join("partition").exists() {
        if let Some(parent) = dir.parent() {
            dir = parent.to_path_buf();
        }
    }
    let queue_dir = dir.join("queue");
    if !queue_dir.is_dir() {
        return Err(format!("{} has no queue directory (not a request-based block device)", dir.display()));
    }
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut queue = BTreeMap::new();
    let entries = std::fs::read_dir(&queue_dir).map_err(|e| format!("{}: {e}", queue_dir.display()))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_file() {
            if let Some(v) = read_value(&p) {
                queue.insert(e.file_name().to_string_lossy().into_owned(), v);
            }
        }
    }
    let driver = std::fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    Ok(BlockDevice {
        name,
        dev: format!("{major}:{minor}"),
        model: read_value(&dir.join("device/model")).filter(|s| !s.is_empty()),
        vendor: read_value(&dir.join("device/vendor")).filter(|s| !s.is_empty()),
        driver,
        queue,
        queue_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_sysfs_resolves_partitions_and_reads_every_queue_setting() {
        let sys = tempfile::tempdir().expect("tempdir");
        let disk = sys.path().join("devices/virtual/block/vdz");
        std::fs::create_dir_all(disk.join("queue")).expect("mkdir");
        std::fs::create_dir_all(disk.join("vdz1")).expect("mkdir");
        std::fs::write(disk.join("vdz1/partition"), "1\n").expect("write");
        std::fs::create_dir_all(disk.join("device")).expect("mkdir");
        std::fs::write(disk.join("device/model"), "Fast Disk 9000 \n").expect("write");
        std::fs::write(disk.join("queue/scheduler"), "none [mq-deadline] kyber\n").expect("write");
        std::fs::write(disk.join("queue/read_ahead_kb"), "128\n").expect("write");
        std::fs::write(disk.join("queue/huge"), "x".repeat(5000)).expect("write");
        std::fs::create_dir_all(sys.path().join("dev/block")).expect("mkdir");
        std::os::unix::fs::symlink(disk.join("vdz1"), sys.path().join("dev/block/254:1")).expect("link");
        let d = device_by_number(254, 1, sys.path()).expect("device");
        assert_eq!(d.name, "vdz");
        assert_eq!(d.model.as_deref(), Some("Fast Disk 9000"));
        assert_eq!(d.scheduler().as_deref(), Some("mq-deadline"));
        assert_eq!(d.queue.get("read_ahead_kb").map(String::as_str), Some("128"));
        assert!(!d.queue.contains_key("huge"), "over-long values are left out");
        assert!(device_by_number(254, 9, sys.path()).is_err());
        assert_eq!(active_choice("none"), Some("none".into()));
        // The real tree: the temp dir's device has a queue (or says why not).
        match device_of(Path::new(env!("CARGO_MANIFEST_DIR")), Path::new("/sys")) {
            Ok(d) => assert!(d.queue.contains_key("nr_requests") || d.queue.is_empty(), "{d:?}"),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
