//! ringtier errors as Python exceptions. The classes live in `ringtier/errors.py` (so that a
//! not-found error can be both a `FileNotFoundError` and a `ValueError`); each carries the
//! error's `kind` (`ringtier_core::ErrorKind::as_str`) and whether it is `temporary`.

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use ringtier_core::error::{Error, ErrorKind};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS.get_or_try_init(py, || py.import("ringtier.errors").map(Bound::unbind))?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// An exception of class `name` from `ringtier.errors` with `message`, `kind` and `temporary`.
fn make(name: &str, message: String, kind: &str, temporary: bool) -> PyErr {
    Python::attach(|py| {
        let built = class(py, name).and_then(|cls| {
            let exc = cls.call1((message.clone(),))?;
            exc.setattr("kind", kind)?;
            exc.setattr("temporary", temporary)?;
            Ok(PyErr::from_value(exc))
        });
        built.unwrap_or_else(|e| PyRuntimeError::new_err(format!("{message} (and ringtier.errors failed: {e})")))
    })
}

/// The Python exception for a ringtier error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let name = match e.kind() {
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::InvalidKey | ErrorKind::InvalidInput | ErrorKind::Misaligned | ErrorKind::OutOfRange => {
            "InvalidInputError"
        }
        ErrorKind::NoSpace => "NoSpaceError",
        ErrorKind::Corrupt => "CorruptError",
        ErrorKind::Busy => "BusyError",
        ErrorKind::Unsupported => "UnsupportedError",
        _ => "RingtierError",
    };
    make(name, e.to_string(), e.kind().as_str(), e.is_temporary())
}

/// `ringtier.errors.ForkError` (an object used in a process it was not created in).
pub(crate) fn fork_error(message: String) -> PyErr {
    make("ForkError", message, "fork", false)
}

/// `ringtier.errors.ClosedError` (a closed store).
pub(crate) fn closed(message: String) -> PyErr {
    make("ClosedError", message, "closed", false)
}

/// `ringtier.errors.PoolExhaustedError` (Python holds the buffers the loader needs).
pub(crate) fn pool_exhausted(message: String) -> PyErr {
    make("PoolExhaustedError", message, "resource_exhausted", false)
}

/// `ringtier.errors.InvalidInputError` with `message`.
pub(crate) fn invalid(message: String) -> PyErr {
    make("InvalidInputError", message, "invalid_input", false)
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
