//! The split point: the deterministic steps (JPEG decode and resize of the whole image to a
//! fixed size) computed once and stored in a tier; later epochs read those pixels back through
//! the tier (O_DIRECT on the io_uring tier) and run only the random steps (crop, flip,
//! normalize) online. PRESTO (Isenko et al., SIGMOD 2022) measured 3x to 13x from choosing this
//! split well.
//!
//! A materialized sample is `size` x `size` RGB `u8` (HWC), stored under
//! `materialized/v1-<size>-<fingerprint>/<index>.rgb`; the fingerprint hashes every sample's
//! key, size and CRC-32C (the manifest) with the stored size and the decoder's name, so a
//! changed dataset or size never reads stale samples: it simply misses and materializes again.
//! A sample missing (or of the wrong size) is decoded from its JPEG and written in the
//! background while the epoch goes on; writes are staged and renamed by the tier, so a crash
//! never leaves a torn sample behind.
//!
//! The random crop is drawn on the stored image: with the default (the whole image squashed to
//! `size` x `size`) a crop covers the same fraction of the picture as on the original, but
//! its aspect ratio is measured on the squashed image. This is the usual price of the split;
//! [`crate::Crop::Resize`] and [`crate::Crop::Center`] chains stay close to the online result
//! (a second resampling).

use std::sync::Arc;

use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::Tier;

use ringtier_dataset::Dataset;
use ringtier_decode::Crop;

/// Where and at what size the deterministic steps are stored. Set it with
/// [`crate::LoaderConfig::with_materialize`].
#[derive(Clone)]
#[non_exhaustive]
pub struct Materialize {
    /// The tier holding materialized samples (for example a `UringTier` on a local disk).
    pub tier: Arc<dyn Tier>,
    /// Stored width and height in pixels. Default 256 (room for a 224 crop).
    pub size: u32,
    /// How the stored image is cut from the decoded one: [`Crop::Resize`] (the whole image
    /// squashed to `size` x `size`, the default) or a deterministic crop
    /// ([`Crop::Center`], [`Crop::CenterCrop`]) when the whole chain up to its crop is
    /// deterministic (an evaluation chain): the stored pixels are then the crop itself and
    /// later epochs keep its aspect ratio. A random crop cannot be stored.
    pub crop: Crop,
}

impl Materialize {
    /// Materialize into `tier` at the default size.
    pub fn new(tier: Arc<dyn Tier>) -> Self {
        Materialize { tier, size: 256, crop: Crop::Resize }
    }

    /// Sets [`Materialize::crop`]; a random crop is an error (it would be frozen into the
    /// store).
    pub fn with_crop(mut self, crop: Crop) -> Result<Self> {
        if matches!(crop, Crop::RandomResized { .. }) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "a random crop cannot be materialized (every epoch would see the same one): store the whole image \
                 (Crop::Resize) and crop online",
            ));
        }
        self.crop = crop;
        Ok(self)
    }

    /// Sets [`Materialize::size`].
    pub fn with_size(mut self, size: u32) -> Self {
        self.size = size;
        self
    }

    /// Bytes of one stored sample.
    pub fn sample_bytes(&self) -> u64 {
        self.size as u64 * self.size as u64 * 3
    }
}

impl std::fmt::Debug for Materialize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Materialize")
            .field("tier", &self.tier.name())
            .field("size", &self.size)
            .field("crop", &self.crop)
            .finish()
    }
}

/// The key prefix of `dataset` materialized at `size` (the whole image resized): changes with
/// any sample's key, size or checksum, the size, the JPEG decoder, and the format version.
pub fn materialized_prefix(dataset: &Dataset, size: u32) -> String {
    materialized_prefix_cropped(dataset, size, Crop::Resize)
}

/// [`materialized_prefix`] for a store cut with `crop` ([`Materialize::crop`]): a deterministic
/// crop is part of the key; [`Crop::Resize`] keys are those [`materialized_prefix`] has always
/// given.
pub fn materialized_prefix_cropped(dataset: &Dataset, size: u32, crop: Crop) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms (the key is stored on disk).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    // The decoder is part of the key: libjpeg-turbo and zune-jpeg differ by a few levels.
    // (With libjpeg-turbo these are the bytes the format has always hashed.)
    eat(b"ringtier-materialized-v1 ");
    eat(ringtier_decode::JPEG_DECODER.as_bytes());
    eat(b"+fir bilinear dct");
    eat(&size.to_le_bytes());
    match crop {
        Crop::Center { resize } => {
            eat(b" center ");
            eat(&resize.to_le_bytes());
        }
        Crop::CenterCrop => eat(b" center_crop"),
        // The whole image resized: the keys as they have always been (a random crop is never
        // stored: `Materialize::with_crop` refuses it).
        _ => {}
    }
    for s in dataset.iter() {
        eat(s.key.as_bytes());
        eat(&[0]);
        eat(&s.size.to_le_bytes());
        eat(&s.crc32c.map_or([0xff; 5], |c| {
            let b = c.to_le_bytes();
            [1, b[0], b[1], b[2], b[3]]
        }));
    }
    format!("materialized/v1-{size}-{h:016x}")
}

/// The key of sample `index` under `prefix`.
pub(crate) fn sample_key(prefix: &str, index: u32) -> String {
    format!("{prefix}/{index:08}.rgb")
}
