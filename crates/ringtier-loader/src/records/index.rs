//! Per-shard indexes of record offsets, for a true global shuffle.
//!
//! The text format is DALI's `tfrecord2idx`: one line per record, `offset size` in decimal
//! (size = bytes of the record in the shard, framing included). `ringtier index` writes
//! `SHARD.idx` beside each shard; indexes written by DALI's tool read the same. For WebDataset
//! shards the same two columns give each sample's first header and its span.
//!
//! An index is untrusted input: its size is bounded by what an index of its shard can hold
//! ([`RecordIndex::max_text_bytes`]) before it is read, each line by
//! [`MAX_INDEX_LINE_BYTES`], and every entry by the shard's size.

use std::io::Read as _;
use std::path::Path;

use ringtier_core::error::{Error, ErrorKind, Operation, Result};

/// The most bytes of one line of an index. A DALI line is two numbers; a `wds2idx` line
/// lists a sample's members, four short columns each.
pub const MAX_INDEX_LINE_BYTES: usize = 1 << 20;

/// The most bytes of an index file, whatever its shard's size: 1 GiB (some 50 million
/// records of one shard in DALI's format).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// The records of one shard: (offset, size) each, in shard order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordIndex {
    /// (byte offset, bytes) of every record.
    pub entries: Vec<(u64, u64)>,
}

impl RecordIndex {
    /// Parses index text (DALI's `tfrecord2idx` format); `origin` names it in errors. Each
    /// record must start at or after the previous one's end and end within `shard_size`.
    /// A `wds2idx` index (first line `v1.x N`) is recognized by its first line.
    /// Text longer than [`RecordIndex::max_text_bytes`] or a line longer than
    /// [`MAX_INDEX_LINE_BYTES`] is refused.
    pub fn parse(text: &str, origin: &str, shard_size: u64) -> Result<RecordIndex> {
        let max = Self::max_text_bytes(shard_size);
        if text.len() as u64 > max {
            return Err(too_large(origin, text.len() as u64, shard_size, max));
        }
        let mut entries = Vec::new();
        let mut end = 0u64;
        let mut wds: Option<(usize, usize)> = None;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| Error::new(ErrorKind::Corrupt, format!("index {origin}, line {}: {why}", i + 1));
            if line.len() > MAX_INDEX_LINE_BYTES {
                return Err(bad(format!("a line of {} bytes (at most {MAX_INDEX_LINE_BYTES})", line.len())));
            }
            if entries.is_empty() && wds.is_none() && line.starts_with('v') {
                wds = Some(wds2idx_header(line).map_err(bad)?);
                continue;
            }
            let (off, len) = match wds {
                Some((columns, _)) => wds2idx_sample(line, columns).map_err(bad)?,
                None => {
                    let mut f = line.split_ascii_whitespace();
                    let (Some(off), Some(len)) = (f.next(), f.next()) else {
                        return Err(bad("expected two columns: offset size".into()));
                    };
                    let off: u64 = off.parse().map_err(|_| bad(format!("bad offset {:?}", shown(off))))?;
                    let len: u64 = len.parse().map_err(|_| bad(format!("bad size {:?}", shown(len))))?;
                    (off, len)
                }
            };
            if off < end || len == 0 || off.checked_add(len).is_none_or(|e| e > shard_size) {
                return Err(bad(format!(
                    "record at byte {off} of {len} bytes does not fit the shard ({shard_size} bytes) after the \
                     previous record's end {end}: the index does not match its shard"
                )));
            }
            end = off + len;
            entries.push((off, len));
        }
        if let Some((_, n)) = wds {
            if n != entries.len() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("index {origin}: its first line announces {n} samples, it lists {}", entries.len()),
                ));
            }
        }
        Ok(RecordIndex { entries })
    }

    /// The most bytes an index of a shard of `shard_size` bytes may take: 64 KiB (comments)
    /// plus 4 bytes per byte of the shard (a DALI line of at most 42 bytes per record of at
    /// least 16; a `wds2idx` line of a few hundred bytes per member of at least 512), and at
    /// most [`MAX_INDEX_BYTES`].
    pub fn max_text_bytes(shard_size: u64) -> u64 {
        shard_size.saturating_mul(4).saturating_add(64 << 10).min(MAX_INDEX_BYTES)
    }

    /// Reads and parses the index file `path` of a shard of `shard_size` bytes (see
    /// [`RecordIndex::parse`]); a file larger than [`RecordIndex::max_text_bytes`] is refused
    /// before it is read, and one that is not UTF-8 text is an error naming it.
    pub fn load(path: &Path, shard_size: u64) -> Result<RecordIndex> {
        let origin = path.display().to_string();
        let ctx = |e: std::io::Error| Error::from(e).with_operation(Operation::Open).with_key(origin.clone());
        let file = std::fs::File::open(path).map_err(ctx)?;
        let max = Self::max_text_bytes(shard_size);
        let len = file.metadata().map_err(ctx)?.len();
        if len > max {
            return Err(too_large(&origin, len, shard_size, max));
        }
        // The file may grow after the stat: read at most one byte past the bound.
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len as usize).map_err(|e| {
            Error::new(ErrorKind::ResourceExhausted, format!("index {origin}: cannot allocate {len} bytes: {e}"))
        })?;
        file.take(max + 1).read_to_end(&mut bytes).map_err(ctx)?;
        if bytes.len() as u64 > max {
            return Err(too_large(&origin, bytes.len() as u64, shard_size, max));
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            Error::new(ErrorKind::Corrupt, format!("index {origin}: not UTF-8 text (byte {})", e.valid_up_to()))
        })?;
        Self::parse(text, &origin, shard_size)
    }

    /// The index as text.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(self.entries.len() * 16);
        for (o, l) in &self.entries {
            s.push_str(&format!("{o} {l}\n"));
        }
        s
    }

    /// The largest record.
    pub fn max_len(&self) -> u64 {
        self.entries.iter().map(|e| e.1).max().unwrap_or(0)
    }
}

