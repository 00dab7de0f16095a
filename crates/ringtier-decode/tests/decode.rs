//! The decoder and its transforms against references: Pillow (torchvision's semantics on PIL
//! images) run by `pillow_reference.py`, and formulas (normalization, layout, flip, the random
//! crop's parameters). Pillow is found as `$RINGTIER_PYTHON` (default `python3`); without it
//! the Pillow comparisons are skipped with a message, unless `RINGTIER_REQUIRE_PILLOW=1`
//! (set by `.ci/run`, which installs it) makes that a failure.
//!
//! Tolerances, by the decoder the build runs ([`JPEG_DECODER`]):
//! - libjpeg-turbo (feature `turbojpeg`): the same decode as Pillow's (ISLOW IDCT, fancy
//!   upsampling) and the same fixed-point bilinear convolution, so outputs match to within 1
//!   level per byte (rounding) and on average much closer: at most 2 levels anywhere and a mean
//!   absolute difference under 0.35 (measured: at most 1 level, mean 0.20 to 0.25: Pillow and
//!   fast_image_resize round their two passes differently).
//! - zune-jpeg (the default): its own IDCT and chroma upsampling, full-size decode only (so
//!   the references are Pillow's full-size decodes): at most 6 levels and a mean under 0.55
//!   (measured: at most 5 levels, mean at most 0.47).

use std::path::{Path, PathBuf};
use std::process::Command;

use ringtier_core::ErrorKind;
use ringtier_decode::{
    center_crop_box, random_resized_params, Crop, DecodeConfig, JpegDecoder, Layout, Normalize, SampleRng, JPEG_DECODER,
};

/// Per-byte tolerance against Pillow: (largest, mean) absolute difference, by decoder.
fn tolerance() -> (u8, f64) {
    match JPEG_DECODER {
        "libjpeg-turbo" => (2, 0.35),
        // zune-jpeg's IDCT and chroma upsampling are not libjpeg's: measured at most 5 levels,
        // mean at most 0.48 over these 180 cases (4:2:0 and 4:2:2 images differ most).
        _ => (6, 0.55),
    }
}

/// A test image with smooth gradients, hard edges and texture, so that resampling and chroma
/// upsampling both matter.
fn picture(w: u16, h: u16, seed: u32) -> Vec<u8> {
    let (w, h) = (w as u32, h as u32);
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    let mut x = seed.wrapping_mul(2654435761) | 1;
    for y in 0..h {
        for xx in 0..w {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let noise = (x % 24) as i32 - 12;
            let in_box = xx > w / 4 && xx < w / 2 && y > h / 3 && y < 2 * h / 3;
            let ring =
                ((xx as i32 - (3 * w / 4) as i32).pow(2) + (y as i32 - (h / 2) as i32).pow(2)) < (h as i32 / 4).pow(2);
            let r = if in_box { 230 } else { (xx * 255 / w) as i32 } + noise;
            let g = if ring { 20 } else { (y * 255 / h) as i32 } + noise / 2;
            let b = (((xx / 8 + y / 8) % 2) * 180) as i32 + 30 + noise;
            px.extend([r.clamp(0, 255) as u8, g.clamp(0, 255) as u8, b.clamp(0, 255) as u8]);
        }
    }
    px
}

fn encode(w: u16, h: u16, seed: u32, sampling: jpeg_encoder::SamplingFactor, gray: bool) -> Vec<u8> {
    let px = picture(w, h, seed);
    let mut out = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut out, 85);
    enc.set_sampling_factor(sampling);
    if gray {
        let luma: Vec<u8> = px.chunks_exact(3).map(|p| ((p[0] as u32 + p[1] as u32 + p[2] as u32) / 3) as u8).collect();
        enc.encode(&luma, w, h, jpeg_encoder::ColorType::Luma).expect("encode");
    } else {
        enc.encode(&px, w, h, jpeg_encoder::ColorType::Rgb).expect("encode");
    }
    out
}

