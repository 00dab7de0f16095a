//! Whole samples read in pieces no larger than a pooled buffer, so the loader's memory is set
//! by its configuration and never by the largest file.
//!
//! A sample that fits one pooled buffer is read with one request into it, as before. A larger
//! one is read in successive requests of the buffer's size (each into a pooled buffer that is
//! returned as soon as its bytes are copied out) and assembled, with one copy, into a buffer of
//! the sample's size that belongs to the batch. At most `max_buffers` pooled buffers are held
//! at once, however large the samples.

use ringtier_core::buf::AlignedBuf;
use ringtier_core::{BufferPool, ReadBatch, Tier};

use ringtier_dataset::Sample;

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

/// One request: a piece of one sample.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Position of the sample in the caller's list.
    sample: usize,
    offset: u64,
    len: usize,
    /// Whether the sample is read in more than one piece.
    split: bool,
    /// The sample's last piece (asks for one byte more, to notice a file that grew).
    last: bool,
}

/// A sample being read: its assembled buffer (split samples) and the first error.
enum Progress {
    Pending,
    Whole(AlignedBuf),
    Assembling(AlignedBuf),
    Failed(String),
}

/// Reads every sample of `samples` whole through `tier`, into buffers from `pool`, with
/// requests of at most `piece` bytes (a multiple of the pool's alignment) and at most
/// `max_buffers` pooled buffers held at once (at least `samples.len()`, and the pool must be
/// able to give that many). Buffers come from `reserve` first (taken from the pool before the
/// batch started, see [`buffers_needed`]), then from the pool; a split sample's piece buffer goes
/// back to `reserve` once copied out. Returns, per sample in order, its bytes (the buffer's
/// window) or why it could not be read (naming the key and byte offset).
pub(crate) async fn read_whole(
    tier: &dyn Tier,
    pool: &BufferPool,
    samples: &[&Sample],
    piece: usize,
    max_buffers: usize,
    reserve: &mut Vec<AlignedBuf>,
) -> Vec<Result<AlignedBuf, String>> {
    // Whole samples keep their buffer, so a wave always has one left while a split one waits.
    let max_buffers = max_buffers.max(samples.len());
    let mut requests = Vec::with_capacity(samples.len());
    for (i, s) in samples.iter().enumerate() {
        let split = s.size > piece as u64;
        let mut offset = 0u64;
        loop {
            let rest = s.size - offset;
            if rest <= piece as u64 {
                requests.push(Piece { sample: i, offset, len: rest as usize + 1, split, last: true });
                break;
            }
            requests.push(Piece { sample: i, offset, len: piece, split, last: false });
            offset += piece as u64;
        }
    }
    let mut progress: Vec<Progress> = samples.iter().map(|_| Progress::Pending).collect();
    let mut kept = 0usize;
    let mut next = 0usize;
    while next < requests.len() {
        // Whole samples keep their pooled buffer; the wave may use what is left.
        let wave_len = max_buffers.saturating_sub(kept).max(1).min(requests.len() - next);
        let wave = &requests[next..next + wave_len];
        next += wave_len;
        let mut batch = ReadBatch::with_capacity(wave.len(), wave.len() * 32);
        for p in wave {
            let buf = match reserve.pop() {
                Some(b) => b,
                None => pool.acquire().await,
            };
            batch.push(&samples[p.sample].key, p.offset, p.len, buf);
        }
        let mut batch = tier.read_batch(batch).await;
        for ((key, _, res, buf), p) in batch.drain().zip(wave) {
            let s = samples[p.sample];
            if matches!(progress[p.sample], Progress::Failed(_)) {
                continue;
            }
            let want = if p.last { s.size - p.offset } else { p.len as u64 };
            let mut buf = match (res, buf) {
                (Ok(n), Some(buf)) if n as u64 == want => buf,
                (Ok(n), _) => {
                    let got = p.offset + n as u64;
                    let more = if n as u64 > want { " or more" } else { "" };
                    progress[p.sample] = Progress::Failed(format!(
                        "{key}: size mismatch, expected {} bytes, read {got}{more} (at byte {})",
                        s.size, p.offset
                    ));
                    continue;
                }
                (Err(e), _) => {
                    progress[p.sample] = Progress::Failed(format!("{key}: {e} (at byte {})", p.offset));
                    continue;
                }
            };
            if !p.split {
                kept += 1;
                progress[p.sample] = Progress::Whole(buf);
                continue;
            }
            if matches!(progress[p.sample], Progress::Pending) {
                match AlignedBuf::new(s.size as usize, pool.align()) {
                    Ok(whole) => progress[p.sample] = Progress::Assembling(whole),
                    Err(e) => {
                        progress[p.sample] = Progress::Failed(format!("{key}: {e}"));
                        continue;
                    }
                }
            }
            if let Progress::Assembling(whole) = &mut progress[p.sample] {
                let start = p.offset as usize;
                let data = buf.as_slice();
                whole.capacity_mut()[start..start + data.len()].copy_from_slice(data);
                if p.last {
                    if let Err(e) = whole.set_window(0, s.size as usize) {
                        progress[p.sample] = Progress::Failed(format!("{key}: {e}"));
                    }
                }
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
            Progress::Whole(b) | Progress::Assembling(b) => Ok(b),
            Progress::Failed(why) => Err(why),
            Progress::Pending => Err(format!("{}: not read", s.key)),
        })
        .collect()
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
            samples.push(Sample { key, size: n as u64, crc32c: None });
        }
        // Buffers of 3 pages: pieces of 8 KiB. The five whole samples keep theirs, and the
        // three split ones (1.1 MB in all) go through the 3 buffers left.
        let pool = BufferPool::new(PoolConfig::new(3 * 4096, sizes.len(), 4096)).expect("pool");
        let piece = piece_size(pool.buf_size(), 4096);
        let refs: Vec<&Sample> = samples.iter().collect();
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
            samples.push(Sample { key: format!("r{i}"), size: n as u64, crc32c: None });
        }
        let pool = BufferPool::new(PoolConfig::new(2 * 4096, 6, 4096)).expect("pool");
        let piece = piece_size(pool.buf_size(), 4096);
        // 30,000 bytes in pieces of 4 KiB: 8 requests, 11 in all; at most 5 buffers held.
        let need = buffers_needed(sizes.iter().map(|&n| n as u64), piece, 5);
        assert_eq!(need, 5);
        let mut reserve: Vec<AlignedBuf> = (0..need).map(|_| pool.try_acquire().expect("free")).collect();
        // The pool's last buffer is taken away: the read must make do with the reserve.
        let last = pool.try_acquire().expect("sixth");
        let refs: Vec<&Sample> = samples.iter().collect();
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
        let shrunk = Sample { key: "big".into(), size: 30_000, crc32c: None };
        let grown = Sample { key: "big".into(), size: 10_000, crc32c: None };
        let out = read_whole(&tier, &pool, &[&shrunk, &grown], 4096, 4, &mut Vec::new()).await;
        let e0 = out[0].as_ref().expect_err("shrunk");
        assert!(e0.contains("big: size mismatch, expected 30000 bytes, read 20000"), "{e0}");
        let e1 = out[1].as_ref().expect_err("grown");
        assert!(e1.contains("read 10001 or more (at byte 8192)"), "{e1}");
        assert_eq!(pool.in_use(), 0);
    }
}
