//! The one public error type of ringtier.
//!
//! Every fallible operation returns [`Error`]: a [`ErrorKind`], whether retrying can help
//! ([`Error::is_temporary`]), the context the operation ran in (operation, key, tier), the OS
//! error code when one exists, and an optional source error.

use std::fmt;
use std::io;

/// What went wrong, independent of which tier reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The object (or file) does not exist.
    NotFound,
    /// An object already exists where a new one was to be created.
    AlreadyExists,
    /// The key is not a valid object key (absolute, `..`, NUL, empty component, too long).
    InvalidKey,
    /// An argument is invalid: a zero-sized pool, a buffer too small for the request, ...
    InvalidInput,
    /// A buffer, offset or length violates the alignment Direct I/O requires.
    Misaligned,
    /// A read started past the end of the object.
    OutOfRange,
    /// The device or tier is full (ENOSPC, EDQUOT, or a tier's capacity bound).
    NoSpace,
    /// Permission denied by the operating system.
    PermissionDenied,
    /// The operation or mode is not supported here (e.g. O_DIRECT on a filesystem without it).
    Unsupported,
    /// Data failed a check: checksum mismatch, truncated object, corrupt metadata.
    Corrupt,
    /// A resource limit was hit (memlock, open files, pool exhausted).
    ResourceExhausted,
    /// The engine was shut down while the operation was pending.
    Shutdown,
    /// Held by someone else: a lock another process (or another open store) holds.
    Busy,
    /// Any other I/O error; see the OS error code.
    Io,
}

impl ErrorKind {
    /// A short stable name, used in messages and as a metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Misaligned => "misaligned",
            ErrorKind::OutOfRange => "out_of_range",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Shutdown => "shutdown",
            ErrorKind::Busy => "busy",
            ErrorKind::Io => "io",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Stat of one object.
    Stat,
    /// Listing by prefix.
    List,
    /// Deleting an object.
    Delete,
    /// Positional read.
    Read,
    /// Positional write into a pending object.
    Write,
    /// Creating a pending object.
    Create,
    /// Making a pending object durable and visible.
    Commit,
    /// Discarding a pending object.
    Abort,
    /// Opening a file or tier.
    Open,
    /// Setting up an engine, pool or ring.
    Setup,
}

impl Operation {
    /// A short stable name, used in messages and as a metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Stat => "stat",
            Operation::List => "list",
            Operation::Delete => "delete",
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Create => "create",
            Operation::Commit => "commit",
            Operation::Abort => "abort",
            Operation::Open => "open",
            Operation::Setup => "setup",
        }
    }
}

