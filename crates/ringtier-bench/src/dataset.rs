//! `ringtier gen`: synthetic datasets shaped like the paper's, deterministic from a seed, with
//! a manifest (key, size, CRC-32C) so benchmarks need no directory walk.
//!
//! Sizes follow a log-normal distribution: `size = median * exp(sigma * N(0,1))`, clipped to
//! `[min, max]`. Presets:
//!
//! | preset | files | median | sigma | min | max | classes |
//! |---|---|---|---|---|---|---|
//! | `imagenet` | 16,384 | 112 KB | 0.6 | 2 KB | 1 MiB | 1,000 |
//! | `caltech101` | 9,144 | 12 KB | 0.5 | 1 KB | 256 KiB | 102 |
//! | `small` (demo) | 2,000 | 112 KB | 0.6 | 1 KB | 1 MiB | 16 |
//!
//! `--format raw` writes incompressible random bytes of exactly the drawn size. `--format
//! jpeg` writes real baseline JPEGs (gradient backgrounds, shapes and noise of varied
//! strength, quality 85) whose dimensions are chosen so the encoded size lands near the drawn
//! size; the manifest records the actual sizes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use ringtier_loader::manifest::{checksum, Manifest, ManifestEntry, MANIFEST_FILE};
use ringtier_loader::records::{write_tar_end, write_tar_member, write_tfrecord};

use crate::harness::{files_under, Rng};
use crate::parse_size;
use clap::Args;
use std::io::IsTerminal;

/// File contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    /// Random bytes.
    Raw,
    /// Real JPEG images.
    Jpeg,
    /// TFRecord shards of random samples (`--shards`, sample i in shard i mod shards).
    Tfrecord,
    /// WebDataset tar shards: per sample a `.bin` (random bytes) and a `.cls` (its class).
    Wds,
}

/// Named dataset shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Preset {
    /// The paper's ImageNet subset: 16,384 files, median 112 KB.
    Imagenet,
    /// Caltech-101: 9,144 files, median 12 KB.
    Caltech101,
    /// The demo's: 2,000 ImageNet-like files.
    Small,
}

/// Shape of a generated dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct DatasetSpec {
    pub(crate) files: usize,
    pub(crate) median_bytes: u64,
    pub(crate) sigma: f64,
    pub(crate) min_bytes: u64,
    pub(crate) max_bytes: u64,
    pub(crate) classes: usize,
    pub(crate) seed: u64,
    pub(crate) format: Format,
    /// Every drawn size is rounded up to a multiple of this (1: no rounding). fio reads only
    /// whole blocks of each file, so a comparison with fio at block size B uses multiples of B.
    pub(crate) size_multiple: u64,
}

impl DatasetSpec {
    pub(crate) fn preset(p: Preset) -> Self {
        let (files, median_bytes, sigma, min_bytes, max_bytes, classes) = match p {
            Preset::Imagenet => (16_384, 112_000, 0.6, 2_000, 1 << 20, 1000),
            Preset::Caltech101 => (9_144, 12_000, 0.5, 1_000, 256 << 10, 102),
            Preset::Small => (2_000, 112_000, 0.6, 1_000, 1 << 20, 16),
        };
        DatasetSpec {
            files,
            median_bytes,
            sigma,
            min_bytes,
            max_bytes,
            classes,
            seed: 1,
            format: Format::Raw,
            size_multiple: 1,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.files == 0 {
            bail!("--files must be at least 1");
        }
        if self.classes == 0 {
            bail!("--classes must be at least 1");
        }
        if self.median_bytes == 0 || self.median_bytes > self.max_bytes || self.min_bytes > self.median_bytes {
            bail!("sizes must satisfy 0 < --min <= --median <= --max-size");
        }
        if self.size_multiple == 0 || self.size_multiple > self.max_bytes {
            bail!("--size-multiple must be between 1 and --max-size");
        }
        if !(0.0..=3.0).contains(&self.sigma) {
            bail!("--sigma must be between 0 and 3");
        }
        Ok(())
    }
}

/// A dataset on disk and its manifest.
#[derive(Debug)]
pub(crate) struct Dataset {
    pub(crate) root: PathBuf,
    pub(crate) manifest: Manifest,
    /// True when the file list came from a manifest (checksums known).
    pub(crate) has_checksums: bool,
}

impl Dataset {
    pub(crate) fn total_bytes(&self) -> u64 {
        self.manifest.total_bytes()
    }

