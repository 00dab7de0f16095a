//! The one restore path under every read of a checkpoint: a [`RestoreRequest`] says which
//! step, which copies, what of each part and into which buffers; [`Inner::run_restore`] finds
//! the manifest, selects the parts, streams their chunks into the sink and falls back to a
//! slower copy of a part whose copy is bad.
//!
//! | caller | copies | extent | buffers |
//! |---|---|---|---|
//! | [`CheckpointStore::restore`] (and `load`, `load_into`, `read_part`) | fastest first | whole parts | pooled |
//! | [`CheckpointStore::read_part_range`] | fastest first | a range of one part | pooled |
//! | [`CheckpointStore::verify`], a drain's source check | one tier | whole parts | pooled |
//! | [`CheckpointStore::load_direct`] | fastest first | whole parts | the caller's targets |

use super::*;

/// One restore: the step, its options, and the three choices that tell restores apart.
pub(super) struct RestoreRequest<'a> {
    step: u64,
    opts: &'a RestoreOptions,
    copies: Copies,
    extent: Extent,
    buffers: Buffers,
}

/// Which committed copies a restore may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copies {
    /// The fastest copy, a slower one for a part whose faster copy is bad. A slower tier is
    /// asked only then: a restore from the fast tier neither waits for nor fails on a slow
    /// tier that is unreachable (S3 down).
    FastestFirst,
    /// This tier's copy alone, no fallback (verifying the copy).
    Only(usize),
}

/// What of the selected parts is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extent {
    /// Whole parts, each checked against its checksum.
    WholeParts,
    /// Bytes `[offset, offset + len)` of the one selected part, unchecked: no checksum covers
    /// a range.
    Range { offset: u64, len: u64 },
}

/// Where the chunks are read into.
enum Buffers {
    /// The store's read buffers (kept between restores), handed to the sink and recycled.
    Pooled,
    /// The caller's targets, read in place ([`ReadTargets`]).
    Direct(Arc<dyn ReadTargets>),
}

impl<'a> RestoreRequest<'a> {
    /// Every part (or those `opts` names) of `step`, whole, from the fastest copy with
    /// fallback, through the store's read buffers.
    pub(super) fn new(step: u64, opts: &'a RestoreOptions) -> Self {
        RestoreRequest {
            step,
            opts,
            copies: Copies::FastestFirst,
            extent: Extent::WholeParts,
            buffers: Buffers::Pooled,
        }
    }

    /// Reads bytes `[offset, offset + len)` of the one part `opts` names.
    pub(super) fn range(self, offset: u64, len: u64) -> Self {
        RestoreRequest { extent: Extent::Range { offset, len }, ..self }
    }

    /// Reads tier `tier`'s copy alone, without falling back.
    pub(super) fn only(self, tier: usize) -> Self {
        RestoreRequest { copies: Copies::Only(tier), ..self }
    }

    /// Reads into `targets` in place instead of the store's buffers.
    pub(super) fn into_targets(self, targets: Arc<dyn ReadTargets>) -> Self {
        RestoreRequest { buffers: Buffers::Direct(targets), ..self }
    }
}

impl Inner {
    /// Runs `req` into `sink`: the manifest from the fastest copy whose manifest reads, the
    /// parts asked for in save order, their chunks streamed with checksums checked on the way,
    /// a slower copy for a part whose copy is bad (each reason in the report).
    pub(super) async fn run_restore<S: RestoreSink>(
        &self,
        req: RestoreRequest<'_>,
        sink: &mut S,
    ) -> Result<RestoreReport> {
        let started = Instant::now();
        let RestoreRequest { step, opts, copies, extent, buffers } = req;
        // The tiers that may hold a copy, fastest first.
        let mut held: Vec<usize> = (0..self.tiers.len())
            .filter(|&t| match copies {
                Copies::FastestFirst => true,
                Copies::Only(o) => o == t,
            })
            .collect();
        let mut fallbacks = Vec::new();
        let manifest = self.first_manifest(step, &mut held, &mut fallbacks).await?;
        let selected = select_parts(step, &manifest, opts, extent)?;
        sink.prepare(&selected).await?;
        let first = held[0];
        let spans = selected
            .iter()
            .map(|p| Span {
                tier: Arc::clone(&self.tiers[first]),
                key: self.part_key(step, &p.name),
                start: p.start,
                end: p.end,
            })
            .collect();
        let mut reads = ChunkReads::new(spans, opts.chunk_bytes, opts.depth);
        let pooled = matches!(buffers, Buffers::Pooled);
        match buffers {
            Buffers::Pooled => {
                let kept = std::mem::take(&mut *self.read_buffers.lock().unwrap_or_else(|p| p.into_inner()));
                reads.seed(kept);
            }
            Buffers::Direct(targets) => {
                // Each part's destination is allocated for the size its copy on this tier has
                // (stat), never more than what the manifest claims: a manifest that lies about
                // a size never allocates it.
                let mut sizes = Vec::with_capacity(selected.len());
                for p in &selected {
                    let meta = self.tiers[first].stat(&self.part_key(step, &p.name)).await?;
                    sizes.push(meta.size);
                }
                if !targets.prepare(&selected, &sizes, reads.align())? {
                    return Err(Error::new(ErrorKind::Unsupported, DIRECT_DECLINED));
                }
                reads.set_targets(targets);
            }
        }
        let (bytes, sources) = self.stream(step, &held, &selected, &mut reads, sink, &mut fallbacks).await?;
        for f in &fallbacks {
            tracing::warn!("checkpoint {step}: {f}");
        }
        if pooled {
            let mut kept = self.read_buffers.lock().unwrap_or_else(|p| p.into_inner());
            for b in reads.take_free() {
                if kept.len() < READ_BUFFERS_KEPT {
                    kept.push(b);
                }
            }
        }
        Ok(RestoreReport { step, bytes, sources, fallbacks, seconds: started.elapsed().as_secs_f64() })
    }

