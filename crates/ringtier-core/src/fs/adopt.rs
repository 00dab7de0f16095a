//! Adoption ([`FsRoot::adopt`]): a regular file that a program wrote under the root itself
//! (TensorFlow's saver into a directory of the fast tier) published as an object without its
//! bytes being written again.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::*;
use crate::tier::Adopted;

/// Bytes read per `pread` while an adopted file is checksummed (kept small: the copy out of
/// the page cache stays in the CPU's cache for the CRC).
const CRC_READ_BYTES: usize = 1 << 20;

/// Files at least this large are checksummed by several threads at once.
const CRC_SPLIT_BYTES: u64 = 32 << 20;

/// The most threads that checksum one file.
const CRC_MAX_THREADS: usize = 4;

/// What a `stat` is, in words, for an error about a file that is not a regular one.
fn kind_of(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// The CRC-32C of `len` bytes of `file` from `offset`, and how many there were (fewer at its
/// end), read in [`CRC_READ_BYTES`] pieces.
fn crc_range(file: &File, offset: u64, len: u64) -> Result<(u64, u32)> {
    let mut buf = vec![0u8; CRC_READ_BYTES.min(usize::try_from(len).unwrap_or(usize::MAX)).max(1)];
    let (mut done, mut crc) = (0u64, 0u32);
    while done < len {
        let want = buf.len().min(usize::try_from(len - done).unwrap_or(usize::MAX));
        match file.read_at(&mut buf[..want], offset + done) {
            Ok(0) => break,
            Ok(n) => {
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                done += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::from(e).with_operation(Operation::Read)),
        }
    }
    Ok((done, crc))
}

/// The CRC-32C of the first `size` bytes of `file` and how many there were: one thread, or
/// for a large file up to [`CRC_MAX_THREADS`] on ranges of it, their CRCs combined.
fn checksum(file: &File, size: u64) -> Result<(u64, u32)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(CRC_MAX_THREADS);
    if size < CRC_SPLIT_BYTES || threads < 2 {
        return crc_range(file, 0, size);
    }
    let piece = size.div_ceil(threads as u64);
    let results: Vec<Result<(u64, u32)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|i| {
                let (start, end) = (i * piece, ((i + 1) * piece).min(size));
                s.spawn(move || crc_range(file, start, end.saturating_sub(start)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a checksum thread panicked"))))
            .collect()
    });
    let (mut total, mut crc) = (0u64, 0u32);
    for (i, r) in results.into_iter().enumerate() {
        let (n, c) = r?;
        crc = crc32c::crc32c_combine(crc, c, n as usize);
        total += n;
        if n < piece && (i as u64 + 1) * piece < size {
            // Short before the end: the file shrank under us; report what was there.
            return Ok((total, crc));
        }
    }
    Ok((total, crc))
}

impl FsRoot {
    /// [`Tier::adopt`](crate::Tier::adopt) for the file tiers: publishes the regular file at
    /// `from` (a path under the root, written as a key) as the object `key` without copying
    /// it, and returns it with the CRC-32C of its bytes.
    ///
    /// 1. `from` is reached from the root's descriptor without following any link (a link on
    ///    the way or at `from` is [`ErrorKind::PermissionDenied`] naming it) and must be a
    ///    regular file ([`ErrorKind::InvalidInput`] for a FIFO, a directory, a device).
    /// 2. A file with more than one link (another name could change the object later) or on
    ///    another file system than the root (a rename cannot move it) is declined: `Ok(None)`,
    ///    nothing changed.
    /// 3. It is renamed into the staging directory under a name of this process (from here a
    ///    crash leaves it where [`FsRoot::lock`] removes dead writers' files), opened there
    ///    again without following links and checked to be the file looked at in 1.
    /// 4. Its writeback is started (`sync_file_range`), its bytes read once for the CRC-32C
    ///    (from the page cache: it was just written), then [`FsRoot::commit_staged`]: data
    ///    fsync, parents created and fsynced, rename onto `key`, directory fsync.
    ///
    /// An error after 3 puts the file back at `from` (or removes it where that fails). The
    /// caller must not change the file while it is adopted; a size that changed meanwhile is
    /// an error. A root that follows links adopts nothing (it is read-only).
    pub fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        self.check_writable(Operation::Commit, key)?;
        let ctx = |e: Error| e.with_operation(Operation::Commit).with_key(from);
        validate_key(from).map_err(ctx)?;
        validate_key(key).map_err(|e| e.with_operation(Operation::Commit))?;
        if from == key {
            return Err(ctx(Error::new(ErrorKind::InvalidInput, "a file cannot be adopted under its own name")));
        }
        let (parent, leaf) = split_key(from);
        let src_dir = self.dir_fd(parent, false, false).map_err(ctx)?;
        let st = self.stat_in(src_dir.as_raw_fd(), leaf, from).map_err(ctx)?;
        if !at::is_file(&st) {
            return Err(ctx(Error::new(
                ErrorKind::InvalidInput,
                format!("{} is {}: only regular files are adopted", self.path_of(from).display(), kind_of(&st)),
            )));
        }
        if st.st_nlink != 1 {
            return Ok(self.declined(from, &format!("it has {} links (another name could change it)", st.st_nlink)));
        }
        let root = at::fstat(self.root_fd()).map_err(|e| ctx(Error::from(e)))?;
        if st.st_dev != root.st_dev {
            return Ok(self.declined(from, "it lies on another file system than the tier's root"));
        }
        let dir = Arc::new(self.dir_fd(STAGING_DIR, true, false).map_err(ctx)?);
        let staged = StagedFile::new_name(dir).map_err(ctx)?;
        let (staging_fd, staged_name) = staged.dir_and_name();
        let c_leaf = at::c_name(leaf).map_err(|e| ctx(Error::from(e)))?;
        match at::renameat(src_dir.as_raw_fd(), &c_leaf, staging_fd, staged_name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                return Ok(self.declined(from, "a mount point lies between it and the tier's staging directory"))
            }
            Err(e) => return Err(ctx(Error::from(e))),
        }
        match self.adopt_staged(&staged, &st, key) {
            Ok(adopted) => Ok(Some(adopted)),
            Err(e) => {
                // Put back where it was, so that a failed adoption loses nothing of the caller's.
                if at::renameat(staging_fd, staged_name, src_dir.as_raw_fd(), &c_leaf).is_err() {
                    let _ = staged.remove();
                }
                Err(e.with_operation(Operation::Commit))
            }
        }
    }

    /// Steps 3 (the check) and 4 of [`FsRoot::adopt`], on the file now in staging.
    fn adopt_staged(&self, staged: &StagedFile, looked_at: &libc::stat, key: &str) -> Result<Adopted> {
        let file = staged.reopen(libc::O_RDONLY)?;
        let st = at::fstat(file.as_raw_fd()).map_err(|e| Error::from(e).with_key(staged.display()))?;
        if (st.st_dev, st.st_ino) != (looked_at.st_dev, looked_at.st_ino) || !at::is_file(&st) {
            return Err(Error::new(ErrorKind::Io, "the file was replaced while it was being adopted").with_key(key));
        }
        // A live writer's staged file (as `create_staged` makes them): another process's `lock`
        // does not take it for a dead one's.
        at::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB)
            .map_err(|e| Error::from(e).with_key(staged.display()))?;
        // A hint: the writeback runs while the bytes are read for their checksum.
        if let Err(e) = at::start_writeback(file.as_raw_fd()) {
            tracing::debug!(key, "sync_file_range: {e}");
        }
        let size = st.st_size as u64;
        let (read, crc32c) = checksum(&file, size).map_err(|e| e.with_key(key))?;
        if read != size {
            return Err(Error::new(
                ErrorKind::Io,
                format!("the file shrank from {size} to {read} bytes while it was being adopted"),
            )
            .with_key(key));
        }
        let meta = self.commit_staged(&file, staged, key)?;
        if meta.size != size {
            // Published, but not the bytes checksummed: the caller's commit fails and removes it.
            return Err(Error::new(
                ErrorKind::Io,
                format!("the file changed from {size} to {} bytes while it was being adopted", meta.size),
            )
            .with_key(key));
        }
        Ok(Adopted { meta, crc32c })
    }

    /// Logs why `from` is not adopted; `None`.
    fn declined(&self, from: &str, why: &str) -> Option<Adopted> {
        tracing::debug!(root = %self.root.display(), from, "not adopted, to be copied: {why}");
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_in_pieces_and_threads_match_one_pass() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(CRC_SPLIT_BYTES as usize + 3 * CRC_READ_BYTES + 17))
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
            .collect();
        std::fs::write(&path, &data).expect("write");
        let file = File::open(&path).expect("open");
        let want = crc32c::crc32c(&data);
        assert_eq!(checksum(&file, data.len() as u64).expect("crc"), (data.len() as u64, want));
        assert_eq!(crc_range(&file, 0, data.len() as u64).expect("crc"), (data.len() as u64, want));
        // Asked past the end: what is there.
        assert_eq!(
            crc_range(&file, 5, data.len() as u64).expect("crc"),
            (data.len() as u64 - 5, crc32c::crc32c(&data[5..]))
        );
        let (n, _) = checksum(&file, data.len() as u64 + 4096).expect("crc");
        assert_eq!(n, data.len() as u64);
        assert_eq!(checksum(&file, 0).expect("crc"), (0, 0));
    }
}
