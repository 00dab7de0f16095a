//! Real baseline JPEGs of about a given size: a procedural scene (gradient, ellipses, noise)
//! encoded at quality 85, its dimensions fitted to the size.

use anyhow::{Context, Result};

use crate::rng::Rng;

/// Encodes a JPEG of about `target` bytes into `out`: draws a scene, encodes it, rescales the
/// dimensions by the size ratio and encodes once more.
pub(crate) fn jpeg_of_size(rng: &mut Rng, target: u64, out: &mut Vec<u8>) -> Result<()> {
    let scene = Scene::random(rng);
    // A first guess from a typical 1 byte per pixel at quality 85, 4:3.
    let mut px = (target as f64 / scene.bytes_per_pixel_guess()).max(256.0);
    for _ in 0..2 {
        let h = ((px * 3.0 / 4.0).sqrt() as u32).clamp(16, 4096);
        let w = (px as u32 / h).clamp(16, 4096);
        scene.encode(w as u16, h as u16, out)?;
        let ratio = target as f64 / out.len().max(1) as f64;
        if (0.85..1.15).contains(&ratio) {
            break;
        }
        px *= ratio;
    }
    Ok(())
}

/// A procedural picture: a two-colour gradient, a few ellipses, and noise.
struct Scene {
    c0: [f32; 3],
    c1: [f32; 3],
    blobs: Vec<([f32; 2], [f32; 2], [f32; 3])>,
    noise: f32,
    seed: u64,
}

impl Scene {
    fn random(rng: &mut Rng) -> Scene {
        let mut col = || [rng.next_f64() as f32 * 255.0, rng.next_f64() as f32 * 255.0, rng.next_f64() as f32 * 255.0];
        let (c0, c1) = (col(), col());
        let n = 2 + (rng.next_u64() % 6) as usize;
        let blobs = (0..n)
            .map(|_| {
                let c = [rng.next_f64() as f32, rng.next_f64() as f32];
                let r = [0.05 + 0.3 * rng.next_f64() as f32, 0.05 + 0.3 * rng.next_f64() as f32];
                let k = [rng.next_f64() as f32 * 255.0, rng.next_f64() as f32 * 255.0, rng.next_f64() as f32 * 255.0];
                (c, r, k)
            })
            .collect();
        Scene { c0, c1, blobs, noise: 5.0 + 60.0 * rng.next_f64() as f32, seed: rng.next_u64() }
    }

    fn bytes_per_pixel_guess(&self) -> f64 {
        0.3 + self.noise as f64 / 40.0
    }

    fn encode(&self, w: u16, h: u16, out: &mut Vec<u8>) -> Result<()> {
        let (wf, hf) = (w as f32, h as f32);
        let mut pixels = Vec::with_capacity(w as usize * h as usize * 3);
        let mut rng = Rng::new(self.seed);
        for y in 0..h {
            for x in 0..w {
                let (u, v) = (x as f32 / wf, y as f32 / hf);
                let t = (u + v) / 2.0;
                let mut p = [0f32; 3];
                for (c, px) in p.iter_mut().enumerate() {
                    *px = self.c0[c] * (1.0 - t) + self.c1[c] * t;
                }
                for (center, r, k) in &self.blobs {
                    let (dx, dy) = ((u - center[0]) / r[0], (v - center[1]) / r[1]);
                    if dx * dx + dy * dy < 1.0 {
                        p = *k;
                    }
                }
                let n = (rng.next_f64() as f32 - 0.5) * self.noise;
                pixels.extend(p.iter().map(|c| (c + n).clamp(0.0, 255.0) as u8));
            }
        }
        out.clear();
        let enc = jpeg_encoder::Encoder::new(&mut *out, 85);
        enc.encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb).context("encoding a JPEG")?;
        Ok(())
    }
}
