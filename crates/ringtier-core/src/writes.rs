//! Writes of one object writer still in flight, whether or not their futures are still
//! polled: the file tiers make a writer's next write and its commit wait for them, so a
//! dropped `write_at` can neither land after a later write nor after the commit's data fsync.

use std::sync::{Arc, Mutex};

use futures_channel::oneshot;

/// The writes of one writer that have not completed yet, including those whose futures were
/// dropped: a later write and the commit wait for them, so a cancelled write can never land
/// after a later one or after the data fsync.
#[derive(Debug, Default)]
pub struct WritesInFlight {
    state: Mutex<(usize, Vec<oneshot::Sender<()>>)>,
}

/// One write counted in [`WritesInFlight`] until it is dropped (by the job, when its last
/// completion is reaped).
#[derive(Debug)]
pub struct WriteTicket(Arc<WritesInFlight>);

impl WritesInFlight {
    /// Counts one more write until the returned ticket is dropped.
    pub fn ticket(self: &Arc<Self>) -> WriteTicket {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
        WriteTicket(Arc::clone(self))
    }

    /// Waits until every ticket is dropped.
    pub async fn idle(&self) {
        let rx = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.0 == 0 {
                return;
            }
            let (tx, rx) = oneshot::channel();
            st.1.push(tx);
            rx
        };
        // A dropped sender (the tier went away) ends the wait too.
        let _ = rx.await;
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 -= 1;
        if st.0 == 0 {
            for tx in st.1.drain(..) {
                let _ = tx.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_waits_for_every_ticket_even_of_abandoned_writes() {
        let writes = Arc::new(WritesInFlight::default());
        tokio::time::timeout(Duration::from_secs(1), writes.idle()).await.expect("idle with no writes");
        let (a, b) = (writes.ticket(), writes.ticket());
        let waiter = tokio::spawn({
            let writes = Arc::clone(&writes);
            async move { writes.idle().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "one write still in flight");
        // The last ticket goes on another thread, as a driver or pool thread drops it.
        std::thread::spawn(move || drop(b)).join().expect("thread");
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("task");
    }
}
