//! A fixed pool of threads for blocking system calls, with futures for the results.
//!
//! This is what the posix tier runs its `pread`/`pwrite` on (the honest baseline: a
//! tf.data or PyTorch worker pool amounts to the same), and where file tiers run metadata
//! calls that io_uring has no opcode for (directory listing).

use std::fmt;
use std::future::Future;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::error::{Error, ErrorKind, Result};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of named threads running blocking closures.
pub struct BlockingPool {
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl fmt::Debug for BlockingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingPool").field("threads", &self.threads.len()).finish()
    }
}

impl BlockingPool {
    /// Starts `threads` threads (at least one) named `{name}-{i}`.
    pub fn new(name: &str, threads: usize) -> Result<Self> {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = crossbeam_channel::unbounded();
        let mut handles = Vec::with_capacity(threads.max(1));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| Error::from(e).with_operation(crate::error::Operation::Setup))?;
            handles.push(handle);
        }
        Ok(BlockingPool { tx: Some(tx), threads: handles })
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Runs `f` on a pool thread; the future resolves to its result.
    pub fn run<F, T>(&self, f: F) -> impl Future<Output = Result<T>> + Send + 'static
    where
        F: FnOnce() -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (done_tx, done_rx) = futures_channel::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done_tx.send(f());
        });
        let sent = match &self.tx {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        };
        async move {
            if !sent {
                return Err(Error::new(ErrorKind::Shutdown, "blocking pool is shut down"));
            }
            match done_rx.await {
                Ok(res) => res,
                Err(_) => Err(Error::new(ErrorKind::Shutdown, "blocking pool thread died before answering")),
            }
        }
    }
}

impl Drop for BlockingPool {
    fn drop(&mut self) {
        self.tx.take();
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            // A job that drops the last handle to its own pool must not join itself.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}
