//! Where the output comes from in the image: the per-sample random generator, torchvision's
//! random-resized crop parameters and its resize-then-center-crop box.

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::rng::SplitMix64;

use crate::config::{Crop, DecodeConfig};

/// The generator behind the random transforms: SplitMix64 seeded from (seed, epoch, sample
/// index), so each sample's crop and flip depend on nothing else.
#[derive(Debug, Clone)]
pub struct SampleRng(SplitMix64);

impl SampleRng {
    /// The generator of sample `index` in `epoch` under `seed`.
    pub fn new(seed: u64, epoch: u64, index: u64) -> Self {
        let a = SplitMix64::new(seed ^ 0x5851_F42D_4C95_7F2D).next_u64() ^ epoch.wrapping_mul(SplitMix64::GAMMA);
        let b = SplitMix64::new(a).next_u64() ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
        SampleRng(SplitMix64::new(b))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }

    /// Uniform integer in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
}

/// A crop box in pixels of the full-size image: left, top, width, height.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

/// torchvision's `RandomResizedCrop.get_params` for a `width` x `height` image: up to ten
/// draws of an area fraction in `scale` and a log-uniform aspect ratio in `ratio`, the first
/// box that fits placed uniformly; otherwise the central box of the closest allowed ratio.
/// Returns integer (left, top, width, height).
pub fn random_resized_params(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SampleRng,
) -> (u32, u32, u32, u32) {
    let (wf, hf) = (width as f64, height as f64);
    let area = wf * hf;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * (scale.0 + (scale.1 - scale.0) * rng.uniform());
        let aspect = (lr0 + (lr1 - lr0) * rng.uniform()).exp();
        let w = (target * aspect).sqrt().round_ties_even();
        let h = (target / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= wf && h > 0.0 && h <= hf {
            let (w, h) = (w as u32, h as u32);
            let top = rng.below((height - h + 1) as u64) as u32;
            let left = rng.below((width - w + 1) as u64) as u32;
            return (left, top, w, h);
        }
    }
    let in_ratio = wf / hf;
    let (w, h) = if in_ratio < ratio.0 {
        (width, ((wf / ratio.0).round_ties_even() as u32).clamp(1, height))
    } else if in_ratio > ratio.1 {
        (((hf * ratio.1).round_ties_even() as u32).clamp(1, width), height)
    } else {
        (width, height)
    };
    ((width - w) / 2, (height - h) / 2, w, h)
}

/// torchvision's `Resize(resize)` then `CenterCrop(size)` as one box in the source image:
/// the shorter side becomes `resize` (the longer `int(resize * long / short)`), the crop's
/// offset is `round((resized - size) / 2)` (ties to even, as Python's `round`).
pub fn center_crop_box(width: u32, height: u32, resize: u32, size: u32) -> CropBox {
    let (w, h) = (width as f64, height as f64);
    let (rw, rh) = if width <= height {
        (resize as f64, (resize as f64 * h / w).trunc())
    } else {
        ((resize as f64 * w / h).trunc(), resize as f64)
    };
    let left = ((rw - size as f64) / 2.0).round_ties_even();
    let top = ((rh - size as f64) / 2.0).round_ties_even();
    let (sx, sy) = (w / rw, h / rh);
    CropBox { left: left * sx, top: top * sy, width: size as f64 * sx, height: size as f64 * sy }
}

/// torchvision's `CenterCrop(size)` box on a `width` x `height` image (at least size x size):
/// integer (left, top), `round((side - size) / 2)` with ties to even.
pub fn center_crop_offsets(width: u32, height: u32, size: u32) -> (u32, u32) {
    let off = |side: u32| ((side.saturating_sub(size)) as f64 / 2.0).round_ties_even() as u32;
    (off(width), off(height))
}

/// Refuses an image the crop of `cfg` cannot take: a `CenterCrop` larger than the image
/// (torchvision would pad it with zeros).
pub(crate) fn check_fits(cfg: &DecodeConfig, w: u32, h: u32) -> Result<()> {
    if cfg.crop == Crop::CenterCrop && (w < cfg.size || h < cfg.size) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "CenterCrop({}) of a {w}x{h} image: the crop is larger than the image (torchvision pads it with \
                 zeros; ringtier does not): resize first, e.g. Resize({}) before CenterCrop",
                cfg.size, cfg.size
            ),
        ));
    }
    Ok(())
}

/// The crop region of `cfg` on a `w` x `h` image, and whether it is in whole pixels (a crop
/// torchvision takes before resizing).
pub(crate) fn region_of(cfg: &DecodeConfig, w: u32, h: u32, rng: &mut SampleRng) -> (CropBox, bool) {
    match cfg.crop {
        Crop::Resize => (CropBox { left: 0.0, top: 0.0, width: w as f64, height: h as f64 }, false),
        Crop::Center { resize } => (center_crop_box(w, h, resize, cfg.size), false),
        Crop::CenterCrop => {
            let (l, t) = center_crop_offsets(w, h, cfg.size);
            let s = cfg.size as f64;
            (CropBox { left: l as f64, top: t as f64, width: s, height: s }, true)
        }
        Crop::RandomResized { scale, ratio } => {
            let (l, t, cw, ch) = random_resized_params(w, h, scale, ratio, rng);
            (CropBox { left: l as f64, top: t as f64, width: cw as f64, height: ch as f64 }, true)
        }
    }
}