    pub(crate) fn max_size(&self) -> u64 {
        self.manifest.max_size()
    }

    pub(crate) fn len(&self) -> usize {
        self.manifest.entries.len()
    }

    pub(crate) fn median_size(&self) -> u64 {
        let mut s: Vec<u64> = self.manifest.entries.iter().map(|e| e.size).collect();
        s.sort_unstable();
        s.get(s.len() / 2).copied().unwrap_or(0)
    }

    /// Manifest indices in the order a recursive directory walk meets the files, each
    /// directory's entries in `readdir` order, descending into a subdirectory as it is met:
    /// the order fio's `--opendir` reads a file set in. Files not in the manifest are ignored.
    pub(crate) fn readdir_order(&self) -> Result<Vec<u32>> {
        let index: std::collections::HashMap<&str, u32> =
            self.manifest.entries.iter().enumerate().map(|(i, e)| (e.key.as_str(), i as u32)).collect();
        let mut out = Vec::with_capacity(self.len());
        for path in files_under(&self.root)? {
            let key = path.strip_prefix(&self.root).ok().and_then(|k| k.to_str());
            if let Some(&i) = key.and_then(|k| index.get(k)) {
                out.push(i);
            }
        }
        if out.len() != self.len() {
            bail!("{} files of the manifest are missing from {}", self.len() - out.len(), self.root.display());
        }
        Ok(out)
    }

