//! The checkpoint manifest: written last, its presence is what makes a checkpoint committed.

use ringtier_core::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// The manifest format's name.
pub const FORMAT: &str = "ringtier-checkpoint";
/// The manifest version this code writes and reads.
pub const VERSION: u32 = 1;

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

    /// Serialises the manifest.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising plain owned data cannot fail.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parses and checks a manifest read from `origin` for `step`.
    pub fn parse(bytes: &[u8], step: u64, origin: &str) -> Result<CheckpointManifest> {
        let corrupt = |why: String| Error::new(ErrorKind::Corrupt, format!("checkpoint manifest {origin}: {why}"));
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(corrupt(format!("format is not {FORMAT:?}")));
        }
        match v.get("version").and_then(|x| x.as_u64()) {
            Some(1) => {}
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
        if m.step != step {
            return Err(corrupt(format!("says step {} but is stored under step {step}", m.step)));
        }
        Ok(m)
    }
}
