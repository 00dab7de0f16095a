//! [`CachedTier`] over a node directory shared by processes ([`CachedTier::for_node_dir`]):
//! reads follow this rank's plan (a planned copy is read and verified, else the slow tier;
//! a run's first reader writes the copy, its last one drops it), and the clairvoyant
//! prefetcher writes this rank's next runs into slots the plan has freed, with the read budget
//! the readers leave.

use std::collections::BTreeSet;

use super::*;
use crate::node_dir::dir::{Found, Replace, SlotState};
use crate::node_dir::plan::Decision;
use crate::node_dir::Shared;

/// Objects one prefetch batch holds at most.
const GROUP: usize = 16;
/// Slots a prefetcher pass looks at, at most.
const SCAN: usize = 64;

fn replace_of(d: &Decision) -> Replace {
    if d.replace_dead {
        Replace::Older
    } else {
        Replace::Free
    }
}

impl Inner {
    fn shared(&self) -> &Shared {
        self.shared.as_ref().expect("shared mode")
    }

    /// Serves `batch` through the node directory (see the module docs).
    pub(super) async fn shared_read_batch(self: &Arc<Self>, mut batch: ReadBatch) -> ReadBatch {
        let sh = self.shared();
        let cur = sh.current();
        let mut plan: Vec<Option<(u32, Decision, u64)>> = vec![None; batch.len()];
        {
            let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
            let (names, entries) = batch.parts_mut();
            for (i, e) in entries.iter().enumerate() {
                if e.is_done() {
                    continue;
                }
                let Some(&id) = keys.ids.get(e.key(names)) else { continue };
                let Some(cur) = &cur else { continue };
                if let Some((p, d)) = cur.decision(sh.local, id) {
                    cur.cursor.fetch_max(p + 1, Ordering::AcqRel);
                    plan[i] = Some((id, d, keys.sizes[id as usize]));
                }
            }
        }
        // A copy this rank's prefetcher is bringing in: wait for it (at most a second) rather
        // than reading the slow tier twice.
        if let Some(cur) = &cur {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
            loop {
                let notified = self.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let busy = {
                    let f = cur.fetching.lock().unwrap_or_else(|p| p.into_inner());
                    plan.iter().flatten().any(|(id, d, _)| d.start && f.contains(id))
                };
                if !busy || tokio::time::timeout_at(deadline, notified).await.is_err() {
                    break;
                }
            }
        }
        // Planned copies, read and verified off the runtime's threads.
        let wanted: Vec<(usize, u32, Decision, u64)> = plan
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.filter(|(_, d, _)| d.kept()).map(|(id, d, s)| (i, id, d, s)))
            .collect();
        let found: Vec<Found> = if wanted.is_empty() {
            Vec::new()
        } else {
            let this = Arc::clone(self);
            let asks: Vec<(u32, u32, u64, u64)> = wanted.iter().map(|&(_, id, d, s)| (d.slot, id, d.gen, s)).collect();
            tokio::task::spawn_blocking(move || {
                asks.into_iter().map(|(slot, id, gen, size)| this.shared().dir.read(slot, id, gen, size)).collect()
            })
            .await
            .unwrap_or_default()
        };
        let mut drops = Vec::new();
        {
            let (_, entries) = batch.parts_mut();
            for ((i, id, d, _), f) in wanted.iter().zip(found) {
                let e = &mut entries[*i];
                match f {
                    Found::Copy(data) => {
                        let Some(mut buf) = e.take_buf() else { continue };
                        let res = copy_out(&data, e.offset(), e.len(), &mut buf);
                        let mut st = self.lock();
                        if let Ok(n) = &res {
                            st.count_bytes(true, *n as u64);
                        }
                        if e.offset() == 0 {
                            if d.start {
                                st.counters.prefetch_hits[0] += 1;
                            } else {
                                st.counters.hits[0] += 1;
                            }
                        }
                        drop(st);
                        e.finish(res, buf);
                    }
                    Found::Bad => {
                        sh.counters.bad.fetch_add(1, Ordering::Relaxed);
                    }
                    Found::Miss => {}
                }
                if d.end {
                    drops.push((d.slot, *id, d.gen)); // also when missed: a late writer must not bring it back
                }
            }
        }
        if !drops.is_empty() {
            let this = Arc::clone(self);
            tokio::task::spawn_blocking(move || {
                for (slot, id, gen) in drops {
                    if this.shared().dir.drop_run(slot, id, gen) {
                        this.shared().counters.dropped.fetch_add(1, Ordering::Relaxed);
                        this.lock().counters.evictions += 1;
                    }
                }
            });
        }
        // The rest from the slow tier, as one batch.
        let mut misses = ReadBatch::new();
        let mut missed = Vec::new();
        {
            let (names, entries) = batch.parts_mut();
            for (i, e) in entries.iter_mut().enumerate() {
                if e.is_done() {
                    continue;
                }
                let Some(buf) = e.take_buf() else { continue };
                misses.push(e.key(names), e.offset(), e.len(), buf);
                missed.push(i);
            }
        }
        if !missed.is_empty() {
            let demand = DemandGuard::new(self, misses.len());
            let mut misses = self.backing.read_batch(misses).await;
            drop(demand);
            let mut writes = Vec::new();
            let (_, entries) = batch.parts_mut();
            for (i, (_, offset, res, buf)) in missed.into_iter().zip(misses.drain()) {
                let e = &mut entries[i];
                if let (Ok(n), Some(b)) = (&res, &buf) {
                    let mut st = self.lock();
                    st.count_bytes(false, *n as u64);
                    if offset == 0 {
                        st.counters.misses += 1;
                    }
                    drop(st);
                    if let Some((id, d, size)) = plan[i] {
                        // A run that goes on after this read: its copy, written by this reader.
                        if d.kept() && !d.end && offset == 0 && *n as u64 == size {
                            writes.push((d, id, Arc::<[u8]>::from(b.as_slice())));
                        }
                    }
                }
                match buf {
                    Some(b) => e.finish(res, b),
                    None => e.set_result(res),
                }
            }
            if !writes.is_empty() {
                let this = Arc::clone(self);
                tokio::task::spawn_blocking(move || {
                    for (d, id, data) in writes {
                        this.place(d, id, &data, Replace::Older);
                    }
                });
            }
        }
        self.report();
        self.notify.notify_waiters();
        batch
    }

    /// Writes run `d` of sample `id` (blocking).
    fn place(&self, d: Decision, id: u32, data: &[u8], replace: Replace) {
        let sh = self.shared();
        match sh.dir.write(d.slot, id, d.gen, data, replace) {
            Ok(crate::node_dir::dir::Wrote::Placed) => {
                sh.counters.placed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(crate::node_dir::dir::Wrote::Skipped) => {
                sh.counters.skipped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                sh.counters.skipped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("writing a copy into the node cache failed (read from the slow tier instead): {e}");
            }
        }
    }
}

