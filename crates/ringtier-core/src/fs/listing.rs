//! Listing a file tier's root: one walk of its directories ([`FsRoot::list`],
//! [`FsRoot::list_with`]).
//!
//! Entries are read with `getdents64` and their `d_type`: a directory is opened without a
//! stat, and, when sizes are not asked for ([`ListOptions::stat_files`] false), a regular file
//! is listed without one (its size [`UNKNOWN_SIZE`]); links and entries of unknown type are
//! always stat'd. An entry that cannot be listed (a dangling link, a link loop, a directory
//! that cannot be read, a name that is not UTF-8) fails a strict listing with an error naming
//! it, and is recorded and left out of a lenient one ([`ListOptions::skip_bad`]).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::FsRoot;
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::{validate_prefix, RESERVED_PREFIX};
use crate::listing::{ListOptions, Listing, UNKNOWN_SIZE};
use crate::sys as at;
use crate::tier::ObjectMeta;

/// A directory a listing read: its key (`""` for the root) and what tells whether its entries
/// changed since (see [`super::listing_cache`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirStamp {
    /// The directory's key.
    pub(crate) key: String,
    /// Its inode number.
    pub(crate) ino: u64,
    /// Its modification time (seconds, nanoseconds): changes when an entry is added, removed
    /// or renamed.
    pub(crate) mtime: (i64, i64),
    /// Its change time (seconds, nanoseconds): changes with the modification time and with
    /// its mode or owner.
    pub(crate) ctime: (i64, i64),
}