struct Image {
    name: &'static str,
    path: PathBuf,
    data: Vec<u8>,
}

fn images(dir: &Path) -> Vec<Image> {
    use jpeg_encoder::SamplingFactor as S;
    let specs: [(&str, u16, u16, S, bool); 6] = [
        ("caltech_420", 128, 95, S::F_2_2, false),
        ("imagenet_420", 500, 375, S::F_2_2, false),
        ("portrait_444", 333, 500, S::F_1_1, false),
        ("large_420", 1106, 829, S::F_2_2, false),
        ("huge_422", 2000, 1800, S::F_2_1, false),
        ("gray", 640, 480, S::F_1_1, true),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, &(name, w, h, s, gray))| {
            let data = encode(w, h, i as u32 + 1, s, gray);
            let path = dir.join(format!("{name}.jpg"));
            std::fs::write(&path, &data).expect("write");
            Image { name, path, data }
        })
        .collect()
}

fn decode(
    d: &mut JpegDecoder,
    data: &[u8],
    cfg: &DecodeConfig,
    rng: &mut SampleRng,
) -> (Vec<u8>, ringtier_decode::DecodeInfo) {
    let mut out = vec![0u8; cfg.output_bytes()];
    let info = d.decode_into(data, cfg, rng, &mut out).expect("decode");
    (out, info)
}

