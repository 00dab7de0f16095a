//! Committing files that already lie on the fast tier ([`CheckpointStore::commit_files`]):
//! a checkpoint a framework wrote itself (TensorFlow's saver into a directory of the fast
//! tier) becomes a step without its bytes being written a second time.

use super::*;

impl CheckpointStore {
    /// Commits the files `dir/NAME` for each of `names`, which a program already wrote under
    /// the fast tier, as the parts `NAME` of checkpoint `step`, and returns once the step is
    /// durable, as [`CheckpointStore::save`] does; the drain to slower tiers is queued.
    ///
    /// `dir` is a directory under the fast tier's root written as a key (relative,
    /// `/`-separated, no `..`, no `.ringtier` component; not inside the store's prefix). Each
    /// file is adopted where the fast tier can ([`Tier::adopt`]: on a file tier, checked to be
    /// a regular file reached without a link, moved into the tier's staging directory,
    /// checksummed from the page cache, data fsynced, renamed into the step, directory
    /// fsynced): no byte is written again. Where the tier declines one (a file with several
    /// links or on another file system, a tier that cannot adopt: object stores, layers that
    /// change writes) it is copied, as `save` copies a part, and left where it was. Then the
    /// manifest is written last, as for `save`: the step is committed exactly when its
    /// manifest is, so a crash at any point leaves the previous steps and this one whole or
    /// absent (recovery removes a step without a manifest, adopted parts included). The step's
    /// manifest, restore, verify, drain, eviction and quarantine are those of a saved step.
    ///
    /// The files must not change while this runs. Adopted files are gone from `dir` once this
    /// returns (also when it fails part-way: the step's parts are removed, its adopted files
    /// with them); copied ones stay. A link (on the way to a file or the file itself) is
    /// [`ErrorKind::PermissionDenied`], a FIFO or a directory [`ErrorKind::NotFound`] (not a
    /// regular file), both before anything is moved. The fast tier's capacity bound
    /// (`fast_capacity_bytes`) counts the files (evicting drained steps, or writing through to
    /// the next tier with [`OnFull::WriteThrough`], as `save`); its free space does not, since
    /// the bytes are on it already.
    pub async fn commit_files(&self, step: u64, dir: &str, names: &[String]) -> Result<SaveReport> {
        let inner = &self.inner;
        let write = |e: Error| e.with_operation(Operation::Write);
        if !inner.writable {
            return Err(write(Error::new(
                ErrorKind::Unsupported,
                format!("cannot commit checkpoint {step}: the store is open read-only"),
            )));
        }
        let start = Instant::now();
        validate_key(dir).map_err(write)?;
        let prefix = &inner.cfg.prefix;
        if dir == prefix || dir.starts_with(&format!("{prefix}/")) {
            return Err(write(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "files to commit lie in {dir:?}, inside the store's own prefix {prefix:?}: write them elsewhere"
                ),
            )));
        }
        if names.is_empty() {
            return Err(write(Error::new(ErrorKind::InvalidInput, format!("checkpoint {step}: no files to commit"))));
        }
        let mut seen = BTreeSet::new();
        for name in names {
            validate_part_name(name).map_err(write)?;
            if !seen.insert(name.as_str()) {
                return Err(write(Error::new(ErrorKind::InvalidInput, format!("part {name:?} given twice"))));
            }
        }
        let _step_guard = StepGuard::new(inner, step)?;
        inner.check_new_step(step).await?;
        // Every file there and a regular file before anything moves: a link, a FIFO or a
        // missing file fails the commit with nothing changed.
        let fast = &inner.tiers[0];
        let mut sizes = Vec::with_capacity(names.len());
        for name in names {
            sizes.push(fast.stat(&format!("{dir}/{name}")).await.map_err(write)?.size);
        }
        let need: u64 = sizes.iter().sum();
        let last = inner.tiers.len() - 1;
        let mut target = 0;
        if target < last && !self.make_room_for(0, step, need, 0).await? {
            tracing::warn!(step, "tier {:?} is full; copying the files through to the next tier", fast.name());
            target = 1;
        }
        let written = {
            let _saving = SavingGuard::new(inner);
            self.adopt_checkpoint(target, step, dir, names, &sizes).await
        };
        match written {
            Ok((bytes, adopted_bytes)) => {
                let blocking = start.elapsed();
                tracing::debug!(
                    step,
                    tier = inner.tiers[target].name(),
                    adopted_bytes,
                    blocking_ms = blocking.as_secs_f64() * 1e3,
                    "committed files"
                );
                inner.saved(step, target, bytes, blocking);
                Ok(SaveReport {
                    step,
                    bytes,
                    tier: inner.tiers[target].name().to_string(),
                    blocking,
                    wrote_through: target > 0,
                    adopted_bytes,
                })
            }
            Err(e) => {
                // As a failed save: nothing of the step stays (its adopted parts included).
                let _ = inner.remove(target, step).await;
                inner.m.saves_err[target].increment(1);
                Err(write(e))
            }
        }
    }

    /// Commits each file as a part of `step` on tier `t` (adopted where `t` is the fast tier
    /// and it can, copied from the fast tier otherwise), then the manifest. Returns the
    /// checkpoint's bytes and how many of them were adopted.
    async fn adopt_checkpoint(
        &self,
        t: usize,
        step: u64,
        dir: &str,
        names: &[String],
        sizes: &[u64],
    ) -> Result<(u64, u64)> {
        let inner = &self.inner;
        let fast = &inner.tiers[0];
        let mut metas = Vec::with_capacity(names.len());
        let mut adopted_bytes = 0;
        for (name, &size) in names.iter().zip(sizes) {
            let from = format!("{dir}/{name}");
            let key = inner.part_key(step, name);
            let adopted = if t == 0 { fast.adopt(&from, &key).await? } else { None };
            let (size, crc32c) = match adopted {
                Some(a) => {
                    adopted_bytes += a.meta.size;
                    (a.meta.size, a.crc32c)
                }
                None => {
                    let (chunk, _) = inner.chunk_layout(t);
                    let src = TierChunks::new(Arc::clone(fast), from, size, chunk, drain::DRAIN_READ_DEPTH);
                    inner.write_stream(t, &key, false, src).await?
                }
            };
            metas.push(PartMeta { name: name.clone(), size, crc32c });
        }
        let bytes = inner.commit_manifest(t, step, metas).await?;
        Ok((bytes, adopted_bytes))
    }
}
