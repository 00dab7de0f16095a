//! [`SmallTmpfs`]: a real file system that fills up, for tests of a full tier.

/// A tmpfs of a fixed size mounted on a temp dir under `parent`, unmounted when dropped: a real
/// file system that fills up, for tests of a full tier.
#[derive(Debug)]
pub struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax, e.g. `16m`); `None`, with the reason printed,
    /// where mounting is not permitted (not root, no CAP_SYS_ADMIN, a container).
    pub fn mount(size: &str, parent: &std::path::Path) -> Option<SmallTmpfs> {
        let dir = tempfile::Builder::new().prefix("small-fs").tempdir_in(parent).ok()?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallTmpfs { dir }),
            Ok(o) => {
                eprintln!("skipped: cannot mount a {size} tmpfs here: {}", String::from_utf8_lossy(&o.stderr).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    /// The mount point.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
