//! A streamed epoch: the rank's shards in the sampler's order, read in bounded pieces, parsed,
//! and delivered through the seeded shuffle buffer, skipping what a resumed epoch already had.

use super::*;
use ringtier_core::rng::SplitMix64;

/// Delivers records through the shuffle buffer, dropping the first `skip` of them. Returns
/// false when the consumer went away.
pub(super) struct Out<'a> {
    pub(super) q: &'a Queue,
    /// Building an index: (offset, len) of every record, nothing sent.
    pub(super) collect: Option<Vec<(u64, u64)>>,
    pub(super) buffer: Vec<Record>,
    /// Bytes of the records in `buffer`.
    pub(super) bytes: usize,
    pub(super) cap: usize,
    /// Byte bound of the buffer (`usize::MAX`: none).
    pub(super) cap_bytes: usize,
    pub(super) rng: SplitMix64,
    pub(super) skip: u64,
}

impl<'a> Out<'a> {
    pub(super) fn new(q: &'a Queue, cfg: &RecordConfig, seed: u64, skip: u64) -> Self {
        let cap = cfg.shuffle_buffer;
        let cap_bytes = if cfg.shuffle_bytes == 0 { usize::MAX } else { cfg.shuffle_bytes };
        // Room for what the byte bound lets in, not a large count of large records up front.
        let room = if cap <= 1 { 0 } else { cap.min(1024) };
        Out {
            q,
            collect: None,
            buffer: Vec::with_capacity(room),
            bytes: 0,
            cap,
            cap_bytes,
            rng: SplitMix64::new(seed),
            skip,
        }
    }

    pub(super) async fn deliver(&mut self, r: Record) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            self.q.held.sub(r.bytes());
            return true;
        }
        self.q.send(r).await
    }

    /// Takes a parsed record (already counted in `held`).
    pub(super) async fn push(&mut self, r: Record) -> bool {
        if let Some(v) = &mut self.collect {
            v.push((r.offset, r.len));
            self.q.held.sub(r.bytes());
            return true;
        }
        if self.cap <= 1 {
            return self.deliver(r).await;
        }
        let n = r.bytes() as usize;
        // Full by count with room by bytes: the new record takes a random one's place (the
        // classic shuffle buffer). Otherwise random records leave until it fits (a record
        // larger than the byte bound passes through an emptied buffer).
        if self.buffer.len() >= self.cap {
            let i = (self.rng.next_u64() % self.buffer.len() as u64) as usize;
            let gone = self.buffer[i].bytes() as usize;
            if self.bytes - gone + n <= self.cap_bytes {
                let out = std::mem::replace(&mut self.buffer[i], r);
                self.bytes = self.bytes - gone + n;
                return self.deliver(out).await;
            }
            let out = self.buffer.swap_remove(i);
            self.bytes -= gone;
            if !self.deliver(out).await {
                return false;
            }
        }
        while !self.buffer.is_empty() && self.bytes + n > self.cap_bytes {
            let i = (self.rng.next_u64() % self.buffer.len() as u64) as usize;
            let out = self.buffer.swap_remove(i);
            self.bytes -= out.bytes() as usize;
            if !self.deliver(out).await {
                return false;
            }
        }
        self.bytes += n;
        self.buffer.push(r);
        true
    }

    pub(super) async fn drain(&mut self) -> bool {
        while !self.buffer.is_empty() {
            let i = (self.rng.next_u64() % self.buffer.len() as u64) as usize;
            let r = self.buffer.swap_remove(i);
            self.bytes -= r.bytes() as usize;
            if !self.deliver(r).await {
                return false;
            }
        }
        true
    }
}

pub(super) fn shard_error(inner: &Inner, e: &RecordError) -> String {
    let shard = inner.shards.get(e.shard).map_or("?", |s| s.key.as_str());
    format!("{} shard {shard}, byte offset {}: {}", inner.format.as_str(), e.offset, e.why)
}

pub(super) async fn run_epoch(inner: &Inner, epoch: u64, position: u64, q: &Queue) -> Option<()> {
    // Skipped records count toward the position only when delivered, so the skip is replayed
    // deterministically: the same shards, the same shuffle.
    let seed = inner.cfg.seed
        ^ epoch.wrapping_mul(0xA076_1D64_78BD_642F)
        ^ ((inner.cfg.rank * inner.cfg.workers + inner.cfg.worker) as u64).wrapping_mul(0xE703_7ED1_A0B4_28DB);
    let mut out = Out::new(q, &inner.cfg, seed, position);
    let shards: Vec<usize> = inner.sampler.epoch(epoch).into_iter().map(|s| s as usize).collect();
    if let Err(e) = read_shards(inner, &shards, &mut out).await? {
        let _ = q.note(Item::Failed(e)).await;
        return None;
    }
    out.drain().await.then_some(())
}

/// One read request of a stream: (position in the shard list, offset, the read).
type Pending = (usize, u64, tokio::task::JoinHandle<ReadBatch>);

