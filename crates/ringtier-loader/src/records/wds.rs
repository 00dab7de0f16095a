//! WebDataset shards: POSIX tar (ustar) archives in which the files sharing a key (the path up
//! to the first dot of the file name) form one sample, one field per extension:
//! `n01440764/img0001.jpg` and `n01440764/img0001.cls` are the fields `jpg` and `cls` of the
//! sample `n01440764/img0001`. Header checksums are checked; pax and GNU long-name headers are
//! understood; directories and links are ignored.

use super::{Field, Parser, Record, RecordError};

const BLOCK: usize = 512;

/// The most bytes of a GNU long-name or pax extended header read into memory: these hold a
/// path and a few attributes, never data.
pub(crate) const MAX_META_BYTES: u64 = 1 << 20;

/// Splits a tar member's path into (sample key, field name) as the `webdataset` package does.
pub fn split_key(path: &str) -> (&str, &str) {
    let base = path.rfind('/').map_or(0, |i| i + 1);
    match path[base..].find('.') {
        Some(dot) => (&path[..base + dot], &path[base + dot + 1..]),
        None => (path, ""),
    }
}

/// A numeric field of a tar header: octal digits (padded with spaces or NULs), or GNU
/// base-256 for large values (first byte 0x80; 0xff, a negative number, is refused, as is a
/// value past 64 bits). `None` for anything else.
fn octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // Two's complement after the marker bit: bit 6 of the first byte is the sign.
        if field[0] & 0x40 != 0 {
            return None;
        }
        let mut v: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let s = std::str::from_utf8(field).ok()?;
    let s = s.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return Some(0);
    }
    // Digits only (`from_str_radix` would also take a sign).
    if !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u64::from_str_radix(s, 8).ok()
}

/// A member's path for an error message: at most 200 characters of it (a pax path can be long).
fn shown(path: &str) -> String {
    match path.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &path[..i]),
        None => path.to_string(),
    }
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Appends a ustar member `path` holding `data` to `out` (for generators and tests).
pub fn write_member(out: &mut Vec<u8>, path: &str, data: &[u8]) {
    let mut h = [0u8; BLOCK];
    let name = path.as_bytes();
    if name.len() <= 100 {
        h[..name.len()].copy_from_slice(name);
    } else {
        // ustar prefix/name split at a slash.
        let split = path[..name.len().min(155)].rfind('/').unwrap_or(0);
        h[345..345 + split].copy_from_slice(&name[..split]);
        let rest = &name[split + 1..];
        h[..rest.len().min(100)].copy_from_slice(&rest[..rest.len().min(100)]);
    }
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(BLOCK), 0);
}

/// Appends the two zero blocks that end an archive.
pub fn write_end(out: &mut Vec<u8>) {
    out.resize(out.len() + 2 * BLOCK, 0);
}

enum State {
    Header {
        have: usize,
    },
    /// Member data: copied into `data` when kept, else skipped; then `pad` bytes.
    Data {
        data: Option<Vec<u8>>,
        left: u64,
        pad: usize,
        kind: Kind,
    },
    /// The end-of-archive zero block was seen.
    Ended,
    Stopped,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    LongName,
    Pax,
    Skip,
}

/// An incremental WebDataset tar parser over a shard's bytes, fed in pieces of any size.
pub(crate) struct WdsParser {
    shard: usize,
    /// Offset of the next byte fed.
    pos: u64,
    /// Offset of the end of what is parsed (the shard's size): no member may claim more.
    end: u64,
    hdr: Box<[u8; BLOCK]>,
    state: State,
    /// Offset of the current member's header.
    member_start: u64,
    /// Path of the current member (for a file member, the long name or pax path before it).
    path: String,
    /// A GNU long name or pax `path` for the next member.
    next_path: Option<String>,
    /// Offset of the first header (pax or long name included) of the next file member.
    sample_start: Option<u64>,
    /// The sample being assembled: key, offset of its first member, end of its last
    /// member so far, fields.
    sample: Option<(String, u64, u64, Vec<Field>)>,
}