/// A column for an error message: at most 32 characters of it.
fn shown(column: &str) -> String {
    match column.char_indices().nth(32) {
        Some((i, _)) => format!("{}...", &column[..i]),
        None => column.to_string(),
    }
}

fn too_large(origin: &str, len: u64, shard_size: u64, max: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!(
            "index {origin}: {len} bytes, more than an index of its {shard_size}-byte shard can take ({max}): the \
             index does not match its shard"
        ),
    )
}

/// Tar block size: a member's header and the padding of its data.
const TAR_BLOCK: u64 = 512;

/// The first line of a `wds2idx` index: (columns per member, samples announced).
fn wds2idx_header(line: &str) -> std::result::Result<(usize, usize), String> {
    let mut f = line.split_ascii_whitespace();
    let (version, count) = (f.next().unwrap_or(""), f.next());
    let columns = match version {
        "v1.2" => 4,
        "v1.1" | "v1.0" => 3,
        other => {
            return Err(format!("unknown wds2idx index version {:?} (v1.0, v1.1 and v1.2 are read)", shown(other)))
        }
    };
    let n = count.and_then(|c| c.parse().ok()).ok_or_else(|| format!("expected `{} SAMPLES`", shown(version)))?;
    Ok((columns, n))
}

/// One sample line of a `wds2idx` index: (offset of its first header, bytes to the end of its
/// last member's padded data).
fn wds2idx_sample(line: &str, columns: usize) -> std::result::Result<(u64, u64), String> {
    let n = line.split_ascii_whitespace().count();
    if n == 0 || n % columns != 0 {
        return Err(format!(
            "expected groups of {columns} columns (ext offset size{})",
            if columns == 4 { " name" } else { "" }
        ));
    }
    let (mut first, mut last) = (u64::MAX, 0u64);
    // (offset, size) are the second and third columns of each group.
    let mut f = line.split_ascii_whitespace();
    while let (Some(_ext), Some(off), Some(size)) = (f.next(), f.next(), f.next()) {
        if columns == 4 {
            f.next();
        }
        let off: u64 = off.parse().map_err(|_| format!("bad offset {:?}", shown(off)))?;
        let size: u64 = size.parse().map_err(|_| format!("bad size {:?}", shown(size)))?;
        if off < TAR_BLOCK || off % TAR_BLOCK != 0 {
            return Err(format!("member data at byte {off} is not after a 512-byte tar header on a block boundary"));
        }
        first = first.min(off - TAR_BLOCK);
        let end = off
            .checked_add(size)
            .and_then(|e| e.checked_next_multiple_of(TAR_BLOCK))
            .ok_or_else(|| format!("member at byte {off} of {size} bytes overflows"))?;
        last = last.max(end);
    }
    Ok((first, last - first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dali_text_round_trips_and_bad_indexes_are_named() {
        let idx = RecordIndex { entries: vec![(0, 116), (116, 30), (146, 20)] };
        assert_eq!(RecordIndex::parse(&idx.to_text(), "a.idx", 166).expect("parse"), idx);
        assert_eq!(RecordIndex::parse("0 116\n116 30  \n\n146 20\n", "a.idx", 166).expect("dali"), idx);
        for (text, want) in [
            ("0 116\n100 30\n", "line 2"),
            ("0 200\n", "does not match its shard"),
            ("x 1\n", "bad offset"),
            ("5\n", "two columns"),
        ] {
            let e = RecordIndex::parse(text, "a.idx", 166).expect_err(want);
            assert!(e.to_string().contains(want) && e.to_string().contains("a.idx"), "{e}");
        }
    }

    #[test]
    fn wds2idx_indexes_read_as_sample_spans() {
        // Two samples of two members each: headers at 0, 1024 | 2048, 3584; data 512 B, 3 B |
        // 600 B, 1 B (padded to 512-byte blocks).
        let v12 = "v1.2 2\njpg 512 512 a.jpg cls 1536 3 a.cls\njpg 2560 600 b.jpg cls 4096 1 b.cls\n";
        let want = RecordIndex { entries: vec![(0, 2048), (2048, 2560)] };
        assert_eq!(RecordIndex::parse(v12, "s.idx", 4096 + 1024).expect("v1.2"), want);
        let v11 = "v1.1 2\njpg 512 512 cls 1536 3\njpg 2560 600 cls 4096 1\n";
        assert_eq!(RecordIndex::parse(v11, "s.idx", 4096 + 1024).expect("v1.1"), want);
        for (text, why) in [
            ("v1.2 3\njpg 512 512 a.jpg\n", "announces 3 samples"),
            ("v9 1\njpg 512 1 a\n", "unknown wds2idx index version"),
            ("v1.2 1\njpg 512 1\n", "groups of 4"),
            ("v1.2 1\njpg 700 1 a.jpg\n", "block boundary"),
            ("v1.2 1\njpg 512 9000 a.jpg\n", "does not match its shard"),
            ("v1.2 2\njpg 1024 1 b.jpg\njpg 512 1 a.jpg\n", "line 3"),
        ] {
            let e = RecordIndex::parse(text, "s.idx", 5120).expect_err(why);
            assert!(e.to_string().contains(why) && e.to_string().contains("s.idx"), "{why}: {e}");
        }
    }

    #[test]
    fn hostile_indexes_are_bounded_errors() {
        let long = format!("0 {}\n", "1".repeat(MAX_INDEX_LINE_BYTES));
        let big = "0 1\n".repeat(40_000);
        for (text, size, want) in [
            (long.as_str(), 1 << 30, "a line of"),
            (big.as_str(), 1000, "more than an index of its 1000-byte shard"),
            ("0 99999999999999999999999\n", 100, "bad size \"99999999999999999999999\""),
            ("v1.2 1\njpg 18446744073709551104 511 a.jpg\n", u64::MAX, "overflows"),
            ("v1.2 1\njpg 512 18446744073709551615 a.jpg\n", u64::MAX, "overflows"),
            ("0 18446744073709551615\n", 1000, "does not fit the shard"),
            ("5 18446744073709551615\n", u64::MAX, "does not fit the shard"),
        ] {
            let e = RecordIndex::parse(text, "h.idx", size).expect_err(want);
            assert!(e.to_string().contains(want) && e.to_string().contains("h.idx"), "{want}: {e}");
            assert_eq!(e.kind(), ErrorKind::Corrupt);
        }
        assert_eq!(RecordIndex::max_text_bytes(0), 64 << 10);
        assert_eq!(RecordIndex::max_text_bytes(u64::MAX), MAX_INDEX_BYTES);
    }

    #[test]
    fn load_bounds_the_file_before_reading_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.idx");
        std::fs::write(&path, "0 16\n16 20\n").expect("write");
        assert_eq!(RecordIndex::load(&path, 36).expect("load").entries, vec![(0, 16), (16, 20)]);
        // Larger than an index of its shard can be: refused from its size (a sparse file).
        let f = std::fs::File::create(&path).expect("create");
        f.set_len(1 << 40).expect("sparse");
        let e = RecordIndex::load(&path, 36).expect_err("too large");
        assert!(e.to_string().contains("more than an index"), "{e}");
        std::fs::write(&path, b"0 16\n\xff\xfe 20\n").expect("write");
        let e = RecordIndex::load(&path, 36).expect_err("binary");
        assert!(e.to_string().contains("not UTF-8 text (byte 5)") && e.to_string().contains("s.idx"), "{e}");
        let e = RecordIndex::load(&dir.path().join("missing.idx"), 36).expect_err("missing");
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
}
