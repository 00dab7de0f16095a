//! The hand-off between an epoch's worker and its consumer: the worker (a thread of its own or
//! a runtime task), the bounded queue of records and the bytes it holds.

use super::*;

/// Where an epoch's reading, parsing and shuffling run.
pub(super) enum Worker {
    /// A thread of its own, which drives the epoch on the runtime (`Handle::block_on`): the
    /// parsing runs beside the runtime's threads (which take the reads' completions) and the
    /// consumer, and every record is allocated on this one thread, so in one malloc arena
    /// (records allocated on whichever runtime worker ran the task spread over the workers'
    /// arenas, each keeping its high-water mark: about twice the bytes held in RSS).
    Thread,
    /// A runtime task, where a thread could not be started.
    Task(tokio::task::JoinHandle<()>),
}

/// Starts an epoch's work on its own thread (see [`Worker`]); on a runtime task where no
/// thread can be started. Call inside a tokio runtime.
pub(super) fn start(work: impl std::future::Future<Output = ()> + Send + 'static) -> Worker {
    let rt = tokio::runtime::Handle::current();
    let slot = Arc::new(std::sync::Mutex::new(Some(work)));
    let theirs = Arc::clone(&slot);
    let handle = rt.clone();
    let spawned = std::thread::Builder::new().name("ringtier-records".into()).spawn(move || {
        let work = theirs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(work) = work {
            handle.block_on(work);
        }
    });
    match spawned {
        Ok(_) => Worker::Thread,
        Err(e) => {
            tracing::warn!("records: no thread for the epoch ({e}); it runs as a runtime task");
            let work = slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            Worker::Task(rt.spawn(async move {
                if let Some(work) = work {
                    work.await;
                }
            }))
        }
    }
}

/// What the epoch task sends.
pub(super) enum Item {
    Record(Record),
    Skipped(String),
    Failed(Error),
}

/// Record bytes an epoch holds (parsed, in the shuffle buffer, in the prefetch queue; not
/// yet taken by the consumer), and the most it held at once.
#[derive(Debug, Default)]
pub(super) struct Held {
    pub(super) now: AtomicU64,
    pub(super) peak: AtomicU64,
}

impl Held {
    pub(super) fn add(&self, n: u64) {
        let now = self.now.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: u64) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The prefetch queue: at most `prefetch` records and `prefetch_bytes` bytes (the loaders'
/// one queue type, [`crate::queue`]), and the record bytes held.
pub(super) struct Queue {
    tx: crate::queue::Sender<Item>,
    pub(super) held: Arc<Held>,
}

impl Queue {
    pub(super) fn new(cfg: &RecordConfig) -> (Queue, crate::queue::Receiver<Item>) {
        let (tx, rx) = crate::queue::bounded(cfg.prefetch, cfg.prefetch_bytes);
        (Queue { tx, held: Arc::default() }, rx)
    }

    /// Sends a record (counted in `held` already) once the queue has room for its bytes.
    /// False when the consumer went away.
    pub(super) async fn send(&self, r: Record) -> bool {
        let n = r.bytes();
        self.tx.send(Item::Record(r), n).await
    }

    /// Sends a skipped record's reason or an error (no bytes). False when the consumer went
    /// away.
    pub(super) async fn note(&self, item: Item) -> bool {
        self.tx.send(item, 0).await
    }
}
