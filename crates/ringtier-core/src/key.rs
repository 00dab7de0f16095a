//! Object keys: validated relative names that can never escape a tier's root.
//!
//! A key is a `/`-separated relative path. It is rejected when it is empty, absolute, longer
//! than [`MAX_KEY_LEN`] bytes, contains NUL or a backslash, has an empty, `.` or `..`
//! component, or a component starting with the reserved prefix [`RESERVED_PREFIX`] (used by
//! file tiers for staged, uncommitted objects).

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// The longest key accepted, in bytes (Linux's `PATH_MAX` less room for a tier root).
pub const MAX_KEY_LEN: usize = 1024;

/// The longest single component accepted, in bytes (Linux's `NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;

/// Components starting with this prefix are reserved for a tier's own bookkeeping.
pub const RESERVED_PREFIX: &str = ".ringtier";

/// Checks `key` without allocating. See the module docs for the rules.
pub fn validate_key(key: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::new(ErrorKind::InvalidKey, why.to_string()).with_key(key));
    if key.is_empty() {
        return bad("empty key");
    }
    if key.len() > MAX_KEY_LEN {
        return bad("key longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return bad("absolute key (leading '/')");
    }
    if key.as_bytes().contains(&0) {
        return bad("key contains NUL");
    }
    if key.contains('\\') {
        return bad("key contains a backslash");
    }
    for comp in key.split('/') {
        match comp {
            "" => return bad("empty path component ('//' or trailing '/')"),
            "." => return bad("'.' component"),
            ".." => return bad("'..' component"),
            c if c.len() > MAX_COMPONENT_LEN => return bad("component longer than 255 bytes"),
            c if c.starts_with(RESERVED_PREFIX) => return bad("component uses the reserved prefix '.ringtier'"),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a listing prefix: empty, or a key-like string that may end in `/` or mid-component.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    if trimmed.is_empty() {
        return Err(Error::new(ErrorKind::InvalidKey, "prefix '/' is absolute").with_key(prefix));
    }
    // The last component may be partial, but a partial '.' or '..' would still be a bad key,
    // so the full rules apply to the trimmed prefix.
    validate_key(trimmed)
}

/// A validated object key.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(String);

impl ObjectKey {
    /// Validates and wraps `key`.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        validate_key(&key)?;
        Ok(ObjectKey(key))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key without its last component, if it has a parent.
    pub fn parent(&self) -> Option<&str> {
        self.0.rsplit_once('/').map(|(p, _)| p)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for ObjectKey {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        ObjectKey::new(value)
    }
}

impl TryFrom<String> for ObjectKey {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        ObjectKey::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_keys() {
        for k in ["a", "a/b/c.jpg", "class_001/img 7.JPEG", ".hidden", "a..b", "...", "x/.y"] {
            assert!(validate_key(k).is_ok(), "{k}");
        }
        assert_eq!(
            ObjectKey::new("a/b/c").map(|k| k.parent().map(str::to_owned)).ok().flatten().as_deref(),
            Some("a/b")
        );
    }

    #[test]
    fn bad_keys() {
        let long = "a".repeat(MAX_KEY_LEN + 1);
        let long_comp = "b".repeat(256);
        for k in [
            "",
            "/etc/passwd",
            "..",
            "../x",
            "a/../../x",
            "a/..",
            ".",
            "./a",
            "a//b",
            "a/",
            "a\0b",
            "a\\..\\b",
            &long,
            &long_comp,
            ".ringtier-staging/x",
            "a/.ringtier",
        ] {
            let err = validate_key(k).expect_err(k);
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{k}");
        }
    }

    #[test]
    fn prefixes() {
        for p in ["", "a", "a/", "a/b", "cla"] {
            assert!(validate_prefix(p).is_ok(), "{p}");
        }
        for p in ["/", "/a", "../", "a/../b", "a//"] {
            assert!(validate_prefix(p).is_err(), "{p}");
        }
    }
}