/// Runs Pillow on `cases` (JSON objects without the closing brace's "name"), returns each output.
fn pillow(dir: &Path, cases: &[String]) -> Option<Vec<Vec<u8>>> {
    let python = std::env::var("RINGTIER_PYTHON").unwrap_or_else(|_| "python3".into());
    let required = std::env::var("RINGTIER_REQUIRE_PILLOW").is_ok_and(|v| v == "1");
    let ok = Command::new(&python).args(["-c", "import PIL"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(!required, "RINGTIER_REQUIRE_PILLOW=1 but `{python} -c 'import PIL'` fails");
        eprintln!("SKIPPED: Pillow not importable by {python} (set RINGTIER_PYTHON to a Python with Pillow)");
        return None;
    }
    let json = format!("[{}]", cases.join(","));
    let spec = dir.join("cases.json");
    std::fs::write(&spec, json).expect("write cases");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pillow_reference.py");
    let out = Command::new(&python).arg(&script).arg(&spec).arg(dir).output().expect("run python");
    assert!(out.status.success(), "pillow_reference.py failed: {}", String::from_utf8_lossy(&out.stderr));
    Some((0..cases.len()).map(|i| std::fs::read(dir.join(format!("case{i}.rgb"))).expect("reference output")).collect())
}

/// The largest and the mean absolute difference per byte.
fn difference(ours: &[u8], reference: &[u8]) -> (u8, f64) {
    assert_eq!(ours.len(), reference.len(), "sizes");
    let mut max = 0u8;
    let mut sum = 0u64;
    for (a, b) in ours.iter().zip(reference) {
        let d = a.abs_diff(*b);
        max = max.max(d);
        sum += d as u64;
    }
    (max, sum as f64 / ours.len() as f64)
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("decode").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

#[test]
fn resize_center_and_random_crops_match_pillow() {
    let dir = tempdir();
    let imgs = images(dir.path());
    let mut dec = JpegDecoder::new().expect("decoder");
    let mut ours = Vec::new();
    let mut cases = Vec::new();
    let mut push = |name: String, out: Vec<u8>, case: String| {
        let i = cases.len();
        cases.push(format!("{{\"name\": \"case{i}\", {case}}}"));
        ours.push((name, out));
    };
    for img in &imgs {
        let file = format!("\"file\": \"{}\"", img.path.display());
        for size in [224u32, 64] {
            // The whole image, full-size decode, then with DCT scaling (Pillow's draft).
            for dct in [false, true] {
                let cfg = DecodeConfig::default().with_size(size).with_dct_scaling(dct);
                let (out, info) = decode(&mut dec, &img.data, &cfg, &mut SampleRng::new(0, 0, 0));
                push(
                    format!("{} resize {size} dct {dct} (1/{})", img.name, info.dct_denominator),
                    out,
                    format!("{file}, \"op\": \"resize\", \"size\": {size}, \"draft\": {}", info.dct_denominator),
                );
            }
            // torchvision Resize(size * 8 / 7) + CenterCrop(size), full-size decode.
            let resize = size * 8 / 7;
            let cfg =
                DecodeConfig::default().with_size(size).with_crop(Crop::Center { resize }).with_dct_scaling(false);
            let (out, _) = decode(&mut dec, &img.data, &cfg, &mut SampleRng::new(0, 0, 0));
            push(
                format!("{} center {resize}/{size}", img.name),
                out,
                format!("{file}, \"op\": \"center\", \"size\": {size}, \"resize\": {resize}"),
            );
            // RandomResizedCrop + flip over several samples: crop then resize (full-size decode)
            // and, with DCT scaling, the same box on Pillow's draft-scaled image.
            for index in 0..6u64 {
                for dct in [false, true] {
                    let cfg = DecodeConfig::default()
                        .with_size(size)
                        .with_crop(Crop::RANDOM_RESIZED)
                        .with_flip(true)
                        .with_dct_scaling(dct);
                    let (out, info) = decode(&mut dec, &img.data, &cfg, &mut SampleRng::new(7, 1, index));
                    let r = info.region;
                    let name = format!("{} rrc {size} #{index} dct {dct} (1/{}) {r:?}", img.name, info.dct_denominator);
                    let case = if info.dct_denominator == 1 {
                        format!(
                            "{file}, \"op\": \"crop\", \"size\": {size}, \"box\": [{}, {}, {}, {}], \"flip\": {}",
                            r.left, r.top, r.width, r.height, info.flipped
                        )
                    } else {
                        let d = info.dct_denominator as f64;
                        let (w, h) = (info.source.0 as f64, info.source.1 as f64);
                        let (fx, fy) = ((w / d).ceil() / w, (h / d).ceil() / h);
                        format!(
                            "{file}, \"op\": \"box\", \"size\": {size}, \"draft\": {}, \"box\": [{}, {}, {}, {}], \"flip\": {}",
                            info.dct_denominator,
                            r.left * fx,
                            r.top * fy,
                            r.width * fx,
                            r.height * fy,
                            info.flipped
                        )
                    };
                    push(name, out, case);
                }
            }
        }
    }
    let Some(reference) = pillow(dir.path(), &cases) else { return };
    let (max_tol, mean_tol) = tolerance();
    let mut failures = Vec::new();
    let (mut worst, mut worst_mean) = (0u8, 0f64);
    for ((name, out), reference) in ours.iter().zip(&reference) {
        let (max, mean) = difference(out, reference);
        eprintln!("{JPEG_DECODER} {name}: max |diff| {max}, mean {mean:.4}");
        (worst, worst_mean) = (worst.max(max), worst_mean.max(mean));
        if max > max_tol || mean > mean_tol {
            failures.push(format!("{name}: max |diff| {max}, mean {mean:.4}"));
        }
    }
    eprintln!("{JPEG_DECODER}: {} cases, worst max |diff| {worst}, worst mean {worst_mean:.4}", ours.len());
    assert!(
        failures.is_empty(),
        "{JPEG_DECODER}: over the tolerance (max {max_tol}, mean {mean_tol}):\n{}",
        failures.join("\n")
    );
}

#[test]
fn layouts_normalization_and_flip_follow_their_formulas() {
    let dir = tempdir();
    let imgs = images(dir.path());
    let mut dec = JpegDecoder::new().expect("decoder");
    let size = 96u32;
    let hw = (size * size) as usize;
    for img in &imgs {
        let base = DecodeConfig::default().with_size(size).with_crop(Crop::RANDOM_RESIZED);
        let rng = || SampleRng::new(3, 0, 11);
        let (hwc, _) = decode(&mut dec, &img.data, &base, &mut rng());
        // CHW u8: a transpose of HWC.
        let (chw, _) = decode(&mut dec, &img.data, &base.with_layout(Layout::Chw), &mut rng());
        for i in 0..hw {
            for c in 0..3 {
                assert_eq!(chw[c * hw + i], hwc[i * 3 + c], "{}: CHW pixel {i} channel {c}", img.name);
            }
        }
        // f32: (x / 255 - mean) / std, in both layouts.
        let n = Normalize::IMAGENET;
        for layout in [Layout::Hwc, Layout::Chw] {
            let cfg = base.with_layout(layout).with_normalize(n);
            let (f, _) = decode(&mut dec, &img.data, &cfg, &mut rng());
            let vals: Vec<f32> = f.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
            assert_eq!(vals.len(), hw * 3);
            for i in 0..hw {
                for c in 0..3 {
                    let want = (hwc[i * 3 + c] as f32 / 255.0 - n.mean[c]) / n.std[c];
                    let got = if layout == Layout::Hwc { vals[i * 3 + c] } else { vals[c * hw + i] };
                    assert!(
                        (got - want).abs() <= 1e-6,
                        "{}: {layout:?} pixel {i} channel {c}: {got} vs {want}",
                        img.name
                    );
                }
            }
        }
        // The flip mirrors each row of the same crop; the draw is the sample's (about half flip).
        let mut flipped = 0;
        for index in 0..40u64 {
            let cfg = base.with_flip(true);
            let (a, ia) = decode(&mut dec, &img.data, &cfg, &mut SampleRng::new(5, 2, index));
            let (b, ib) = decode(&mut dec, &img.data, &base, &mut SampleRng::new(5, 2, index));
            assert_eq!(ia.region, ib.region, "the flip draw comes after the crop's");
            if ia.flipped {
                flipped += 1;
                let s = size as usize;
                for y in 0..s {
                    for x in 0..s {
                        assert_eq!(a[(y * s + x) * 3..][..3], b[(y * s + s - 1 - x) * 3..][..3]);
                    }
                }
            } else {
                assert_eq!(a, b);
            }
        }
        assert!((8..=32).contains(&flipped), "{}: {flipped} of 40 flipped", img.name);
    }
}

#[test]
fn random_resized_crop_parameters_follow_torchvision() {
    let (scale, ratio) = ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0));
    for (w, h) in [(500u32, 375u32), (128, 95), (333, 500), (64, 64)] {
        let mut areas = Vec::new();
        for index in 0..2000u64 {
            let mut rng = SampleRng::new(1, 0, index);
            let (l, t, cw, ch) = random_resized_params(w, h, scale, ratio, &mut rng);
            assert!(cw >= 1 && ch >= 1 && l + cw <= w && t + ch <= h, "{w}x{h}: box ({l},{t},{cw},{ch})");
            // Rounding to whole pixels moves area and ratio by at most half a pixel per side.
            let a = (cw as f64) * (ch as f64) / (w as f64 * h as f64);
            let tol_a = (cw as f64 + ch as f64 + 1.0) / (w as f64 * h as f64);
            assert!(a >= scale.0 - tol_a && a <= 1.0, "{w}x{h}: area {a}");
            let r = cw as f64 / ch as f64;
            let rmin = (cw as f64 - 0.5) / (ch as f64 + 0.5);
            let rmax = (cw as f64 + 0.5) / (ch as f64 - 0.5).max(0.5);
            assert!(rmax >= ratio.0 && rmin <= ratio.1, "{w}x{h}: ratio {r}");
            areas.push(a);
            // The same sample in the same epoch draws the same box.
            assert_eq!(random_resized_params(w, h, scale, ratio, &mut SampleRng::new(1, 0, index)), (l, t, cw, ch));
        }
        // Area fractions spread over the range (uniform draws of the target area, about half
        // of them rejected only when the box does not fit).
        let mean = areas.iter().sum::<f64>() / areas.len() as f64;
        assert!((0.35..0.65).contains(&mean), "{w}x{h}: mean area fraction {mean}");
    }
    // Another epoch draws other boxes.
    let a: Vec<_> =
        (0..50).map(|i| random_resized_params(500, 375, scale, ratio, &mut SampleRng::new(1, 0, i))).collect();
    let b: Vec<_> =
        (0..50).map(|i| random_resized_params(500, 375, scale, ratio, &mut SampleRng::new(1, 1, i))).collect();
    assert_ne!(a, b);
    // A strip no draw fits: torchvision's fallback, the central box at the closest ratio.
    let mut rng = SampleRng::new(0, 0, 0);
    assert_eq!(random_resized_params(1000, 10, (0.9, 1.0), ratio, &mut rng), ((1000 - 13) / 2, 0, 13, 10));
    assert_eq!(random_resized_params(10, 1000, (0.9, 1.0), ratio, &mut rng), (0, (1000 - 13) / 2, 10, 13));
    // torchvision's Resize(256) + CenterCrop(224) on 500x375: resized 341x256, offsets
    // round(58.5) = 58 (ties to even) and 16.
    let b = center_crop_box(500, 375, 256, 224);
    let (sx, sy) = (500.0 / 341.0, 375.0 / 256.0);
    assert!((b.left - 58.0 * sx).abs() < 1e-9 && (b.top - 16.0 * sy).abs() < 1e-9, "{b:?}");
    assert!((b.width - 224.0 * sx).abs() < 1e-9 && (b.height - 224.0 * sy).abs() < 1e-9, "{b:?}");
}

