//! The JPEG decoder proper, one of two chosen at build time: libjpeg-turbo with the
//! `turbojpeg` feature (DCT-domain downscaling, SIMD; its build needs cmake and nasm), else
//! zune-jpeg (pure Rust, full-size decode only). Both give RGB, HWC, `u8`.

#[cfg(feature = "turbojpeg")]
#[allow(unsafe_code)] // the TurboJPEG FFI, fenced in turbo::Handle
mod turbo;
#[cfg(not(feature = "turbojpeg"))]
mod zune;

#[cfg(feature = "turbojpeg")]
pub(crate) use turbo::{Backend, NAME};
#[cfg(not(feature = "turbojpeg"))]
pub(crate) use zune::{Backend, NAME};

use ringtier_core::error::{Error, ErrorKind};

use crate::geometry::CropBox;

/// What the caller wants decoded, once it has seen the image's dimensions.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "turbojpeg"), allow(dead_code))] // zune-jpeg decodes whole images at full size
pub(crate) struct Plan {
    /// The DCT scaling denominator wanted (1, 2, 4 or 8; zune-jpeg decodes at 1 whatever this
    /// says).
    pub(crate) denominator: usize,
    /// The part of the full-size image the transforms read (their region and the resize
    /// filter's reach), in its pixels; None for all of it. A backend may decode more (zune-jpeg
    /// decodes everything), never less.
    pub(crate) window: Option<CropBox>,
}

/// What one decode produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    /// The JPEG's width and height.
    pub(crate) full: (usize, usize),
    /// Width and height of the whole image after DCT scaling (the scale of the pixels).
    pub(crate) scaled: (usize, usize),
    /// The DCT scaling denominator used (1, 2, 4 or 8; always 1 for zune-jpeg).
    pub(crate) denominator: usize,
    /// Where the decoded pixels start in the scaled image: (0, 0) unless only a window was
    /// decoded.
    pub(crate) origin: (usize, usize),
    /// Width and height of the decoded pixels (the scaled image, or the window of it).
    pub(crate) extent: (usize, usize),
}

/// A decode failure: the input is corrupt, truncated or unsupported.
pub(crate) fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("JPEG decode failed: {e}"))
}
