//! Setting up one driver's ring: size, SQPOLL, registered buffers (the tier's pool) and
//! registered files, each with a logged fallback when the kernel refuses.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::IoUring;
use ringtier_core::catalog;
use ringtier_core::error::{Error, Operation, Result};
use ringtier_core::BufferPool;

use super::{Driver, DriverHandle, Shared, FIXED_FILE_SLOTS};
use crate::config::UringConfig;

/// Times a ring refused for memory at every size is tried again (20 ms apart).
const ENOMEM_PAUSES: u32 = 5;

/// Starts one driver thread.
pub(crate) fn spawn(
    index: usize,
    config: &UringConfig,
    pool: Option<BufferPool>,
    shared: Arc<Shared>,
) -> Result<DriverHandle> {
    let tier_name = shared.name.clone();
    let setup = |e: io::Error, what: &str| {
        Error::from(e).with_operation(Operation::Setup).with_tier(&tier_name).with_key(what.to_string())
    };
    let asked = config.queue_depth.max(1);
    // A ring that the locked-memory limit refuses at the asked size (ENOMEM, `ulimit -l` as
    // in many containers) is retried at half the size, down to 8 entries; the driver then keeps
    // no more requests in flight than the ring it got holds.
    // The kernel gives a closed ring's memory back to the limit from a work queue, a moment
    // after the close: a ring refused at every size right after another was dropped (a loader
    // made after the last one) is tried again, a few times, after a pause.
    let first = (asked + 2).next_power_of_two() * 2;
    let mut entries = first;
    let mut pauses = 0;
    let ring = loop {
        match build_ring(config, entries) {
            Ok(ring) => break ring,
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && entries > 8 => entries /= 2,
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && pauses < ENOMEM_PAUSES => {
                pauses += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
                entries = first;
            }
            Err(e) => {
                let what = match (config.coop_taskrun, config.defer_taskrun) {
                    (_, true) => "io_uring_setup (DEFER_TASKRUN + SINGLE_ISSUER, Linux 6.1)",
                    (true, false) => "io_uring_setup (COOP_TASKRUN, Linux 5.19)",
                    _ => "io_uring_setup",
                };
                return Err(setup(e, what));
            }
        }
    };
    let depth = asked.min((entries / 2).saturating_sub(2).max(1));
    if depth < asked && index == 0 {
        tracing::warn!(
            tier = %tier_name,
            "io_uring_setup refused a ring for {asked} requests in flight (ENOMEM: locked-memory limit); \
             using {depth}. Raise `ulimit -l` for the full depth."
        );
    }

    // SAFETY: eventfd takes no pointers.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(setup(io::Error::last_os_error(), "eventfd"));
    }
    // SAFETY: efd is a fresh descriptor nobody else owns.
    let wake_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });

    let mut registered_pool = None;
    if let (Some(pool), true) = (&pool, config.register_buffers) {
        if pool.count() > 16_384 || pool.buf_size() > (1 << 30) {
            shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(tier = %shared.name, "buffer pool too large to register as fixed buffers; using plain buffers");
        } else {
            let iovecs: Vec<libc::iovec> = (0..pool.count() as u32)
                .map(|i| libc::iovec { iov_base: pool.buffer_ptr(i).cast(), iov_len: pool.buf_size() })
                .collect();
            // SAFETY: every iovec points into the pool's slab, which stays allocated while the
            // driver holds its `pool` clone (dropped only after the ring).
            match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => registered_pool = Some(pool.id()),
                Err(e) => {
                    shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(catalog::URING_REGISTER_FALLBACKS_TOTAL, "tier" => shared.name.clone(), "what" => "buffers")
                        .increment(1);
                    if index == 0 {
                        tracing::warn!(
                            tier = %shared.name,
                            "could not register {} bytes of buffers with io_uring ({e}); RLIMIT_MEMLOCK may be too low. \
                             Using plain buffers.",
                            pool.count() * pool.buf_size()
                        );
                    }
                }
            }
        }
    }
    let mut fixed_files = false;
    let mut direct_files = false;
    if config.register_files {
        // Slots [0, FIXED_FILE_SLOTS) for opened files (UringFile); the rest, one per request
        // in flight, for the kernel to allocate to per-file opens (direct descriptors).
        let per_file = depth + 64;
        match ring.submitter().register_files_sparse(FIXED_FILE_SLOTS + per_file) {
            Ok(()) => {
                fixed_files = true;
                direct_files = set_file_alloc_range(&ring, FIXED_FILE_SLOTS, per_file).is_ok();
            }
            Err(e) => {
                shared.stats.register_fallbacks.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(catalog::URING_REGISTER_FALLBACKS_TOTAL, "tier" => shared.name.clone(), "what" => "files")
                    .increment(1);
                tracing::warn!(tier = %shared.name, "could not register a fixed-file table ({e}); using plain descriptors");
            }
        }
    }

    let (tx, rx) = crossbeam_channel::unbounded();
    let parked = Arc::new(AtomicBool::new(false));
    let in_flight_gauge = metrics::gauge!(catalog::URING_IN_FLIGHT, "tier" => shared.name.clone());
    let submits = metrics::counter!(catalog::URING_SUBMITS_TOTAL, "tier" => shared.name.clone());
    let sqes = metrics::counter!(catalog::URING_SQES_TOTAL, "tier" => shared.name.clone());
    let mut driver = Driver {
        ring,
        rx,
        wake_fd: Arc::clone(&wake_fd),
        parked: Arc::clone(&parked),
        depth: depth as usize,
        max_read: config.max_read_bytes as usize,
        jobs: Vec::new(),
        free_ids: Vec::new(),
        queue: VecDeque::new(),
        in_flight: 0,
        unsubmitted: 0,
        registered_pool,
        _pool: pool,
        fixed_files,
        direct_files,
        shared,
        wake_buf: Box::new(0),
        wake_armed: false,
        in_flight_gauge,
        submits,
        sqes,
    };
    let enable = config.defer_taskrun;
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
    let thread = std::thread::Builder::new()
        .name(format!("ringtier-uring-{index}"))
        .spawn(move || {
            // A disabled ring (DEFER_TASKRUN) becomes this thread's: enabled here, so that
            // SINGLE_ISSUER names the driver thread as the ring's one submitter.
            let enabled = if enable { driver.ring.submitter().register_enable_rings() } else { Ok(()) };
            let ok = enabled.is_ok();
            let _ = ready_tx.send(enabled);
            if ok {
                driver.run();
            }
        })
        .map_err(|e| Error::from(e).with_operation(Operation::Setup))?;
    let mut handle = DriverHandle { tx: Some(tx), wake: wake_fd, parked, thread: Some(thread) };
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => {
            handle.stop();
            Err(setup(e, "IORING_REGISTER_ENABLE_RINGS"))
        }
        Err(_) => {
            handle.stop();
            Err(setup(io::Error::other("the driver thread ended during set-up"), "driver thread"))
        }
    }
}

