//! The pass after the decode: resize the region to the output (`fast_image_resize`, bilinear,
//! antialiased as Pillow's), flip, and convert to the output layout and type.

use fast_image_resize as fir;
use ringtier_core::error::{Error, ErrorKind, Result};

use crate::config::{DecodeConfig, Layout, Normalize};
use crate::geometry::CropBox;

/// Where the pixels came from and where the output goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// Dimensions of the whole image after DCT scaling (the scale of the pixels).
    pub(crate) scaled: (u32, u32),
    /// Dimensions of the full-size image, the region's coordinates.
    pub(crate) full: (u32, u32),
    /// Where the decoded pixels start in the scaled image (a decoded window's corner).
    pub(crate) origin: (u32, u32),
    /// Dimensions of the decoded pixels.
    pub(crate) extent: (u32, u32),
    pub(crate) region: CropBox,
    pub(crate) integer_crop: bool,
    pub(crate) flipped: bool,
}

/// Resize the region of `src` to the output, flip, convert.
pub(crate) fn resample(
    resizer: &mut fir::Resizer,
    resized: &mut Vec<u8>,
    src_px: &[u8],
    g: Geometry,
    cfg: &DecodeConfig,
    out: &mut [u8],
) -> Result<()> {
    let size = cfg.size;
    let (sw, sh) = g.scaled;
    let (w, h) = g.full;
    let (ox, oy) = g.origin;
    let (ew, eh) = g.extent;
    let region = g.region;
    let direct = cfg.normalize.is_none() && cfg.layout == Layout::Hwc;
    let px = size as usize * size as usize * 3;
    if !direct && resized.len() < px {
        resized.resize(px, 0);
    }
    let dst_buf: &mut [u8] = if direct { out } else { &mut resized[..px] };
    {
        let src = fir::images::ImageRef::new(ew, eh, src_px, fir::PixelType::U8x3)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("resize source: {e}")))?;
        let mut dst = fir::images::Image::from_slice_u8(size, size, dst_buf, fir::PixelType::U8x3)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("resize destination: {e}")))?;
        let opts = fir::ResizeOptions::new().resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear));
        let (fx, fy) = (sw as f64 / w as f64, sh as f64 / h as f64);
        let res = if g.integer_crop && (sw, sh) == (w, h) {
            // torchvision crops, then resizes: the filter sees only the crop.
            let view = fir::images::CroppedImage::new(
                &src,
                (region.left as u32).saturating_sub(ox),
                (region.top as u32).saturating_sub(oy),
                region.width as u32,
                region.height as u32,
            )
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("crop: {e}")))?;
            resizer.resize(&view, &mut dst, &opts)
        } else {
            // The region in decoded pixels (relative to the decoded window's corner); clamped,
            // since the scaling's rounding may put its far edge a hair past the image.
            let (l, t) = ((region.left * fx - ox as f64).max(0.0), (region.top * fy - oy as f64).max(0.0));
            let (cw, ch) = ((region.width * fx).min(ew as f64 - l), (region.height * fy).min(eh as f64 - t));
            let opts = opts.crop(l, t, cw, ch);
            resizer.resize(&src, &mut dst, &opts)
        };
        res.map_err(|e| Error::new(ErrorKind::InvalidInput, format!("resize: {e}")))?;
    }
    let s = size as usize;
    if g.flipped {
        let target: &mut [u8] = if direct { out } else { &mut resized[..px] };
        for row in target.chunks_exact_mut(s * 3) {
            flip_row(row);
        }
    }
    if !direct {
        convert(&resized[..px], s * s, cfg.layout, cfg.normalize, out);
    }
    Ok(())
}

fn flip_row(row: &mut [u8]) {
    let n = row.len() / 3;
    for i in 0..n / 2 {
        let j = n - 1 - i;
        for c in 0..3 {
            row.swap(i * 3 + c, j * 3 + c);
        }
    }
}

/// HWC `u8` (`hw` pixels) to the output layout and type.
fn convert(src: &[u8], hw: usize, layout: Layout, normalize: Option<Normalize>, out: &mut [u8]) {
    match (layout, normalize) {
        (Layout::Hwc, None) => out.copy_from_slice(src),
        (Layout::Chw, None) => {
            let (r, rest) = out.split_at_mut(hw);
            let (g, b) = rest.split_at_mut(hw);
            for (i, p) in src.chunks_exact(3).enumerate() {
                r[i] = p[0];
                g[i] = p[1];
                b[i] = p[2];
            }
        }
        (layout, Some(n)) => {
            // One table per channel: exact for every byte value, no division per pixel.
            let mut lut = [[0f32; 256]; 3];
            for (c, t) in lut.iter_mut().enumerate() {
                for (v, slot) in t.iter_mut().enumerate() {
                    *slot = (v as f32 / 255.0 - n.mean[c]) / n.std[c];
                }
            }
            match layout {
                Layout::Hwc => {
                    for (i, (o, &v)) in out.chunks_exact_mut(4).zip(src).enumerate() {
                        o.copy_from_slice(&lut[i % 3][v as usize].to_ne_bytes());
                    }
                }
                Layout::Chw => {
                    for (c, plane) in out.chunks_exact_mut(hw * 4).enumerate() {
                        for (o, p) in plane.chunks_exact_mut(4).zip(src.chunks_exact(3)) {
                            o.copy_from_slice(&lut[c][p[c] as usize].to_ne_bytes());
                        }
                    }
                }
            }
        }
    }
}
