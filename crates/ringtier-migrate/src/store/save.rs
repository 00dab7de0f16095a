//! Saving: room on the fast tier (capacity, free space, `on_full`), streaming parts in
//! aligned chunks, committing parts then the manifest.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    /// The step saved.
    pub step: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Name of the tier the checkpoint was committed on.
    pub tier: String,
    /// How long `save` blocked.
    pub blocking: Duration,
    /// True when the fast tier was full and the checkpoint went to a slower tier.
    pub wrote_through: bool,
    /// Bytes committed without being written again: files adopted by
    /// [`CheckpointStore::commit_files`] (0 for [`CheckpointStore::save`]).
    pub adopted_bytes: u64,
}

/// Whether a save fits on a tier.
#[derive(Debug)]
pub(super) enum Room {
    Fits,
    /// Not now: draining and evicting may make room. Says why.
    Full(String),
    /// Not even on an empty tier. Says why.
    Never(String),
}

/// Bytes kept free on a file system beyond a checkpoint's own when deciding whether it fits:
/// file-system metadata and the alignment padding of direct writes (1/256 of it plus 1 MiB).
/// A save that still meets ENOSPC is handled as a full tier.
pub(super) fn free_slack(need: u64) -> u64 {
    need / 256 + (1 << 20)
}

/// Holds `step` in the set of steps being saved for as long as it lives.
pub(super) struct StepGuard<'a>(&'a Inner, u64);

impl<'a> StepGuard<'a> {
    pub(super) fn new(inner: &'a Inner, step: u64) -> Result<Self> {
        if !inner.saving_steps.lock().unwrap_or_else(|p| p.into_inner()).insert(step) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("checkpoint {step} is already being saved (wait for that save to finish)"),
            )
            .with_operation(Operation::Write));
        }
        Ok(StepGuard(inner, step))
    }
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.0.saving_steps.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

/// Counts a save in progress for as long as it lives.
pub(super) struct SavingGuard<'a>(&'a Inner);

impl<'a> SavingGuard<'a> {
    pub(super) fn new(inner: &'a Inner) -> Self {
        inner.saving.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SavingGuard(inner)
    }
}

impl Drop for SavingGuard<'_> {
    fn drop(&mut self) {
        self.0.saving.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.save_done.notify_waiters();
    }
}

