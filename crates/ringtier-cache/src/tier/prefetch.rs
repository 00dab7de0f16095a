//! The clairvoyant prefetcher: the objects the ranks sharing the cache will read next, fetched
//! ahead in batches into free room (or the staged budget), with only the read budget that the
//! readers' own reads leave.

use super::*;

/// Objects one prefetch request batch holds at most.
const PREFETCH_GROUP: usize = 16;

/// The clairvoyant prefetcher: takes the next objects in the node's time order that may come in,
/// fetches them in batches of up to [`PREFETCH_GROUP`], and waits for room when there is none.
/// Its reads and the readers' reads at the slow tier together stay within `prefetch_depth`:
/// demand reads come first, the prefetcher spends only the bandwidth they leave.
pub(super) async fn prefetcher(weak: Weak<Inner>, notify: Arc<Notify>) {
    let mut tasks = tokio::task::JoinSet::new();
    let depth = match weak.upgrade() {
        Some(inner) => inner.cfg.prefetch_depth,
        None => return,
    };
    let permits = Arc::new(Semaphore::new(depth));
    // Objects in flight, prefetched and demanded, after taking one more.
    let busy = |inner: &Inner, permits: &Semaphore| {
        depth - permits.available_permits() + inner.demand.load(std::sync::atomic::Ordering::Acquire)
    };
    loop {
        let Ok(mut permit) = Arc::clone(&permits).acquire_owned().await else { return };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(inner) = weak.upgrade() else { return };
        let (group, dropped): (Vec<(u32, String, u64)>, _) = {
            let keys = inner.keys.read().unwrap_or_else(|p| p.into_inner());
            let mut st = inner.lock();
            let mut group = Vec::new();
            while group.len() < PREFETCH_GROUP && busy(&inner, &permits) <= depth {
                if !group.is_empty() {
                    match Arc::clone(&permits).try_acquire_owned() {
                        Ok(p) if busy(&inner, &permits) <= depth => permit.merge(p),
                        _ => break,
                    }
                }
                let Some((id, size)) = st.next_prefetch(&keys.sizes) else { break };
                match keys.names.get(id as usize) {
                    Some(key) => group.push((id, key.clone(), size)),
                    None => {
                        st.inflight.remove(&id);
                        st.abandon(id);
                    }
                }
            }
            (group, std::mem::take(&mut st.dropped))
        };
        inner.drop_files(dropped);
        if group.is_empty() {
            drop(permit);
            drop(inner);
            tokio::select! {
                _ = notified => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        } else {
            tasks.spawn(async move {
                let _permit = permit;
                let mut guard = InflightGuard { inner: &inner, ids: group.iter().map(|g| g.0).collect(), done: false };
                let objects: Vec<(String, u64)> = group.iter().map(|(_, k, s)| (k.clone(), *s)).collect();
                let fetched = inner.fetch_many(&objects).await;
                let mut stored = Vec::with_capacity(group.len());
                for ((id, key, _), data) in group.iter().zip(fetched) {
                    let copy = match data {
                        Ok(d) => {
                            let level = inner.lock().entries.get(id).map(|e| e.level);
                            match level {
                                Some(l) if inner.write_level(*id, l, d.clone()).await => Some(inner.memory_copy(l, &d)),
                                _ => None,
                            }
                        }
                        Err(e) => {
                            tracing::warn!("prefetching {key}: {e}");
                            None
                        }
                    };
                    stored.push((*id, copy));
                }
                guard.done = true;
                let mut st = inner.lock();
                for (id, copy) in stored {
                    st.inflight.remove(&id);
                    match copy {
                        Some(copy) => st.complete(id, copy),
                        None => st.abandon(id),
                    }
                }
                drop(st);
                inner.report();
                inner.notify.notify_waiters();
            });
        }
        while tasks.try_join_next().is_some() {}
    }
}

/// Removes a prefetch's reservation if its task is dropped before it finished.
struct InflightGuard<'a> {
    inner: &'a Arc<Inner>,
    ids: Vec<u32>,
    done: bool,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self.inner.lock();
            for &id in &self.ids {
                st.inflight.remove(&id);
                st.abandon(id);
            }
            drop(st);
            self.inner.notify.notify_waiters();
        }
    }
}
