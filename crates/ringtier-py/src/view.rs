//! The buffer protocol of the objects that hand pooled or restored memory to Python.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

/// Fills `view` with a writable, one-dimensional view (format `B`) of the `len` bytes at
/// `ptr`, exported by `owner`, and counts it in `exports` (released by `__releasebuffer__`).
///
/// # Safety
///
/// `view` is null or a `Py_buffer` the caller owns, and `ptr..ptr + len` stays valid while
/// `owner` lives (the view references `owner` through `view.obj` until it is released).
pub(crate) unsafe fn fill_view(
    py: Python<'_>,
    owner: *mut pyo3::ffi::PyObject,
    view: *mut pyo3::ffi::Py_buffer,
    ptr: *mut c_void,
    len: usize,
    flags: c_int,
    exports: &AtomicUsize,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("a null Py_buffer"));
    }
    // SAFETY: `view` is the caller's non-null Py_buffer; the bytes outlive `owner`, which the
    // view keeps referenced (the function's contract).
    let rc = unsafe { pyo3::ffi::PyBuffer_FillInfo(view, owner, ptr, len as pyo3::ffi::Py_ssize_t, 0, flags) };
    if rc != 0 {
        return Err(PyErr::fetch(py));
    }
    exports.fetch_add(1, Ordering::SeqCst);
    Ok(())
}
