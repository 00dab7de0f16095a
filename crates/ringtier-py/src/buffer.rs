//! The one buffer exporter: bytes Rust owns (a pooled read buffer, decoded pixels, a record
//! field, a restored checkpoint part), handed to Python through the buffer protocol without a
//! copy. Every class that exports memory (`Sample`, `RecordField`, `Record`, `PartBuffer`)
//! holds an [`ExportedBytes`] and forwards `__getbuffer__` / `__releasebuffer__` to it.
//!
//! The views are writable, one-dimensional, format `B`. A view references the exporting Python
//! object (`view.obj`), so the bytes outlive every view; the bytes can be taken back early
//! ([`ExportedBytes::take`], `Sample.release()`) only while no view exists.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Memory an [`ExportedBytes`] can own: its bytes stay where they are until it is dropped.
pub(crate) trait OwnedBytes: Send {
    /// The bytes, mutable (taken once, when the exporter is made).
    fn as_mut_bytes(&mut self) -> &mut [u8];
}

impl OwnedBytes for Vec<u8> {
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// Where the bytes are, taken once from the owner.
#[derive(Debug, Clone, Copy)]
struct BytesPtr(*mut u8);

// SAFETY: the pointer is into memory the `Held` next to it owns, which never moves or
// reallocates while it is held (a Vec is never resized, a pooled buffer never moves); Python
// reaches it only through buffer views that keep the exporting object alive.
unsafe impl Send for BytesPtr {}

/// The owner and where its bytes are.
#[derive(Debug)]
struct Held<B> {
    owner: B,
    ptr: BytesPtr,
    len: usize,
}

/// Bytes owned in Rust and exported to Python through the buffer protocol, with a count of
/// the views alive.
#[derive(Debug)]
pub(crate) struct ExportedBytes<B> {
    /// None once taken back.
    held: Mutex<Option<Held<B>>>,
    /// Buffer views alive now.
    exports: AtomicUsize,
}

impl<B: OwnedBytes> ExportedBytes<B> {
    /// Exports the bytes of `owner`.
    pub(crate) fn new(mut owner: B) -> Self {
        let bytes = owner.as_mut_bytes();
        let (ptr, len) = (BytesPtr(bytes.as_mut_ptr()), bytes.len());
        ExportedBytes { held: Mutex::new(Some(Held { owner, ptr, len })), exports: AtomicUsize::new(0) }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Held<B>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes exported (0 once taken back).
    pub(crate) fn len(&self) -> usize {
        self.lock().as_ref().map_or(0, |h| h.len)
    }

    /// Buffer views alive now.
    pub(crate) fn views(&self) -> usize {
        self.exports.load(Ordering::SeqCst)
    }

    /// True once the bytes were taken back.
    pub(crate) fn is_taken(&self) -> bool {
        self.lock().is_none()
    }

    /// A copy of the bytes, or None once taken back.
    pub(crate) fn to_bytes<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let guard = self.lock();
        let h = guard.as_ref()?;
        // SAFETY: `ptr..ptr + len` is the owner's memory, held while `guard` is.
        let bytes = unsafe { std::slice::from_raw_parts(h.ptr.0.cast_const(), h.len) };
        Some(PyBytes::new(py, bytes))
    }

    /// Takes the owner back, ending the export; `Err(views)` while buffer views exist, Ok(None)
    /// when already taken.
    pub(crate) fn take(&self) -> Result<Option<B>, usize> {
        let mut guard = self.lock();
        let views = self.views();
        if views > 0 {
            return Err(views);
        }
        Ok(guard.take().map(|h| h.owner))
    }

    /// Takes the owner back as the exporter is dropped (no view can exist then: each keeps
    /// the exporting object alive).
    pub(crate) fn take_on_drop(&mut self) -> Option<B> {
        self.held.get_mut().unwrap_or_else(|p| p.into_inner()).take().map(|h| h.owner)
    }

    /// `__getbuffer__`: fills `view` with a writable, one-dimensional view (format `B`) of the
    /// bytes, exported by `exporter`, and counts it (until [`Self::release_view`]).
    /// `taken` is the error's message when the bytes were taken back.
    ///
    /// # Safety
    ///
    /// `exporter` is the Python object that owns `self` (its class's `__releasebuffer__` calls
    /// [`Self::release_view`]); `view` is null or a `Py_buffer` the caller owns.
    pub(crate) unsafe fn get_buffer(
        &self,
        py: Python<'_>,
        exporter: *mut pyo3::ffi::PyObject,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
        taken: &str,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a null Py_buffer"));
        }
        // Held across the fill and the count, so that `take` sees the view.
        let guard = self.lock();
        let h = guard.as_ref().ok_or_else(|| PyBufferError::new_err(taken.to_string()))?;
        // SAFETY: `view` is the caller's non-null Py_buffer. `ptr..ptr + len` stays valid while
        // `exporter` lives (it owns `self`, and `take` refuses while a view exists), and the
        // view references `exporter` through `view.obj` until it is released.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                exporter,
                h.ptr.0.cast::<c_void>(),
                h.len as pyo3::ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
        self.exports.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// `__releasebuffer__`: one view fewer.
    pub(crate) fn release_view(&self) {
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_taken_back_once_and_the_length_goes_to_zero() {
        let mut bytes = ExportedBytes::new(vec![7u8; 4096]);
        assert_eq!((bytes.len(), bytes.views(), bytes.is_taken()), (4096, 0, false));
        let owner = bytes.take().expect("no view").expect("held");
        assert_eq!(owner, vec![7u8; 4096]);
        assert_eq!((bytes.len(), bytes.is_taken()), (0, true));
        assert_eq!(bytes.take(), Ok(None));
        assert_eq!(bytes.take_on_drop(), None);
    }

    #[test]
    fn the_pointer_is_the_owners_memory() {
        let v = vec![1u8, 2, 3];
        let at = v.as_ptr();
        let mut bytes = ExportedBytes::new(v);
        let held = bytes.held.get_mut().expect("lock").as_ref().map(|h| (h.ptr.0.cast_const(), h.len));
        assert_eq!(held, Some((at, 3)));
        assert_eq!(bytes.take_on_drop().as_deref(), Some(&[1u8, 2, 3][..]));
    }
}
