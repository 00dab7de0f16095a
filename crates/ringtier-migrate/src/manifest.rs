//! The checkpoint manifest: written last, its presence is what makes a checkpoint committed.
//!
//! Version 2 (written since the store heals around bad copies) carries a checksum of its own:
//! `crc32c`, the CRC-32C of the manifest's other fields serialised as compact JSON in field
//! order. A flipped byte in a value fails the check; one in a name fails the parse. Version 1
//! manifests (no checksum) are still read. A manifest larger than [`MAX_MANIFEST_BYTES`] is
//! refused before it is read.

use ringtier_core::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// The manifest format's name.
pub const FORMAT: &str = "ringtier-checkpoint";
/// The manifest version this code writes; it reads this one and version 1.
pub const VERSION: u32 = 2;

/// The largest manifest read, in bytes (about 100,000 parts): a larger object under a
/// manifest's key is corrupt, and is refused before anything is allocated for it.
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// One part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    /// The part's name (one key component).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32C of the contents.
    pub crc32c: u32,
}

/// What a committed checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this code.
    pub version: u32,
    /// The training step.
    pub step: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The parts, in save order.
    pub parts: Vec<PartMeta>,
}

impl CheckpointManifest {
    /// Total bytes of all parts.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.size).sum()
    }

    /// The manifest's own checksum: CRC-32C of its fields as compact JSON.
    pub fn checksum(&self) -> u32 {
        // Serialising plain owned data cannot fail.
        crc32c::crc32c(&serde_json::to_vec(self).unwrap_or_default())
    }

    /// Serialises the manifest, with its checksum (version 2).
    pub fn to_bytes(&self) -> Vec<u8> {
        let crc = self.checksum();
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("crc32c".into(), serde_json::Value::from(crc));
        }
        serde_json::to_vec_pretty(&v).unwrap_or_default()
    }

    /// Parses and checks a manifest read from `origin` for `step`.
    pub fn parse(bytes: &[u8], step: u64, origin: &str) -> Result<CheckpointManifest> {
        let corrupt = |why: String| Error::new(ErrorKind::Corrupt, format!("checkpoint manifest {origin}: {why}"));
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(corrupt(format!(
                "{} bytes, more than a manifest can hold ({MAX_MANIFEST_BYTES})",
                bytes.len()
            )));
        }
        let mut v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON (torn or damaged): {e}")))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(corrupt(format!("format is not {FORMAT:?}")));
        }
        let version = v.get("version").and_then(|x| x.as_u64());
        let stored_crc = match v.as_object_mut().map(|o| o.remove("crc32c")) {
            Some(Some(c)) => Some(
                c.as_u64()
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or_else(|| corrupt("crc32c is not a 32-bit number".into()))?,
            ),
            _ => None,
        };
        match version {
            Some(1) => {}
            Some(2) if stored_crc.is_some() => {}
            Some(2) => return Err(corrupt("no crc32c (a version 2 manifest carries its checksum)".into())),
            Some(other) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "checkpoint manifest {origin}: unknown version {other} (this build reads version {VERSION})"
                    ),
                ))
            }
            None => return Err(corrupt("no version".into())),
        }
        let m: CheckpointManifest = serde_json::from_value(v).map_err(|e| corrupt(format!("bad fields: {e}")))?;
        if let Some(crc) = stored_crc {
            let actual = m.checksum();
            if actual != crc {
                return Err(corrupt(format!("checksum mismatch (crc32c {actual:08x}, stored {crc:08x})")));
            }
        }
        if m.step != step {
            return Err(corrupt(format!("says step {} but is stored under step {step}", m.step)));
        }
        Ok(m)
    }
}
