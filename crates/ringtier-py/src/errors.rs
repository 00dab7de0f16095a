//! ringtier errors as Python exceptions. The classes live in `ringtier/errors.py` (so that a
//! not-found error can be both a `FileNotFoundError` and a `ValueError`), and so does the table
//! of which class each [`ErrorKind`] is raised as (`ringtier.errors.CLASS_BY_KIND`, one class
//! per kind, each also the matching builtin). Each exception carries the error's `kind`
//! ([`ErrorKind::as_str`]), whether it is `temporary`, and the OS error code as `errno`.

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use ringtier_core::error::{Error, ErrorKind};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn module<'py>(py: Python<'py>) -> PyResult<&'py Bound<'py, PyModule>> {
    Ok(ERRORS.get_or_try_init(py, || py.import("ringtier.errors").map(Bound::unbind))?.bind(py))
}

/// What an exception is built from.
struct Fields<'a> {
    kind: &'a str,
    message: String,
    temporary: bool,
    errno: Option<i32>,
}

/// `ringtier.errors._from_kind(kind, message, ...)` (the class of the kind) when `class` is
/// None, else `ringtier.errors._new(class, message, kind, ...)`: a class below a kind
/// (`PoolExhaustedError`) or one of Python's own kinds (`closed`, `fork`).
fn try_build(py: Python<'_>, class: Option<&str>, f: &Fields<'_>) -> PyResult<PyErr> {
    let m = module(py)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("temporary", f.temporary)?;
    kwargs.set_item("errno", f.errno)?;
    let exc = match class {
        Some(name) => {
            kwargs.set_item("kind", f.kind)?;
            m.getattr("_new")?.call((m.getattr(name)?, f.message.as_str()), Some(&kwargs))?
        }
        None => m.getattr("_from_kind")?.call((f.kind, f.message.as_str()), Some(&kwargs))?,
    };
    Ok(PyErr::from_value(exc))
}

/// The exception [`try_build`] makes, or a `RuntimeError` with the message when
/// `ringtier.errors` itself fails.
fn build(class: Option<&str>, f: Fields<'_>) -> PyErr {
    Python::attach(|py| {
        try_build(py, class, &f)
            .unwrap_or_else(|e| PyRuntimeError::new_err(format!("{} (and ringtier.errors failed: {e})", f.message)))
    })
}

/// An exception of class `name` from `ringtier.errors` (not an engine error).
fn make(name: &str, message: String, kind: &str) -> PyErr {
    build(Some(name), Fields { kind, message, temporary: false, errno: None })
}

/// The Python exception for a ringtier error: the class `ringtier.errors.CLASS_BY_KIND` gives
/// its kind, with `kind`, `temporary` and `errno` (the OS code, also `OSError.errno`).
pub(crate) fn to_py(e: Error) -> PyErr {
    let fields =
        Fields { kind: e.kind().as_str(), message: e.to_string(), temporary: e.is_temporary(), errno: e.os_code() };
    build(None, fields)
}

/// `ringtier.errors.ForkError` (an object used in a process it was not created in).
pub(crate) fn fork_error(message: String) -> PyErr {
    make("ForkError", message, "fork")
}

/// `ringtier.errors.ClosedError` (a closed store).
pub(crate) fn closed(message: String) -> PyErr {
    make("ClosedError", message, "closed")
}

/// `ringtier.errors.PoolExhaustedError` (Python holds the buffers the loader needs): a
/// `ResourceExhaustedError` and a `BufferError`.
pub(crate) fn pool_exhausted(message: String) -> PyErr {
    make("PoolExhaustedError", message, ErrorKind::ResourceExhausted.as_str())
}

/// `ringtier.errors.InvalidInputError` with `message`.
pub(crate) fn invalid(message: String) -> PyErr {
    make("InvalidInputError", message, ErrorKind::InvalidInput.as_str())
}

/// A `TypeError` with `message`.
pub(crate) fn type_error(message: String) -> PyErr {
    PyTypeError::new_err(message)
}

/// An I/O error while doing `what`.
pub(crate) fn from_io(what: &str, e: std::io::Error) -> PyErr {
    to_py(Error::from(e).with_key(what.to_string()))
}

/// `Result<T, ringtier_core::Error>` to `PyResult<T>`.
pub(crate) trait IntoPy<T> {
    /// Maps the error with [`to_py`].
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for ringtier_core::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of `ringtier_core` (`ErrorKind` is `#[non_exhaustive]`, so no match here can
    /// be exhaustive: a new kind is added to this list and to `CLASS_BY_KIND`).
    const KINDS: [ErrorKind; 14] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::InvalidKey,
        ErrorKind::InvalidInput,
        ErrorKind::Misaligned,
        ErrorKind::OutOfRange,
        ErrorKind::NoSpace,
        ErrorKind::PermissionDenied,
        ErrorKind::Unsupported,
        ErrorKind::Corrupt,
        ErrorKind::ResourceExhausted,
        ErrorKind::Shutdown,
        ErrorKind::Busy,
        ErrorKind::Io,
    ];

    #[test]
    fn every_kind_has_its_class_in_errors_py() {
        let source = include_str!("../python/ringtier/errors.py");
        let table = source.split("CLASS_BY_KIND: Mapping").nth(1).expect("errors.py defines CLASS_BY_KIND");
        let table = &table[..table.find("\n)\n").expect("the end of CLASS_BY_KIND")];
        for kind in KINDS {
            let entry = format!("\"{}\": ", kind.as_str());
            assert!(table.contains(&entry), "{kind} has no class in ringtier.errors.CLASS_BY_KIND");
        }
        assert_eq!(table.matches("\": ").count(), KINDS.len(), "CLASS_BY_KIND names a kind ringtier_core lacks");
    }
}
