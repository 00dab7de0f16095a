//! The datasets the experiments read: a directory and its manifest ([`Dataset`]), opened or
//! generated. The generator itself (specs, presets, files, JPEGs, shards) is the product's,
//! `ringtier::gen` (the crate `ringtier-gen`), which `ringtier gen` runs too.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ringtier_dataset::manifest::{Manifest, ManifestEntry, MANIFEST_FILE};

use crate::harness::files_under;
#[cfg(test)]
use ringtier::gen::sizes;
pub(crate) use ringtier::gen::{DatasetSpec, Format, Preset, ShapeArgs};
#[cfg(test)]
use ringtier_dataset::manifest::checksum;

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

/// Writes the dataset `spec` shapes under `root` with its manifest (`ringtier::gen::generate`)
/// and returns it, checksums known.
pub(crate) fn generate(root: &Path, spec: &DatasetSpec, force: bool, progress: bool) -> Result<Dataset> {
    let manifest = ringtier::gen::generate(root, spec, force, progress)?;
    Ok(Dataset { root: root.to_path_buf(), manifest, has_checksums: true })
}

#[cfg(test)]
mod tests {
    use super::*;

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
