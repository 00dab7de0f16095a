//! [`JpegDecoder`]: one per thread, the backend's decode then the resample pass into the
//! caller's output buffer.

use std::cell::RefCell;

use fast_image_resize as fir;
use ringtier_core::error::{Error, ErrorKind, Result};

use crate::backend::{self, corrupt, Backend, Plan};
use crate::config::{DecodeConfig, MAX_JPEG_DIMENSION};
use crate::geometry::{check_fits, region_of, CropBox, SampleRng};
use crate::resample::{resample, Geometry};

/// The JPEG decoder this build runs: `"libjpeg-turbo"` with the `turbojpeg` feature, else
/// `"zune-jpeg"`. Reports and `ringtier bench decode` name it.
pub const JPEG_DECODER: &str = backend::NAME;

/// A decoder with its buffers: one per thread, reused for every image (grow-only scratch, the
/// resizer's buffers), so the steady state allocates nothing per image.
pub struct JpegDecoder {
    backend: Backend,
    resizer: fir::Resizer,
    /// The decoded (possibly DCT-scaled) image, RGB.
    pixels: Vec<u8>,
    /// The resized image, RGB HWC, when the output needs another pass.
    resized: Vec<u8>,
}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder")
            .field("decoder", &JPEG_DECODER)
            .field("pixels", &self.pixels.len())
            .field("resized", &self.resized.len())
            .finish()
    }
}

/// What [`JpegDecoder::decode_into`] did, for benchmarks and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeInfo {
    /// The JPEG's width and height.
    pub source: (u32, u32),
    /// The DCT scaling denominator used (1, 2, 4 or 8; always 1 with zune-jpeg).
    pub dct_denominator: u32,
    /// The region resized, in pixels of the full-size image.
    pub region: CropBox,
    /// Whether the output was flipped.
    pub flipped: bool,
    /// Width and height of the pixels decoded (after DCT scaling; with libjpeg-turbo only the
    /// window the transforms read, the whole image otherwise).
    pub decoded: (u32, u32),
}

impl JpegDecoder {
    /// A decoder (with libjpeg-turbo, one decompressor handle).
    pub fn new() -> Result<Self> {
        Ok(JpegDecoder {
            backend: Backend::new()?,
            resizer: fir::Resizer::new(),
            pixels: Vec::new(),
            resized: Vec::new(),
        })
    }