    /// The manifest of `step` from the first tier of `held` whose manifest reads. Tiers
    /// without a committed copy leave `held`, and so do those whose manifest is unusable (each
    /// with its reason in `fallbacks`). When no copy is left: `NotFound` if none was committed,
    /// else the reasons, temporary if a tier could not be asked (a caller can retry).
    async fn first_manifest(
        &self,
        step: u64,
        held: &mut Vec<usize>,
        fallbacks: &mut Vec<String>,
    ) -> Result<CheckpointManifest> {
        let mut unreachable: Option<Error> = None;
        while let Some(&t) = held.first() {
            match self.manifest(t, step).await {
                Ok(m) => return Ok(m),
                // Not committed on this tier.
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    held.remove(0);
                }
                Err(e) => {
                    self.m.fallbacks[t].increment(1);
                    fallbacks.push(format!("copy on tier {:?} unusable: {e}", self.tiers[t].name()));
                    if unreachable.is_none() && e.is_temporary() {
                        unreachable = Some(e);
                    }
                    held.remove(0);
                }
            }
        }
        if fallbacks.is_empty() {
            return Err(Error::new(ErrorKind::NotFound, format!("no committed copy of checkpoint {step} on any tier"))
                .with_operation(Operation::Read));
        }
        let msg = format!("checkpoint {step}: every copy failed: {}", fallbacks.join("; "));
        // A tier that could not be asked (temporarily) may still hold a good copy: the error
        // is temporary then, so a caller can retry.
        Err(match unreachable {
            Some(e) => Error::new(e.kind(), msg),
            None => Error::new(ErrorKind::Corrupt, msg),
        })
    }

    /// Streams the chunks of `reads` into `sink`, part by part, checking each whole part's
    /// checksum; a part whose copy is bad is discarded and read again from the next copy in
    /// `held` that agrees with the manifest. Returns the bytes delivered and each part's
    /// source tier, in save order.
    async fn stream<S: RestoreSink>(
        &self,
        step: u64,
        held: &[usize],
        selected: &[PartInfo],
        reads: &mut ChunkReads,
        sink: &mut S,
        fallbacks: &mut Vec<String>,
    ) -> Result<(u64, Vec<(String, String)>)> {
        // Per selected part: position in `held` of the copy being read.
        let mut source = vec![0usize; selected.len()];
        let mut current: Option<usize> = None;
        let mut crc = 0u32;
        let mut bytes = 0u64;
        let mut sources = Vec::with_capacity(selected.len());
        while let Some(chunk) = reads.next().await {
            let i = chunk.span;
            let part = &selected[i];
            if current != Some(i) {
                current = Some(i);
                crc = 0;
                sink.begin(part).await?;
            }
            let (start, end) = (part.start, part.end);
            let failure = match chunk.result {
                Ok(n) => {
                    let mut failure = None;
                    if let Some(buf) = chunk.buf {
                        crc = crc32c::crc32c_append(crc, &buf.as_slice()[..n]);
                        let (res, buf) =
                            if n > 0 { sink.write(part, chunk.offset - start, buf).await } else { (Ok(()), buf) };
                        reads.recycle(buf);
                        if let Err(e) = res {
                            sink.discard(part).await;
                            return Err(e);
                        }
                    }
                    if chunk.offset + n as u64 == end {
                        let whole = start == 0 && end == part.size;
                        if whole && crc != part.crc32c {
                            failure = Some(Error::new(
                                ErrorKind::Corrupt,
                                format!(
                                    "part {:?}: checksum mismatch (crc32c {crc:08x}, manifest {:08x})",
                                    part.name, part.crc32c
                                ),
                            ));
                        } else {
                            if let Err(e) = sink.finish(part).await {
                                sink.discard(part).await;
                                return Err(e);
                            }
                            bytes += end - start;
                            sources.push((part.name.clone(), reads.span(i).tier.name().to_string()));
                            current = None;
                        }
                    }
                    failure
                }
                Err(e) => {
                    if let Some(buf) = chunk.buf {
                        reads.recycle(buf);
                    }
                    Some(e)
                }
            };
            let Some(e) = failure else { continue };
            // This copy of the part is bad: the next tier's, if it agrees with the manifest.
            sink.discard(part).await;
            current = None;
            let t = held[source[i]];
            self.m.fallbacks[t].increment(1);
            fallbacks.push(format!("part {:?} on tier {:?}: {e}", part.name, self.tiers[t].name()));
            let Some(t2) = self.next_copy(step, held, &mut source[i], part, fallbacks).await else {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("checkpoint {step}: every copy failed: {}", fallbacks.join("; ")),
                ));
            };
            tracing::warn!(step, part = part.name.as_str(), "reading a slower copy: {e}");
            reads.restart(i, Arc::clone(&self.tiers[t2]), self.part_key(step, &part.name)).await;
        }
        Ok((bytes, sources))
    }

    /// The next tier after `held[*source]` whose manifest has `part` as the faster copy's
    /// manifest has it (name, size, checksum); `*source` moves to it. Each tier passed over
    /// is a line of `fallbacks`. `None` when no slower copy is left.
    async fn next_copy(
        &self,
        step: u64,
        held: &[usize],
        source: &mut usize,
        part: &PartInfo,
        fallbacks: &mut Vec<String>,
    ) -> Option<usize> {
        loop {
            *source += 1;
            let &t2 = held.get(*source)?;
            match self.manifest(t2, step).await {
                Ok(m)
                    if m.parts
                        .iter()
                        .any(|p| p.name == part.name && p.size == part.size && p.crc32c == part.crc32c) =>
                {
                    return Some(t2)
                }
                Ok(_) => fallbacks.push(format!(
                    "part {:?} on tier {:?}: its manifest disagrees with the faster copy's",
                    part.name,
                    self.tiers[t2].name()
                )),
                Err(e) => fallbacks.push(format!("copy on tier {:?} unusable: {e}", self.tiers[t2].name())),
            }
        }
    }
}

