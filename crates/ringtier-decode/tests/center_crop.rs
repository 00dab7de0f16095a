//! `Crop::CenterCrop` (torchvision's `CenterCrop` alone) and the flip probability.

use ringtier_core::error::ErrorKind;
use ringtier_decode::{center_crop_offsets, Crop, DecodeConfig, JpegDecoder, Layout, SampleRng};

/// A w x h RGB image whose every byte encodes its position, so any shift shows.
fn ramp(w: u32, h: u32) -> Vec<u8> {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            px.extend_from_slice(&[(x * 7 % 256) as u8, (y * 5 % 256) as u8, ((x + y) % 256) as u8]);
        }
    }
    px
}

fn crop_of(src: &[u8], w: u32, left: u32, top: u32, size: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for y in top..top + size {
        let row = ((y * w + left) * 3) as usize;
        out.extend_from_slice(&src[row..row + (size * 3) as usize]);
    }
    out
}

#[test]
fn center_crop_takes_the_central_pixels_unchanged_with_torchvisions_rounding() {
    let mut dec = JpegDecoder::new().expect("decoder");
    for (w, h, size) in [(100, 80, 64), (101, 81, 64), (64, 64, 64), (300, 65, 64), (99, 200, 33)] {
        let src = ramp(w, h);
        let cfg = DecodeConfig::default().with_size(size).with_crop(Crop::CenterCrop).with_threads(1);
        let mut out = vec![0u8; cfg.output_bytes()];
        dec.transform_rgb(&src, w, h, &cfg, &mut SampleRng::new(0, 0, 0), &mut out).expect("transform");
        let (l, t) = center_crop_offsets(w, h, size);
        // torchvision: int(round((side - size) / 2)), Python's round (ties to even).
        let py_round = |v: f64| v.round_ties_even() as u32;
        assert_eq!((l, t), (py_round((w - size) as f64 / 2.0), py_round((h - size) as f64 / 2.0)));
        assert!(out == crop_of(&src, w, l, t, size), "{w}x{h} -> {size}: not the exact central pixels");
    }
}

#[test]
fn center_crop_larger_than_the_image_is_an_error_not_a_silent_resize() {
    let mut dec = JpegDecoder::new().expect("decoder");
    let cfg = DecodeConfig::default().with_size(64).with_crop(Crop::CenterCrop).with_threads(1);
    let mut out = vec![0u8; cfg.output_bytes()];
    let err =
        dec.transform_rgb(&ramp(50, 90), 50, 90, &cfg, &mut SampleRng::new(0, 0, 0), &mut out).expect_err("too small");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("larger than the image"), "{err}");
}

#[test]
fn flip_probability_one_always_flips_zero_never_and_out_of_range_is_refused() {
    let mut dec = JpegDecoder::new().expect("decoder");
    let (w, h) = (40, 30);
    let src = ramp(w, h);
    let base =
        DecodeConfig::default().with_size(24).with_crop(Crop::CenterCrop).with_layout(Layout::Hwc).with_threads(1);
    let run = |dec: &mut JpegDecoder, cfg: &DecodeConfig, i: u64| {
        let mut out = vec![0u8; cfg.output_bytes()];
        dec.transform_rgb(&src, w, h, cfg, &mut SampleRng::new(1, 0, i), &mut out).expect("transform").flipped
    };
    let always = base.with_flip(true).with_flip_probability(1.0);
    let never = base.with_flip(true).with_flip_probability(0.0);
    assert!((0..50).all(|i| run(&mut dec, &always, i)));
    assert!((0..50).all(|i| !run(&mut dec, &never, i)));
    let half = base.with_flip(true);
    let flipped = (0..400).filter(|&i| run(&mut dec, &half, i)).count();
    assert!((140..260).contains(&flipped), "p=0.5 flipped {flipped} of 400");
    for p in [1.5, -0.1, f64::NAN] {
        let err = base.with_flip(true).with_flip_probability(p).validate().expect_err("bad probability");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "p={p}");
    }
}
