//! The decode stage: JPEG to RGB with the transforms of a training pipeline, in one pass.
//!
//! Decoder: libjpeg-turbo 3.1 (the `turbojpeg` crate, built from its bundled source with SIMD)
//! with DCT-domain downscaling: when the region to resize is at least twice the output in both
//! directions, the JPEG is decoded straight at 1/2, 1/4 or 1/8 of its size (Pillow's
//! `Image.draft` rule). Resizer: `fast_image_resize` (AVX2/SSE4.1), bilinear with the filter
//! widened when downscaling (antialiased, as Pillow's `resize(..., BILINEAR)`). Why these two:
//! `docs/DECODE.md` has the measurements against zune-jpeg and the `image` crate.
//!
//! Transforms follow torchvision on PIL images: [`Crop::Resize`] (the whole image to size x
//! size, `img.resize((s, s), BILINEAR)`), [`Crop::Center`] (`Resize(r)` then `CenterCrop(s)`),
//! [`Crop::RandomResized`] (`RandomResizedCrop(s, scale, ratio)`), then an optional random
//! horizontal flip (p = 0.5), then the layout ([`Layout::Hwc`] or [`Layout::Chw`]) as `u8`,
//! or `f32` normalized with per-channel mean and std (`ToTensor` + `Normalize`). Random draws
//! come from a generator seeded by (seed, epoch, sample index): an epoch is reproducible
//! whatever the batch order, threads or ranks.

use std::cell::RefCell;

use fast_image_resize as fir;
use ringtier_core::error::{Error, ErrorKind, Result};

/// The largest JPEG dimension decoded (pixels); larger headers are rejected before any memory
/// is allocated for them.
pub const MAX_JPEG_DIMENSION: usize = 16_384;

/// Which region of the image becomes the output, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Crop {
    /// The whole image resized to size x size, aspect ratio not kept (Pillow
    /// `img.resize((size, size), BILINEAR)`). The default.
    Resize,
    /// Evaluation: the shorter side resized to `resize` (aspect kept), then the central
    /// size x size (torchvision `Resize(resize)` + `CenterCrop(size)`). `resize` >= size.
    Center {
        /// Length of the shorter side after resizing (256 for the usual 224 crop).
        resize: u32,
    },
    /// Training: a random region of `scale` of the area and aspect ratio in `ratio` (drawn as
    /// torchvision's `RandomResizedCrop.get_params`, its central fallback included), resized to
    /// size x size.
    RandomResized {
        /// Area fraction range, torchvision's default (0.08, 1.0).
        scale: (f64, f64),
        /// Aspect ratio (width / height) range, torchvision's default (3/4, 4/3).
        ratio: (f64, f64),
    },
}

impl Crop {
    /// `RandomResized` with torchvision's defaults: scale (0.08, 1.0), ratio (3/4, 4/3).
    pub const RANDOM_RESIZED: Crop = Crop::RandomResized { scale: (0.08, 1.0), ratio: (3.0 / 4.0, 4.0 / 3.0) };
}

/// Memory layout of a decoded sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Height, width, channel (RGBRGB...): what PIL and numpy give. The default.
    Hwc,
    /// Channel, height, width (RRR...GGG...BBB...): what torch models take.
    Chw,
}

/// Per-channel normalization to `f32`: `(x / 255 - mean) / std`, as torchvision's `ToTensor`
/// then `Normalize(mean, std)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Mean per channel (R, G, B), on the 0..1 scale.
    pub mean: [f32; 3],
    /// Standard deviation per channel (R, G, B), on the 0..1 scale; positive.
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet's statistics, as in torchvision's examples.
    pub const IMAGENET: Normalize = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };
}

/// Decode settings: output size, transforms, threads.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DecodeConfig {
    /// Output width and height in pixels. Default 224 (AlexNet's input).
    pub size: u32,
    /// Threads decoding. Default: the cores available to this process.
    pub threads: usize,
    /// The region that becomes the output. Default [`Crop::Resize`].
    pub crop: Crop,
    /// Flip horizontally with probability 0.5 (torchvision `RandomHorizontalFlip`). Default
    /// false.
    pub flip: bool,
    /// Output layout. Default [`Layout::Hwc`].
    pub layout: Layout,
    /// `f32` output normalized per channel; `None` (the default) gives `u8`.
    pub normalize: Option<Normalize>,
    /// Decode at 1/2, 1/4 or 1/8 size in the DCT domain when the region is that much larger
    /// than the output (Pillow's `draft`); false decodes at full size. Default true.
    pub dct_scaling: bool,
}

impl DecodeConfig {
    /// Sets [`DecodeConfig::size`].
    pub fn with_size(mut self, size: u32) -> Self {
        self.size = size;
        self
    }

    /// Sets [`DecodeConfig::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`DecodeConfig::crop`].
    pub fn with_crop(mut self, crop: Crop) -> Self {
        self.crop = crop;
        self
    }

    /// Sets [`DecodeConfig::flip`].
    pub fn with_flip(mut self, flip: bool) -> Self {
        self.flip = flip;
        self
    }

