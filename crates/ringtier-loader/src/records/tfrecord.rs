//! TFRecord framing: per record, a little-endian `u64` length, the masked CRC-32C of those 8
//! bytes, the data, and the masked CRC-32C of the data. Both CRCs are checked.

use super::{Field, Parser, Record, RecordError};

/// TensorFlow's CRC mask: rotate right by 15 bits and add a constant.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one framed record holding `data` to `out`.
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

const HEADER: usize = 12;
const FOOTER: usize = 4;

enum State {
    /// Collecting the 12-byte header.
    Header { have: usize },
    /// Copying `len` bytes of data into the record (the one copy of each record).
    Data { data: Vec<u8>, len: usize },
    /// Collecting the 4-byte data CRC.
    Footer { data: Vec<u8>, have: usize },
    /// After a framing error the rest of the shard cannot be trusted.
    Stopped,
}

/// An incremental TFRecord parser over a shard's bytes, fed in pieces of any size.
pub(crate) struct TfRecordParser {
    shard: usize,
    size: u64,
    /// Offset of the next byte fed.
    pos: u64,
    /// Offset of the record being parsed.
    start: u64,
    hdr: [u8; HEADER],
    foot: [u8; FOOTER],
    state: State,
}

impl TfRecordParser {
    /// A parser for shard number `shard` of `size` bytes.
    pub(crate) fn new(shard: usize, size: u64) -> Self {
        TfRecordParser {
            shard,
            size,
            pos: 0,
            start: 0,
            hdr: [0; HEADER],
            foot: [0; FOOTER],
            state: State::Header { have: 0 },
        }
    }

    /// A parser of the bytes `offset..end` of a shard (one indexed record).
    pub(crate) fn at(mut self, offset: u64, end: u64) -> Self {
        self.pos = offset;
        self.start = offset;
        self.size = end;
        self
    }

    fn err(&mut self, offset: u64, fatal: bool, why: String) -> RecordError {
        if fatal {
            self.state = State::Stopped;
        }
        RecordError { shard: self.shard, offset, fatal, why }
    }
}

impl Parser for TfRecordParser {
    fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Result<Record, RecordError>>) {
        while !chunk.is_empty() {
            match &mut self.state {
                State::Stopped => return,
                State::Header { have } => {
                    if *have == 0 {
                        self.start = self.pos;
                    }
                    let n = (HEADER - *have).min(chunk.len());
                    self.hdr[*have..*have + n].copy_from_slice(&chunk[..n]);
                    *have += n;
                    self.pos += n as u64;
                    chunk = &chunk[n..];
                    if *have < HEADER {
                        continue;
                    }
                    let len_bytes: [u8; 8] = self.hdr[..8].try_into().unwrap_or_default();
                    let len = u64::from_le_bytes(len_bytes);
                    let crc = u32::from_le_bytes(self.hdr[8..].try_into().unwrap_or_default());
                    if crc != masked_crc32c(&len_bytes) {
                        let start = self.start;
                        let e = self.err(start, true, "CRC mismatch of the record length".into());
                        out.push(Err(e));
                        return;
                    }
                    let left = self.size.saturating_sub(self.start.saturating_add((HEADER + FOOTER) as u64));
                    if len > left {
                        let start = self.start;
                        let e = self.err(
                            start,
                            true,
                            format!("truncated record: length {len} but only {left} bytes left in the shard"),
                        );
                        out.push(Err(e));
                        return;
                    }
                    // `len` fits the bytes left in the shard: they exist, so may be allocated
                    // (where memory allows; a failed allocation is an error, not an abort).
                    let mut data = Vec::new();
                    let Some(n) = usize::try_from(len).ok().filter(|&n| data.try_reserve_exact(n).is_ok()) else {
                        let start = self.start;
                        let e = self.err(start, true, format!("cannot allocate {len} bytes for a record"));
                        out.push(Err(e));
                        return;
                    };
                    self.state = State::Data { data, len: n };
                }
                State::Data { data, len } => {
                    let n = (*len - data.len()).min(chunk.len());
                    data.extend_from_slice(&chunk[..n]);
                    self.pos += n as u64;
                    chunk = &chunk[n..];
                    if data.len() == *len {
                        let data = std::mem::take(data);
                        self.state = State::Footer { data, have: 0 };
                    }
                }
                State::Footer { data, have } => {
                    let n = (FOOTER - *have).min(chunk.len());
                    self.foot[*have..*have + n].copy_from_slice(&chunk[..n]);
                    *have += n;
                    self.pos += n as u64;
                    chunk = &chunk[n..];
                    if *have < FOOTER {
                        continue;
                    }
                    let data = std::mem::take(data);
                    self.state = State::Header { have: 0 };
                    let crc = u32::from_le_bytes(self.foot);
                    if crc != masked_crc32c(&data) {
                        // The length was sound, so the next record starts where it says.
                        let start = self.start;
                        out.push(Err(self.err(start, false, "CRC mismatch of the record data".into())));
                    } else {
                        out.push(Ok(Record {
                            shard: self.shard,
                            offset: self.start,
                            len: (HEADER + data.len() + FOOTER) as u64,
                            key: String::new(),
                            fields: vec![Field { name: String::new(), data }],
                        }));
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Result<Record, RecordError>>) {
        let mid = match &self.state {
            State::Header { have } => *have > 0,
            State::Data { .. } | State::Footer { .. } => true,
            State::Stopped => false,
        };
        if mid {
            let start = self.start;
            out.push(Err(self.err(start, true, "truncated record at the end of the shard".into())));
        }
    }
}
