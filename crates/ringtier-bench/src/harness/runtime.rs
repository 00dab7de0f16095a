//! The one way a benchmark (or the CLI) builds a tokio runtime.

use anyhow::{Context, Result};

/// A tokio runtime with timers and I/O: `workers == 0` gives a current-thread runtime (one
/// driver thread, the caller's), any other number a multi-thread runtime with that many
/// workers.
pub fn runtime(workers: usize) -> Result<tokio::runtime::Runtime> {
    let mut b = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    b.enable_all().build().context("building a tokio runtime")
}