impl Inner {
    /// Refuses a save of `step` where it exists: committed, or quarantined, on any tier.
    pub(super) async fn check_new_step(&self, step: u64) -> Result<()> {
        for t in 0..self.tiers.len() {
            if self.is_committed(t, step).await? {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("checkpoint {step} already exists on tier {:?}", self.tiers[t].name()),
                ));
            }
            if self.is_quarantined(t, step).await? {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "checkpoint {step} has a quarantined copy on tier {:?} (see `ringtier ckpt ls`); remove it \
                         first (`ringtier ckpt rm --step {step}`, CheckpointStore::delete)",
                        self.tiers[t].name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Writes the manifest of checkpoint `step` (its parts, in order) on tier `t`: the commit
    /// point, once every part is committed there. Returns the checkpoint's bytes.
    pub(super) async fn commit_manifest(&self, t: usize, step: u64, parts: Vec<PartMeta>) -> Result<u64> {
        let manifest =
            CheckpointManifest { format: FORMAT.into(), version: VERSION, step, created_unix_ms: now_ms(), parts };
        self.write_object(t, &self.manifest_key(step), &manifest.to_bytes()).await?;
        Ok(manifest.total_bytes())
    }

    pub(super) async fn write_object(&self, t: usize, key: &str, data: &[u8]) -> Result<()> {
        let mut attempt = 0;
        loop {
            match ringtier_core::ops::put(self.tiers[t].as_ref(), key, data, self.cfg.chunk_bytes).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_temporary() && attempt < self.cfg.retries => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Streams `next_chunk` into a new object `key` on tier `t`, returning its size and CRC.
    /// Two buffers: the next chunk is filled (copied or read, and checksummed) while the
    /// current one is written. Temporary write errors are retried; anything else aborts the
    /// staged object.
    pub(super) async fn write_stream(
        &self,
        t: usize,
        key: &str,
        throttle: bool,
        mut next_chunk: impl AsyncChunks,
    ) -> Result<(u64, u32)> {
        let tier = self.tiers[t].as_ref();
        let (chunk, align) = self.chunk_layout(t);
        // Buffers are reused across parts and saves (first-touch page faults cost more than the
        // disk); one extra alignment block, as a direct read of a chunk may need the aligned span.
        let mut spare = self.take_buffer(chunk + align, align)?;
        let first = self.take_buffer(chunk + align, align)?;
        let mut writer = tier.create(key).await?;
        // A writer that checksums what it sends in blocks (S3: its parts) gets each block's
        // CRC-32C, taken here anyway, instead of reading the bytes a second time.
        let block = writer.crc_block().filter(|&b| b > 0 && chunk % b == 0);
        let mut off = 0u64;
        let (res, mut cur) = next_chunk.fill(first, chunk).await;
        let (mut crc, mut cur_crcs) = block_crcs(cur.as_slice(), block);
        let mut n = match res {
            Ok(n) => n,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(e);
            }
        };
        while n > 0 {
            let write = async {
                if throttle {
                    // A drain: give way to saves in progress.
                    self.drain_pause().await;
                    if let Some(b) = &self.bucket {
                        let wait = b.take(n as u64);
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
                    }
                }
                let mut attempt = 0;
                let mut buf = cur;
                loop {
                    let (res, b) = if cur_crcs.is_empty() {
                        writer.write_at(off, buf).await
                    } else {
                        writer.write_at_crcs(off, buf, &cur_crcs).await
                    };
                    buf = b;
                    match res {
                        Err(e) if e.is_temporary() && attempt < self.cfg.retries => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                        }
                        other => return (other, buf),
                    }
                }
            };
            // The next chunk is filled and checksummed while this one is written.
            let fill = async {
                if throttle {
                    // The drain's read of its next chunk gives way too.
                    self.drain_pause().await;
                }
                let (res, next) = next_chunk.fill(spare, chunk).await;
                let (next_crc, next_crcs) = block_crcs(next.as_slice(), block);
                crc = crc32c::crc32c_combine(crc, next_crc, next.len());
                (res, next, next_crcs)
            };
            let ((wres, written), (fres, next, next_crcs)) = tokio::join!(write, fill);
            let filled = match (wres, fres) {
                (Ok(()), Ok(m)) => m,
                (Err(e), _) | (Ok(()), Err(e)) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            };
            off += n as u64;
            n = filled;
            spare = written;
            cur = next;
            cur_crcs = next_crcs;
        }
        self.give_buffer(spare);
        self.give_buffer(cur);
        writer.commit().await?;
        Ok((off, crc))
    }

    /// Bytes per write to tier `t` (the configured chunk, rounded up to the tier's alignment)
    /// and that alignment.
    pub(super) fn chunk_layout(&self, t: usize) -> (usize, usize) {
        let align = self.tiers[t].capabilities().alignment.max(4096);
        (ringtier_core::buf::align_up(self.cfg.chunk_bytes.max(4096) as u64, align as u64) as usize, align)
    }

    pub(super) fn take_buffer(&self, size: usize, align: usize) -> Result<AlignedBuf> {
        let mut free = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.iter().position(|b| b.capacity() >= size && b.align() >= align) {
            let mut b = free.swap_remove(i);
            b.clear();
            return Ok(b);
        }
        drop(free);
        AlignedBuf::new(size, align)
    }

    pub(super) fn give_buffer(&self, buf: AlignedBuf) {
        let mut free = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < 2 * (self.cfg.drain_concurrency + self.cfg.save_parallelism.max(1)) {
            free.push(buf);
        }
    }

    /// Free bytes of tier `t`'s file system (or bound) now; `None` where the tier cannot tell.
    pub(super) async fn free_space(&self, t: usize) -> Option<u64> {
        match self.tiers[t].space().await {
            Ok(s) => s.map(|s| s.free_bytes),
            Err(e) => {
                tracing::debug!(tier = self.tiers[t].name(), "free space unknown: {e}");
                None
            }
        }
    }

    /// Whether a checkpoint of `need` bytes fits on tier `t` now: within the fast tier's
    /// capacity bound, and `new_bytes` of it (what is still to be written: `need` for a save, 0
    /// for adopted files, which are on the file system already) within the file system's free
    /// space (less [`free_slack`]).
    pub(super) async fn room_for(&self, t: usize, step: u64, need: u64, new_bytes: u64) -> Result<Room> {
        let name = self.tiers[t].name();
        if t == 0 {
            if let Some(cap) = self.cfg.fast_capacity_bytes {
                if need > cap {
                    return Ok(Room::Never(format!(
                        "checkpoint {step} ({need} bytes) is larger than the fast tier's capacity of {cap} bytes"
                    )));
                }
                let used = self.fast_used().await?;
                if used + need > cap {
                    return Ok(Room::Full(format!(
                        "the fast tier's capacity of {cap} bytes holds {used} bytes and cannot take checkpoint {step} \
                         ({need} bytes)"
                    )));
                }
            }
        }
        if new_bytes == 0 {
            return Ok(Room::Fits);
        }
        let need = new_bytes;
        match self.tiers[t].space().await {
            Ok(Some(space)) if need > space.total_bytes => Ok(Room::Never(format!(
                "checkpoint {step} ({need} bytes) is larger than tier {name:?} ({} bytes in all)",
                space.total_bytes
            ))),
            Ok(Some(space)) if need + free_slack(need) > space.free_bytes => Ok(Room::Full(format!(
                "tier {name:?} has {} bytes free, too few for checkpoint {step} ({need} bytes)",
                space.free_bytes
            ))),
            Ok(_) => Ok(Room::Fits),
            Err(e) => {
                tracing::debug!(tier = name, "free space unknown: {e}");
                Ok(Room::Fits)
            }
        }
    }

    pub(super) async fn fast_used(&self) -> Result<u64> {
        Ok(self.scan(0).await?.values().filter(|f| f.manifest).map(|f| f.bytes).sum())
    }
}

impl CheckpointStore {
    /// Saves `parts` as checkpoint `step` on the fastest tier (or, when it is full, as
    /// configured) and returns once it is durable: every part committed, then the manifest.
    /// The copy to slower tiers is queued. On error nothing of `step` stays visible and earlier
    /// checkpoints are untouched.
    pub async fn save(&self, step: u64, parts: Vec<Part<'_>>) -> Result<SaveReport> {
        self.save_to(step, parts, false).await
    }

