//! The listing of a dataset root cached beside its files, in `ROOT/.ringtier-listing`
//! ([`ListOptions::cache`]): a million files are listed from one file of about ten bytes a key
//! instead of a walk of every directory.
//!
//! **Never trusted over the files.** The cache is used only when every directory it was made
//! from is unchanged: the root's entries are read again and must be the same names of the same
//! types, and every other directory must have the same inode, modification time and change
//! time (an entry added, removed or renamed changes its directory's modification time; a
//! linked directory is checked at its target). A directory modified within two seconds before
//! the listing started may have changed in the same timestamp tick after it was read: such a
//! listing is not cached. Sizes read from the cache are hints ([`Listing::sizes_are_hints`]):
//! the loader reads each file to its end, whatever its size now. A cache made by a lenient
//! listing that left entries out is used only by lenient listings (a strict one lists again and
//! fails naming the entry); one without sizes only by listings that do not ask for them.
//!
//! **Hostile input.** The file is read whole only below [`MAX_CACHE_BYTES`], its body must match
//! its CRC-32C, every count is bounded by the bytes left, every key is validated as a key and
//! keys must be strictly increasing; anything else is a cache not used (and written again).
//!
//! **Written atomically, best effort.** A temporary file beneath the root's descriptor
//! (`O_EXCL | O_NOFOLLOW`) renamed over the old one: a reader sees the old cache or the new
//! one. A root that cannot be written (read-only, another user's) is listed every time.
//!
//! Format (little-endian; varints are LEB128): magic `RTLIST\0\x01`, body length (u64),
//! CRC-32C of the body (u32), body: flags (u8: 1 = sizes exact at listing), the root's entries
//! (count; name, `d_type` each), the directories (count; key, inode u64, mtime s i64 ns u32,
//! ctime s i64 ns u32 each), the files (count; each key front-coded against the previous one:
//! bytes shared, suffix; size + 1, 0 for unknown), the entries left out (count; key, kind,
//! errno + 1 or 0, message).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};

use super::listing::DirStamp;
use super::FsRoot;
use crate::error::{Error, ErrorKind, Operation};
use crate::key::{validate_key, MAX_COMPONENT_LEN, MAX_KEY_LEN, RESERVED_PREFIX};
use crate::listing::{ListOptions, Listing, UNKNOWN_SIZE};
use crate::sys as at;

/// The cache's file name in the root (reserved: never listed as a sample).
pub const LISTING_CACHE_FILE: &str = ".ringtier-listing";

/// The largest cache read or written (about 50 million keys).
pub const MAX_CACHE_BYTES: u64 = 1 << 30;

const MAGIC: &[u8; 8] = b"RTLIST\x00\x01";

/// A directory modified this close to the listing's start is not trusted to be as listed.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The longest message of an entry left out that is kept.
const MAX_MESSAGE_LEN: usize = 4096;

/// What a listing saw of the root: its entries (name, `d_type`), without reserved names.
pub(crate) type RootEntries = Vec<(String, u8)>;

/// The root's entries now, sorted, as the walk records them.
fn root_entries_now(root: &FsRoot) -> Option<RootEntries> {
    let mut out: RootEntries = at::read_dir_entries(root.root_fd())
        .ok()?
        .into_iter()
        .filter_map(|(name, t)| name.into_string().ok().map(|n| (n, t)))
        .filter(|(n, _)| !n.starts_with(RESERVED_PREFIX))
        .collect();
    out.sort();
    Some(out)
}

