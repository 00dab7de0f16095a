//! Everything `ringtier tune` writes outside its output directory: kernel settings in sysfs,
//! each changed only for as long as a measurement needs it and always put back.
//!
//! * [`block`]: the queue settings of the device under the data (`/sys/block/DEV/queue/*`:
//!   `scheduler`, `read_ahead_kb`, `nr_requests`, `nomerges`, ...), set per configuration of
//!   the sweep;
//! * [`thp`]: the transparent huge page mode (`/sys/kernel/mm/transparent_hugepage/enabled`),
//!   set to `always` while fio runs so that its buffers are on the same memory as ringtier's.
//!
//! Both write through [`set_recorded`], which records a file's original value in one
//! process-wide journal before its first write. The journal is played back (every file to its
//! original) by [`restore_all`]: between configurations, by a [`RestoreGuard`]'s drop (normal
//! end, error, panic unwinding), by a panic hook (a panic on any thread), and by a thread that
//! waits for SIGINT, SIGTERM and SIGHUP (Ctrl-C), which restores and then exits with 128 +
//! the signal ([`install_restorers`]). SIGKILL cannot be caught: the report's
//! `block_settings_before` then holds the values to put back by hand. A setting the kernel
//! does not let us write (not root, a read-only sysfs, an attribute the driver fixes) is a
//! note in the report, never an error.

pub(crate) mod block;
pub(crate) mod thp;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

use anyhow::Result;

/// Original values to put back: (file, value), in the order first changed.
static ORIGINALS: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());
static HOOKS: Once = Once::new();

/// Restores every recorded original when dropped.
#[derive(Debug)]
pub(crate) struct RestoreGuard(());

impl RestoreGuard {
    /// A guard that restores every recorded original (block or system setting) when dropped.
    pub(crate) fn new() -> RestoreGuard {
        RestoreGuard(())
    }
}

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        restore_all();
    }
}

/// Puts every changed setting back (newest change first is not needed: each file has one
/// original); returns how many were restored. Safe to call more than once.
pub(crate) fn restore_all() -> usize {
    let list = match ORIGINALS.lock() {
        Ok(mut l) => std::mem::take(&mut *l),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    let mut n = 0;
    for (path, value) in list.iter().rev() {
        match write_value(path, value) {
            Ok(()) => n += 1,
            Err(e) => eprintln!("tune: could not restore {} to {value:?}: {e}", path.display()),
        }
    }
    if n > 0 {
        eprintln!("tune: restored {n} kernel setting(s) (block queue, transparent huge pages)");
    }
    n
}

/// [`restore_all`], run between configurations (it says so only when it restored something).
pub(crate) fn restore_all_quiet() {
    restore_all();
}

/// Writes `value` to the kernel setting `path`, whose value now is `orig`, recording `orig`
/// first (the first time this file is changed) so that [`restore_all`] puts it back. Used for
/// the device's queue settings and for system settings a comparison needs for a while.
pub(crate) fn set_recorded(path: &Path, orig: &str, value: &str) -> Result<()> {
    {
        let mut list = ORIGINALS.lock().unwrap_or_else(|p| p.into_inner());
        if !list.iter().any(|(p, _)| p == path) {
            list.push((path.to_path_buf(), orig.to_string()));
        }
    }
    write_value(path, value).map_err(|e| anyhow::anyhow!("setting {} to {value:?} (was {orig:?}): {e}", path.display()))
}

/// Writes `value` to the sysfs file `path`, recording nothing.
fn write_value(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())?;
    f.flush()
}

/// Installs, once per process, the panic hook and the signal thread that restore the
/// settings. Call it before any other thread starts: SIGINT, SIGTERM and SIGHUP are blocked
/// in the calling thread (and so in every thread it starts later) and taken by the waiter.
pub(crate) fn install_restorers() {
    HOOKS.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_all();
            previous(info);
        }));
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        if set.thread_block().is_err() {
            eprintln!("tune: could not block signals; Ctrl-C will not restore block settings");
            return;
        }
        let spawned = std::thread::Builder::new().name("ringtier-tune-signals".into()).spawn(move || {
            if let Ok(sig) = set.wait() {
                eprintln!("tune: {sig}, restoring the kernel settings it changed");
                restore_all();
                std::process::exit(128 + sig as i32);
            }
        });
        if spawned.is_err() {
            let _ = set.thread_unblock();
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    /// Serializes the tests that use the process-wide journal of originals.
    pub(crate) static LOCK: Mutex<()> = Mutex::new(());
}