    /// Sets [`DecodeConfig::layout`].
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets [`DecodeConfig::normalize`].
    pub fn with_normalize(mut self, normalize: impl Into<Option<Normalize>>) -> Self {
        self.normalize = normalize.into();
        self
    }

    /// Sets [`DecodeConfig::dct_scaling`].
    pub fn with_dct_scaling(mut self, dct_scaling: bool) -> Self {
        self.dct_scaling = dct_scaling;
        self
    }

    /// Bytes of one decoded sample: size x size x 3, times 4 when normalized to `f32`.
    pub fn output_bytes(&self) -> usize {
        let px = self.size as usize * self.size as usize * 3;
        if self.normalize.is_some() {
            px * 4
        } else {
            px
        }
    }

    /// True when the transform draws random numbers (random crop or flip).
    pub fn is_random(&self) -> bool {
        self.flip || matches!(self.crop, Crop::RandomResized { .. })
    }

    /// Checks the settings; the loader and [`JpegDecoder::decode_into`] call it.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidInput, m));
        if self.size == 0 || self.size as usize > MAX_JPEG_DIMENSION {
            return bad(format!("decode size must be 1..={MAX_JPEG_DIMENSION}, got {}", self.size));
        }
        if self.threads == 0 {
            return bad("decode threads must be at least 1".into());
        }
        match self.crop {
            Crop::Resize => {}
            Crop::Center { resize } => {
                if resize < self.size || resize as usize > MAX_JPEG_DIMENSION {
                    return bad(format!("center crop: resize {resize} must be at least the size {}", self.size));
                }
            }
            Crop::RandomResized { scale, ratio } => {
                let ok = |(a, b): (f64, f64)| a.is_finite() && b.is_finite() && a > 0.0 && a <= b;
                if !ok(scale) || scale.1 > 1.0 {
                    return bad(format!("random-resized crop: scale {scale:?} must satisfy 0 < min <= max <= 1"));
                }
                if !ok(ratio) {
                    return bad(format!("random-resized crop: ratio {ratio:?} must satisfy 0 < min <= max"));
                }
            }
        }
        if let Some(n) = self.normalize {
            if n.std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || n.mean.iter().any(|m| !m.is_finite()) {
                return bad(format!("normalize: std must be positive and mean finite, got {n:?}"));
            }
        }
        Ok(())
    }
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            size: 224,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            crop: Crop::Resize,
            flip: false,
            layout: Layout::Hwc,
            normalize: None,
            dct_scaling: true,
        }
    }
}

/// The generator behind the random transforms: SplitMix64 seeded from (seed, epoch, sample
/// index), so each sample's crop and flip depend on nothing else.
#[derive(Debug, Clone)]
pub struct SampleRng(u64);

impl SampleRng {
    /// The generator of sample `index` in `epoch` under `seed`.
    pub fn new(seed: u64, epoch: u64, index: u64) -> Self {
        let mut r = SampleRng(seed ^ 0x5851_F42D_4C95_7F2D);
        let a = r.next_u64() ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut r = SampleRng(a);
        let b = r.next_u64() ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
        SampleRng(b)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
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

/// A decoder with its buffers: one per thread, reused for every image (grow-only scratch, the
/// resizer's buffers), so the steady state allocates nothing per image.
pub struct JpegDecoder {
    tj: turbojpeg::Decompressor,
    resizer: fir::Resizer,
    /// The decoded (possibly DCT-scaled) image, RGB.
    pixels: Vec<u8>,
    /// The resized image, RGB HWC, when the output needs another pass.
    resized: Vec<u8>,
}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder").field("pixels", &self.pixels.len()).field("resized", &self.resized.len()).finish()
    }
}

/// What [`JpegDecoder::decode_into`] did, for benchmarks and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeInfo {
    /// The JPEG's width and height.
    pub source: (u32, u32),
    /// The DCT scaling denominator used (1, 2, 4 or 8).
    pub dct_denominator: u32,
    /// The region resized, in pixels of the full-size image.
    pub region: CropBox,
    /// Whether the output was flipped.
    pub flipped: bool,
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("JPEG decode failed: {e}"))
}

