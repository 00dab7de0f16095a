//! The cold pass: one rule for every experiment. As root, `sync` and
//! `echo 3 > /proc/sys/vm/drop_caches` (the whole page cache, dentries and inodes); when not
//! root, or when that write fails (a read-only `/proc/sys` in a container), `sync` and
//! `posix_fadvise(POSIX_FADV_DONTNEED)` on every file of the set, which works without root.
//! Every report says which of the two ran ([`ColdMethod`]). `RINGTIER_COLD=fadvise` asks for
//! the eviction alone, also as root.

use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use serde::Serialize;

/// How a pass was made cold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColdMethod {
    /// `sync; echo 3 > /proc/sys/vm/drop_caches` (root).
    DropCaches,
    /// `posix_fadvise(DONTNEED)` on every file of the set.
    Fadvise,
    /// Not made cold (warm passes, asked for).
    Warm,
}

impl ColdMethod {
    /// The name reports use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ColdMethod::DropCaches => "drop_caches",
            ColdMethod::Fadvise => "posix_fadvise(DONTNEED)",
            ColdMethod::Warm => "warm",
        }
    }
}

impl std::fmt::Display for ColdMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ColdMethod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Evicts `path` from the page cache (`posix_fadvise(DONTNEED)`); dirty pages must have been
/// written back first.
fn evict(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).map_err(std::io::Error::from)
}

/// `RINGTIER_COLD=fadvise`: evict only the files of the set, also as root (a shared machine
/// whose page cache others use, or a comparison with figures taken by eviction). Any other
/// value, or none, keeps the rule above.
fn fadvise_only() -> bool {
    std::env::var_os("RINGTIER_COLD").is_some_and(|v| v == "fadvise")
}

/// Writes back and drops the whole page cache (root only).
fn drop_caches() -> std::io::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
}

/// The cold-pass rule with its options.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cold {
    /// Warm passes: nothing is evicted.
    pub(crate) warm: bool,
    /// Fail when the whole page cache cannot be dropped (`--drop-caches`), instead of falling
    /// back to evicting the files.
    pub(crate) require_drop_caches: bool,
    /// A file of the set that cannot be evicted (gone, unreadable) is passed over instead of
    /// being an error (`--on-error skip`: the pass itself reports it).
    pub(crate) tolerate_unreadable: bool,
    /// Drop only the files' pages (`posix_fadvise(DONTNEED)`), keeping inodes and dentries: for
    /// comparisons with fio, which stats every file before its timed phase.
    pub(crate) keep_metadata: bool,
}

impl Cold {
    /// The rule with its defaults: cold, falling back to eviction, every file must evict.
    pub(crate) fn new() -> Cold {
        Cold::default()
    }

    /// Makes the next read of every file in `files` cold; says how.
    pub(crate) fn pass<P: AsRef<Path>>(&self, files: impl IntoIterator<Item = P>) -> Result<ColdMethod> {
        if self.warm {
            return Ok(ColdMethod::Warm);
        }
        if !fadvise_only() && !self.keep_metadata {
            match drop_caches() {
                Ok(()) => return Ok(ColdMethod::DropCaches),
                Err(e) if self.require_drop_caches => {
                    return Err(e).context("dropping the page cache (--drop-caches needs root)")
                }
                Err(_) => {}
            }
        }
        for f in files {
            let f = f.as_ref();
            if let Err(e) = evict(f) {
                if !self.tolerate_unreadable {
                    bail!("{}: {e} (evicting it from the page cache before a cold pass)", f.display());
                }
            }
        }
        Ok(ColdMethod::Fadvise)
    }

    /// [`Cold::pass`] over every file under the directories `dirs`.
    pub(crate) fn pass_dirs(&self, dirs: &[&Path]) -> Result<ColdMethod> {
        let mut files = Vec::new();
        if !self.warm {
            for d in dirs {
                files.extend(super::files_under(d)?);
            }
        }
        self.pass(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cold_pass_says_how_and_missing_files_fail_unless_tolerated() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), b"x").expect("write");
        let how = Cold::new().pass_dirs(&[dir.path()]).expect("cold");
        assert!(matches!(how, ColdMethod::DropCaches | ColdMethod::Fadvise), "{how}");
        assert_eq!(Cold { warm: true, ..Cold::new() }.pass([dir.path().join("a")]).expect("warm"), ColdMethod::Warm);
        if how == ColdMethod::Fadvise {
            assert!(Cold::new().pass([dir.path().join("missing")]).is_err());
            let tolerant = Cold { tolerate_unreadable: true, ..Cold::new() };
            assert_eq!(tolerant.pass([dir.path().join("missing")]).expect("tolerated"), ColdMethod::Fadvise);
        }
        assert_eq!(serde_json::to_value(how).expect("json"), serde_json::json!(how.as_str()));
        // Metadata kept: the files' pages only, whatever root may do.
        let files_only = Cold { keep_metadata: true, ..Cold::new() };
        assert_eq!(files_only.pass([dir.path().join("a")]).expect("fadvise"), ColdMethod::Fadvise);
        assert!(files_only.pass([dir.path().join("missing")]).is_err());
    }
}
