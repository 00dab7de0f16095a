//! `materialize=DIR` on the Python loaders: the split point (`ringtier_loader::Materialize`,
//! docs/DECODE.md). The first epoch decodes and resizes each JPEG and stores the pixels in a
//! tier over `DIR`; later epochs read those pixels back and run only the random steps.
//!
//! With a transform chain (`transform=` and `materialize=` on `ringtier.torch` datasets, the
//! loader's `materialize_for=`), [`transform_split`] decides what is stored:
//! - a chain with a random crop (`RandomResizedCrop`): the decoded image resized whole to
//!   `materialize_size` (default the larger of 256 and the output size), the crop drawn on it
//!   each epoch;
//! - a deterministic crop (`Resize` + `CenterCrop`, `CenterCrop`, `Resize((s, s))`): the crop
//!   itself, at the output size, so the stored image keeps the online result's aspect ratio.
//!
//! Flip, dtype and normalization always run online ([`online_config`]): the flip is random,
//! and float pixels would take four times the storage of the `uint8` ones stored.

use std::path::Path;

use ringtier_decode::{Crop, DecodeConfig};
use ringtier_loader::Materialize;

use crate::errors::{self, IntoPy};
use crate::tiers::open_tier;

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

/// What a transform chain stores (see the module docs): side in pixels and crop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    /// Stored width and height.
    pub(crate) size: u32,
    /// How the stored image is cut from the decoded one.
    pub(crate) crop: Crop,
}

/// Whether the chain's crop is drawn at random (the only crop that is not stored).
fn random_crop(cfg: &DecodeConfig) -> bool {
    matches!(cfg.crop, Crop::RandomResized { .. })
}

/// The split point of the chain `cfg`, stored at `size` (random crops only).
pub(crate) fn transform_split(cfg: &DecodeConfig, size: Option<u32>) -> pyo3::PyResult<Split> {
    if random_crop(cfg) {
        let stored = size.unwrap_or(cfg.size.max(256));
        if stored < cfg.size {
            return Err(errors::invalid(format!(
                "materialize_size {stored} is smaller than the transform's output {}: the crop would be upscaled",
                cfg.size
            )));
        }
        return Ok(Split { size: stored, crop: Crop::Resize });
    }
    if let Some(s) = size.filter(|&s| s != cfg.size) {
        return Err(errors::invalid(format!(
            "materialize_size {s}: this transform is deterministic up to its crop, so the crop itself is stored, at the \
             output size {} (leave materialize_size=None)",
            cfg.size
        )));
    }
    Ok(Split { size: cfg.size, crop: cfg.crop })
}

/// The chain that runs each epoch on stored pixels: the random crop on the stored image, or,
/// where the crop was stored, a copy of it (a resize to the same size); then flip, layout,
/// dtype and normalization.
pub(crate) fn online_config(cfg: &DecodeConfig) -> DecodeConfig {
    if random_crop(cfg) {
        *cfg
    } else {
        cfg.with_crop(Crop::Resize)
    }
}

/// The materialize settings of `materialize=DIR` for the chain `cfg` ([`transform_split`]),
/// and the loader's decode settings that yield the stored pixels (HWC `uint8`).
pub(crate) fn materialize_split(
    dir: &Path,
    size: Option<u32>,
    cfg: &DecodeConfig,
    decode_threads: usize,
    engine: &str,
) -> pyo3::PyResult<(Materialize, DecodeConfig)> {
    let split = transform_split(cfg, size)?;
    let tier = open_tier(dir, engine, None, true, false)?;
    let m = Materialize::new(tier).with_size(split.size).with_crop(split.crop).py_err()?;
    Ok((m, DecodeConfig::default().with_size(split.size).with_threads(decode_threads)))
}
