//! Dataset manifests: every file's relative path, size and CRC-32C, so readers need no
//! directory walk and can verify what they read.
//!
//! The manifest is a text file, `.ringtier-manifest.tsv`, at the dataset root (the reserved
//! prefix keeps it out of listings and out of the key space):
//!
//! ```text
//! # ringtier-manifest v1
//! # key<TAB>size<TAB>crc32c (hex)
//! class000/img000000.jpg<TAB>123456<TAB>1a2b3c4d
//! ```
//!
//! Lines starting with `#` are comments, except that the first line must name the format and
//! version. Keys follow the object-key rules and contain no tab or newline.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::Path;

use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::fs::fsync_dir;
use ringtier_core::key::validate_key;

/// File name of the manifest inside a dataset directory.
pub const MANIFEST_FILE: &str = ".ringtier-manifest.tsv";

const HEADER: &str = "# ringtier-manifest v1";

/// The largest manifest read, in bytes (4 GiB: some 80 million files at 50 bytes a line); a
/// larger file under the manifest's name is refused before it is read.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 30;

/// CRC-32C (Castagnoli) of `data`, hardware-accelerated where the CPU has it.
pub fn checksum(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// One file of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Relative path (an object key).
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32C of the contents.
    pub crc32c: u32,
}

/// Every file of a dataset, in a fixed order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The files.
    pub entries: Vec<ManifestEntry>,
}

fn corrupt(path: &str, line: usize, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("corrupt manifest, line {line}: {why}"))
        .with_operation(Operation::Open)
        .with_key(path)
}

