//! The decode stage: JPEG to RGB, resized, as a training input pipeline does.

use ringtier_core::error::{Error, ErrorKind, Result};

/// Decode settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeConfig {
    /// Output width and height in pixels. Default 224 (AlexNet's input).
    pub size: u32,
    /// Threads decoding. Default 2.
    pub threads: usize,
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
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig { size: 224, threads: 2 }
    }
}

/// Decodes a JPEG and resizes it to `size` x `size` RGB (3 bytes per pixel).
pub fn decode_jpeg_resized(data: &[u8], size: u32) -> Result<Vec<u8>> {
    let img = image::load_from_memory_with_format(data, image::ImageFormat::Jpeg)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("JPEG decode failed: {e}")))?;
    let rgb = img.to_rgb8();
    let out = image::imageops::resize(&rgb, size, size, image::imageops::FilterType::Triangle);
    Ok(out.into_raw())
}
