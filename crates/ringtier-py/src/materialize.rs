//! `materialize=DIR` on the Python loaders: the split point (`ringtier_loader::Materialize`,
//! docs/DECODE.md). The first epoch decodes and resizes each JPEG and stores the pixels in a
//! tier over `DIR`; later epochs read those pixels back and run only the random steps.

use std::path::Path;

use ringtier_loader::{DecodeConfig, Materialize};

use crate::errors;
use crate::loader::open_tier;

/// The stored size when none is given: the decoded size itself when the chain has no random
/// step (later epochs then copy the stored pixels, no second resampling), else at least 256
/// (room for a random crop drawn on the stored image).
fn default_size(decode: &DecodeConfig) -> u32 {
    if decode.is_random() {
        decode.size.max(256)
    } else {
        decode.size
    }
}

/// The materialize settings of `materialize=DIR` (created when missing; a tier that writes,
/// so it never follows a link) on `engine`, at `size` pixels or the default for `decode`.
pub(crate) fn materialize(
    dir: &Path,
    size: Option<u32>,
    decode: Option<&DecodeConfig>,
    engine: &str,
) -> pyo3::PyResult<Materialize> {
    let Some(decode) = decode else {
        return Err(errors::invalid(format!(
            "materialize={} needs decode=: it stores decoded pixels (raw bytes have nothing to materialize)",
            dir.display()
        )));
    };
    let size = size.unwrap_or_else(|| default_size(decode));
    if size == 0 {
        return Err(errors::invalid("materialize_size must be at least 1 pixel".into()));
    }
    if size < decode.size {
        return Err(errors::invalid(format!(
            "materialize_size {size} is smaller than the decoded size {}: the stored pixels would be upscaled",
            decode.size
        )));
    }
    let tier = open_tier(dir, engine, None, true, false)?;
    Ok(Materialize::new(tier).with_size(size))
}
