//! Whole samples read in pieces no larger than a pooled buffer, so the loader's memory is set
//! by its configuration and never by the largest file.
//!
//! A sample that fits one pooled buffer is read with one request into it, as before. A larger
//! one is read in successive requests of the buffer's size (each into a pooled buffer that is
//! returned as soon as its bytes are copied out) and assembled, with one copy, into a buffer of
//! the sample's size that belongs to the batch. At most `max_buffers` pooled buffers are held
//! at once, however large the samples.

use ringtier_core::buf::AlignedBuf;
use ringtier_core::error::{Error, ErrorKind};
use ringtier_core::{BufferPool, ReadBatch, Tier, UNKNOWN_SIZE};

/// Largest read when [`crate::LoaderConfig::read_size`] is 0: samples up to this size are read
/// with one request, larger ones in requests of this size.
pub const DEFAULT_MAX_READ: usize = 8 << 20;

/// The largest request a pooled buffer of `buf_size` bytes takes at a `align`-aligned offset,
/// including the extra byte asked for at a sample's end: `buf_size - align` rounded down to
/// the alignment.
pub(crate) fn piece_size(buf_size: usize, align: usize) -> usize {
    let align = align.max(1);
    (buf_size.saturating_sub(align) / align * align).max(align)
}

/// How many pooled buffers reading `sizes` whole takes at most at once with requests of at
/// most `piece` bytes and at most `max_buffers` held: the number of requests, capped at
/// `max_buffers` (never below the number of samples). Taking this many from the pool before
/// [`read_whole`] starts, in batch order, means it never waits for the pool.
pub(crate) fn buffers_needed(sizes: impl ExactSizeIterator<Item = u64>, piece: usize, max_buffers: usize) -> usize {
    let samples = sizes.len();
    let piece = piece.max(1) as u64;
    let requests: usize = sizes.map(|s| s.div_ceil(piece).max(1) as usize).sum();
    requests.min(max_buffers.max(samples))
}

/// One sample to read whole: its key and size, and whether the size is exact (a file of
/// another size is an error naming it) or a hint or [`UNKNOWN_SIZE`] (the file is read to its
/// end, whatever its size now).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want<'a> {
    pub(crate) key: &'a str,
    pub(crate) size: u64,
    pub(crate) exact: bool,
}

impl<'a> Want<'a> {
    /// A sample of exactly `size` bytes.
    pub(crate) fn exact(key: &'a str, size: u64) -> Self {
        Want { key, size, exact: size != UNKNOWN_SIZE }
    }

    /// A sample whose size is a hint, or unknown.
    pub(crate) fn hint(key: &'a str, size: u64) -> Self {
        Want { key, size, exact: false }
    }
}

/// One request: a piece of one sample.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Position of the sample in the caller's list.
    sample: usize,
    offset: u64,
    len: usize,
    /// The last piece planned for the sample (asks for one byte more than its size, to notice a
    /// file that grew; a sample of unknown size is planned one buffer at a time).
    last: bool,
}

/// A sample being read: its assembled buffer (split samples) and the first error.
enum Progress {
    Pending,
    Whole(AlignedBuf),
    /// Assembled from pieces: the buffer, and the bytes filled.
    Assembling(AlignedBuf, usize),
    Failed(ErrorKind, String),
}

/// The pieces of a sample of `size` bytes (exact or a hint) at most `piece` bytes each, the last
/// one asking for a byte more; one piece of `piece` bytes for an unknown size.
fn plan(sample: usize, size: u64, piece: usize, out: &mut std::collections::VecDeque<Piece>) {
    if size == UNKNOWN_SIZE {
        out.push_back(Piece { sample, offset: 0, len: piece, last: true });
        return;
    }
    let mut offset = 0u64;
    loop {
        let rest = size - offset;
        if rest <= piece as u64 {
            out.push_back(Piece { sample, offset, len: rest as usize + 1, last: true });
            return;
        }
        out.push_back(Piece { sample, offset, len: piece, last: false });
        offset += piece as u64;
    }
}