/// The cached listing of `root`, when there is one, it parses, it answers `options`, and every
/// directory it was made from is unchanged; `None` otherwise (list again).
pub(crate) fn load(root: &FsRoot, options: ListOptions) -> Option<Listing> {
    let data = read_cache(root)?;
    let cached = match parse(&data) {
        Ok(c) => c,
        Err(why) => {
            tracing::debug!(root = %root.root.display(), "listing cache not used: {why}");
            return None;
        }
    };
    if options.stat_files && !cached.sizes_exact {
        return None;
    }
    if !options.skip_bad && !cached.listing.skipped().is_empty() {
        return None;
    }
    if root_entries_now(root)? != cached.root_entries {
        tracing::debug!(root = %root.root.display(), "listing cache stale: the root's entries changed");
        return None;
    }
    let follow = if root.follow_links { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    for d in cached.dirs.iter().filter(|d| !d.key.is_empty()) {
        let now = at::c_name(&d.key).and_then(|c| at::fstatat(root.root_fd(), &c, follow));
        if !now.is_ok_and(|st| DirStamp::of(&d.key, &st) == *d) {
            tracing::debug!(root = %root.root.display(), dir = %d.key, "listing cache stale: a directory changed");
            return None;
        }
    }
    let mut listing = cached.listing;
    listing.set_sizes_are_hints(true);
    listing.set_from_cache(true);
    Some(listing)
}

fn read_cache(root: &FsRoot) -> Option<Vec<u8>> {
    let c = at::c_name(LISTING_CACHE_FILE).ok()?;
    let fd = at::openat2(
        root.root_fd(),
        &c,
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
    .ok()?;
    let st = at::fstat(fd.as_raw_fd()).ok()?;
    let len = st.st_size as u64;
    if !at::is_file(&st) || len > MAX_CACHE_BYTES {
        return None;
    }
    let mut data = Vec::with_capacity(len as usize);
    std::fs::File::from(fd).take(MAX_CACHE_BYTES + 1).read_to_end(&mut data).ok()?;
    Some(data)
}

/// Writes the cache of a whole-root listing that started at `started`, made from `stamps`
/// and the root's entries `root_entries`; best effort (a failure is logged at debug level).
pub(crate) fn store(
    root: &FsRoot,
    listing: &Listing,
    sizes_exact: bool,
    stamps: &[DirStamp],
    root_entries: &RootEntries,
    started: SystemTime,
) {
    let racy = started.checked_sub(RACY_WINDOW).and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
    let Some(racy) = racy else { return };
    let recent = |(s, ns): (i64, i64)| s < 0 || Duration::new(s as u64, ns.clamp(0, 999_999_999) as u32) >= racy;
    if stamps.iter().filter(|d| !d.key.is_empty()).any(|d| recent(d.mtime) || recent(d.ctime)) {
        tracing::debug!(root = %root.root.display(), "listing not cached: a directory changed in the last two seconds");
        return;
    }
    let body = encode(listing, sizes_exact, stamps, root_entries);
    if body.len() as u64 + 20 > MAX_CACHE_BYTES {
        return;
    }
    if let Err(e) = write_atomically(root, &body) {
        tracing::debug!(root = %root.root.display(), "listing not cached: {e}");
    }
}

fn write_atomically(root: &FsRoot, body: &[u8]) -> std::io::Result<()> {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = format!("{LISTING_CACHE_FILE}.tmp-{}-{nanos:x}", std::process::id());
    let c_tmp = at::c_name(&tmp)?;
    let fd = at::openat2(
        root.root_fd(),
        &c_tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )?;
    let mut file = std::fs::File::from(fd);
    let mut head = Vec::with_capacity(20);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&(body.len() as u64).to_le_bytes());
    head.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    let written = file.write_all(&head).and_then(|()| file.write_all(body));
    drop(file);
    let renamed = written
        .and_then(|()| at::c_name(LISTING_CACHE_FILE))
        .and_then(|c_final| at::renameat(root.root_fd(), &c_tmp, root.root_fd(), &c_final));
    if renamed.is_err() {
        let _ = at::unlinkat(root.root_fd(), &c_tmp);
    }
    renamed
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn encode(listing: &Listing, sizes_exact: bool, stamps: &[DirStamp], root_entries: &RootEntries) -> Vec<u8> {
    let mut out = Vec::with_capacity(listing.len() * 12 + stamps.len() * 48 + 64);
    out.push(u8::from(sizes_exact));
    put_varint(&mut out, root_entries.len() as u64);
    for (name, t) in root_entries {
        put_bytes(&mut out, name.as_bytes());
        out.push(*t);
    }
    put_varint(&mut out, stamps.len() as u64);
    for d in stamps {
        put_bytes(&mut out, d.key.as_bytes());
        out.extend_from_slice(&d.ino.to_le_bytes());
        out.extend_from_slice(&d.mtime.0.to_le_bytes());
        out.extend_from_slice(&(d.mtime.1 as u32).to_le_bytes());
        out.extend_from_slice(&d.ctime.0.to_le_bytes());
        out.extend_from_slice(&(d.ctime.1 as u32).to_le_bytes());
    }
    put_varint(&mut out, listing.len() as u64);
    let mut prev = "";
    for (key, size) in listing.iter() {
        let shared = prev.bytes().zip(key.bytes()).take_while(|(a, b)| a == b).count();
        put_varint(&mut out, shared as u64);
        put_bytes(&mut out, &key.as_bytes()[shared..]);
        put_varint(&mut out, if size == UNKNOWN_SIZE { 0 } else { size + 1 });
        prev = key;
    }
    put_varint(&mut out, listing.skipped().len() as u64);
    for s in listing.skipped() {
        put_bytes(&mut out, s.key.as_bytes());
        put_bytes(&mut out, s.error.kind().as_str().as_bytes());
        put_varint(&mut out, s.error.os_code().map_or(0, |e| e as u64 + 1));
        let msg = s.error.message();
        let mut cut = msg.len().min(MAX_MESSAGE_LEN);
        while !msg.is_char_boundary(cut) {
            cut -= 1;
        }
        put_bytes(&mut out, &msg.as_bytes()[..cut]);
    }
    out
}

/// A cache file, parsed.
struct Cached {
    sizes_exact: bool,
    root_entries: RootEntries,
    dirs: Vec<DirStamp>,
    listing: Listing,
}

/// A cursor over the body that never reads past it.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len()).ok_or("truncated")?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    /// A count of items each at least `min_bytes` long: bounded by the bytes left.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.varint()?;
        let left = (self.data.len() - self.at) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(format!("count {n} larger than the file"));
        }
        Ok(n as usize)
    }

    fn text(&mut self, max: usize) -> Result<&'a str, String> {
        let n = self.varint()?;
        if n > max as u64 {
            return Err(format!("a string of {n} bytes (at most {max})"));
        }
        std::str::from_utf8(self.bytes(n as usize)?).map_err(|_| "a string that is not UTF-8".to_string())
    }
}

