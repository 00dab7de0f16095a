//! Decode settings: the output size, the crop, the flip, the layout and the normalization.

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
    /// The central size x size pixels, not resized (torchvision `CenterCrop(size)` alone): the
    /// offset is `round((side - size) / 2)` (ties to even, as Python's `round`). An image
    /// smaller than the crop on either side is an error (torchvision pads it with zeros).
    CenterCrop,
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
    /// Flip horizontally with probability [`DecodeConfig::flip_probability`] (torchvision
    /// `RandomHorizontalFlip`). Default false.
    pub flip: bool,
    /// The probability of the flip when `flip` is on, in 0..=1 (torchvision's `p`). Default 0.5.
    pub flip_probability: f64,
    /// Output layout. Default [`Layout::Hwc`].
    pub layout: Layout,
    /// `f32` output normalized per channel; `None` (the default) gives `u8`.
    pub normalize: Option<Normalize>,
    /// Decode at 1/2, 1/4 or 1/8 size in the DCT domain when the region is that much larger
    /// than the output (Pillow's `draft`); false decodes at full size. Default true.
    pub dct_scaling: bool,
    /// Decode only the window of the image the crop and the resize read (libjpeg-turbo's
    /// partial decompression: rows below it are not decoded, columns beside it not
    /// inverse-transformed); false decodes the whole image. The output is the same either way.
    /// zune-jpeg always decodes the whole image. Default true.
    pub partial_decode: bool,
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

    /// Sets [`DecodeConfig::flip_probability`].
    pub fn with_flip_probability(mut self, p: f64) -> Self {
        self.flip_probability = p;
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

    /// Sets [`DecodeConfig::partial_decode`].
    pub fn with_partial_decode(mut self, partial_decode: bool) -> Self {
        self.partial_decode = partial_decode;
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

    /// Checks the settings; the loader and [`crate::JpegDecoder::decode_into`] call it.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidInput, m));
        if self.size == 0 || self.size as usize > MAX_JPEG_DIMENSION {
            return bad(format!("decode size must be 1..={MAX_JPEG_DIMENSION}, got {}", self.size));
        }
        if self.threads == 0 {
            return bad("decode threads must be at least 1".into());
        }
        match self.crop {
            Crop::Resize | Crop::CenterCrop => {}
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
        if !(0.0..=1.0).contains(&self.flip_probability) {
            return bad(format!("flip probability must be in 0..=1, got {}", self.flip_probability));
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
            flip_probability: 0.5,
            layout: Layout::Hwc,
            normalize: None,
            dct_scaling: true,
            partial_decode: true,
        }
    }
}