#[test]
fn corrupt_truncated_and_bad_settings_are_clear_errors() {
    let data = encode(320, 240, 9, jpeg_encoder::SamplingFactor::F_2_2, false);
    let mut dec = JpegDecoder::new().expect("decoder");
    let cfg = DecodeConfig::default();
    let mut out = vec![0u8; cfg.output_bytes()];
    let mut rng = SampleRng::new(0, 0, 0);
    for (what, bytes) in [
        ("truncated", &data[..data.len() / 2]),
        ("header only", &data[..200]),
        ("not a JPEG", &[0x55u8; 4000][..]),
        ("empty", &[][..]),
    ] {
        let err = dec.decode_into(bytes, &cfg, &mut rng, &mut out).expect_err(what);
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{what}: {err}");
        assert!(err.to_string().contains("JPEG"), "{what}: {err}");
    }
    // The decoder is still good after errors.
    dec.decode_into(&data, &cfg, &mut rng, &mut out).expect("decode after errors");
    let wrong = dec.decode_into(&data, &cfg, &mut rng, &mut out[..10]).expect_err("short output");
    assert_eq!(wrong.kind(), ErrorKind::InvalidInput);
    for bad in [
        DecodeConfig::default().with_size(0),
        DecodeConfig::default().with_threads(0),
        DecodeConfig::default().with_crop(Crop::Center { resize: 100 }),
        DecodeConfig::default().with_crop(Crop::RandomResized { scale: (0.5, 0.1), ratio: (0.75, 1.33) }),
        DecodeConfig::default().with_crop(Crop::RandomResized { scale: (0.1, 1.5), ratio: (0.75, 1.33) }),
        DecodeConfig::default().with_normalize(Normalize { mean: [0.0; 3], std: [1.0, 0.0, 1.0] }),
    ] {
        assert_eq!(bad.validate().expect_err("invalid").kind(), ErrorKind::InvalidInput, "{bad:?}");
    }
}

