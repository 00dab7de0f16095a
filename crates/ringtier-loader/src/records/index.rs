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
    pub fn parse(text: &str, origin: &str, shard_size: u64) -> Result<RecordIndex> {
        let mut entries = Vec::new();
        let mut end = 0u64;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| Error::new(ErrorKind::Corrupt, format!("index {origin}, line {}: {why}", i + 1));
            let mut f = line.split_ascii_whitespace();
            let (Some(off), Some(len)) = (f.next(), f.next()) else {
                return Err(bad("expected two columns: offset size".into()));
            };
            let off: u64 = off.parse().map_err(|_| bad(format!("bad offset {off:?}")))?;
            let len: u64 = len.parse().map_err(|_| bad(format!("bad size {len:?}")))?;
            if off < end || len == 0 || off.checked_add(len).is_none_or(|e| e > shard_size) {
                return Err(bad(format!(
                    "record at byte {off} of {len} bytes does not fit the shard ({shard_size} bytes) after the \
                     previous record's end {end}: the index does not match its shard"
                )));
            }
            end = off + len;
            entries.push((off, len));
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
}