fn kind_named(name: &str) -> ErrorKind {
    use ErrorKind::*;
    [
        NotFound,
        AlreadyExists,
        InvalidKey,
        InvalidInput,
        Misaligned,
        OutOfRange,
        NoSpace,
        PermissionDenied,
        Unsupported,
        Corrupt,
        ResourceExhausted,
        Shutdown,
        Busy,
        Io,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
    .unwrap_or(Io)
}

fn parse(data: &[u8]) -> Result<Cached, String> {
    if data.len() < 20 || &data[..8] != MAGIC {
        return Err("not a listing cache of this version".into());
    }
    let len = u64::from_le_bytes(data[8..16].try_into().map_err(|_| "header")?);
    let crc = u32::from_le_bytes(data[16..20].try_into().map_err(|_| "header")?);
    let body = &data[20..];
    if len != body.len() as u64 {
        return Err(format!("body of {} bytes, header says {len}", body.len()));
    }
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader { data: body, at: 0 };
    let sizes_exact = r.u8()? == 1;
    let n = r.count(2)?;
    let mut root_entries = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.text(MAX_COMPONENT_LEN)?.to_string();
        let t = r.u8()?;
        root_entries.push((name, t));
    }
    if root_entries.windows(2).any(|w| w[0] >= w[1]) {
        return Err("root entries not sorted".into());
    }
    let n = r.count(33)?;
    let mut dirs = Vec::with_capacity(n);
    for _ in 0..n {
        let key = r.text(MAX_KEY_LEN)?.to_string();
        if !key.is_empty() {
            validate_key(&key).map_err(|e| e.to_string())?;
        }
        let ino = u64::from_le_bytes(r.fixed()?);
        let mtime = (i64::from_le_bytes(r.fixed()?), i64::from(u32::from_le_bytes(r.fixed()?)));
        let ctime = (i64::from_le_bytes(r.fixed()?), i64::from(u32::from_le_bytes(r.fixed()?)));
        dirs.push(DirStamp { key, ino, mtime, ctime });
    }
    let n = r.count(3)?;
    let mut listing = Listing::new();
    let mut key = String::new();
    for _ in 0..n {
        let shared = r.varint()?;
        if shared > key.len() as u64 || !key.is_char_boundary(shared as usize) {
            return Err("a key shares more than the previous one has".into());
        }
        let suffix = r.text(MAX_KEY_LEN)?;
        let size = r.varint()?;
        let mut next = String::with_capacity(shared as usize + suffix.len());
        next.push_str(&key[..shared as usize]);
        next.push_str(suffix);
        validate_key(&next).map_err(|e| e.to_string())?;
        if !listing.is_empty() && next <= key {
            return Err("keys not strictly increasing".into());
        }
        listing.push(&next, if size == 0 { UNKNOWN_SIZE } else { size - 1 });
        key = next;
    }
    let n = r.count(4)?;
    for _ in 0..n {
        let key = r.text(MAX_KEY_LEN)?.to_string();
        let kind = kind_named(r.text(32)?);
        let errno = r.varint()?;
        let message = r.text(MAX_MESSAGE_LEN)?;
        let error = match errno {
            0 => Error::new(kind, message),
            e => Error::from_errno(i32::try_from(e - 1).map_err(|_| "errno")?, message).set_kind(kind),
        };
        listing.push_skipped(key.as_str(), error.with_operation(Operation::List).with_key(key.as_str()));
    }
    if r.at != body.len() {
        return Err("bytes after the end".into());
    }
    Ok(Cached { sizes_exact, root_entries, dirs, listing })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Listing, Vec<DirStamp>, RootEntries) {
        let mut l = Listing::new();
        for (k, s) in [("a/1.bin", 10), ("a/2.bin", UNKNOWN_SIZE), ("b/x/3.bin", 0), ("top.bin", 7)] {
            l.push(k, s);
        }
        l.push_skipped("a/dead", Error::from_errno(libc::ENOENT, "broken symbolic link: /r/a/dead"));
        let dirs = vec![
            DirStamp { key: String::new(), ino: 2, mtime: (1, 2), ctime: (3, 4) },
            DirStamp { key: "a".into(), ino: 5, mtime: (6, 7), ctime: (8, 9) },
        ];
        let root = vec![("a".to_string(), libc::DT_DIR), ("b".into(), libc::DT_DIR), ("top.bin".into(), libc::DT_REG)];
        (l, dirs, root)
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(&(body.len() as u64).to_le_bytes());
        data.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        data.extend_from_slice(body);
        data
    }

    #[test]
    fn a_cache_parses_back_to_what_was_listed() {
        let (l, dirs, root) = sample();
        let c = parse(&framed(&encode(&l, false, &dirs, &root))).expect("parse");
        assert_eq!(c.listing.iter().collect::<Vec<_>>(), l.iter().collect::<Vec<_>>());
        assert_eq!((c.dirs, c.root_entries, c.sizes_exact), (dirs, root, false));
        let s = &c.listing.skipped()[0];
        assert_eq!(
            (s.key.as_str(), s.error.kind(), s.error.os_code()),
            ("a/dead", ErrorKind::NotFound, Some(libc::ENOENT))
        );
        assert!(s.error.to_string().contains("broken symbolic link"));
    }

    #[test]
    fn hostile_caches_are_refused_not_trusted() {
        let (l, dirs, root) = sample();
        let body = encode(&l, true, &dirs, &root);
        let good = framed(&body);
        // Every truncation, and every single flipped byte, is refused (or, for a flip the
        // checksum cannot see, never panics).
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x41;
            assert!(parse(&bad).is_err(), "byte {i} flipped");
        }
        // A body with a valid checksum but hostile contents: huge counts, a key with '..',
        // keys out of order, a prefix longer than the previous key.
        let hostile = [
            vec![1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f],
            vec![1, 0, 0, 1, 0, 5, b'a', b'/', b'.', b'.', b'/', 1, 0],
            vec![1, 0, 0, 2, 0, 1, b'b', 1, 0, 1, b'a', 1, 0],
            vec![1, 0, 0, 1, 9, 1, b'b', 1, 0],
            vec![1, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ];
        for (i, body) in hostile.iter().enumerate() {
            assert!(parse(&framed(body)).is_err(), "hostile body {i}");
        }
    }
}