impl WdsParser {
    /// A parser for shard number `shard` of `size` bytes.
    pub(crate) fn new(shard: usize, size: u64) -> Self {
        WdsParser {
            shard,
            pos: 0,
            end: size,
            hdr: Box::new([0; BLOCK]),
            state: State::Header { have: 0 },
            member_start: 0,
            path: String::new(),
            next_path: None,
            sample_start: None,
            sample: None,
        }
    }

    /// A parser of the bytes `offset..end` of a shard (one indexed sample).
    pub(crate) fn at(mut self, offset: u64, end: u64) -> Self {
        self.pos = offset;
        self.end = end;
        self
    }

    fn fatal(&mut self, offset: u64, why: String) -> RecordError {
        self.state = State::Stopped;
        RecordError { shard: self.shard, offset, fatal: true, why }
    }

    fn flush(&mut self, out: &mut Vec<Result<Record, RecordError>>) {
        if let Some((key, offset, end, fields)) = self.sample.take() {
            out.push(Ok(Record { shard: self.shard, offset, len: end - offset, key, fields }));
        }
    }

    /// Parses the header block; returns the next state or an error.
    fn header(&mut self, out: &mut Vec<Result<Record, RecordError>>) -> Option<RecordError> {
        let h = &self.hdr;
        if h.iter().all(|&b| b == 0) {
            self.flush(out);
            self.state = State::Ended;
            return None;
        }
        let stored = octal(&h[148..156]);
        let sum: u64 =
            h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
        if stored != Some(sum) {
            let (start, name) = (self.member_start, cstr(&h[..100]));
            return Some(
                self.fatal(
                    start,
                    format!("corrupt tar header of member {name:?} (checksum {stored:?}, computed {sum})"),
                ),
            );
        }
        let raw_size: [u8; 12] = std::array::from_fn(|i| h[124 + i]);
        let size = octal(&raw_size);
        let typeflag = h[156];
        let mut path = cstr(&h[..100]);
        if &h[257..262] == b"ustar" {
            let prefix = cstr(&h[345..500]);
            if !prefix.is_empty() {
                path = format!("{prefix}/{path}");
            }
        }
        let kind = match typeflag {
            b'0' | 0 | b'7' => Kind::File,
            b'L' => Kind::LongName,
            b'x' => Kind::Pax,
            _ => Kind::Skip,
        };
        if kind == Kind::File {
            self.path = self.next_path.take().unwrap_or(path);
            // A member of another key: the sample so far is whole, delivered now (not lost
            // should this member turn out truncated or corrupt).
            if self.sample.as_ref().is_some_and(|(k, ..)| k != split_key(&self.path).0) {
                self.flush(out);
            }
        } else if kind == Kind::Skip {
            // A long name or pax path names the next member, whatever its type: a directory's
            // long name is not the next file's.
            self.path = self.next_path.take().unwrap_or(path);
            self.sample_start = None;
        } else {
            self.path = path;
            if self.sample_start.is_none() {
                self.sample_start = Some(self.member_start);
            }
        }
        // The size is bounded by the bytes left before anything is allocated for it.
        let left = self.end.saturating_sub(self.pos);
        let why = match size {
            None => Some(format!("tar member {:?}: corrupt size field {raw_size:?}", shown(&self.path))),
            Some(size) if size > left => Some(format!(
                "truncated tar member {:?}: it declares {size} bytes, but only {left} bytes are left in the shard",
                shown(&self.path)
            )),
            Some(size) if matches!(kind, Kind::LongName | Kind::Pax) && size > MAX_META_BYTES => Some(format!(
                "tar member {:?}: a long-name or pax header of {size} bytes (at most {MAX_META_BYTES})",
                shown(&self.path)
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            let start = self.member_start;
            return Some(self.fatal(start, why));
        }
        let size = size.unwrap_or(0);
        let pad = (size.next_multiple_of(BLOCK as u64) - size) as usize;
        let data =
            if kind == Kind::Skip {
                None
            } else {
                let mut v = Vec::new();
                if usize::try_from(size).map_or(true, |n| v.try_reserve_exact(n).is_err()) {
                    let start = self.member_start;
                    return Some(self.fatal(
                        start,
                        format!("tar member {:?}: cannot allocate {size} bytes for it", shown(&self.path)),
                    ));
                }
                Some(v)
            };
        self.state = State::Data { data, left: size, pad, kind };
        None
    }

    fn member_done(&mut self, data: Vec<u8>, kind: Kind, out: &mut Vec<Result<Record, RecordError>>) {
        match kind {
            Kind::File => {
                let path = std::mem::take(&mut self.path);
                let (key, field) = split_key(&path);
                if self.sample.as_ref().is_some_and(|(k, ..)| k != key) {
                    self.flush(out);
                }
                let (start, end) = (self.sample_start.take().unwrap_or(self.member_start), self.pos);
                let sample = self.sample.get_or_insert_with(|| (key.to_string(), start, end, Vec::new()));
                sample.2 = end;
                sample.3.push(Field { name: field.to_string(), data });
            }
            Kind::LongName => self.next_path = Some(cstr(&data)),
            Kind::Pax => {
                // Records of "LEN key=value\n"; only `path` matters here.
                let text = String::from_utf8_lossy(&data);
                for line in text.split('\n') {
                    if let Some((_, kv)) = line.split_once(' ') {
                        if let Some(p) = kv.strip_prefix("path=") {
                            self.next_path = Some(p.to_string());
                        }
                    }
                }
            }
            Kind::Skip => {}
        }
    }
}

impl Parser for WdsParser {
    fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Result<Record, RecordError>>) {
        while !chunk.is_empty() {
            match &mut self.state {
                State::Stopped => return,
                State::Ended => {
                    // Zero padding after the end block; anything else is ignored as tar does.
                    self.pos += chunk.len() as u64;
                    return;
                }
                State::Header { have } => {
                    if *have == 0 {
                        self.member_start = self.pos;
                    }
                    let n = (BLOCK - *have).min(chunk.len());
                    self.hdr[*have..*have + n].copy_from_slice(&chunk[..n]);
                    *have += n;
                    self.pos += n as u64;
                    chunk = &chunk[n..];
                    if *have == BLOCK {
                        if let Some(e) = self.header(out) {
                            out.push(Err(e));
                            return;
                        }
                    }
                }
                State::Data { data, left, pad, kind } => {
                    if *left > 0 {
                        let n = (*left).min(chunk.len() as u64) as usize;
                        if let Some(d) = data {
                            d.extend_from_slice(&chunk[..n]);
                        }
                        *left -= n as u64;
                        self.pos += n as u64;
                        chunk = &chunk[n..];
                        continue;
                    }
                    let n = (*pad).min(chunk.len());
                    *pad -= n;
                    self.pos += n as u64;
                    chunk = &chunk[n..];
                    if *pad == 0 {
                        let (data, kind) = (data.take(), *kind);
                        self.state = State::Header { have: 0 };
                        if let Some(d) = data {
                            self.member_done(d, kind, out);
                        }
                    }
                }
            }
        }
        // A member whose data ends exactly at the end of the chunk, with no padding.
        if let State::Data { data, left: 0, pad: 0, kind } = &mut self.state {
            let (data, kind) = (data.take(), *kind);
            self.state = State::Header { have: 0 };
            if let Some(d) = data {
                self.member_done(d, kind, out);
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Result<Record, RecordError>>) {
        match &self.state {
            State::Header { have: 0 } | State::Ended => self.flush(out),
            State::Stopped => {}
            State::Header { .. } => {
                let start = self.member_start;
                let e = self.fatal(start, "truncated tar header at the end of the shard".into());
                out.push(Err(e));
            }
            State::Data { .. } => {
                let start = self.member_start;
                let why = format!("truncated tar member {:?} at the end of the shard", shown(&self.path));
                let e = self.fatal(start, why);
                out.push(Err(e));
            }
        }
    }
}
