//! The JPEG decoder proper, one of two chosen at build time: libjpeg-turbo with the
//! `turbojpeg` feature (DCT-domain downscaling, SIMD; its build needs cmake and nasm), else
//! zune-jpeg (pure Rust, full-size decode only). Both give RGB, HWC, `u8`.

#[cfg(feature = "turbojpeg")]
mod turbo;
#[cfg(not(feature = "turbojpeg"))]
mod zune;

#[cfg(feature = "turbojpeg")]
pub(crate) use turbo::{Backend, NAME};
#[cfg(not(feature = "turbojpeg"))]
pub(crate) use zune::{Backend, NAME};

use ringtier_core::error::{Error, ErrorKind};

/// What one decode produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    /// The JPEG's width and height.
    pub(crate) full: (usize, usize),
    /// Width and height of the decoded pixels (after DCT scaling).
    pub(crate) scaled: (usize, usize),
    /// The DCT scaling denominator used (1, 2, 4 or 8; always 1 for zune-jpeg).
    pub(crate) denominator: usize,
}

/// A decode failure: the input is corrupt, truncated or unsupported.
pub(crate) fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("JPEG decode failed: {e}"))
}
