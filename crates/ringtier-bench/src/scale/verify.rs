//! Exactly once, checked: the files of the data set (walked by the parent, not taken from the
//! loader's listing), the ranks' record files (each sample's key, CRC-32C and size, one line
//! each), and, on request, the bytes on disk (every file read again and hashed by the parent).

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ringtier_core::key::{MAX_KEY_LEN, RESERVED_PREFIX};
use serde::Serialize;

/// Deepest directory nesting walked (a link loop ends here instead of recursing forever).
const MAX_DEPTH: usize = 64;

/// Names shown per kind of failure.
const EXAMPLES: usize = 3;

/// The data set's files: every file under the root (links followed, as a dataset tier does),
/// as keys relative to it, sorted; components with the reserved prefix (`.ringtier-listing`,
/// the listing cache) are not samples and are left out.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileSet {
    keys: Vec<String>,
}

impl FileSet {
    /// Walks `dir`.
    pub(crate) fn walk(dir: &Path) -> Result<FileSet> {
        fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) -> Result<()> {
            if depth > MAX_DEPTH {
                bail!("{}: directories nested deeper than {MAX_DEPTH} (a link loop?)", dir.display());
            }
            for ent in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
                let ent = ent.with_context(|| format!("listing {}", dir.display()))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if name.starts_with(RESERVED_PREFIX) {
                    continue;
                }
                let key = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
                let ty = ent.file_type().with_context(|| format!("{}", ent.path().display()))?;
                let is_dir =
                    ty.is_dir() || (ty.is_symlink() && std::fs::metadata(ent.path()).is_ok_and(|m| m.is_dir()));
                if is_dir {
                    walk(&ent.path(), &key, depth + 1, out)?;
                } else {
                    out.push(key);
                }
            }
            Ok(())
        }
        let mut keys = Vec::new();
        walk(dir, "", 0, &mut keys)?;
        keys.sort_unstable();
        Ok(FileSet { keys })
    }

    /// Files in the set.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The position of `key` in the set.
    fn index(&self, key: &str) -> Option<usize> {
        self.keys.binary_search_by(|k| k.as_str().cmp(key)).ok()
    }

    /// Every file's path under `dir`.
    pub(crate) fn paths<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
        self.keys.iter().map(move |k| dir.join(k))
    }

    /// Reads every file under `dir` again and hashes it: `(CRC-32C, size)` per file of the set,
    /// in set order, on `threads` threads; a file that cannot be read is `None`.
    pub(crate) fn hash_on_disk(&self, dir: &Path, threads: usize) -> Vec<Option<(u32, u64)>> {
        let threads = threads.max(1);
        let chunk = self.keys.len().div_ceil(threads).max(1);
        let mut out: Vec<Option<(u32, u64)>> = vec![None; self.keys.len()];
        std::thread::scope(|s| {
            for (keys, slots) in self.keys.chunks(chunk).zip(out.chunks_mut(chunk)) {
                s.spawn(move || {
                    let mut buf = Vec::new();
                    for (k, slot) in keys.iter().zip(slots) {
                        buf.clear();
                        let read = std::fs::File::open(dir.join(k)).and_then(|mut f| f.read_to_end(&mut buf));
                        *slot = read.ok().map(|n| (crc32c::crc32c(&buf), n as u64));
                    }
                });
            }
        });
        out
    }
}

/// What the ranks of one pass recorded, against the file set.
#[derive(Debug, Clone, Default)]
pub(crate) struct Records {
    /// Times each file of the set was read.
    counts: Vec<u32>,
    /// Each file's first recorded `(CRC-32C, size)`.
    seen: Vec<Option<(u32, u64)>>,
    /// Samples recorded.
    samples: u64,
    /// Keys recorded that are not files of the set, with how many there were.
    unknown: Vec<String>,
    unknown_count: u64,
    /// Files read twice whose two reads differ.
    inconsistent: Vec<String>,
    inconsistent_count: u64,
}