/// The error type of every ringtier API.
pub struct Error {
    kind: ErrorKind,
    temporary: bool,
    message: String,
    operation: Option<Operation>,
    key: Option<String>,
    tier: Option<String>,
    os_code: Option<i32>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Shorthand for `std::result::Result<T, ringtier_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            temporary: false,
            message: message.into(),
            operation: None,
            key: None,
            tier: None,
            os_code: None,
            source: None,
        }
    }

    /// An error from a raw OS error code (`errno`), classified by [`kind_of_errno`].
    pub fn from_errno(errno: i32, message: impl Into<String>) -> Self {
        let mut e = Error::new(kind_of_errno(errno), message);
        e.os_code = Some(errno);
        e.temporary = errno_is_temporary(errno);
        e
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True when retrying the same operation may succeed (EAGAIN, EINTR, EBUSY, ...).
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// The OS error code (`errno`) this error came from, if any.
    pub fn os_code(&self) -> Option<i32> {
        self.os_code
    }

    /// The operation the error happened in, if known.
    pub fn operation(&self) -> Option<Operation> {
        self.operation
    }

    /// The object key the error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The name of the tier that reported the error, if known.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The message without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Changes the kind.
    pub fn set_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// Marks the error as temporary (or not).
    pub fn set_temporary(mut self, temporary: bool) -> Self {
        self.temporary = temporary;
        self
    }

    /// Records the operation the error happened in (kept if already set).
    pub fn with_operation(mut self, op: Operation) -> Self {
        self.operation.get_or_insert(op);
        self
    }

    /// Records the key the error concerns (kept if already set).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        if self.key.is_none() {
            self.key = Some(key.into());
        }
        self
    }

    /// Records the tier that reported the error (kept if already set, so the innermost tier wins).
    pub fn with_tier(mut self, tier: impl Into<String>) -> Self {
        if self.tier.is_none() {
            self.tier = Some(tier.into());
        }
        self
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Shorthand: operation, key and tier at once.
    pub fn context(self, op: Operation, key: &str, tier: &str) -> Self {
        self.with_operation(op).with_key(key).with_tier(tier)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug prints the same readable form as Display: it is what `main` shows on error.
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(op) = self.operation {
            write!(f, " during {}", op.as_str())?;
        }
        if let Some(key) = &self.key {
            write!(f, " of {key:?}")?;
        }
        if let Some(tier) = &self.tier {
            write!(f, " on tier {tier:?}")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(code) = self.os_code {
            write!(f, " ({})", io::Error::from_raw_os_error(code))?;
        }
        if self.temporary {
            f.write_str(" [temporary]")?;
        }
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

impl From<io::Error> for Error {
    fn from(err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(code) => Error::from_errno(code, "I/O error"),
            None => {
                let kind = match err.kind() {
                    io::ErrorKind::NotFound => ErrorKind::NotFound,
                    io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
                    io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                    io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData => ErrorKind::Corrupt,
                    io::ErrorKind::Unsupported => ErrorKind::Unsupported,
                    _ => ErrorKind::Io,
                };
                let temporary = matches!(
                    err.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                );
                let message = err.to_string();
                Error::new(kind, message).set_temporary(temporary)
            }
        }
    }
}

/// Maps an `errno` to an [`ErrorKind`].
pub fn kind_of_errno(errno: i32) -> ErrorKind {
    match errno {
        libc::ENOENT | libc::ENOTDIR => ErrorKind::NotFound,
        libc::EEXIST => ErrorKind::AlreadyExists,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorKind::NoSpace,
        libc::EACCES | libc::EPERM | libc::EROFS => ErrorKind::PermissionDenied,
        libc::EINVAL => ErrorKind::InvalidInput,
        libc::EOPNOTSUPP | libc::ENOSYS => ErrorKind::Unsupported,
        libc::ENOMEM | libc::EMFILE | libc::ENFILE => ErrorKind::ResourceExhausted,
        libc::ENAMETOOLONG => ErrorKind::InvalidKey,
        _ => ErrorKind::Io,
    }
}

/// True for the `errno` values after which the same call may succeed.
pub fn errno_is_temporary(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EINTR | libc::EBUSY | libc::ETIMEDOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_keeps_code_and_classifies() {
        let e = Error::from_errno(libc::ENOSPC, "write failed").context(Operation::Write, "a/b", "posix");
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(e.os_code(), Some(libc::ENOSPC));
        assert!(!e.is_temporary());
        let text = e.to_string();
        assert!(text.contains("no_space during write of \"a/b\" on tier \"posix\""), "{text}");
        assert!(Error::from_errno(libc::EAGAIN, "x").is_temporary());
        assert!(Error::from_errno(libc::EINTR, "x").is_temporary());
    }

    #[test]
    fn innermost_context_wins() {
        let e = Error::new(ErrorKind::Io, "x")
            .with_tier("inner")
            .with_tier("outer")
            .with_operation(Operation::Read)
            .with_operation(Operation::Write);
        assert_eq!(e.tier(), Some("inner"));
        assert_eq!(e.operation(), Some(Operation::Read));
    }

    #[test]
    fn io_error_conversion() {
        let e: Error = io::Error::from_raw_os_error(libc::ENOENT).into();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let e: Error = io::Error::new(io::ErrorKind::Interrupted, "x").into();
        assert!(e.is_temporary());
    }
}