    /// Runs `f` with this thread's decoder (created on first use, kept for the thread's life).
    pub fn with_thread_local<R>(f: impl FnOnce(&mut JpegDecoder) -> Result<R>) -> Result<R> {
        thread_local! {
            static DECODER: RefCell<Option<JpegDecoder>> = const { RefCell::new(None) };
        }
        DECODER.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(JpegDecoder::new()?);
            }
            match slot.as_mut() {
                Some(d) => f(d),
                None => Err(Error::new(ErrorKind::InvalidInput, "decoder missing")),
            }
        })
    }

    /// Decodes `jpeg` and applies `cfg`'s transforms into `out` (exactly
    /// [`DecodeConfig::output_bytes`] long; `f32` values in native byte order). `rng` draws the
    /// random crop and flip. A corrupt, truncated or unsupported JPEG is an
    /// [`ErrorKind::Corrupt`] error and leaves `out` unspecified.
    pub fn decode_into(
        &mut self,
        jpeg: &[u8],
        cfg: &DecodeConfig,
        rng: &mut SampleRng,
        out: &mut [u8],
    ) -> Result<DecodeInfo> {
        cfg.validate()?;
        if out.len() != cfg.output_bytes() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("output buffer of {} bytes, the transform makes {}", out.len(), cfg.output_bytes()),
            ));
        }
        let size = cfg.size;
        let mut chosen = None;
        // The header's dimensions, checked before the pixels are allocated; then the region,
        // the flip, and the DCT-domain downscaling: the largest of 1/8, 1/4, 1/2 that keeps the
        // region at least the output size in both directions (Pillow's draft rule, applied to
        // the region; libjpeg-turbo only).
        let decoded = self.backend.decode(jpeg, &mut self.pixels, |w, h| {
            if w == 0 || h == 0 || w > MAX_JPEG_DIMENSION || h > MAX_JPEG_DIMENSION {
                return Err(corrupt(format!("{w}x{h} pixels is outside 1..={MAX_JPEG_DIMENSION}")));
            }
            check_fits(cfg, w as u32, h as u32)?;
            let (region, integer_crop) = region_of(cfg, w as u32, h as u32, rng);
            let flipped = cfg.flip && rng.uniform() < cfg.flip_probability;
            chosen = Some((region, integer_crop, flipped));
            let mut denom = 1usize;
            if cfg.dct_scaling {
                for d in [8usize, 4, 2] {
                    if region.width >= (size as usize * d) as f64 && region.height >= (size as usize * d) as f64 {
                        denom = d;
                        break;
                    }
                }
            }
            // The window the resize reads: the region and the filter's reach beyond it
            // (bilinear: one source pixel per output pixel's step, at least one), plus two
            // pixels of rounding; the backend decodes only that where it can.
            let reach = (region.width.max(region.height) / size as f64).max(1.0).ceil() + 2.0;
            let window = CropBox {
                left: (region.left - reach).max(0.0),
                top: (region.top - reach).max(0.0),
                width: region.width + 2.0 * reach,
                height: region.height + 2.0 * reach,
            };
            let window = if cfg.partial_decode { Some(window) } else { None };
            Ok(Plan { denominator: denom, window })
        })?;
        let Some((region, integer_crop, flipped)) = chosen else {
            return Err(corrupt("no frame header"));
        };
        let (w, h) = (decoded.full.0 as u32, decoded.full.1 as u32);
        let (sw, sh) = (decoded.scaled.0 as u32, decoded.scaled.1 as u32);
        let (ew, eh) = (decoded.extent.0 as u32, decoded.extent.1 as u32);
        let n = ew as usize * eh as usize * 3;
        let geometry = Geometry {
            scaled: (sw, sh),
            full: (w, h),
            origin: (decoded.origin.0 as u32, decoded.origin.1 as u32),
            extent: (ew, eh),
            region,
            integer_crop,
            flipped,
        };
        resample(&mut self.resizer, &mut self.resized, &self.pixels[..n], geometry, cfg, out)?;
        Ok(DecodeInfo {
            source: (w, h),
            dct_denominator: decoded.denominator as u32,
            region,
            flipped,
            decoded: (ew, eh),
        })
    }

    /// Applies `cfg`'s transforms to an RGB image already in memory (`width` x `height`, HWC
    /// `u8`), e.g. one materialized by an earlier epoch: the same crop, flip and output as
    /// [`JpegDecoder::decode_into`], with the random crop drawn on this image's dimensions.
    pub fn transform_rgb(
        &mut self,
        rgb: &[u8],
        width: u32,
        height: u32,
        cfg: &DecodeConfig,
        rng: &mut SampleRng,
        out: &mut [u8],
    ) -> Result<DecodeInfo> {
        cfg.validate()?;
        if out.len() != cfg.output_bytes()
            || rgb.len() != width as usize * height as usize * 3
            || width == 0
            || height == 0
        {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "transform of a {width}x{height} image from {} bytes into {} (the transform makes {})",
                    rgb.len(),
                    out.len(),
                    cfg.output_bytes()
                ),
            ));
        }
        check_fits(cfg, width, height)?;
        let (region, integer_crop) = region_of(cfg, width, height, rng);
        let flipped = cfg.flip && rng.uniform() < cfg.flip_probability;
        let geometry = Geometry {
            scaled: (width, height),
            full: (width, height),
            origin: (0, 0),
            extent: (width, height),
            region,
            integer_crop,
            flipped,
        };
        resample(&mut self.resizer, &mut self.resized, rgb, geometry, cfg, out)?;
        Ok(DecodeInfo { source: (width, height), dct_denominator: 1, region, flipped, decoded: (width, height) })
    }
}

/// Decodes a JPEG and resizes it to `size` x `size` RGB (3 bytes per pixel) with this
/// thread's decoder. Allocates the result; the loader decodes into pooled buffers instead.
pub fn decode_jpeg_resized(data: &[u8], size: u32) -> Result<Vec<u8>> {
    let cfg = DecodeConfig::default().with_size(size).with_threads(1);
    let mut out = vec![0u8; cfg.output_bytes()];
    JpegDecoder::with_thread_local(|d| d.decode_into(data, &cfg, &mut SampleRng::new(0, 0, 0), &mut out))?;
    Ok(out)
}
