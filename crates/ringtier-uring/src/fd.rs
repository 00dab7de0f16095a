//! Files that queued and in-flight jobs name.
//!
//! A job never carries a bare descriptor number. It holds an `Arc` of the file (or of the
//! tier's root), so the descriptor stays open until the job's last completion has been reaped,
//! whatever the caller does meanwhile: a dropped future, a dropped writer or `UringFile`, a
//! dropped tier. Without this, a job queued behind the queue depth could reach the kernel after
//! its file was closed and its number reused by an unrelated `open`, and write into that file
//! (the pattern of tokio-uring's `SharedFd`).
//!
//! A fixed-file slot is released the same way: [`FixedSlot`] unregisters the slot on every
//! ring when the last holder drops it, and only then is the slot free for another file. The
//! unregistration travels through each driver's job channel, after every job already sent.

use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use futures_channel::oneshot;

use crate::driver::Job;

/// The slot table of a tier's rings: `true` where a slot is taken.
pub(crate) type SlotTable = Arc<Mutex<Vec<bool>>>;

/// A fixed-file slot registered on every ring of a tier.
pub(crate) struct FixedSlot {
    slot: u32,
    drivers: Vec<crossbeam_channel::Sender<Job>>,
    table: SlotTable,
}

impl FixedSlot {
    /// Takes a free slot of `table`, to be registered through `drivers`; `None` when all are
    /// taken.
    pub(crate) fn reserve(table: &SlotTable, drivers: Vec<crossbeam_channel::Sender<Job>>) -> Option<Self> {
        let mut slots = table.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.iter().position(|used| !used)?;
        slots[slot] = true;
        Some(FixedSlot { slot: slot as u32, drivers, table: Arc::clone(table) })
    }

    /// The slot number.
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }
}

impl Drop for FixedSlot {
    fn drop(&mut self) {
        for d in &self.drivers {
            let (reply, _) = oneshot::channel();
            // A stopped driver has no table left to clear.
            let _ = d.send(Job::RegisterFile { slot: self.slot, fd: -1, reply });
        }
        let mut slots = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots.get_mut(self.slot as usize) {
            *s = false;
        }
    }
}

impl fmt::Debug for FixedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FixedSlot").field(&self.slot).finish()
    }
}

/// An open file, possibly registered as a fixed file, shared by its owner and the jobs that
/// name it.
#[derive(Debug)]
pub(crate) struct SharedFile {
    /// Declared first: the slot is unregistered before the descriptor closes.
    fixed: Option<FixedSlot>,
    file: File,
}

impl SharedFile {
    pub(crate) fn new(file: File) -> Self {
        SharedFile { fixed: None, file }
    }

    /// Records the fixed-file slot the file was registered in.
    pub(crate) fn set_fixed(&mut self, slot: FixedSlot) {
        self.fixed = Some(slot);
    }

    /// The descriptor, valid while this value lives.
    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The fixed-file slot, when registered.
    pub(crate) fn fixed(&self) -> Option<u32> {
        self.fixed.as_ref().map(FixedSlot::slot)
    }
}
