//! The bounded prefetch queue between an epoch's producer and its consumer: one type for both
//! loaders. The file loader sends each batch's reading task (bounded by count; its buffers are
//! bounded by the pool it reserves from), the record loader sends records (bounded by count and
//! by bytes). Dropping the receiving side stops a producer that waits for room.

use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

/// A bounded queue: at most `items` items waiting, and where `bytes` is not 0 at most that many
/// bytes (one semaphore permit per byte, taken before an item is sent and given back when the
/// consumer takes it; an item larger than the bound takes all of them).
pub(crate) fn bounded<T>(items: usize, bytes: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(items.max(1));
    let total = (bytes as u64).min(u64::from(u32::MAX));
    let bound = Arc::new(ByteBound { sem: Semaphore::new(total as usize), total });
    (Sender { tx, bound: Arc::clone(&bound) }, Receiver { rx, bound })
}

/// The byte bound: permits of a semaphore, one per byte.
#[derive(Debug)]
struct ByteBound {
    sem: Semaphore,
    /// Permits in all (the bound, at most `u32::MAX`); 0: no byte bound.
    total: u64,
}

impl ByteBound {
    /// Permits an item of `bytes` takes.
    fn permits(&self, bytes: u64) -> u32 {
        bytes.min(self.total) as u32
    }
}

/// The producer's end.
#[derive(Debug)]
pub(crate) struct Sender<T> {
    tx: mpsc::Sender<(T, u32)>,
    bound: Arc<ByteBound>,
}

impl<T> Sender<T> {
    /// Sends `item`, which holds `bytes` against the byte bound, once there is room for it.
    /// False when the consumer went away.
    pub(crate) async fn send(&self, item: T, bytes: u64) -> bool {
        let n = self.bound.permits(bytes);
        if n > 0 {
            match self.bound.sem.acquire_many(n).await {
                Ok(p) => p.forget(),
                Err(_) => return false,
            }
        }
        self.tx.send((item, n)).await.is_ok()
    }
}

/// The consumer's end.
#[derive(Debug)]
pub(crate) struct Receiver<T> {
    rx: mpsc::Receiver<(T, u32)>,
    bound: Arc<ByteBound>,
}

impl<T> Receiver<T> {
    /// The next item (its bytes given back to the bound); `None` once the producer is done.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        self.recv_then(|_| {}).await
    }

    /// The next item, with `taken` run on it before its bytes go back to the bound: a consumer
    /// that counts the bytes it holds (the record loader's `held`) uncounts them there, so the
    /// producer, which counts an item before it waits for room, never sees both counted.
    pub(crate) async fn recv_then(&mut self, taken: impl FnOnce(&T)) -> Option<T> {
        let (item, n) = self.rx.recv().await?;
        taken(&item);
        self.bound.sem.add_permits(n as usize);
        Some(item)
    }

    /// Drops what is queued now (a failed epoch delivers nothing after its error).
    pub(crate) fn drain(&mut self) {
        while let Ok((item, n)) = self.rx.try_recv() {
            self.bound.sem.add_permits(n as usize);
            drop(item);
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // A producer waiting for room stops (its acquire fails) instead of waiting forever.
        self.bound.sem.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_by_bytes_and_count() {
        let (tx, mut rx) = bounded::<u32>(8, 100);
        assert!(tx.send(1, 60).await);
        // 60 + 60 > 100: the second waits until the first is taken.
        let second = tokio::spawn(async move {
            let ok = tx.send(2, 60).await;
            (ok, tx)
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "the byte bound let a second item in");
        assert_eq!(rx.recv().await, Some(1));
        let (ok, tx) = second.await.expect("join");
        assert!(ok);
        assert_eq!(rx.recv().await, Some(2));
        // An item larger than the bound takes all of it and still goes through.
        assert!(tx.send(3, 1_000).await);
        assert_eq!(rx.recv().await, Some(3));
        drop(tx);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_dropped_consumer_stops_a_waiting_producer() {
        let (tx, rx) = bounded::<u32>(8, 10);
        assert!(tx.send(1, 10).await);
        let waiting = tokio::spawn(async move { tx.send(2, 10).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(rx);
        assert!(!waiting.await.expect("join"), "the send went through to nobody");
    }

    #[tokio::test]
    async fn count_bound_without_a_byte_bound() {
        let (tx, mut rx) = bounded::<u32>(1, 0);
        assert!(tx.send(1, 1 << 40).await);
        let second = tokio::spawn(async move { tx.send(2, 0).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "the count bound let a second item in");
        assert_eq!(rx.recv().await, Some(1));
        assert!(second.await.expect("join"));
        rx.drain();
    }
}
