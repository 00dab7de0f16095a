//! Block-layer settings of the device under the data (`/sys/block/DEV/queue/*`): read,
//! changed for a configuration, and always put back through the journal of originals
//! ([`super`]: a guard, a panic hook and a signal thread restore them). A setting the kernel
//! does not let us write (not root, a read-only sysfs, an attribute the driver fixes) is a
//! note in the report, never an error.

use anyhow::Result;
use serde::Serialize;

use super::{set_recorded, write_value, RestoreGuard};
use crate::harness::blockdev::{active_choice, read_value, BlockDevice};

/// A setting that could not be written, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct ReadOnly {
    pub(crate) setting: String,
    pub(crate) why: String,
}

/// The device's settings, changeable where the kernel lets us.
#[derive(Debug)]
pub(crate) struct BlockSettings {
    pub(crate) device: BlockDevice,
}

impl BlockSettings {
    /// The settings of `device`.
    pub(crate) fn new(device: BlockDevice) -> BlockSettings {
        BlockSettings { device }
    }

    /// A guard that restores whatever is changed while it lives.
    pub(crate) fn guard(&self) -> RestoreGuard {
        RestoreGuard::new()
    }

    fn current(&self, name: &str) -> Option<String> {
        let v = read_value(&self.device.queue_dir.join(name))?;
        if name == "scheduler" {
            active_choice(&v)
        } else {
            Some(v)
        }
    }

    /// Which of `names` cannot be written, each with the reason: the current value is written
    /// back (no change) to find out.
    pub(crate) fn probe_writable(&self, names: &[&str]) -> Vec<ReadOnly> {
        let mut out = Vec::new();
        for &name in names {
            let path = self.device.queue_dir.join(name);
            let why = match self.current(name) {
                None => Some(format!("{} is missing or unreadable", path.display())),
                Some(v) => write_value(&path, &v).err().map(|e| format!("{}: {e}", path.display())),
            };
            if let Some(why) = why {
                out.push(ReadOnly { setting: name.to_string(), why });
            }
        }
        out
    }

    /// Sets each `(name, value)`, recording the original first; restoration is by
    /// [`restore_all`](super::restore_all) (the guard, the hooks). A value the kernel rejects
    /// is an error naming the setting (the device's other settings are then restored by the
    /// guard).
    pub(crate) fn apply(&self, settings: &[(&str, String)]) -> Result<()> {
        for (name, value) in settings {
            let path = self.device.queue_dir.join(name);
            let Some(orig) = self.current(name) else {
                anyhow::bail!("{} is missing or unreadable", path.display());
            };
            if orig == *value {
                continue;
            }
            set_recorded(&path, &orig, value)?;
        }
        Ok(())
    }

    /// Every queue setting now, for the report.
    pub(crate) fn snapshot(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        if let Ok(rd) = std::fs::read_dir(&self.device.queue_dir) {
            for e in rd.flatten() {
                if e.path().is_file() {
                    if let Some(v) = read_value(&e.path()) {
                        m.insert(e.file_name().to_string_lossy().into_owned(), v);
                    }
                }
            }
        }
        m
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::super::restore_all;
    use super::*;

    /// A fake sysfs tree with one disk, `254:7`, and its queue settings.
    pub(crate) fn fake_sysfs() -> tempfile::TempDir {
        let sys = tempfile::tempdir().expect("tempdir");
        let disk = sys.path().join("devices/virtual/block/vdt");
        std::fs::create_dir_all(disk.join("queue")).expect("mkdir");
        for (k, v) in [
            ("scheduler", "none [mq-deadline] kyber\n"),
            ("read_ahead_kb", "128\n"),
            ("nr_requests", "256\n"),
            ("nomerges", "0\n"),
        ] {
            std::fs::write(disk.join("queue").join(k), v).expect("write");
        }
        std::fs::create_dir_all(sys.path().join("dev/block")).expect("mkdir");
        std::os::unix::fs::symlink(&disk, sys.path().join("dev/block/254:7")).expect("link");
        sys
    }

    fn settings(sys: &Path) -> BlockSettings {
        BlockSettings::new(crate::harness::blockdev::device_by_number(254, 7, sys).expect("device"))
    }

    #[test]
    fn settings_are_restored_after_a_panic_and_at_the_guards_end() {
        let _l = super::super::tests::LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let sys = fake_sysfs();
        let s = settings(sys.path());
        let q = s.device.queue_dir.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = s.guard();
            s.apply(&[("read_ahead_kb", "4096".into()), ("nomerges", "2".into())]).expect("apply");
            assert_eq!(std::fs::read_to_string(q.join("read_ahead_kb")).expect("read"), "4096");
            panic!("a panic in the middle of a sweep");
        }));
        assert!(r.is_err());
        assert_eq!(std::fs::read_to_string(q.join("read_ahead_kb")).expect("read"), "128");
        assert_eq!(std::fs::read_to_string(q.join("nomerges")).expect("read"), "0");
        {
            let _g = s.guard();
            s.apply(&[("scheduler", "none".into())]).expect("apply");
            assert_eq!(std::fs::read_to_string(q.join("scheduler")).expect("read"), "none");
        }
        assert_eq!(std::fs::read_to_string(q.join("scheduler")).expect("read"), "mq-deadline");
        assert_eq!(restore_all(), 0, "nothing left to restore");
    }

    #[test]
    fn a_read_only_setting_is_reported_not_an_error() {
        let _l = super::super::tests::LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let sys = fake_sysfs();
        let s = settings(sys.path());
        let f = s.device.queue_dir.join("nr_requests");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).expect("chmod");
        // Root ignores file modes; the immutable attribute (ext4, tmpfs) stops root too.
        let immutable = nix::unistd::geteuid().is_root()
            && std::process::Command::new("chattr").arg("+i").arg(&f).status().map(|s| s.success()).unwrap_or(false);
        if nix::unistd::geteuid().is_root() && !immutable {
            eprintln!("skipped: root, and chattr +i is not available here to make a file read-only");
            return;
        }
        let ro = s.probe_writable(&["nr_requests", "read_ahead_kb", "missing_one"]);
        if immutable {
            let _ = std::process::Command::new("chattr").arg("-i").arg(&f).status();
        }
        let names: Vec<&str> = ro.iter().map(|r| r.setting.as_str()).collect();
        assert_eq!(names, ["nr_requests", "missing_one"], "{ro:?}");
        assert!(ro[0].why.contains("nr_requests"), "{ro:?}");
    }
}
