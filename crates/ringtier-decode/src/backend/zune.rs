//! zune-jpeg: pure Rust (SIMD through `std::arch`, no C toolchain), full-size decode only (no
//! DCT-domain downscaling: the resize does all the reduction).

use ringtier_core::error::Result;
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

use super::{corrupt, Decoded, Plan};
use crate::config::MAX_JPEG_DIMENSION;

/// The decoder's name in reports.
pub(crate) const NAME: &str = "zune-jpeg";

/// zune-jpeg keeps no state between images; the options are built once.
pub(crate) struct Backend {
    options: DecoderOptions,
}

impl Backend {
    pub(crate) fn new() -> Result<Self> {
        let options = DecoderOptions::default()
            .jpeg_set_out_colorspace(ColorSpace::RGB)
            .set_max_width(MAX_JPEG_DIMENSION)
            .set_max_height(MAX_JPEG_DIMENSION)
            .set_strict_mode(true);
        Ok(Backend { options })
    }

    /// Decodes `jpeg` into `pixels` (grown as needed) as RGB at full size. `plan` sees the
    /// width and height and may refuse them; the scaling and the window it asks for are not
    /// available here (the whole image is decoded).
    pub(crate) fn decode(
        &mut self,
        jpeg: &[u8],
        pixels: &mut Vec<u8>,
        plan: impl FnOnce(usize, usize) -> Result<Plan>,
    ) -> Result<Decoded> {
        let mut dec = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(jpeg), self.options);
        dec.decode_headers().map_err(corrupt)?;
        let (w, h) = dec.dimensions().ok_or_else(|| corrupt("no frame header"))?;
        plan(w, h)?;
        let n = dec.output_buffer_size().ok_or_else(|| corrupt("no frame header"))?;
        if n != w * h * 3 {
            return Err(corrupt(format!("{w}x{h} pixels decode to {n} bytes, not RGB")));
        }
        if pixels.len() < n {
            pixels.resize(n, 0);
        }
        dec.decode_into(&mut pixels[..n]).map_err(corrupt)?;
        Ok(Decoded { full: (w, h), scaled: (w, h), denominator: 1, origin: (0, 0), extent: (w, h) })
    }
}