    /// Opens a dataset: its manifest if there is one, else a walk of the directory.
    pub(crate) fn open(root: &Path) -> Result<Dataset> {
        let meta = std::fs::metadata(root).with_context(|| format!("dataset directory {}", root.display()))?;
        if !meta.is_dir() {
            bail!("dataset {} is not a directory", root.display());
        }
        let (manifest, has_checksums) = if root.join(MANIFEST_FILE).exists() {
            (Manifest::load(root)?, true)
        } else {
            // Files and class folders that are symbolic links are read through the links, as
            // torchvision's ImageFolder does (loops and broken links are errors).
            let fsroot = ringtier_core::fs::FsRoot::open(root, false)?.following_links(true);
            let entries =
                fsroot.list("")?.into_iter().map(|m| ManifestEntry { key: m.key, size: m.size, crc32c: 0 }).collect();
            (Manifest { entries }, false)
        };
        if manifest.entries.is_empty() {
            bail!(
                "dataset {} holds no regular files, also through symbolic links (names starting with \
                 `.ringtier-` are ignored); generate one with `ringtier gen --dir ...`",
                root.display()
            );
        }
        Ok(Dataset { root: root.to_path_buf(), manifest, has_checksums })
    }
}

/// The sizes a spec draws, in file order.
pub(crate) fn sizes(spec: &DatasetSpec) -> Vec<u64> {
    let mut rng = Rng::new(spec.seed);
    (0..spec.files)
        .map(|_| {
            let s = (spec.median_bytes as f64) * (spec.sigma * rng.normal()).exp();
            (s as u64).clamp(spec.min_bytes, spec.max_bytes).div_ceil(spec.size_multiple.max(1))
                * spec.size_multiple.max(1)
        })
        .collect()
}

fn key_of(spec: &DatasetSpec, i: usize) -> String {
    let ext = match spec.format {
        Format::Raw | Format::Tfrecord | Format::Wds => "bin",
        Format::Jpeg => "jpg",
    };
    format!("class{:04}/img{:07}.{ext}", i % spec.classes, i)
}

/// Writes the dataset under `root` and its manifest; syncs the files so they can be evicted
/// from the page cache. Refuses a directory that already holds a manifest unless `force`.
pub(crate) fn generate(root: &Path, spec: &DatasetSpec, force: bool, progress: bool) -> Result<Dataset> {
    spec.validate()?;
    if root.join(MANIFEST_FILE).exists() && !force {
        bail!("{} already holds a dataset (its manifest exists); pass --force to regenerate", root.display());
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    for c in 0..spec.classes.min(spec.files) {
        let dir = root.join(format!("class{c:04}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let sizes = sizes(spec);
    let bar = if progress { indicatif::ProgressBar::new(spec.files as u64) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} files, {elapsed} elapsed, eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("generating");
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    let written = AtomicU64::new(0);
    let results: Vec<Result<Vec<(usize, ManifestEntry)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (sizes, bar, written) = (&sizes, &bar, &written);
                s.spawn(move || -> Result<Vec<(usize, ManifestEntry)>> {
                    let mut out = Vec::new();
                    let mut buf = Vec::new();
                    for i in (w..spec.files).step_by(workers) {
                        let key = key_of(spec, i);
                        // Per-file generator: the output does not depend on the thread count.
                        let mut rng = Rng::new(spec.seed.wrapping_mul(1_000_003).wrapping_add(i as u64 + 1));
                        match spec.format {
                            Format::Raw | Format::Tfrecord | Format::Wds => {
                                buf.resize(sizes[i] as usize, 0);
                                rng.fill(&mut buf);
                            }
                            Format::Jpeg => jpeg_of_size(&mut rng, sizes[i], &mut buf)?,
                        }
                        let path = root.join(&key);
                        std::fs::write(&path, &buf).with_context(|| format!("writing {}", path.display()))?;
                        out.push((i, ManifestEntry { key, size: buf.len() as u64, crc32c: checksum(&buf) }));
                        written.fetch_add(buf.len() as u64, Ordering::Relaxed);
                        bar.inc(1);
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("generator thread panicked"))))
            .collect()
    });
    let mut all = Vec::with_capacity(spec.files);
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|(i, _)| *i);
    bar.set_message("syncing");
    let dir = std::fs::File::open(root).with_context(|| format!("opening {}", root.display()))?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from).context("syncfs")?;
    let manifest = Manifest { entries: all.into_iter().map(|(_, e)| e).collect() };
    manifest.store(root)?;
    bar.finish_and_clear();
    Ok(Dataset { root: root.to_path_buf(), manifest, has_checksums: true })
}

/// Encodes a JPEG of about `target` bytes into `out`: draws a scene, encodes it, rescales the
/// dimensions by the size ratio and encodes once more.
fn jpeg_of_size(rng: &mut Rng, target: u64, out: &mut Vec<u8>) -> Result<()> {
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

/// `ringtier gen`.
pub(crate) fn gen(a: GenArgs) -> Result<()> {
    if let Some(url) = a.dir.to_str().filter(|d| ringtier_s3::S3Config::is_s3_url(d)).map(str::to_string) {
        // Generated in a temporary directory, then uploaded, then removed.
        let tmp = tempfile::Builder::new().prefix("ringtier-gen-").tempdir().context("creating a temp dir")?;
        let local = GenArgs { dir: tmp.path().join("ds"), force: true, ..a };
        gen(local)?;
        let t0 = std::time::Instant::now();
        let (n, bytes) = upload_dir(&tmp.path().join("ds"), &url)?;
        println!("uploaded {n} objects, {:.1} MB, to {url} in {:.1} s", bytes as f64 / 1e6, t0.elapsed().as_secs_f64());
        return Ok(());
    }
    let spec = a.shape.spec(a.preset)?;
    let t0 = std::time::Instant::now();
    if matches!(spec.format, Format::Tfrecord | Format::Wds) {
        let (shards, bytes) = generate_shards(&a.dir, &spec, a.shards, a.force)?;
        println!(
            "wrote {} samples as {shards} {:?} shards, {:.1} MB, in {:.1} s",
            spec.files,
            spec.format,
            bytes as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let ds = generate(&a.dir, &spec, a.force, std::io::stderr().is_terminal())?;
    println!(
        "wrote {} files, {:.1} MB (median {:.0} KB, max {:.0} KB), manifest {} in {:.1} s",
        ds.len(),
        ds.total_bytes() as f64 / 1e6,
        ds.median_size() as f64 / 1e3,
        ds.max_size() as f64 / 1e3,
        a.dir.join(ringtier_loader::manifest::MANIFEST_FILE).display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn shard_name(format: Format, s: usize, n: usize) -> String {
    match format {
        Format::Wds => format!("shard-{s:06}.tar"),
        _ => format!("train-{s:05}-of-{n:05}.tfrecord"),
    }
}

/// Writes the spec's samples (random bytes of the drawn sizes) as `shards` shards, sample i in
/// shard i % shards, and a manifest of the shard files. Returns (shards, samples, bytes).
pub(crate) fn generate_shards(root: &Path, spec: &DatasetSpec, shards: usize, force: bool) -> Result<(usize, u64)> {
    if shards == 0 {
        bail!("--shards must be at least 1");
    }
    if root.join(MANIFEST_FILE).exists() && !force {
        bail!("{} already holds a dataset (its manifest exists); pass --force to regenerate", root.display());
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let sizes = sizes(spec);
    let mut entries = Vec::with_capacity(shards);
    let mut total = 0u64;
    let mut sample = Vec::new();
    for s in 0..shards {
        let mut out = Vec::new();
        for i in (s..spec.files).step_by(shards) {
            let mut rng = Rng::new(spec.seed.wrapping_mul(1_000_003).wrapping_add(i as u64 + 1));
            sample.resize(sizes[i] as usize, 0);
            rng.fill(&mut sample);
            match spec.format {
                Format::Wds => {
                    let key = format!("class{:04}/img{i:07}", i % spec.classes);
                    write_tar_member(&mut out, &format!("{key}.bin"), &sample);
                    write_tar_member(&mut out, &format!("{key}.cls"), format!("{}", i % spec.classes).as_bytes());
                }
                _ => write_tfrecord(&mut out, &sample),
            }
        }
        if spec.format == Format::Wds {
            write_tar_end(&mut out);
        }
        let key = shard_name(spec.format, s, shards);
        let path = root.join(&key);
        std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
        total += out.len() as u64;
        entries.push(ManifestEntry { key, size: out.len() as u64, crc32c: checksum(&out) });
    }
    let dir = std::fs::File::open(root).with_context(|| format!("opening {}", root.display()))?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from).context("syncfs")?;
    Manifest { entries }.store(root)?;
    Ok((shards, total))
}

/// `ringtier gen --dir s3://...`: uploads the dataset generated in `local` (every file but the
/// manifest, whose `.ringtier` name is reserved; keys relative to `local`) to the S3 prefix;
/// returns (objects, bytes).
pub(crate) fn upload_dir(local: &Path, url: &str) -> Result<(usize, u64)> {
    // The manifest (a reserved name) stays local: the objects are the dataset.
    let mut files: Vec<PathBuf> = files_under(local)?
        .into_iter()
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".ringtier")))
        .collect();
    files.sort();
    crate::runtime(2)?.block_on(async {
        let tier = ringtier_s3::S3Tier::open(ringtier_s3::S3Config::from_url(url)?)
            .await
            .with_context(|| format!("opening {url}"))?;
        let (mut tasks, mut bytes) = (Vec::new(), 0u64);
        for f in &files {
            let key = f.strip_prefix(local)?.to_string_lossy().into_owned();
            let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            bytes += data.len() as u64;
            let t = tier.clone();
            tasks.push(tokio::spawn(async move { t.put_object(&key, data.into()).await.map(|_| ()) }));
            if tasks.len() >= 32 {
                for t in tasks.drain(..) {
                    t.await??;
                }
            }
        }
        for t in tasks {
            t.await??;
        }
        Ok((files.len(), bytes))
    })
}

/// The shape of a generated dataset.
#[derive(Args, Debug, Clone)]
pub struct ShapeArgs {
    /// Number of files (default: the preset's).
    #[arg(long)]
    pub(crate) files: Option<usize>,
    /// Median file size (log-normal sizes), e.g. 112000 or 12k (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) median: Option<u64>,
    /// Log-normal sigma of the sizes (default: the preset's).
    #[arg(long)]
    pub(crate) sigma: Option<f64>,
    /// Smallest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_size: Option<u64>,
    /// Largest file size (default: the preset's).
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
    /// Class directories (default: the preset's).
    #[arg(long)]
    pub(crate) classes: Option<usize>,
    /// Seed of sizes and contents.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// File contents: raw random bytes or real JPEG images.
    #[arg(long, value_enum, default_value = "raw")]
    pub(crate) format: Format,
    /// Round every size up to a multiple of this (raw format), e.g. 128k for a comparison
    /// with fio at that block size: fio reads only whole blocks of each file.
    #[arg(long, default_value = "1", value_parser = parse_size)]
    pub(crate) size_multiple: u64,
}

impl ShapeArgs {
    pub(crate) fn spec(&self, preset: Preset) -> Result<DatasetSpec> {
        let d = DatasetSpec::preset(preset);
        let spec = DatasetSpec {
            files: self.files.unwrap_or(d.files),
            median_bytes: self.median.unwrap_or(d.median_bytes),
            sigma: self.sigma.unwrap_or(d.sigma),
            min_bytes: self.min_size.unwrap_or(d.min_bytes.min(self.median.unwrap_or(d.median_bytes))),
            max_bytes: self.max_size.unwrap_or(d.max_bytes.max(self.median.unwrap_or(d.median_bytes))),
            classes: self.classes.unwrap_or(d.classes),
            seed: self.seed,
            format: self.format,
            size_multiple: self.size_multiple,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Arguments of `ringtier gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// Directory to write the dataset into (created); or an S3 prefix,
    /// `s3://bucket/prefix[?endpoint=URL]` (credentials from AWS_* variables): the dataset is
    /// generated in a temporary directory and uploaded there, one object per file.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Dataset shape: imagenet (16,384 files, median 112 KB), caltech101 (9,144, median 12 KB).
    #[arg(long, value_enum, default_value = "imagenet")]
    pub(crate) preset: Preset,
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// Regenerate over an existing dataset.
    #[arg(long)]
    pub(crate) force: bool,
    /// Shards of `--format tfrecord|wds` (sample i goes to shard i mod shards).
    #[arg(long, default_value_t = 16)]
    pub(crate) shards: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_deterministic_and_have_the_asked_median() {
        let spec = DatasetSpec { files: 4001, ..DatasetSpec::preset(Preset::Small) };
        let a = sizes(&spec);
        assert_eq!(a, sizes(&spec));
        let mut s = a.clone();
        s.sort();
        let median = s[s.len() / 2] as f64;
        assert!((median / 112_000.0 - 1.0).abs() < 0.05, "median {median}");
        assert!(s[0] >= 1000 && *s.last().unwrap_or(&0) <= 1 << 20);
    }

    #[test]
    fn generate_writes_files_and_a_matching_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = DatasetSpec { files: 20, classes: 3, ..DatasetSpec::preset(Preset::Small) };
        let ds = generate(dir.path(), &spec, false, false).expect("generate");
        assert_eq!(ds.len(), 20);
        for e in &ds.manifest.entries {
            let data = std::fs::read(dir.path().join(&e.key)).expect("read");
            assert_eq!((data.len() as u64, checksum(&data)), (e.size, e.crc32c), "{}", e.key);
        }
        assert_eq!(Dataset::open(dir.path()).expect("open").manifest, ds.manifest);
        assert!(generate(dir.path(), &spec, false, false).is_err(), "refuses to overwrite");
        let again = generate(dir.path(), &spec, true, false).expect("force");
        assert_eq!(again.manifest, ds.manifest, "deterministic");
        assert!(generate(dir.path(), &DatasetSpec { files: 0, ..spec }, true, false).is_err());
    }

    #[test]
    fn jpeg_files_are_real_jpegs_near_the_drawn_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec =
            DatasetSpec { files: 12, classes: 2, format: Format::Jpeg, ..DatasetSpec::preset(Preset::Caltech101) };
        let ds = generate(dir.path(), &spec, false, false).expect("generate");
        let drawn = sizes(&spec);
        for (e, want) in ds.manifest.entries.iter().zip(drawn) {
            let data = std::fs::read(dir.path().join(&e.key)).expect("read");
            assert_eq!(&data[..3], &[0xFF, 0xD8, 0xFF], "JPEG SOI marker in {}", e.key);
            assert_eq!(&data[data.len() - 2..], &[0xFF, 0xD9], "JPEG EOI marker in {}", e.key);
            let ratio = e.size as f64 / want as f64;
            assert!((0.5..2.0).contains(&ratio), "{}: {} bytes for a drawn {want}", e.key, e.size);
        }
    }

    #[test]
    fn open_walks_a_directory_without_manifest_and_rejects_empty_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(Dataset::open(&dir.path().join("missing")).is_err());
        let err = Dataset::open(dir.path()).expect_err("empty").to_string();
        assert!(err.contains("holds no regular files"), "{err}");
        std::fs::create_dir(dir.path().join("c")).expect("mkdir");
        std::fs::write(dir.path().join("c/x"), b"abc").expect("write");
        let ds = Dataset::open(dir.path()).expect("walk");
        assert_eq!((ds.len(), ds.total_bytes(), ds.has_checksums), (1, 3, false));
        std::fs::write(dir.path().join(MANIFEST_FILE), "junk").expect("write");
        assert!(Dataset::open(dir.path()).expect_err("corrupt").to_string().contains("corrupt manifest"));
    }
}