/// The parts of `manifest` that `opts` asks for, in save order (an unknown name is
/// `NotFound`, naming the parts there are), each whole or, for a range, the range of the one
/// part named.
fn select_parts(
    step: u64,
    manifest: &CheckpointManifest,
    opts: &RestoreOptions,
    extent: Extent,
) -> Result<Vec<PartInfo>> {
    if let Some(names) = &opts.parts {
        for n in names {
            if !manifest.parts.iter().any(|p| &p.name == n) {
                let have: Vec<&str> = manifest.parts.iter().map(|p| p.name.as_str()).collect();
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("checkpoint {step} has no part {n:?} (its parts: {})", have.join(", ")),
                ));
            }
        }
    }
    let mut selected: Vec<PartInfo> = Vec::new();
    for (index, p) in manifest.parts.iter().enumerate() {
        if opts.parts.as_ref().is_none_or(|names| names.contains(&p.name)) {
            selected.push(PartInfo {
                index,
                name: p.name.clone(),
                size: p.size,
                crc32c: p.crc32c,
                start: 0,
                end: p.size,
            });
        }
    }
    if let Extent::Range { offset, len } = extent {
        let [p] = selected.as_mut_slice() else {
            return Err(Error::new(ErrorKind::InvalidInput, "a range read names exactly one part"));
        };
        match offset.checked_add(len) {
            Some(end) if end <= p.size => (p.start, p.end) = (offset, end),
            _ => {
                return Err(Error::new(
                    ErrorKind::OutOfRange,
                    format!("bytes {offset}..{offset}+{len} of part {:?} ({} bytes)", p.name, p.size),
                ))
            }
        }
    }
    Ok(selected)
}