/// Reads every sample of `samples` whole through `tier`, into buffers from `pool`, with
/// requests of at most `piece` bytes (a multiple of the pool's alignment) and at most
/// `max_buffers` pooled buffers held at once (at least `samples.len()`, and the pool must be
/// able to give that many). Buffers come from `reserve` first (taken from the pool before the
/// batch started, see [`buffers_needed`]), then from the pool; a split sample's piece buffer goes
/// back to `reserve` once copied out. A sample of exact size must have that size; one whose
/// size is a hint or unknown is read until a read comes back short (its end), in more requests
/// when it is larger than planned. Returns, per sample in order, its bytes (the buffer's
/// window) or why it could not be read (naming the key and byte offset).
pub(crate) async fn read_whole(
    tier: &dyn Tier,
    pool: &BufferPool,
    samples: &[Want<'_>],
    piece: usize,
    max_buffers: usize,
    reserve: &mut Vec<AlignedBuf>,
) -> Vec<Result<AlignedBuf, Error>> {
    // Whole samples keep their buffer, so a wave always has one left while a split one waits.
    let max_buffers = max_buffers.max(samples.len());
    let mut pending = std::collections::VecDeque::with_capacity(samples.len());
    for (i, s) in samples.iter().enumerate() {
        plan(i, s.size, piece, &mut pending);
    }
    let mut progress: Vec<Progress> = samples.iter().map(|_| Progress::Pending).collect();
    // Where a sample of inexact size ends, once a read came back short.
    let mut ends: Vec<Option<u64>> = vec![None; samples.len()];
    let mut kept = 0usize;
    while !pending.is_empty() {
        // Whole samples keep their pooled buffer; the wave may use what is left.
        let wave_len = max_buffers.saturating_sub(kept).max(1).min(pending.len());
        let wave: Vec<Piece> = pending.drain(..wave_len).collect();
        let mut batch = ReadBatch::with_capacity(wave.len(), wave.len() * 32);
        for p in &wave {
            let buf = match reserve.pop() {
                Some(b) => b,
                None => pool.acquire().await,
            };
            batch.push(samples[p.sample].key, p.offset, p.len, buf);
        }
        let mut batch = tier.read_batch(batch).await;
        for ((key, _, res, buf), p) in batch.drain().zip(&wave) {
            let s = samples[p.sample];
            let past_end = ends[p.sample].is_some_and(|end| p.offset >= end);
            if matches!(progress[p.sample], Progress::Failed(..)) || past_end {
                // A piece past the end of a file that shrank: nothing to keep.
                if let Some(mut buf) = buf {
                    buf.clear();
                    reserve.push(buf);
                }
                continue;
            }
            let (n, buf) = match (res, buf) {
                (Ok(n), Some(buf)) => (n, buf),
                (Ok(_), None) => {
                    progress[p.sample] = Progress::Failed(ErrorKind::Io, format!("{key}: the tier kept the buffer"));
                    continue;
                }
                (Err(e), buf) => {
                    progress[p.sample] = Progress::Failed(e.kind(), format!("{key}: {e} (at byte {})", p.offset));
                    if let Some(mut buf) = buf {
                        buf.clear();
                        reserve.push(buf);
                    }
                    continue;
                }
            };
            if s.exact {
                let want = if p.last { s.size - p.offset } else { p.len as u64 };
                if n as u64 != want {
                    let got = p.offset + n as u64;
                    let more = if n as u64 > want { " or more" } else { "" };
                    progress[p.sample] = Progress::Failed(
                        ErrorKind::Corrupt,
                        format!(
                            "{key}: size mismatch, expected {} bytes, read {got}{more} (at byte {})",
                            s.size, p.offset
                        ),
                    );
                    let mut buf = buf;
                    buf.clear();
                    reserve.push(buf);
                    continue;
                }
            } else if n < p.len {
                ends[p.sample] = Some(p.offset + n as u64);
            } else if p.last {
                // Larger than planned (a file that grew, a size that was a hint or unknown):
                // read on from where this piece ended.
                pending.push_back(Piece { sample: p.sample, offset: p.offset + n as u64, len: piece, last: true });
            }
            let whole = p.offset == 0 && p.last && (s.exact || n < p.len);
            if whole && matches!(progress[p.sample], Progress::Pending) {
                kept += 1;
                progress[p.sample] = Progress::Whole(buf);
                continue;
            }
            let mut buf = buf;
            if let Err(why) = assemble(&mut progress[p.sample], s, p.offset as usize, buf.as_slice(), pool.align()) {
                progress[p.sample] = Progress::Failed(ErrorKind::ResourceExhausted, format!("{key}: {why}"));
            }
            // `buf` is free again for the next wave.
            buf.clear();
            reserve.push(buf);
        }
    }
    progress
        .into_iter()
        .zip(samples)
        .map(|(p, s)| match p {
            Progress::Whole(b) => Ok(b),
            Progress::Assembling(mut b, filled) => match b.set_window(0, filled) {
                Ok(()) => Ok(b),
                Err(e) => Err(Error::new(e.kind(), format!("{}: {e}", s.key))),
            },
            Progress::Failed(kind, why) => Err(Error::new(kind, why)),
            Progress::Pending => Err(Error::new(ErrorKind::Io, format!("{}: not read", s.key))),
        })
        .collect()
}

/// Reads `files` whole through `tier`, all in one batched read where each fits one buffer of
/// `pool` (a larger one in pieces of a buffer's size, assembled into a buffer of its size):
/// for a reader that is handed any list of keys (a random-access data source), not an epoch.
/// Each `(key, size)` gives the file's size as a hint or [`UNKNOWN_SIZE`]: every file is read
/// to its end, whatever its size now. Each request's buffer is a free one of `pool` where there
/// is one, else one allocated at the pool's buffer size (zeroed, freed when dropped), so a read
/// never waits for buffers the caller still holds. Returns, per file in order, its bytes (a
/// buffer's window) or why it could not be read (naming the key).
pub async fn read_files(tier: &dyn Tier, pool: &BufferPool, files: &[(&str, u64)]) -> Vec<Result<AlignedBuf, Error>> {
    let piece = piece_size(pool.buf_size(), pool.align());
    let wanted: Vec<Want<'_>> = files.iter().map(|&(key, size)| Want::hint(key, size)).collect();
    let needed = buffers_needed(files.iter().map(|&(_, s)| if s == UNKNOWN_SIZE { 0 } else { s }), piece, files.len());
    let mut reserve = Vec::with_capacity(needed);
    for _ in 0..needed {
        match pool.try_acquire() {
            Some(b) => reserve.push(b),
            None => match AlignedBuf::new(pool.buf_size(), pool.align()) {
                Ok(b) => reserve.push(b),
                Err(e) => return files.iter().map(|_| Err(Error::new(e.kind(), e.message().to_string()))).collect(),
            },
        }
    }
    // `reserve` holds a buffer for every request of a wave: the pool is never waited on.
    read_whole(tier, pool, &wanted, piece, needed, &mut reserve).await
}

/// Copies `data`, read at `offset` of sample `s`, into its assembled buffer (allocated at its
/// size, or grown by doubling when the size was a hint or unknown).
fn assemble(progress: &mut Progress, s: Want<'_>, offset: usize, data: &[u8], align: usize) -> Result<(), String> {
    let end = offset + data.len();
    if matches!(progress, Progress::Pending) {
        let capacity =
            if s.exact { s.size as usize } else { end.max(if s.size == UNKNOWN_SIZE { 0 } else { s.size as usize }) };
        *progress = Progress::Assembling(AlignedBuf::new(capacity.max(end), align).map_err(|e| e.to_string())?, 0);
    }
    let Progress::Assembling(whole, filled) = progress else {
        return Ok(());
    };
    if end > whole.capacity() {
        let mut bigger = AlignedBuf::new(end.max(whole.capacity() * 2), align).map_err(|e| e.to_string())?;
        bigger.capacity_mut()[..*filled].copy_from_slice(&whole.capacity_mut()[..*filled]);
        *whole = bigger;
    }
    whole.capacity_mut()[offset..end].copy_from_slice(data);
    *filled = (*filled).max(end);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtier_core::{ops, MemoryTier, PoolConfig};

    #[test]
    fn piece_sizes() {
        assert_eq!(piece_size(3 * 4096, 4096), 2 * 4096);
        assert_eq!(piece_size(4096 + 100, 4096), 4096);
        assert_eq!(piece_size(1000, 1), 999);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn samples_larger_than_a_buffer_are_read_in_pieces() {
        let tier = MemoryTier::new();
        let sizes = [0usize, 1, 4095, 4096, 8192, 8193, 100_000, 1_000_003];
        let mut samples = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            let key = format!("s{i}");
            ops::put(&tier, &key, &data, 1 << 16).await.expect("put");
            samples.push((key, n as u64));
        }
        // Buffers of 3 pages: pieces of 8 KiB. The five whole samples keep theirs, and the
        // three split ones (1.1 MB in all) go through the 3 buffers left.
        let pool = BufferPool::new(PoolConfig::new(3 * 4096, sizes.len(), 4096)).expect("pool");
        let piece = piece_size(pool.buf_size(), 4096);
        let refs: Vec<Want<'_>> = samples.iter().map(|(k, n)| Want::exact(k, *n)).collect();
        let out = read_whole(&tier, &pool, &refs, piece, sizes.len(), &mut Vec::new()).await;
        for ((i, &n), res) in sizes.iter().enumerate().zip(out) {
            let buf = res.expect("read");
            let want: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            assert_eq!(buf.as_slice(), &want[..], "sample {i} of {n} bytes");
            assert_eq!(buf.pool_slot().is_some(), n <= piece, "sample {i}: pooled only when whole");
        }
        assert_eq!(pool.in_use(), 0, "every pooled buffer went back");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reserve_taken_up_front_is_all_the_read_needs() {
        let tier = MemoryTier::new();
        let sizes = [10usize, 30_000, 5000, 0];
        let mut samples = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            ops::put(&tier, &format!("r{i}"), &vec![i as u8 + 1; n], 1 << 16).await.expect("put");
            samples.push((format!("r{i}"), n as u64));
        }
        let pool = BufferPool::new(PoolConfig::new(2 * 4096, 6, 4096)).expect("pool");
        let piece = piece_size(pool.buf_size(), 4096);
        // 30,000 bytes in pieces of 4 KiB: 8 requests, 11 in all; at most 5 buffers held.
        let need = buffers_needed(sizes.iter().map(|&n| n as u64), piece, 5);
        assert_eq!(need, 5);
        let mut reserve: Vec<AlignedBuf> = (0..need).map(|_| pool.try_acquire().expect("free")).collect();
        // The pool's last buffer is taken away: the read must make do with the reserve.
        let last = pool.try_acquire().expect("sixth");
        let refs: Vec<Want<'_>> = samples.iter().map(|(k, n)| Want::exact(k, *n)).collect();
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            read_whole(&tier, &pool, &refs, piece, 5, &mut reserve),
        )
        .await
        .expect("never waits for the pool");
        for ((i, &n), res) in sizes.iter().enumerate().zip(out) {
            assert_eq!(res.expect("read").as_slice(), &vec![i as u8 + 1; n][..], "sample {i}");
        }
        assert_eq!(buffers_needed([1u64, 2, 3].into_iter(), 4096, 64), 3);
        assert_eq!(buffers_needed([0u64].into_iter(), 4096, 64), 1);
        assert_eq!(buffers_needed([8193u64].into_iter(), 4096, 64), 3);
        drop((reserve, last));
        assert_eq!(pool.in_use(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_changed_size_is_named_with_key_and_offset() {
        let tier = MemoryTier::new();
        ops::put(&tier, "big", &vec![1u8; 20_000], 1 << 16).await.expect("put");
        let pool = BufferPool::new(PoolConfig::new(2 * 4096, 4, 4096)).expect("pool");
        let shrunk = Want::exact("big", 30_000);
        let grown = Want::exact("big", 10_000);
        let out = read_whole(&tier, &pool, &[shrunk, grown], 4096, 4, &mut Vec::new()).await;
        let e0 = out[0].as_ref().expect_err("shrunk");
        assert!(e0.message().contains("big: size mismatch, expected 30000 bytes, read 20000"), "{e0}");
        assert_eq!(e0.kind(), ErrorKind::Corrupt);
        let e1 = out[1].as_ref().expect_err("grown");
        assert!(e1.message().contains("read 10001 or more (at byte 8192)"), "{e1}");
        assert_eq!(pool.in_use(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sizes_that_are_hints_or_unknown_are_learned_from_the_reads() {
        let tier = MemoryTier::new();
        let sizes = [0usize, 1, 4095, 4096, 8191, 8192, 8193, 100_000, 1_000_003];
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|j| (j * 13 + i) as u8).collect();
            ops::put(&tier, &format!("h{i}"), &data, 1 << 16).await.expect("put");
        }
        let keys: Vec<String> = (0..sizes.len()).map(|i| format!("h{i}")).collect();
        // Buffers of 3 pages: pieces of 8 KiB.
        let pool = BufferPool::new(PoolConfig::new(3 * 4096, sizes.len() + 2, 4096)).expect("pool");
        let piece = piece_size(pool.buf_size(), 4096);
        // Unknown, right, too small and too large hints: the files win every time.
        let hints: [Box<dyn Fn(usize) -> u64>; 4] = [
            Box::new(|_| UNKNOWN_SIZE),
            Box::new(|n| n as u64),
            Box::new(|n| n as u64 / 3),
            Box::new(|n| n as u64 * 2 + 5),
        ];
        for (h, hint) in hints.iter().enumerate() {
            let wants: Vec<Want<'_>> = keys.iter().zip(sizes).map(|(k, n)| Want::hint(k, hint(n))).collect();
            let mut reserve: Vec<AlignedBuf> = (0..sizes.len()).map(|_| pool.try_acquire().expect("free")).collect();
            let out = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                read_whole(&tier, &pool, &wants, piece, sizes.len(), &mut reserve),
            )
            .await
            .expect("never waits for the pool");
            for ((i, &n), res) in sizes.iter().enumerate().zip(out) {
                let buf = res.unwrap_or_else(|e| panic!("hints {h}: sample {i} of {n} bytes: {e}"));
                let want: Vec<u8> = (0..n).map(|j| (j * 13 + i) as u8).collect();
                assert_eq!(buf.len(), n, "hints {h}: sample {i}");
                assert_eq!(buf.as_slice(), &want[..], "hints {h}: sample {i} of {n} bytes");
            }
            drop(reserve);
            assert_eq!(pool.in_use(), 0, "hints {h}: every pooled buffer went back");
        }
        // A file that is gone is an error naming it, whatever the hint.
        let out = read_whole(&tier, &pool, &[Want::hint("gone", UNKNOWN_SIZE)], piece, 1, &mut Vec::new()).await;
        let e = out[0].as_ref().expect_err("gone");
        assert!(e.message().starts_with("gone: not_found"), "{e}");
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_files_reads_any_keys_and_never_waits_for_held_buffers() {
        let tier = MemoryTier::new();
        let sizes = [0usize, 10, 5000, 8192, 20_000];
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|j| (j * 7 + i) as u8).collect();
            ops::put(&tier, &format!("f{i}"), &data, 1 << 16).await.expect("put");
        }
        // Two buffers of 3 pages, both held by the caller: every read takes a buffer of its own.
        let pool = BufferPool::new(PoolConfig::new(3 * 4096, 2, 4096)).expect("pool");
        let held: Vec<AlignedBuf> = (0..2).map(|_| pool.try_acquire().expect("free")).collect();
        let keys: Vec<String> = [4, 0, 2, 2, 3, 1].iter().map(|i| format!("f{i}")).collect();
        let files: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), UNKNOWN_SIZE)).chain([("nope", 3)]).collect();
        let out = tokio::time::timeout(std::time::Duration::from_secs(10), read_files(&tier, &pool, &files))
            .await
            .expect("never waits for the pool");
        for (k, res) in keys.iter().zip(&out) {
            let i: usize = k[1..].parse().expect("index");
            let want: Vec<u8> = (0..sizes[i]).map(|j| (j * 7 + i) as u8).collect();
            assert_eq!(res.as_ref().expect("read").as_slice(), &want[..], "{k}");
        }
        let e = out[keys.len()].as_ref().expect_err("missing");
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        drop((held, out));
        assert_eq!(pool.in_use(), 0);
    }
}
