//! The drain: committed checkpoints copied to the next tier in the background, pausing for
//! saves, at a bounded rate; then the faster copy may be evicted.

use super::*;

/// What the drain has done since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrainStats {
    /// Checkpoints copied to a slower tier.
    pub checkpoints: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds spent copying, summed over checkpoints (with a drain concurrency of 1, the time
    /// the drain was busy), pauses for saves included.
    pub busy_seconds: f64,
    /// Seconds of `busy_seconds` the drain spent paused because a save was writing.
    pub paused_seconds: f64,
}

impl DrainStats {
    /// Copy throughput in bytes per second while the drain was copying (pauses for saves
    /// excluded); `None` before anything was drained.
    pub fn copy_bytes_per_sec(&self) -> Option<f64> {
        let secs = self.busy_seconds - self.paused_seconds;
        (self.bytes > 0 && secs > 0.0).then(|| self.bytes as f64 / secs)
    }
}

/// Chunk reads of the fast copy in flight ahead of the drain's writer (each a write chunk).
pub(super) const DRAIN_READ_DEPTH: usize = 2;

impl Inner {
    /// A drain's wait for saves in progress, counted in [`DrainStats::paused_seconds`].
    pub(super) async fn drain_pause(&self) {
        if self.saving.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        let paused = Instant::now();
        self.yield_to_saves().await;
        self.drained.lock().unwrap_or_else(|p| p.into_inner()).paused_seconds += paused.elapsed().as_secs_f64();
    }

    /// Waits until no save is writing: background work (drain copies, evictions) runs between
    /// saves, never during one, so it does not add to the training loop's blocking time.
    pub(super) async fn yield_to_saves(&self) {
        loop {
            let done = self.save_done.notified();
            if self.saving.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                break;
            }
            done.await;
        }
    }

    /// A save (or commit of files) of `step` became durable on tier `target` after `blocking`:
    /// counted, and queued for the drain unless `target` is the last tier.
    pub(super) fn saved(&self, step: u64, target: usize, bytes: u64, blocking: std::time::Duration) {
        self.m.blocking[target].record(blocking.as_secs_f64());
        self.m.saves_ok[target].increment(1);
        if target + 1 < self.tiers.len() {
            self.enqueue(step, target, bytes);
        }
    }

    pub(super) fn enqueue(&self, step: u64, from: usize, bytes: u64) {
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pending.insert(step, (from, bytes));
            st.failed.remove(&step);
            self.update_gauges(&st);
        }
        let _ = self.tx.send((step, from));
    }

    pub(super) fn finish_drain(&self, step: u64, failure: Option<String>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending.remove(&step);
        if let Some(f) = failure {
            st.failed.insert(step, f);
        }
        self.update_gauges(&st);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Why the copy of `step` on tier `from` is bad (verified on its own, no fallback), or
    /// `None` when it verifies or cannot be asked now.
    pub(super) async fn source_is_bad(&self, step: u64, from: usize) -> Option<String> {
        let mut sink = super::sinks::DiscardSink;
        let opts = RestoreOptions::default();
        match self.run_restore(RestoreRequest::new(step, &opts).only(from), &mut sink).await {
            Ok(_) => None,
            Err(e) if is_bad_copy(&e) => Some(e.to_string()),
            Err(_) => None,
        }
    }

    /// Copies `step` from tier `from` to `from + 1`, verifying every checksum, then commits
    /// its manifest there.
    pub(super) async fn drain_one(&self, step: u64, from: usize) -> Result<u64> {
        self.copy_step(step, from, from + 1).await
    }
}