    /// Saves straight to the slowest tier (no drain): the baseline the burst buffer beats.
    pub async fn save_direct(&self, step: u64, parts: Vec<Part<'_>>) -> Result<SaveReport> {
        self.save_to(step, parts, true).await
    }

    pub(super) async fn save_to(&self, step: u64, mut parts: Vec<Part<'_>>, direct: bool) -> Result<SaveReport> {
        let inner = &self.inner;
        if !inner.writable {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("cannot save checkpoint {step}: the store is open read-only"),
            )
            .with_operation(Operation::Write));
        }
        let start = Instant::now();
        let mut names = BTreeSet::new();
        for p in &parts {
            validate_part_name(&p.name).map_err(|e| e.with_operation(Operation::Write))?;
            if !names.insert(p.name.clone()) {
                return Err(Error::new(ErrorKind::InvalidInput, format!("part {:?} given twice", p.name)));
            }
        }
        // One save of a step at a time (two `async_save`s of one step from Python, say): the
        // second is refused rather than racing the first's files.
        let _step_guard = StepGuard::new(inner, step)?;
        inner.check_new_step(step).await?;
        let last = inner.tiers.len() - 1;
        let checked = start.elapsed();
        let estimate: u64 = parts.iter().map(Part::size_hint).sum();
        // Where each seekable part starts, to rewind it for another attempt.
        let mut starts = Vec::with_capacity(parts.len());
        for p in parts.iter_mut() {
            starts.push(match &mut p.data {
                PartData::Seekable { reader, .. } => Some(reader.stream_position().map_err(|e| {
                    Error::from(e).with_operation(Operation::Write).with_key(inner.part_key(step, &p.name))
                })?),
                _ => None,
            });
        }
        let mut target = if direct { last } else { 0 };
        let mut wrote_through = false;
        // Room on the fast tier (its capacity bound, its file system's free space) before a
        // byte is written.
        if target < last && !self.make_room(target, step, estimate).await? {
            tracing::warn!(step, "tier {:?} is full; writing through", inner.tiers[target].name());
            target += 1;
            wrote_through = true;
        }
        loop {
            // The drain gives way while the checkpoint is written (not while waiting for room).
            let written = {
                let _saving = SavingGuard::new(inner);
                self.write_checkpoint(target, step, &mut parts).await
            };
            match written {
                Ok(bytes) => {
                    let blocking = start.elapsed();
                    tracing::debug!(
                        step,
                        tier = inner.tiers[target].name(),
                        checks_ms = checked.as_secs_f64() * 1e3,
                        blocking_ms = blocking.as_secs_f64() * 1e3,
                        "saved"
                    );
                    inner.saved(step, target, bytes, blocking);
                    return Ok(SaveReport {
                        step,
                        bytes,
                        tier: inner.tiers[target].name().to_string(),
                        blocking,
                        wrote_through,
                        adopted_bytes: 0,
                    });
                }
                Err((e, consumed_stream)) => {
                    // Nothing of this attempt stays: the failed part's staged object is already
                    // aborted; committed parts go, manifest first.
                    let _ = inner.remove(target, step).await;
                    if e.kind() != ErrorKind::NoSpace || target == last {
                        inner.m.saves_err[target].increment(1);
                        return Err(e.with_operation(Operation::Write));
                    }
                    // The tier filled up part-way: apply the on-full policy to the whole save.
                    let name = inner.tiers[target].name();
                    if consumed_stream {
                        inner.m.saves_err[target].increment(1);
                        return Err(Error::from_errno(
                            libc_enospc(),
                            format!(
                                "checkpoint {step}: tier {name:?} is full ({e}), and a part given as a stream \
                                 that cannot be read again was part-way written; give parts as bytes or as \
                                 seekable streams (Part::seekable) so that a full tier can be retried"
                            ),
                        )
                        .with_operation(Operation::Write));
                    }
                    rewind(&mut parts, &starts).map_err(|e| e.with_operation(Operation::Write))?;
                    tracing::warn!(step, "tier {name:?} filled up during the save: {e}");
                    match self.room_after_enospc(target, step, estimate, &e).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(step, "tier {name:?} is full; writing through");
                            target += 1;
                            wrote_through = true;
                        }
                        Err(e) => {
                            inner.m.saves_err[target].increment(1);
                            return Err(e.with_operation(Operation::Write));
                        }
                    }
                }
            }
        }
    }

    /// Makes room for `need` bytes of checkpoint `step` on tier `t` before it is written:
    /// evicts drained checkpoints, and with [`OnFull::Wait`] waits for the drain while that
    /// can help. `Ok(true)` when it fits, `Ok(false)` to write through
    /// ([`OnFull::WriteThrough`]); [`ErrorKind::NoSpace`] when waiting cannot help.
    pub(super) async fn make_room(&self, t: usize, step: u64, need: u64) -> Result<bool> {
        self.make_room_for(t, step, need, need).await
    }

    /// [`CheckpointStore::make_room`] for a checkpoint of `need` bytes of which `new_bytes`
    /// are still to be written to its file system (see [`Inner::room_for`]).
    pub(super) async fn make_room_for(&self, t: usize, step: u64, need: u64, new_bytes: u64) -> Result<bool> {
        let inner = &self.inner;
        let mut last_look = false;
        // Most saves fit: one look at the tier's room, no eviction scan on the blocking path.
        let mut room = inner.room_for(t, step, need, new_bytes).await?;
        loop {
            if matches!(room, Room::Full(_)) {
                inner.evict(t, Evict::Room(need)).await?;
                room = inner.room_for(t, step, need, new_bytes).await?;
            }
            let why = match room {
                Room::Fits => return Ok(true),
                Room::Full(why) => why,
                Room::Never(why) => {
                    if inner.cfg.on_full == OnFull::WriteThrough {
                        return Ok(false);
                    }
                    return Err(Error::from_errno(
                        libc_enospc(),
                        format!("{why}: it can never be saved there (save with on_full write-through or save_direct)"),
                    ));
                }
            };
            if inner.cfg.on_full == OnFull::WriteThrough {
                return Ok(false);
            }
            if !self.wait_for_drain_progress().await {
                // Nothing to drain: one more look (a drain may have just finished and evicted).
                if last_look {
                    return Err(Error::from_errno(
                        libc_enospc(),
                        format!("{why}, and nothing is left to drain or evict (on_full write-through would write it to the next tier)"),
                    ));
                }
                last_look = true;
            }
            room = inner.room_for(t, step, need, new_bytes).await?;
        }
    }

    /// After a save of `step` met ENOSPC on tier `t` (`err`): `Ok(true)` to retry there once
    /// something was evicted (or, with [`OnFull::Wait`], once a drain finished), `Ok(false)` to
    /// write through ([`OnFull::WriteThrough`]); [`ErrorKind::NoSpace`] when waiting cannot
    /// help. Each retry follows an eviction or a finished drain, so retries end.
    pub(super) async fn room_after_enospc(&self, t: usize, step: u64, need: u64, err: &Error) -> Result<bool> {
        let inner = &self.inner;
        let evictions = |i: &Inner| i.evictions.load(std::sync::atomic::Ordering::SeqCst);
        let before = evictions(inner);
        if inner.evict(t, Evict::AfterEnospc(need)).await? > 0 {
            return Ok(true);
        }
        if inner.cfg.on_full == OnFull::WriteThrough {
            return Ok(false);
        }
        if self.wait_for_drain_progress().await {
            return Ok(true);
        }
        // Nothing pending: retry only if a drain evicted something meanwhile.
        if evictions(inner) != before || inner.evict(t, Evict::AfterEnospc(need)).await? > 0 {
            return Ok(true);
        }
        Err(Error::from_errno(
            libc_enospc(),
            format!(
                "checkpoint {step}: tier {:?} is full ({err}), and nothing is left to drain or evict (on_full \
                 write-through would write it to the next tier)",
                inner.tiers[t].name()
            ),
        ))
    }

    /// Writes every part, then the manifest, on tier `t`. The bool says whether a part given as
    /// a plain stream was read (it cannot be written again).
    pub(super) async fn write_checkpoint(
        &self,
        t: usize,
        step: u64,
        parts: &mut [Part<'_>],
    ) -> std::result::Result<u64, (Error, bool)> {
        let inner = &self.inner;
        let n = parts.len();
        // Up to `save_parallelism` parts are written at once, each taking the next part not yet
        // started: a part's commit (on a file tier: fsync, rename) overlaps the other parts'
        // writes instead of leaving the device idle between parts. After a failure no lane
        // starts another part; the parts in progress finish or fail, then the caller removes
        // what was written.
        let queue = Mutex::new(parts.iter_mut().enumerate());
        let metas: Mutex<Vec<Option<PartMeta>>> = Mutex::new((0..n).map(|_| None).collect());
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let consumed = AtomicBool::new(false);
        let lane = || async {
            while let Some((i, p)) = next_part(&queue, &failure) {
                let key = inner.part_key(step, &p.name);
                let res = match &mut p.data {
                    PartData::Bytes(b) => inner.write_stream(t, &key, false, BytesChunks { data: b }).await,
                    PartData::Reader { reader, .. } => {
                        consumed.store(true, Ordering::Relaxed);
                        inner.write_stream(t, &key, false, ReaderChunks { reader: reader.as_mut() }).await
                    }
                    PartData::Seekable { reader, .. } => {
                        inner.write_stream(t, &key, false, ReaderChunks { reader: reader.as_mut() }).await
                    }
                };
                match res {
                    Ok((size, crc32c)) => {
                        let meta = PartMeta { name: p.name.clone(), size, crc32c };
                        lock(&metas)[i] = Some(meta);
                    }
                    Err(e) => {
                        lock(&failure).get_or_insert(e);
                        return;
                    }
                }
            }
        };
        let lanes = inner.cfg.save_parallelism.clamp(1, n.max(1));
        futures_util::future::join_all((0..lanes).map(|_| lane())).await;
        let consumed_stream = consumed.load(Ordering::Relaxed);
        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err((e, consumed_stream));
        }
        let metas: Vec<PartMeta> =
            metas.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().flatten().collect();
        if metas.len() != n {
            let e =
                Error::new(ErrorKind::Io, format!("checkpoint {step}: only {} of {n} parts were written", metas.len()));
            return Err((e, consumed_stream));
        }
        inner.commit_manifest(t, step, metas).await.map_err(|e| (e, consumed_stream))
    }
}

