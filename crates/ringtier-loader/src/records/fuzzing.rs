//! Entry points for the fuzz targets (`fuzz/` at the repository root, see `docs/FUZZING.md`):
//! each parses arbitrary bytes as a shard or an index, and panics only where what came out
//! breaks an invariant of the parser. Not an API: hidden from the docs, may change any time.

use super::{tfrecord::TfRecordParser, wds::WdsParser, Parser, Record, RecordError, RecordIndex};

type Parsed = Vec<std::result::Result<Record, RecordError>>;

/// The piece size to feed a shard in, from the input's first byte (1 to 256 bytes, or the whole
/// shard when it is 0), and the shard: the rest of the input.
fn split(data: &[u8]) -> (usize, &[u8]) {
    match data.split_first() {
        Some((&0, shard)) => (shard.len().max(1), shard),
        Some((&b, shard)) => (usize::from(b), shard),
        None => (1, data),
    }
}

fn feed_all(p: &mut dyn Parser, shard: &[u8], piece: usize) -> Parsed {
    let mut out = Vec::new();
    for c in shard.chunks(piece.max(1)) {
        p.feed(c, &mut out);
    }
    p.finish(&mut out);
    out
}

/// What every parse must satisfy: records in shard order, not overlapping, within the shard,
/// holding no more bytes than they span; errors within the shard; nothing after a fatal
/// error.
fn check(out: &Parsed, shard_len: usize) {
    let mut end = 0u64;
    let mut stopped = false;
    for r in out {
        assert!(!stopped, "output after a fatal error: {r:?}");
        match r {
            Ok(rec) => {
                assert!(rec.offset >= end, "record at {} overlaps the one before (ends at {end})", rec.offset);
                end = rec.offset.checked_add(rec.len).expect("record end overflows");
                assert!(end <= shard_len as u64, "record ends at {end}, past the shard's {shard_len} bytes");
                assert!(rec.bytes() <= rec.len, "record holds {} bytes in a span of {}", rec.bytes(), rec.len);
            }
            Err(e) => {
                assert!(e.offset <= shard_len as u64, "error at {} past the shard's {shard_len} bytes", e.offset);
                assert!(!e.why.contains('\n'), "a multi-line error: {:?}", e.why);
                stopped = e.fatal;
            }
        }
    }
}

/// Parses `data` (a piece size byte, then a shard) as a TFRecord shard, checks the output,
/// and parses every record again alone at its offset, as a read through an index does: it
/// must come out the same.
pub fn tfrecord(data: &[u8]) {
    let (piece, shard) = split(data);
    let out = feed_all(&mut TfRecordParser::new(0, shard.len() as u64), shard, piece);
    check(&out, shard.len());
    for rec in out.iter().flatten() {
        let (off, end) = (rec.offset, rec.offset + rec.len);
        let mut p = TfRecordParser::new(0, shard.len() as u64).at(off, end);
        let again = feed_all(&mut p, &shard[off as usize..end as usize], piece);
        assert_eq!(again.len(), 1, "record at {off} parsed alone: {again:?}");
        assert_eq!(again[0].as_ref().ok(), Some(rec), "record at {off} parsed alone");
    }
}

/// Parses `data` (a piece size byte, then a shard) as a WebDataset tar shard, checks the
/// output, and parses every sample again alone at its offset, as a read through an index
/// does: it must come out the same.
pub fn wds(data: &[u8]) {
    let (piece, shard) = split(data);
    let out = feed_all(&mut WdsParser::new(0, shard.len() as u64), shard, piece);
    check(&out, shard.len());
    for rec in out.iter().flatten() {
        let (off, end) = (rec.offset, rec.offset + rec.len);
        let mut p = WdsParser::new(0, shard.len() as u64).at(off, end);
        let again = feed_all(&mut p, &shard[off as usize..end as usize], piece);
        assert_eq!(again.len(), 1, "sample at {off} parsed alone: {again:?}");
        assert_eq!(again[0].as_ref().ok(), Some(rec), "sample at {off} parsed alone");
    }
}

/// Parses `data` as an index: its first two bytes give the shard size (0 to 65535 bytes),
/// the rest is the text (not UTF-8: lossily converted). A parsed index lists records in
/// order within the shard, and its DALI text parses back to it.
pub fn index(data: &[u8]) {
    let (size, text) = match data {
        [a, b, rest @ ..] => (u64::from(u16::from_le_bytes([*a, *b])), rest),
        _ => (0, data),
    };
    let text = String::from_utf8_lossy(text);
    let Ok(idx) = RecordIndex::parse(&text, "fuzz.idx", size) else { return };
    let mut end = 0;
    for &(off, len) in &idx.entries {
        assert!(off >= end && len > 0 && off + len <= size, "entry ({off}, {len}) after {end} in {size} bytes");
        end = off + len;
    }
    let again = RecordIndex::parse(&idx.to_text(), "fuzz.idx", size).expect("an index's own text parses");
    assert_eq!(again, idx, "the index's text parses back to it");
}