/// A ring of `entries` entries with the set-up flags `config` asks for.
fn build_ring(config: &UringConfig, entries: u32) -> io::Result<IoUring> {
    let mut builder = IoUring::builder();
    if let Some(idle) = config.sqpoll_idle_ms {
        builder.setup_sqpoll(idle);
    }
    // TASKRUN_FLAG: the kernel marks pending completion work in the SQ ring flags, so that a
    // submit without waiting still enters with GETEVENTS and runs it (io-uring's
    // `submit_and_wait` checks the flag).
    if config.coop_taskrun {
        builder.setup_coop_taskrun().setup_taskrun_flag();
    }
    if config.defer_taskrun {
        // SINGLE_ISSUER binds the ring to the task that creates it, unless it is created
        // disabled: then to the task that enables it, the driver thread (see `Driver::run`),
        // which is the only one that ever submits, registers or reaps.
        builder.setup_single_issuer().setup_defer_taskrun().setup_taskrun_flag().setup_r_disabled();
    }
    builder.build(entries)
}

/// `IORING_REGISTER_FILE_ALLOC_RANGE`: the kernel allocates direct descriptors only from
/// `[off, off + len)` (Linux 6.0). The io-uring crate has no wrapper for it.
fn set_file_alloc_range(ring: &IoUring, off: u32, len: u32) -> io::Result<()> {
    #[repr(C)]
    struct FileIndexRange {
        off: u32,
        len: u32,
        resv: u64,
    }
    const IORING_REGISTER_FILE_ALLOC_RANGE: libc::c_long = 25;
    let range = FileIndexRange { off, len, resv: 0 };
    // SAFETY: io_uring_register on our ring's descriptor with a pointer to a correctly laid
    // out io_uring_file_index_range that lives across the call; nr_args must be 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring.as_raw_fd(),
            IORING_REGISTER_FILE_ALLOC_RANGE,
            &range as *const FileIndexRange,
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
