#![doc = include_str!("../README.md")]
#![deny(unsafe_code)] // allowed in one module: the libjpeg-turbo FFI (backend/turbo.rs)

mod backend;
mod config;
mod decoder;
mod geometry;
mod resample;

pub use config::{Crop, DecodeConfig, Layout, Normalize, MAX_JPEG_DIMENSION};
pub use decoder::{decode_jpeg_resized, DecodeInfo, JpegDecoder, JPEG_DECODER};
pub use geometry::{center_crop_box, center_crop_offsets, random_resized_params, CropBox, SampleRng};