/// The clairvoyant prefetcher of a node directory: this rank's next run starts, in read order,
/// fetched in batches of up to [`GROUP`] into slots the plan has freed, while the readers'
/// reads and its own stay within `prefetch_depth`. Slots freed by other processes are seen by
/// looking again every few milliseconds.
pub(super) async fn shared_prefetcher(weak: Weak<Inner>, notify: Arc<Notify>) {
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(inner) = weak.upgrade() else { return };
        let depth = inner.cfg.prefetch_depth;
        let busy = inflight.load(Ordering::Acquire) + inner.demand.load(Ordering::Acquire);
        let room = depth.saturating_sub(busy).min(GROUP);
        let cur = inner.shared().current();
        if let (Some(cur), true) = (cur, room > 0) {
            let cursor = cur.cursor.load(Ordering::Acquire) as u32;
            let look: Vec<u32> = {
                let mut pending = cur.pending.lock().unwrap_or_else(|p| p.into_inner());
                *pending = pending.split_off(&cursor); // passed: read on demand
                pending.iter().copied().take(SCAN).collect()
            };
            let this = Arc::clone(&inner);
            let cur2 = Arc::clone(&cur);
            // Which of the next run starts may come in now (a header read each, off the runtime).
            let picked: Vec<(u32, u32, Decision)> = tokio::task::spawn_blocking(move || {
                let sh = this.shared();
                let mine = &cur2.plan.ranks[sh.local];
                let mut picked = Vec::new();
                let mut done = BTreeSet::new();
                for p in look {
                    if picked.len() >= room {
                        break;
                    }
                    let (id, d) = (cur2.order[p as usize], mine[p as usize]);
                    match sh.dir.prefetch_state(d.slot, id, d.gen, replace_of(&d)) {
                        SlotState::Done => {
                            done.insert(p);
                        }
                        SlotState::Free => {
                            done.insert(p);
                            picked.push((p, id, d));
                        }
                        SlotState::Busy => {}
                    }
                }
                let mut pending = cur2.pending.lock().unwrap_or_else(|p| p.into_inner());
                for p in done {
                    pending.remove(&p);
                }
                picked
            })
            .await
            .unwrap_or_default();
            if !picked.is_empty() {
                let objects: Vec<(String, u64)> = {
                    let keys = inner.keys.read().unwrap_or_else(|p| p.into_inner());
                    picked
                        .iter()
                        .map(|(_, id, _)| (keys.names[*id as usize].clone(), keys.sizes[*id as usize]))
                        .collect()
                };
                inflight.fetch_add(picked.len(), Ordering::AcqRel);
                cur.fetching.lock().unwrap_or_else(|p| p.into_inner()).extend(picked.iter().map(|(_, id, _)| *id));
                let n = picked.len();
                let cur3 = Arc::clone(&cur);
                let this = Arc::clone(&inner);
                let counter = Arc::clone(&inflight);
                tasks.spawn(async move {
                    let fetched = this.fetch_many(&objects).await;
                    {
                        let mut st = this.lock();
                        for ((_, size), data) in objects.iter().zip(&fetched) {
                            if data.is_ok() {
                                st.counters.prefetched += 1;
                                st.counters.prefetched_bytes += size;
                            }
                        }
                    }
                    let writer = Arc::clone(&this);
                    let ids: Vec<u32> = picked.iter().map(|(_, id, _)| *id).collect();
                    let _ = tokio::task::spawn_blocking(move || {
                        for ((_, id, d), data) in picked.into_iter().zip(fetched) {
                            match data {
                                Ok(data) => writer.place(d, id, &data, replace_of(&d)),
                                Err(e) => tracing::warn!("prefetching into the node cache: {e}"),
                            }
                        }
                    })
                    .await;
                    {
                        let mut f = cur3.fetching.lock().unwrap_or_else(|p| p.into_inner());
                        for id in ids {
                            f.remove(&id);
                        }
                    }
                    counter.fetch_sub(n, Ordering::AcqRel);
                    this.report();
                    this.notify.notify_waiters();
                });
                drop(inner);
                continue;
            }
        }
        drop(inner);
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => {}
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
        while tasks.try_join_next().is_some() {}
    }
}