/// The next part to write, unless a part failed.
fn next_part<'a, 'p>(
    queue: &Mutex<std::iter::Enumerate<std::slice::IterMut<'a, Part<'p>>>>,
    failure: &Mutex<Option<Error>>,
) -> Option<(usize, &'a mut Part<'p>)> {
    if lock(failure).is_some() {
        return None;
    }
    lock(queue).next()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn libc_enospc() -> i32 {
    28
}

/// The CRC-32C of `data` and, with a `block` size, of each `block`-sized piece of it (the
/// whole one combined from them: one pass over the bytes either way).
fn block_crcs(data: &[u8], block: Option<usize>) -> (u32, Vec<u32>) {
    match block {
        None => (crc32c::crc32c(data), Vec::new()),
        Some(b) => {
            let crcs: Vec<u32> = data.chunks(b).map(crc32c::crc32c).collect();
            let whole = data.chunks(b).zip(&crcs).fold(0, |acc, (c, &crc)| crc32c::crc32c_combine(acc, crc, c.len()));
            (whole, crcs)
        }
    }
}

#[cfg(test)]
mod crc_tests {
    #[test]
    fn block_crcs_combine_into_the_whole() {
        let data: Vec<u8> = (0..100_003u32).map(|i| (i * 31 + i / 7) as u8).collect();
        let (whole, none) = super::block_crcs(&data, None);
        assert_eq!((whole, none.len()), (crc32c::crc32c(&data), 0));
        let (whole, crcs) = super::block_crcs(&data, Some(4096));
        assert_eq!(whole, crc32c::crc32c(&data));
        assert_eq!(crcs.len(), data.len().div_ceil(4096));
        assert_eq!(crcs[1], crc32c::crc32c(&data[4096..8192]));
        assert_eq!(*crcs.last().unwrap_or(&0), crc32c::crc32c(&data[24 * 4096..]));
        assert_eq!(super::block_crcs(&[], Some(4096)), (0, Vec::new()));
    }
}