impl Records {
    /// Reads the record files of a pass (`key\tcrc32c-hex\tsize` lines) against `set`. A record
    /// file is bounded like any input: no larger than the set's keys could make it, and each
    /// line must parse.
    pub(crate) fn read(set: &FileSet, files: &[PathBuf]) -> Result<Records> {
        let mut r = Records { counts: vec![0; set.len()], seen: vec![None; set.len()], ..Records::default() };
        // A line is a key, a tab, 8 hex digits, a tab, a size of at most 20 digits, a newline.
        let max_line = MAX_KEY_LEN + 32;
        let max_bytes = (max_line as u64) * (set.len() as u64 + 1);
        for path in files {
            let f = std::fs::File::open(path).with_context(|| format!("opening the record file {}", path.display()))?;
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            if len > max_bytes {
                bail!("{}: {len} bytes, more than {max_bytes} for {} files", path.display(), set.len());
            }
            let mut lines = BufReader::new(f.take(max_bytes));
            let mut line = String::new();
            let mut n = 0u64;
            loop {
                line.clear();
                let got = (&mut lines)
                    .take(max_line as u64 + 1)
                    .read_line(&mut line)
                    .with_context(|| format!("reading {}", path.display()))?;
                if got == 0 {
                    break;
                }
                n += 1;
                let bad = || format!("{} line {n}: not `key\\tcrc32c\\tsize`: {:?}", path.display(), line.trim_end());
                if got > max_line || !line.ends_with('\n') {
                    bail!("{}", bad());
                }
                let mut parts = line.trim_end_matches('\n').split('\t');
                let (Some(key), Some(crc), Some(size), None) = (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    bail!("{}", bad());
                };
                let crc = u32::from_str_radix(crc, 16).with_context(bad)?;
                let size: u64 = size.parse().with_context(bad)?;
                r.add(set, key, (crc, size));
            }
        }
        Ok(r)
    }

    fn add(&mut self, set: &FileSet, key: &str, value: (u32, u64)) {
        self.samples += 1;
        let Some(i) = set.index(key) else {
            self.unknown_count += 1;
            if self.unknown.len() < EXAMPLES {
                self.unknown.push(key.to_string());
            }
            return;
        };
        self.counts[i] = self.counts[i].saturating_add(1);
        match self.seen[i] {
            None => self.seen[i] = Some(value),
            Some(first) if first != value => {
                self.inconsistent_count += 1;
                if self.inconsistent.len() < EXAMPLES {
                    self.inconsistent.push(key.to_string());
                }
            }
            Some(_) => {}
        }
    }

    /// The verdict, with the bytes on disk (`disk`, from [`FileSet::hash_on_disk`]) when given.
    pub(crate) fn check(&self, set: &FileSet, disk: Option<&[Option<(u32, u64)>]>) -> ExactlyOnce {
        let mut v = ExactlyOnce {
            samples: self.samples,
            expected: set.len(),
            unknown: self.unknown_count,
            inconsistent: self.inconsistent_count,
            bytes_checked: disk.is_some(),
            ..ExactlyOnce::default()
        };
        v.examples.unknown = self.unknown.clone();
        v.examples.inconsistent = self.inconsistent.clone();
        for (i, &c) in self.counts.iter().enumerate() {
            let key = || set.keys[i].clone();
            match c {
                0 => {
                    v.missing += 1;
                    if v.examples.missing.len() < EXAMPLES {
                        v.examples.missing.push(key());
                    }
                }
                1 => v.distinct += 1,
                _ => {
                    v.distinct += 1;
                    v.read_twice += 1;
                    if v.examples.twice.len() < EXAMPLES {
                        v.examples.twice.push(key());
                    }
                }
            }
            if let (Some(disk), Some(read)) = (disk, self.seen[i]) {
                if disk.get(i).copied().flatten() != Some(read) {
                    v.bytes_wrong += 1;
                    if v.examples.wrong.len() < EXAMPLES {
                        v.examples.wrong.push(key());
                    }
                }
            }
        }
        v.ok = v.missing == 0
            && v.read_twice == 0
            && v.unknown == 0
            && v.inconsistent == 0
            && v.bytes_wrong == 0
            && v.distinct == v.expected
            && v.samples == v.expected as u64;
        v
    }
}

/// Up to three names of each kind of failure.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Examples {
    pub(crate) twice: Vec<String>,
    pub(crate) missing: Vec<String>,
    pub(crate) unknown: Vec<String>,
    pub(crate) inconsistent: Vec<String>,
    pub(crate) wrong: Vec<String>,
}