#[test]
fn dct_scaled_decodes_of_awkward_sizes_succeed() {
    // The scaled region's far edge, computed in floating point, must never fall past the
    // decoded image (it did for 475x472 and others: a per-sample error on 6% of ImageNet-like
    // files before the clamp).
    let mut dec = JpegDecoder::new().expect("decoder");
    let cfg = DecodeConfig::default().with_size(224);
    let mut out = vec![0u8; cfg.output_bytes()];
    let mut denominators = std::collections::BTreeSet::new();
    for (i, w) in [449u16, 475, 489, 493, 543, 603, 609, 623, 997, 1801].into_iter().enumerate() {
        for h in [w * 3 / 4 + 1, w - 3, w / 2 + 7] {
            let data = encode(w, h, i as u32, jpeg_encoder::SamplingFactor::F_2_2, false);
            for crop in [Crop::Resize, Crop::Center { resize: 256 }, Crop::RANDOM_RESIZED] {
                let c = cfg.with_crop(crop).with_flip(true);
                for index in 0..4 {
                    let info = dec
                        .decode_into(&data, &c, &mut SampleRng::new(1, 0, index), &mut out)
                        .unwrap_or_else(|e| panic!("{w}x{h} {crop:?}: {e}"));
                    denominators.insert(info.dct_denominator);
                }
            }
        }
    }
    if JPEG_DECODER == "libjpeg-turbo" {
        assert!(denominators.len() >= 3, "scaled and unscaled decodes: {denominators:?}");
    } else {
        assert_eq!(denominators.into_iter().collect::<Vec<_>>(), [1], "{JPEG_DECODER} decodes at full size");
    }
}