pub(super) async fn drain_loop(weak: Weak<Inner>, mut rx: mpsc::UnboundedReceiver<(u64, usize)>, concurrency: usize) {
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    while let Some((step, from)) = rx.recv().await {
        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else { break };
        let Some(inner) = weak.upgrade() else { break };
        tokio::spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            let mut attempt = 0;
            let result = loop {
                match inner.drain_one(step, from).await {
                    Err(e) if e.is_temporary() && attempt < inner.cfg.retries => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                    }
                    other => break other,
                }
            };
            // Deleted meanwhile: what this drain copied goes too.
            let deleted = inner.state.lock().unwrap_or_else(|p| p.into_inner()).deleted.remove(&step);
            if deleted {
                let _ = inner.remove(from + 1, step).await;
                inner.finish_drain(step, None);
                return;
            }
            match result {
                Ok(bytes) => {
                    let secs = start.elapsed().as_secs_f64();
                    {
                        let mut d = inner.drained.lock().unwrap_or_else(|p| p.into_inner());
                        d.checkpoints += 1;
                        d.bytes += bytes;
                        d.busy_seconds += secs;
                    }
                    inner.m.drain_seconds[from + 1].record(secs);
                    inner.m.drained_bytes[from + 1].increment(bytes);
                    tracing::debug!(step, bytes, "drained to {}", inner.tiers[from + 1].name());
                    // Onward to an even slower tier, then eviction here.
                    let next_bytes =
                        inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.get(&step).map(|p| p.1);
                    let onward = from + 2 < inner.tiers.len();
                    if onward {
                        inner.enqueue(step, from + 1, next_bytes.unwrap_or(bytes));
                    }
                    // Evict before reporting the drain done, so `drain()` returns on a settled
                    // store.
                    if let Err(e) = inner.evict(from, Evict::Policy).await {
                        tracing::warn!("evicting from {}: {e}", inner.tiers[from].name());
                    }
                    if !onward {
                        inner.finish_drain(step, None);
                    }
                    inner.changed.notify_waiters();
                }
                // The copy being drained may be bad (a part failed its checksum on the way, or
                // is missing): the source copy is verified on its own, and only if it is bad
                // is it quarantined and the drain goes on with later steps. A failure of the
                // destination (an upload the server damaged, a full disk) is a failed drain.
                Err(e) => {
                    let bad = if e.is_temporary() { None } else { inner.source_is_bad(step, from).await };
                    match bad {
                        Some(why) => {
                            let res = inner.quarantine(from, step, &why).await;
                            let _ = inner.remove(from + 1, step).await;
                            match res {
                                Ok(()) => inner.finish_drain(step, None),
                                Err(q) => {
                                    tracing::error!(step, "quarantining a bad copy failed: {q}");
                                    inner.finish_drain(step, Some(format!("{why}; quarantining it failed: {q}")));
                                }
                            }
                        }
                        None => {
                            tracing::error!(step, "drain to {} failed: {e}", inner.tiers[from + 1].name());
                            inner.finish_drain(step, Some(e.to_string()));
                        }
                    }
                }
            }
        });
    }
}

impl CheckpointStore {
    /// Waits until some drain finishes. False when nothing is pending (waiting cannot help).
    pub(super) async fn wait_for_drain_progress(&self) -> bool {
        let notified = self.inner.changed.notified();
        let pending = !self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.is_empty();
        if !pending {
            return false;
        }
        notified.await;
        true
    }

    /// Waits until every queued checkpoint has reached the slowest tier. Errors list the
    /// checkpoints whose drain failed.
    pub async fn drain(&self) -> Result<()> {
        loop {
            let notified = self.inner.changed.notified();
            {
                let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.pending.is_empty() {
                    if st.failed.is_empty() {
                        return Ok(());
                    }
                    let list: Vec<String> = st.failed.iter().map(|(s, e)| format!("step {s}: {e}")).collect();
                    return Err(Error::new(ErrorKind::Io, format!("drain failed for {}", list.join("; "))));
                }
            }
            notified.await;
        }
    }

    /// What the drain has done since the store was opened.
    pub fn drain_stats(&self) -> DrainStats {
        *self.inner.drained.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Steps quarantined since the store was opened (at recovery or by the drain), with the
    /// reason: what [`drain`](Self::drain) did not copy because no intact copy exists.
    pub fn quarantined_since_open(&self) -> Vec<(u64, String)> {
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.quarantined.iter().map(|(s, r)| (*s, r.clone())).collect()
    }

    /// Bytes of committed checkpoints waiting for or in the drain.
    pub fn drain_backlog_bytes(&self) -> u64 {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).pending.values().map(|p| p.1).sum()
    }
}