/// Whether a pass read every file of the data set exactly once across its ranks.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ExactlyOnce {
    /// Samples the ranks recorded, all together.
    pub(crate) samples: u64,
    /// Distinct files of the set read.
    pub(crate) distinct: usize,
    /// Files in the set (walked by the parent).
    pub(crate) expected: usize,
    pub(crate) read_twice: usize,
    pub(crate) missing: usize,
    /// Keys read that are not files of the set.
    pub(crate) unknown: u64,
    /// Files read more than once with different bytes.
    pub(crate) inconsistent: u64,
    /// Whether the bytes read were compared with the files on disk (`--verify-bytes`).
    pub(crate) bytes_checked: bool,
    /// Files whose CRC-32C or size as read differs from the file on disk now.
    pub(crate) bytes_wrong: usize,
    pub(crate) examples: Examples,
    /// All of it held: every file once, nothing else, and (when checked) the bytes on disk.
    pub(crate) ok: bool,
}

impl ExactlyOnce {
    /// One line for the report.
    pub(crate) fn text(&self) -> String {
        format!(
            "{}: {} of {} files, {} twice, {} missing, {} not in the set, {}",
            if self.ok { "ok" } else { "FAILED" },
            self.distinct,
            self.expected,
            self.read_twice,
            self.missing,
            self.unknown,
            if self.bytes_checked {
                format!("{} with bytes other than on disk", self.bytes_wrong)
            } else {
                "bytes not compared with the disk".to_string()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(keys: &[&str]) -> FileSet {
        let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        keys.sort();
        FileSet { keys }
    }

    #[test]
    fn exactly_once_holds_and_each_failure_is_named() {
        let set = set_of(&["a/1", "a/2", "b/3"]);
        let mut r = Records { counts: vec![0; 3], seen: vec![None; 3], ..Records::default() };
        for k in ["a/1", "a/2", "b/3"] {
            r.add(&set, k, (7, 10));
        }
        assert!(r.check(&set, None).ok);
        let disk = vec![Some((7, 10)); 3];
        assert!(r.check(&set, Some(&disk)).ok);
        let mut wrong = disk.clone();
        wrong[1] = Some((8, 10));
        let v = r.check(&set, Some(&wrong));
        assert!(!v.ok && v.bytes_wrong == 1 && v.examples.wrong == ["a/2"], "{v:?}");
        r.add(&set, "a/1", (7, 10));
        r.add(&set, "zzz", (1, 1));
        let v = r.check(&set, None);
        assert!(!v.ok && v.read_twice == 1 && v.unknown == 1, "{v:?}");
        let mut r = Records { counts: vec![0; 3], seen: vec![None; 3], ..Records::default() };
        r.add(&set, "a/1", (7, 10));
        let v = r.check(&set, None);
        assert!(!v.ok && v.missing == 2 && v.examples.missing == ["a/2", "b/3"], "{v:?}");
    }

    #[test]
    fn record_files_are_parsed_and_bad_lines_refused() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("c0")).expect("mkdir");
        std::fs::write(dir.path().join("c0/x.bin"), b"hello").expect("write");
        std::fs::write(dir.path().join(".ringtier-listing"), b"cache").expect("write");
        let set = FileSet::walk(dir.path()).expect("walk");
        assert_eq!(set.keys, ["c0/x.bin"]);
        let rec = dir.path().join("rec");
        std::fs::write(&rec, format!("c0/x.bin\t{:08x}\t5\n", crc32c::crc32c(b"hello"))).expect("write");
        let r = Records::read(&set, std::slice::from_ref(&rec)).expect("read");
        let disk = set.hash_on_disk(dir.path(), 2);
        assert!(r.check(&set, Some(&disk)).ok, "{:?}", r.check(&set, Some(&disk)));
        std::fs::write(&rec, "c0/x.bin\tnot-hex\t5\n").expect("write");
        assert!(Records::read(&set, std::slice::from_ref(&rec)).is_err());
        std::fs::write(&rec, "c0/x.bin\t00000000\n").expect("write");
        assert!(Records::read(&set, std::slice::from_ref(&rec)).is_err());
    }
}
