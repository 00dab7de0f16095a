//! A dataset of files: one per sample in class directories, written by a few threads, synced,
//! then its manifest.

use std::path::Path;

use anyhow::{bail, Context, Result};
use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry, MANIFEST_FILE};

use crate::jpeg::jpeg_of_size;
use crate::rng::Rng;
use crate::shape::{sizes, DatasetSpec, Format};

fn key_of(spec: &DatasetSpec, i: usize) -> String {
    let ext = match spec.format {
        Format::Raw | Format::Tfrecord | Format::Wds => "bin",
        Format::Jpeg => "jpg",
    };
    format!("class{:04}/img{:07}.{ext}", i % spec.classes, i)
}

/// Writes the dataset under `root` (one file per sample, `classNNNN/imgNNNNNNN.bin` or `.jpg`)
/// and its manifest, and returns the manifest; syncs the files so they can be evicted from the
/// page cache. Refuses a directory that already holds a manifest unless `force`. `progress`
/// draws a bar on stderr. The files' bytes depend only on the spec, not on the thread count.
pub fn generate(root: &Path, spec: &DatasetSpec, force: bool, progress: bool) -> Result<Manifest> {
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
    let results: Vec<Result<Vec<(usize, ManifestEntry)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (sizes, bar) = (&sizes, &bar);
                s.spawn(move || -> Result<Vec<(usize, ManifestEntry)>> {
                    let mut out = Vec::new();
                    let mut buf = Vec::new();
                    for i in (w..spec.files).step_by(workers) {
                        let key = key_of(spec, i);
                        // Per-file generator: the output does not depend on the thread count.
                        let mut rng = Rng::for_sample(spec.seed, i);
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
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Preset;

    #[test]
    fn generate_writes_files_and_a_matching_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = DatasetSpec { files: 20, classes: 3, ..DatasetSpec::preset(Preset::Small) };
        let manifest = generate(dir.path(), &spec, false, false).expect("generate");
        assert_eq!(manifest.entries.len(), 20);
        assert_eq!(manifest.entries[4].key, "class0001/img0000004.bin");
        for (e, want) in manifest.entries.iter().zip(sizes(&spec)) {
            let data = std::fs::read(dir.path().join(&e.key)).expect("read");
            assert_eq!((data.len() as u64, checksum(&data)), (e.size, e.crc32c), "{}", e.key);
            assert_eq!(e.size, want, "raw files have the drawn size");
        }
        assert_eq!(Manifest::load(dir.path()).expect("load"), manifest);
        assert!(generate(dir.path(), &spec, false, false).is_err(), "refuses to overwrite");
        let again = generate(dir.path(), &spec, true, false).expect("force");
        assert_eq!(again, manifest, "deterministic");
        assert!(generate(dir.path(), &DatasetSpec { files: 0, ..spec }, true, false).is_err());
    }

    #[test]
    fn jpeg_files_are_real_jpegs_near_the_drawn_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec =
            DatasetSpec { files: 12, classes: 2, format: Format::Jpeg, ..DatasetSpec::preset(Preset::Caltech101) };
        let manifest = generate(dir.path(), &spec, false, false).expect("generate");
        for (e, want) in manifest.entries.iter().zip(sizes(&spec)) {
            let data = std::fs::read(dir.path().join(&e.key)).expect("read");
            assert_eq!(&data[..3], &[0xFF, 0xD8, 0xFF], "JPEG SOI marker in {}", e.key);
            assert_eq!(&data[data.len() - 2..], &[0xFF, 0xD9], "JPEG EOI marker in {}", e.key);
            let ratio = e.size as f64 / want as f64;
            assert!((0.5..2.0).contains(&ratio), "{}: {} bytes for a drawn {want}", e.key, e.size);
        }
    }
}