#[test]
fn partial_decode_gives_the_whole_decodes_output_and_decodes_less() {
    // The window decode (libjpeg-turbo) against the whole-image decode, same samples: every
    // crop kind, DCT scaling on, every subsampling, sizes off the iMCU grid, flips, integer
    // crops; the outputs must be the same bytes (the window holds all the resize reads), and
    // random crops must decode fewer pixels.
    use jpeg_encoder::SamplingFactor as S;
    let mut dec = JpegDecoder::new().expect("decoder");
    let base = DecodeConfig::default().with_size(224).with_flip(true);
    let (mut whole_px, mut window_px, mut cases, mut differing) = (0u64, 0u64, 0, 0);
    let mut worst = 0u8;
    for (i, (w, h, s)) in [
        (500u16, 375u16, S::F_2_2),
        (333, 500, S::F_1_1),
        (1106, 829, S::F_2_1),
        (477, 311, S::F_2_2),
        (2000, 1800, S::F_2_2),
        (320, 240, S::F_4_1),
    ]
    .into_iter()
    .enumerate()
    {
        let data = encode(w, h, 40 + i as u32, s, false);
        for crop in [Crop::RANDOM_RESIZED, Crop::Center { resize: 256 }, Crop::Resize] {
            for layout in [Layout::Hwc, Layout::Chw] {
                let on = base.with_crop(crop).with_layout(layout);
                let off = on.with_partial_decode(false);
                for index in 0..6 {
                    let (a, ia) = decode(&mut dec, &data, &on, &mut SampleRng::new(7, 1, index));
                    let (b, ib) = decode(&mut dec, &data, &off, &mut SampleRng::new(7, 1, index));
                    assert_eq!(
                        (ia.region, ia.flipped, ia.dct_denominator),
                        (ib.region, ib.flipped, ib.dct_denominator)
                    );
                    let (largest, _) = difference(&a, &b);
                    worst = worst.max(largest);
                    differing += usize::from(a != b);
                    cases += 1;
                    if crop == Crop::RANDOM_RESIZED {
                        whole_px += ib.decoded.0 as u64 * ib.decoded.1 as u64;
                        window_px += ia.decoded.0 as u64 * ia.decoded.1 as u64;
                    }
                }
            }
        }
    }
    assert_eq!(differing, 0, "{differing} of {cases} outputs differ, by up to {worst} levels");
    if JPEG_DECODER == "libjpeg-turbo" {
        assert!(window_px * 10 < whole_px * 9, "random crops decode {window_px} of {whole_px} pixels");
    } else {
        assert_eq!(window_px, whole_px, "{JPEG_DECODER} decodes whole images");
    }
}
