//! A file-system image: what a crash state holds, built by applying trace operations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringtier_core::fs::trace::FsOp;

/// The id of the file outside the store that must never change.
pub const OUTSIDE_FILE: u64 = u64::MAX;

/// How one write of a crash state persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Persist {
    /// Whole.
    Whole,
    /// Not at all.
    Lost,
    /// Its first `n` bytes (a 4 KiB boundary of the file).
    Torn(u64),
    /// Its first `n` bytes, then zeros to its end (a zero-filled tail).
    ZeroTail(u64),
}

/// Files by id, names (relative paths) pointing at them, directories. Contents are shared
/// between clones until one of them writes (so a clone costs the maps, not the bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// File contents by id.
    pub files: BTreeMap<u64, Arc<Vec<u8>>>,
    /// Name -> file id.
    pub names: BTreeMap<PathBuf, u64>,
    /// Directories (relative paths).
    pub dirs: BTreeSet<PathBuf>,
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl Image {
    /// The image a workload starts from: `roots` (its tiers' directories) and `outside` (a
    /// directory next to them) with one file, `outside/keep`.
    pub fn initial(roots: &[&str], outside_data: &[u8]) -> Image {
        let mut img = Image::default();
        for r in roots {
            img.dirs.insert(PathBuf::from(r));
        }
        img.dirs.insert(PathBuf::from("outside"));
        img.files.insert(OUTSIDE_FILE, Arc::new(outside_data.to_vec()));
        img.names.insert(PathBuf::from("outside/keep"), OUTSIDE_FILE);
        img
    }

    fn dir_exists(&self, p: &Path) -> bool {
        p.as_os_str().is_empty() || self.dirs.contains(p)
    }

    /// Applies `op` (paths already relative) as `persist` says for a write. Returns whether it
    /// took effect: an operation whose preconditions the state lacks (a rename of a name that
    /// never persisted, an entry in a directory that did not) does nothing, as on a real file
    /// system after such a crash.
    pub fn apply(&mut self, op: &FsOp, persist: Persist) -> bool {
        if persist == Persist::Lost {
            return false;
        }
        match op {
            FsOp::Create { file, path } => {
                if !self.dir_exists(&parent(path)) {
                    return false;
                }
                self.files.entry(*file).or_default();
                self.names.insert(path.clone(), *file);
                true
            }
            FsOp::Write { file, offset, data, .. } => {
                let Some(content) = self.files.get_mut(file) else { return false };
                let content = Arc::make_mut(content);
                let (keep, zeros) = match persist {
                    Persist::Whole => (data.len(), 0),
                    Persist::Lost => return false,
                    Persist::Torn(n) => ((n as usize).min(data.len()), 0),
                    Persist::ZeroTail(n) => {
                        let n = (n as usize).min(data.len());
                        (n, data.len() - n)
                    }
                };
                let start = *offset as usize;
                let end = start + keep + zeros;
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[start..start + keep].copy_from_slice(&data[..keep]);
                content[start + keep..end].fill(0);
                true
            }
            FsOp::SetLen { file, len } => match self.files.get_mut(file) {
                Some(c) => {
                    Arc::make_mut(c).resize(*len as usize, 0);
                    true
                }
                None => false,
            },
            FsOp::Mkdir { path } => {
                if !self.dir_exists(&parent(path)) {
                    return false;
                }
                self.dirs.insert(path.clone())
            }
            FsOp::Rename { from, to } => {
                if !self.dir_exists(&parent(to)) {
                    return false;
                }
                match self.names.remove(from) {
                    Some(id) => {
                        self.names.insert(to.clone(), id);
                        true
                    }
                    None => false,
                }
            }
            FsOp::Unlink { path } => self.names.remove(path).is_some(),
            // Only an empty directory goes (as the kernel's rmdir).
            FsOp::Rmdir { path } => {
                let holds = self.names.keys().any(|n| n.starts_with(path) && n != path)
                    || self.dirs.iter().any(|d| d.starts_with(path) && d != path);
                !holds && self.dirs.remove(path)
            }
            FsOp::Fsync { .. } | FsOp::FsyncDir { .. } | FsOp::Mark(_) => true,
        }
    }

    /// Contents of every name under `prefix` (relative), for comparisons.
    pub fn contents_under(&self, prefix: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        self.names
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(p, id)| (p.clone(), self.files.get(id).map(|c| c.to_vec()).unwrap_or_default()))
            .collect()
    }

    /// Writes the image under `dir` (which must be empty): every reachable directory and name.
    pub fn materialize(&self, dir: &Path) -> std::io::Result<()> {
        for d in &self.dirs {
            std::fs::create_dir_all(dir.join(d))?;
        }
        for (name, id) in &self.names {
            // Reachable only through directories that persisted.
            let mut ok = true;
            let mut p = parent(name);
            while !p.as_os_str().is_empty() {
                if !self.dirs.contains(&p) {
                    ok = false;
                    break;
                }
                p = parent(&p);
            }
            if ok {
                std::fs::write(dir.join(name), self.files.get(id).map(|c| c.as_slice()).unwrap_or_default())?;
            }
        }
        Ok(())
    }
}