impl JpegDecoder {
    /// A decoder (one libjpeg-turbo handle).
    pub fn new() -> Result<Self> {
        let tj = turbojpeg::Decompressor::new().map_err(|e| {
            Error::new(ErrorKind::ResourceExhausted, format!("libjpeg-turbo: cannot create a decompressor: {e}"))
        })?;
        Ok(JpegDecoder { tj, resizer: fir::Resizer::new(), pixels: Vec::new(), resized: Vec::new() })
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
        let header = self.tj.read_header(jpeg).map_err(corrupt)?;
        let (w, h) = (header.width, header.height);
        if w == 0 || h == 0 || w > MAX_JPEG_DIMENSION || h > MAX_JPEG_DIMENSION {
            return Err(corrupt(format!("{w}x{h} pixels is outside 1..={MAX_JPEG_DIMENSION}")));
        }
        let size = cfg.size;
        let (region, integer_crop) = region_of(cfg, w as u32, h as u32, rng);
        let flipped = cfg.flip && rng.uniform() < 0.5;
        // DCT-domain downscaling: the largest of 1/8, 1/4, 1/2 that keeps the region at least
        // the output size in both directions (Pillow's draft rule, applied to the region).
        let mut denom = 1usize;
        if cfg.dct_scaling && !header.is_lossless {
            for d in [8usize, 4, 2] {
                if region.width >= (size as usize * d) as f64 && region.height >= (size as usize * d) as f64 {
                    denom = d;
                    break;
                }
            }
        }
        let sf = turbojpeg::ScalingFactor::new(1, denom);
        self.tj.set_scaling_factor(sf).map_err(corrupt)?;
        let (sw, sh) = (sf.scale(w), sf.scale(h));
        let n = sw * sh * 3;
        if self.pixels.len() < n {
            self.pixels.resize(n, 0);
        }
        let image = turbojpeg::Image {
            pixels: &mut self.pixels[..n],
            width: sw,
            pitch: sw * 3,
            height: sh,
            format: turbojpeg::PixelFormat::RGB,
        };
        self.tj.decompress(jpeg, image).map_err(corrupt)?;

        let geometry =
            Geometry { scaled: (sw as u32, sh as u32), full: (w as u32, h as u32), region, integer_crop, flipped };
        resample(&mut self.resizer, &mut self.resized, &self.pixels[..n], geometry, cfg, out)?;
        Ok(DecodeInfo { source: (w as u32, h as u32), dct_denominator: denom as u32, region, flipped })
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
        let (region, integer_crop) = region_of(cfg, width, height, rng);
        let flipped = cfg.flip && rng.uniform() < 0.5;
        let geometry = Geometry { scaled: (width, height), full: (width, height), region, integer_crop, flipped };
        resample(&mut self.resizer, &mut self.resized, rgb, geometry, cfg, out)?;
        Ok(DecodeInfo { source: (width, height), dct_denominator: 1, region, flipped })
    }
}

/// The crop region of `cfg` on a `w` x `h` image, and whether it is in whole pixels (a crop
/// torchvision takes before resizing).
fn region_of(cfg: &DecodeConfig, w: u32, h: u32, rng: &mut SampleRng) -> (CropBox, bool) {
    match cfg.crop {
        Crop::Resize => (CropBox { left: 0.0, top: 0.0, width: w as f64, height: h as f64 }, false),
        Crop::Center { resize } => (center_crop_box(w, h, resize, cfg.size), false),
        Crop::RandomResized { scale, ratio } => {
            let (l, t, cw, ch) = random_resized_params(w, h, scale, ratio, rng);
            (CropBox { left: l as f64, top: t as f64, width: cw as f64, height: ch as f64 }, true)
        }
    }
}

/// Where the pixels came from and where the output goes.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Dimensions of the decoded pixels (after DCT scaling).
    scaled: (u32, u32),
    /// Dimensions of the full-size image, the region's coordinates.
    full: (u32, u32),
    region: CropBox,
    integer_crop: bool,
    flipped: bool,
}

/// Resize the region of `src` to the output, flip, convert.
fn resample(
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
    let region = g.region;
    let direct = cfg.normalize.is_none() && cfg.layout == Layout::Hwc;
    let px = size as usize * size as usize * 3;
    if !direct && resized.len() < px {
        resized.resize(px, 0);
    }
    let dst_buf: &mut [u8] = if direct { out } else { &mut resized[..px] };
    {
        let src = fir::images::ImageRef::new(sw, sh, src_px, fir::PixelType::U8x3)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("resize source: {e}")))?;
        let mut dst = fir::images::Image::from_slice_u8(size, size, dst_buf, fir::PixelType::U8x3)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("resize destination: {e}")))?;
        let opts = fir::ResizeOptions::new().resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear));
        let (fx, fy) = (sw as f64 / w as f64, sh as f64 / h as f64);
        let res = if g.integer_crop && (sw, sh) == (w, h) {
            // torchvision crops, then resizes: the filter sees only the crop.
            let view = fir::images::CroppedImage::new(
                &src,
                region.left as u32,
                region.top as u32,
                region.width as u32,
                region.height as u32,
            )
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("crop: {e}")))?;
            resizer.resize(&view, &mut dst, &opts)
        } else {
            // The region in decoded pixels; clamped, since the scaling's rounding may put its
            // far edge a hair past the image.
            let (l, t) = (region.left * fx, region.top * fy);
            let (cw, ch) = ((region.width * fx).min(sw as f64 - l), (region.height * fy).min(sh as f64 - t));
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

/// Decodes a JPEG and resizes it to `size` x `size` RGB (3 bytes per pixel) with this
/// thread's decoder. Allocates the result; the loader decodes into pooled buffers instead.
pub fn decode_jpeg_resized(data: &[u8], size: u32) -> Result<Vec<u8>> {
    let cfg = DecodeConfig::default().with_size(size).with_threads(1);
    let mut out = vec![0u8; cfg.output_bytes()];
    JpegDecoder::with_thread_local(|d| d.decode_into(data, &cfg, &mut SampleRng::new(0, 0, 0), &mut out))?;
    Ok(out)
}
