//! Per-shard indexes of record offsets, for a true global shuffle.
//!
//! The text format is DALI's `tfrecord2idx`: one line per record, `offset size` in decimal
//! (size = bytes of the record in the shard, framing included). `ringtier index` writes
//! `SHARD.idx` beside each shard; indexes written by DALI's tool read the same. For WebDataset
//! shards the same two columns give each sample's first header and its span.

use ringtier_core::error::{Error, ErrorKind, Result};

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
    pub fn parse(text: &str, origin: &str, shard_size: u64) -> Result<RecordIndex> {
        let mut entries = Vec::new();
        let mut end = 0u64;
        let mut wds: Option<(usize, usize)> = None;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| Error::new(ErrorKind::Corrupt, format!("index {origin}, line {}: {why}", i + 1));
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
                    let off: u64 = off.parse().map_err(|_| bad(format!("bad offset {off:?}")))?;
                    let len: u64 = len.parse().map_err(|_| bad(format!("bad size {len:?}")))?;
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

/// Tar block size: a member's header and the padding of its data.
const TAR_BLOCK: u64 = 512;

/// The first line of a `wds2idx` index: (columns per member, samples announced).
fn wds2idx_header(line: &str) -> std::result::Result<(usize, usize), String> {
    let mut f = line.split_ascii_whitespace();
    let (version, count) = (f.next().unwrap_or(""), f.next());
    let columns = match version {
        "v1.2" => 4,
        "v1.1" | "v1.0" => 3,
        other => return Err(format!("unknown wds2idx index version {other:?} (v1.0, v1.1 and v1.2 are read)")),
    };
    let n = count.and_then(|c| c.parse().ok()).ok_or_else(|| format!("expected `{version} SAMPLES`"))?;
    Ok((columns, n))
}

/// One sample line of a `wds2idx` index: (offset of its first header, bytes to the end of its
/// last member's padded data).
fn wds2idx_sample(line: &str, columns: usize) -> std::result::Result<(u64, u64), String> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.is_empty() || f.len() % columns != 0 {
        return Err(format!(
            "expected groups of {columns} columns (ext offset size{})",
            if columns == 4 { " name" } else { "" }
        ));
    }
    let (mut first, mut last) = (u64::MAX, 0u64);
    for m in f.chunks(columns) {
        let off: u64 = m[1].parse().map_err(|_| format!("bad offset {:?}", m[1]))?;
        let size: u64 = m[2].parse().map_err(|_| format!("bad size {:?}", m[2]))?;
        if off < TAR_BLOCK || off % TAR_BLOCK != 0 {
            return Err(format!("member data at byte {off} is not after a 512-byte tar header on a block boundary"));
        }
        first = first.min(off - TAR_BLOCK);
        let end = off.checked_add(size).ok_or_else(|| format!("member at byte {off} of {size} bytes overflows"))?;
        last = last.max(end.next_multiple_of(TAR_BLOCK));
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
}
