#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod decoder;
mod geometry;
mod resample;

pub use config::{Crop, DecodeConfig, Layout, Normalize, MAX_JPEG_DIMENSION};
pub use decoder::{decode_jpeg_resized, DecodeInfo, JpegDecoder, JPEG_DECODER};
pub use geometry::{center_crop_box, center_crop_offsets, random_resized_params, CropBox, SampleRng};
