//! libjpeg-turbo 3.1 through the `turbojpeg` crate (bundled source, SIMD required), with
//! DCT-domain downscaling by 1/2, 1/4 or 1/8.

use ringtier_core::error::{Error, ErrorKind, Result};

use super::{corrupt, Decoded};

/// The decoder's name in reports.
pub(crate) const NAME: &str = "libjpeg-turbo";

/// One libjpeg-turbo decompressor handle.
pub(crate) struct Backend {
    tj: turbojpeg::Decompressor,
}

impl Backend {
    pub(crate) fn new() -> Result<Self> {
        let tj = turbojpeg::Decompressor::new().map_err(|e| {
            Error::new(ErrorKind::ResourceExhausted, format!("libjpeg-turbo: cannot create a decompressor: {e}"))
        })?;
        Ok(Backend { tj })
    }

    /// Decodes `jpeg` into `pixels` (grown as needed) as RGB. `denominator` sees the full
    /// width and height, may refuse them, and says the DCT scaling wanted (1, 2, 4 or 8;
    /// lossless JPEGs are never scaled).
    pub(crate) fn decode(
        &mut self,
        jpeg: &[u8],
        pixels: &mut Vec<u8>,
        denominator: impl FnOnce(usize, usize) -> Result<usize>,
    ) -> Result<Decoded> {
        let header = self.tj.read_header(jpeg).map_err(corrupt)?;
        let (w, h) = (header.width, header.height);
        let wanted = denominator(w, h)?;
        let denom = if header.is_lossless { 1 } else { wanted };
        let sf = turbojpeg::ScalingFactor::new(1, denom);
        self.tj.set_scaling_factor(sf).map_err(corrupt)?;
        let (sw, sh) = (sf.scale(w), sf.scale(h));
        let n = sw * sh * 3;
        if pixels.len() < n {
            pixels.resize(n, 0);
        }
        let image = turbojpeg::Image {
            pixels: &mut pixels[..n],
            width: sw,
            pitch: sw * 3,
            height: sh,
            format: turbojpeg::PixelFormat::RGB,
        };
        self.tj.decompress(jpeg, image).map_err(corrupt)?;
        Ok(Decoded { full: (w, h), scaled: (sw, sh), denominator: denom })
    }
}