impl DirStamp {
    pub(crate) fn of(key: &str, st: &libc::stat) -> Self {
        DirStamp {
            key: key.to_string(),
            ino: st.st_ino,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// Whether entries under `key` can match `prefix`: (as a directory, as a file).
fn wanted(prefix: &str, key: &str) -> (bool, bool) {
    if prefix.is_empty() {
        return (true, true);
    }
    let file = key.starts_with(prefix);
    // A directory is descended into when its keys can still match: the prefix goes on below
    // it ("a/" for prefix "a/b"), or it is the prefix's last component ("a" for "a/").
    let below = prefix.len() > key.len() && prefix.starts_with(key) && prefix.as_bytes()[key.len()] == b'/';
    let exact = prefix.len() == key.len() + 1 && prefix.starts_with(key) && prefix.ends_with('/');
    (file || below || exact, file)
}

/// A directory still to read: its descriptor, key, and the (device, inode) of it and of the
/// directories above it (a linked directory met again below itself is a loop).
type Pending = (OwnedFd, String, Vec<(u64, u64)>);

impl FsRoot {
    /// Committed objects whose key starts with `prefix`, sorted, every file stat'd. In a root
    /// that does not follow links, a link met on the way is an error that names it; in one that
    /// does, a dangling link or a loop is. The first such entry fails the listing
    /// ([`FsRoot::list_with`] can leave them out instead).
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        self.walk(
            prefix,
            true,
            false,
            None,
            &mut |key, st| {
                out.push(ObjectMeta {
                    key: key.to_string(),
                    size: st.map_or(0, |s| s.st_size as u64),
                    modified: st.and_then(at::mtime),
                })
            },
            &mut |_, e| Err(e),
        )?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Committed objects whose key starts with `prefix`, sorted, as one arena, listed as
    /// `options` says (see [`ListOptions`]): bad entries left out and recorded, or the first
    /// one an error naming it; sizes from a stat per file, or unknown for regular files; the
    /// cached listing `ROOT/.ringtier-listing` used when it is current, and written otherwise
    /// (whole-root listings only).
    pub fn list_with(&self, prefix: &str, options: ListOptions) -> Result<Listing> {
        let use_cache = options.cache && prefix.is_empty();
        if use_cache {
            if let Some(listing) = super::listing_cache::load(self, options) {
                return Ok(listing);
            }
        }
        let started = std::time::SystemTime::now();
        let mut root_entries = Vec::new();
        let mut listing = Listing::new();
        let mut skipped = Vec::new();
        let lenient = options.skip_bad;
        let stamps = self.walk(
            prefix,
            options.stat_files,
            lenient,
            use_cache.then_some(&mut root_entries),
            &mut |key, st| listing.push(key, st.map_or(UNKNOWN_SIZE, |s| s.st_size as u64)),
            &mut |key, e| {
                if lenient {
                    skipped.push((key, e));
                    Ok(())
                } else {
                    Err(e)
                }
            },
        )?;
        for (key, e) in skipped {
            listing.push_skipped(key, e);
        }
        listing.sort();
        listing.shrink_to_fit();
        if use_cache {
            root_entries.sort();
            super::listing_cache::store(self, &listing, options.stat_files, &stamps, &root_entries, started);
        }
        Ok(listing)
    }

    /// Walks the directories under the root that can hold keys starting with `prefix`, calling
    /// `file` for each regular file (with its stat, or `None` when `stat_files` is false and
    /// the directory entry said it is a regular file) and `bad` for each entry that cannot be
    /// listed (an error naming it; `bad`'s error ends the walk). `report_names`: names that
    /// are not UTF-8 go to `bad` too (otherwise they are passed over: no key can name them).
    /// `root_entries`: where to record the entries of the root itself (name and `d_type`,
    /// reserved names left out), when the walk starts there. Returns the stamps of the
    /// directories read.
    pub(crate) fn walk(
        &self,
        prefix: &str,
        stat_files: bool,
        report_names: bool,
        mut root_entries: Option<&mut super::listing_cache::RootEntries>,
        file: &mut dyn FnMut(&str, Option<&libc::stat>),
        bad: &mut dyn FnMut(String, Error) -> Result<()>,
    ) -> Result<Vec<DirStamp>> {
        validate_prefix(prefix).map_err(|e| e.with_operation(Operation::List))?;
        let list_err = |e: Error| e.with_operation(Operation::List);
        // Start at the deepest directory the prefix names completely.
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let start = match self.dir_fd(dir_part, false, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == ErrorKind::NotFound && !dir_part.is_empty() => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e).with_key(prefix)),
        };
        let mut stamps = Vec::new();
        let mut ancestors = Vec::new();
        if self.follow_links && !dir_part.is_empty() {
            // The directories above the start: a link below it may lead back to them.
            if let Ok(st) = at::fstat(self.root_fd()) {
                ancestors.push((st.st_dev, st.st_ino));
            }
            for (i, _) in dir_part.match_indices('/') {
                if let Ok(st) = at::c_name(&dir_part[..i]).and_then(|c| at::fstatat(self.root_fd(), &c, 0)) {
                    ancestors.push((st.st_dev, st.st_ino));
                }
            }
        }
        if let Ok(st) = at::fstat(start.as_raw_fd()) {
            stamps.push(DirStamp::of(dir_part, &st));
            if self.follow_links {
                ancestors.push((st.st_dev, st.st_ino));
            }
        }
        let mut stack: Vec<Pending> = vec![(start, dir_part.to_string(), ancestors)];
        let mut key = String::new();
        while let Some((dir, rel, ancestors)) = stack.pop() {
            let entries = match at::read_dir_entries(dir.as_raw_fd()) {
                Ok(entries) => entries,
                Err(e) => {
                    let name = if rel.is_empty() { prefix } else { rel.as_str() };
                    bad(name.to_string(), list_err(Error::from(e)).with_key(name))?;
                    continue;
                }
            };
            for (name, d_type) in entries {
                let name = match name.into_string() {
                    Ok(name) => name,
                    Err(e) => {
                        if report_names {
                            let lossy = String::from_utf8_lossy(e.into_cstring().as_bytes()).into_owned();
                            let shown = if rel.is_empty() { lossy } else { format!("{rel}/{lossy}") };
                            let why = Error::new(ErrorKind::InvalidKey, "a name that is not UTF-8 cannot be a key")
                                .with_operation(Operation::List)
                                .with_key(shown.as_str());
                            bad(shown, why)?;
                        }
                        continue;
                    }
                };
                if name.starts_with(RESERVED_PREFIX) {
                    continue;
                }
                if rel.is_empty() {
                    if let Some(r) = root_entries.as_deref_mut() {
                        r.push((name.clone(), d_type));
                    }
                }
                key.clear();
                if !rel.is_empty() {
                    key.push_str(&rel);
                    key.push('/');
                }
                key.push_str(&name);
                let (wanted_dir, wanted_file) = wanted(prefix, &key);
                if !wanted_dir && !wanted_file {
                    continue;
                }
                let injected = self.injected(&key);
                match d_type {
                    libc::DT_REG if !stat_files => {
                        if !wanted_file {
                            continue;
                        }
                        if let Some(errno) = injected {
                            bad(key.clone(), self.entry_error(&key, io::Error::from_raw_os_error(errno)))?;
                            continue;
                        }
                        file(&key, None);
                    }
                    libc::DT_DIR => {
                        if wanted_dir {
                            self.descend(
                                dir.as_raw_fd(),
                                &name,
                                &key,
                                injected,
                                &ancestors,
                                &mut stack,
                                &mut stamps,
                                bad,
                            )?;
                        }
                    }
                    libc::DT_FIFO | libc::DT_CHR | libc::DT_BLK | libc::DT_SOCK => {}
                    _ => {
                        // A link, an entry of unknown type, or a file whose size is wanted.
                        let stat = match injected {
                            Some(errno) => Err(self.entry_error(&key, io::Error::from_raw_os_error(errno))),
                            None => self.stat_in(dir.as_raw_fd(), &name, &key),
                        };
                        let st = match stat {
                            Ok(st) => st,
                            Err(e) if e.kind() == ErrorKind::NotFound && e.os_code() == Some(libc::ENOENT) => {
                                if self.follow_links && self.is_link_at(dir.as_raw_fd(), &name) {
                                    let why = Error::new(
                                        ErrorKind::NotFound,
                                        format!("broken symbolic link: {}", self.root.join(&key).display()),
                                    )
                                    .with_operation(Operation::List)
                                    .with_key(key.as_str());
                                    bad(key.clone(), why)?;
                                }
                                // Otherwise deleted between readdir and stat: not listed.
                                continue;
                            }
                            Err(e) if e.os_code() == Some(libc::ELOOP) && self.follow_links => {
                                let why = Error::new(
                                    ErrorKind::InvalidInput,
                                    format!(
                                        "symbolic link loop: {} (too many levels of symbolic links)",
                                        self.root.join(&key).display()
                                    ),
                                )
                                .with_operation(Operation::List)
                                .with_key(key.as_str());
                                bad(key.clone(), why)?;
                                continue;
                            }
                            Err(e) => {
                                bad(key.clone(), list_err(e).with_key(key.as_str()))?;
                                continue;
                            }
                        };
                        if at::is_dir(&st) {
                            if wanted_dir {
                                self.descend(
                                    dir.as_raw_fd(),
                                    &name,
                                    &key,
                                    None,
                                    &ancestors,
                                    &mut stack,
                                    &mut stamps,
                                    bad,
                                )?;
                            }
                        } else if at::is_file(&st) && wanted_file {
                            file(&key, Some(&st));
                        }
                    }
                }
            }
        }
        Ok(stamps)
    }

    /// Opens the directory `name` of `dir` (key `key`) and queues it, unless it is a loop, it
    /// vanished, or it cannot be opened (then `bad` hears of it).
    #[allow(clippy::too_many_arguments)]
    fn descend(
        &self,
        dir: RawFd,
        name: &str,
        key: &str,
        injected: Option<i32>,
        ancestors: &[(u64, u64)],
        stack: &mut Vec<Pending>,
        stamps: &mut Vec<DirStamp>,
        bad: &mut dyn FnMut(String, Error) -> Result<()>,
    ) -> Result<()> {
        let opened = match injected {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => at::c_name(name)
                .and_then(|c| at::openat2(dir, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0, self.resolve_flags())),
        };
        let sub = match opened {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return bad(key.to_string(), self.entry_error(key, e)),
        };
        let st = match at::fstat(sub.as_raw_fd()) {
            Ok(st) => st,
            Err(e) => return bad(key.to_string(), self.entry_error(key, e)),
        };
        let id = (st.st_dev, st.st_ino);
        if self.follow_links && ancestors.contains(&id) {
            let why = Error::new(
                ErrorKind::InvalidInput,
                format!("symbolic link loop: {} leads back to a directory it is in", self.root.join(key).display()),
            )
            .with_operation(Operation::List)
            .with_key(key);
            return bad(key.to_string(), why);
        }
        stamps.push(DirStamp::of(key, &st));
        let mut below = ancestors.to_vec();
        if self.follow_links {
            below.push(id);
        }
        stack.push((sub, key.to_string(), below));
        Ok(())
    }

    /// The error of a listing entry `key` the kernel refused: a link named where links are not
    /// followed, otherwise the OS error with the key.
    fn entry_error(&self, key: &str, e: io::Error) -> Error {
        self.explain_eloop(key, e).with_operation(Operation::List).with_key(key)
    }

    /// The errno a fail point arms for the listing entry `key` (feature `fail-points`).
    #[allow(unused_variables)]
    fn injected(&self, key: &str) -> Option<i32> {
        #[cfg(feature = "fail-points")]
        if let Some(f) = &self.fail {
            return f.listing_errno(key);
        }
        None
    }

    pub(super) fn is_link_at(&self, dir: RawFd, name: &str) -> bool {
        at::c_name(name)
            .ok()
            .and_then(|c| at::fstatat(dir, &c, libc::AT_SYMLINK_NOFOLLOW).ok())
            .is_some_and(|st| at::is_link(&st))
    }
}

#[cfg(test)]
mod tests {
    use super::wanted;

    #[test]
    fn prefixes_select_directories_and_files() {
        assert_eq!(wanted("", "a"), (true, true));
        assert_eq!(wanted("a/", "a"), (true, false));
        assert_eq!(wanted("a/b", "a"), (true, false));
        assert_eq!(wanted("a/b", "a/bc"), (true, true));
        assert_eq!(wanted("a/b", "ab"), (false, false));
        assert_eq!(wanted("ab", "a"), (false, false));
        assert_eq!(wanted("a", "ab"), (true, true));
    }
}