impl Manifest {
    /// Total bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// The largest file size.
    pub fn max_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).max().unwrap_or(0)
    }

    /// Parses manifest text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Manifest> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l.trim_end() == HEADER => {}
            Some((_, l)) if l.starts_with("# ringtier-manifest ") => {
                return Err(corrupt(origin, 1, format!("unsupported manifest version {:?}", l.trim_end()))
                    .set_kind(ErrorKind::Unsupported))
            }
            _ => return Err(corrupt(origin, 1, format!("first line must be {HEADER:?}"))),
        }
        let mut entries = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, line) in lines {
            let n = i + 1;
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let mut f = line.split('\t');
            let (Some(key), Some(size), Some(crc), None) = (f.next(), f.next(), f.next(), f.next()) else {
                return Err(corrupt(origin, n, "expected three tab-separated fields: key, size, crc32c"));
            };
            validate_key(key).map_err(|e| corrupt(origin, n, e.message()))?;
            let size = size.parse::<u64>().map_err(|_| corrupt(origin, n, format!("bad size {size:?}")))?;
            let crc32c = u32::from_str_radix(crc, 16).map_err(|_| corrupt(origin, n, format!("bad crc32c {crc:?}")))?;
            if !seen.insert(key) {
                return Err(corrupt(origin, n, format!("duplicate key {key:?}")));
            }
            entries.push(ManifestEntry { key: key.to_string(), size, crc32c });
        }
        Ok(Manifest { entries })
    }

    /// Loads `DIR/.ringtier-manifest.tsv`; one larger than [`MAX_MANIFEST_BYTES`] is refused
    /// before it is read.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let origin = path.display().to_string();
        let ctx = |e: std::io::Error| Error::from(e).with_operation(Operation::Open).with_key(origin.clone());
        let file = fs::File::open(&path).map_err(ctx)?;
        let len = file.metadata().map_err(ctx)?.len();
        let bad = |why: String| {
            Error::new(ErrorKind::Corrupt, format!("corrupt manifest: {why}"))
                .with_operation(Operation::Open)
                .with_key(origin.clone())
        };
        let too_large = |len: u64| bad(format!("{len} bytes, more than a manifest may take ({MAX_MANIFEST_BYTES})"));
        if len > MAX_MANIFEST_BYTES {
            return Err(too_large(len));
        }
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len as usize).map_err(|e| {
            Error::new(ErrorKind::ResourceExhausted, format!("manifest {origin}: cannot allocate {len} bytes: {e}"))
        })?;
        // The file may grow after the stat: read at most one byte past the bound.
        file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes).map_err(ctx)?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(too_large(bytes.len() as u64));
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| bad(format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))?;
        Self::parse(&text, &origin)
    }

    /// The manifest as text.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(64 + self.entries.len() * 48);
        s.push_str(HEADER);
        s.push_str("\n# key\tsize\tcrc32c\n");
        for e in &self.entries {
            let _ = writeln!(s, "{}\t{}\t{:08x}", e.key, e.size, e.crc32c);
        }
        s
    }

    /// Writes `DIR/.ringtier-manifest.tsv` durably and atomically (temp file, fsync, rename,
    /// directory fsync).
    pub fn store(&self, dir: &Path) -> Result<()> {
        for e in &self.entries {
            validate_key(&e.key)?;
        }
        let tmp = dir.join(format!("{MANIFEST_FILE}.tmp-{}", std::process::id()));
        let ctx = |e: std::io::Error| Error::from(e).with_operation(Operation::Commit).with_key(MANIFEST_FILE);
        let mut f = fs::File::create(&tmp).map_err(ctx)?;
        f.write_all(self.to_text().as_bytes()).map_err(ctx)?;
        f.sync_all().map_err(ctx)?;
        fs::rename(&tmp, dir.join(MANIFEST_FILE)).map_err(ctx)?;
        fsync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            entries: vec![
                ManifestEntry { key: "a/1.jpg".into(), size: 10, crc32c: checksum(b"0123456789") },
                ManifestEntry { key: "b/2.jpg".into(), size: 0, crc32c: checksum(b"") },
            ],
        }
    }

    #[test]
    fn round_trip_through_text_and_disk() {
        let m = sample();
        assert_eq!(Manifest::parse(&m.to_text(), "t").expect("parse"), m);
        let dir = tempfile::tempdir().expect("tempdir");
        m.store(dir.path()).expect("store");
        assert_eq!(Manifest::load(dir.path()).expect("load"), m);
        assert_eq!(m.total_bytes(), 10);
        assert_eq!(checksum(b"123456789"), 0xe306_9283, "CRC-32C check value");
    }

    #[test]
    fn corrupt_manifests_are_named_with_their_line() {
        let good = sample().to_text();
        let cases = [
            ("", "line 1"),
            ("# ringtier-manifest v9\n", "unsupported manifest version"),
            (&*format!("{good}x\t1\n"), "line 5: expected three"),
            (&*format!("{good}../x\t1\t0\n"), "line 5"),
            (&*format!("{good}c\tbig\t0\n"), "bad size"),
            (&*format!("{good}c\t1\tzz\n"), "bad crc32c"),
            (&*format!("{good}a/1.jpg\t1\t0\n"), "duplicate key"),
        ];
        for (text, want) in cases {
            let err = Manifest::parse(text, "m.tsv").expect_err(want);
            assert!(err.to_string().contains(want), "{want}: {err}");
            assert!(err.to_string().contains("m.tsv"), "{err}");
        }
        let err = Manifest::parse("# ringtier-manifest v9\n", "m").expect_err("version");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert_eq!(Manifest::parse("garbage", "m").expect_err("garbage").kind(), ErrorKind::Corrupt);
        let missing = Manifest::load(Path::new("/nonexistent")).expect_err("missing");
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        // Too large (a sparse file), or not text: refused, named.
        let dir = tempfile::tempdir().expect("tempdir");
        let f = fs::File::create(dir.path().join(MANIFEST_FILE)).expect("create");
        f.set_len(MAX_MANIFEST_BYTES + 1).expect("sparse");
        let e = Manifest::load(dir.path()).expect_err("too large");
        assert!(e.to_string().contains("more than a manifest may take"), "{e}");
        fs::write(dir.path().join(MANIFEST_FILE), b"# ringtier-manifest v1\n\xff\n").expect("write");
        let e = Manifest::load(dir.path()).expect_err("binary");
        assert!(e.to_string().contains("not UTF-8 text (byte 23)") && e.kind() == ErrorKind::Corrupt, "{e}");
    }
}