/// Passes a shard's parsed records (or errors) on. `None`: the consumer went away;
/// `Some(Err)`: the epoch fails.
pub(super) async fn hand_on(
    inner: &Inner,
    parsed: &mut Vec<std::result::Result<Record, RecordError>>,
    fatal: &mut bool,
    out: &mut Out<'_>,
) -> Option<Result<()>> {
    for rec in parsed.iter().flatten() {
        out.q.held.add(rec.bytes());
    }
    let mut drained = parsed.drain(..);
    while let Some(r) = drained.next() {
        match r {
            Ok(rec) => {
                if !out.push(rec).await {
                    return None;
                }
            }
            Err(e) => {
                *fatal |= e.fatal;
                let why = shard_error(inner, &e);
                let failed = match inner.cfg.on_bad {
                    OnBadSample::Skip => {
                        if !out.q.note(Item::Skipped(why)).await {
                            return None;
                        }
                        None
                    }
                    OnBadSample::Fail => Some(Error::new(ErrorKind::Corrupt, why)),
                };
                if let Some(e) = failed {
                    // The records parsed after the error are dropped with the epoch.
                    for rest in drained.by_ref().flatten() {
                        out.q.held.sub(rest.bytes());
                    }
                    return Some(Err(e));
                }
            }
        }
    }
    Some(Ok(()))
}

/// Submits the next reads of `shards` until `window` are in flight (or none is left), each
/// with its buffer taken here, in order. It waits for a buffer only when none of this epoch's
/// reads is in flight; otherwise it takes the free ones and leaves the rest for later (the
/// oldest read, once parsed, gives its buffer back). Waiting while holding buffers whose reads
/// are done but not parsed would let two epochs sharing the pool (two iterators of one
/// dataset, one of them dropped with its queue full) each hold what the other waits for.
async fn refill(
    inner: &Inner,
    shards: &[usize],
    next: &mut (usize, u64),
    inflight: &mut VecDeque<Pending>,
    window: usize,
) {
    let read = inner.cfg.read_size as u64;
    while inflight.len() < window {
        while next.0 < shards.len() && next.1 >= inner.shards[shards[next.0]].size {
            *next = (next.0 + 1, 0);
        }
        let (pos, off) = *next;
        let Some(shard) = shards.get(pos).and_then(|&i| inner.shards.get(i)) else { return };
        let buf = if inflight.is_empty() {
            inner.pool.acquire().await
        } else {
            match inner.pool.try_acquire() {
                Some(b) => b,
                None => return,
            }
        };
        next.1 += read;
        let len = read.min(shard.size - off) as usize;
        let (tier, key) = (Arc::clone(&inner.tier), shard.key.clone());
        inflight.push_back((
            pos,
            off,
            tokio::spawn(async move {
                let mut batch = ReadBatch::with_capacity(1, key.len());
                batch.push(&key, off, len, buf);
                tier.read_batch(batch).await
            }),
        ));
    }
}

/// Streams `shards` (indexes into the shard list), in order, through their parsers. The reads
/// form one sliding window over all of them: `2 x depth - 1` requests of `read_size` bytes in
/// flight while one buffer is parsed, the next request submitted as soon as a buffer is done,
/// the next shard's first requests while the last of a shard are parsed. `None`: the consumer
/// went away; `Some(Err)`: the epoch fails.
pub(super) async fn read_shards(inner: &Inner, shards: &[usize], out: &mut Out<'_>) -> Option<Result<()>> {
    let read = inner.cfg.read_size as u64;
    let window = inner.pool.count().saturating_sub(1).max(1);
    // The next request to submit: (position in `shards`, offset).
    let mut next = (0usize, 0u64);
    let mut inflight: VecDeque<Pending> = VecDeque::with_capacity(window);
    refill(inner, shards, &mut next, &mut inflight, window).await;
    let mut parsed = Vec::new();
    for (pos, &index) in shards.iter().enumerate() {
        let shard = &inner.shards[index];
        let mut parser: Box<dyn Parser> = match inner.format {
            RecordFormat::TfRecord => Box::new(tfrecord::TfRecordParser::new(index, shard.size)),
            RecordFormat::WebDataset => Box::new(wds::WdsParser::new(index, shard.size)),
        };
        let mut fatal = false;
        while inflight.front().is_some_and(|p| p.0 == pos) {
            let Some((_, off, handle)) = inflight.pop_front() else { break };
            let mut batch = match handle.await {
                Ok(b) => b,
                Err(e) => return Some(Err(Error::new(ErrorKind::Shutdown, format!("a read task failed: {e}")))),
            };
            let Some((key, _, res, buf)) = batch.drain().next() else {
                return Some(Err(Error::new(ErrorKind::Shutdown, "a read came back empty")));
            };
            let want = read.min(shard.size - off) as usize;
            let data = match (res, buf) {
                (Ok(n), Some(buf)) if n == want => buf,
                (Ok(n), _) => {
                    let e = Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "{} shard {key}, byte offset {off}: short read ({n} of {want} bytes; did the shard change?)",
                            inner.format.as_str()
                        ),
                    );
                    return Some(Err(e));
                }
                (Err(e), _) => return Some(Err(e)),
            };
            if !fatal {
                parser.feed(data.as_slice(), &mut parsed);
            }
            // The buffer back to the pool, and its successor in flight, before the records
            // are handed on (which may wait for the consumer).
            drop(data);
            refill(inner, shards, &mut next, &mut inflight, window).await;
            if let Err(e) = hand_on(inner, &mut parsed, &mut fatal, out).await? {
                return Some(Err(e));
            }
        }
        if !fatal {
            parser.finish(&mut parsed);
        }
        if let Err(e) = hand_on(inner, &mut parsed, &mut fatal, out).await? {
            return Some(Err(e));
        }
    }
    Some(Ok(()))
}
