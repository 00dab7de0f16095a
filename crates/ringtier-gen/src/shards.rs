//! A dataset of record shards: the spec's samples as TFRecord files or WebDataset tars, and a
//! manifest of the shard files.

use std::path::Path;

use anyhow::{bail, Context, Result};
use ringtier_dataset::manifest::{checksum, Manifest, ManifestEntry, MANIFEST_FILE};
use ringtier_loader::records::{write_tar_end, write_tar_member, write_tfrecord};

use crate::rng::Rng;
use crate::shape::{sizes, DatasetSpec, Format};

fn shard_name(format: Format, s: usize, n: usize) -> String {
    match format {
        Format::Wds => format!("shard-{s:06}.tar"),
        _ => format!("train-{s:05}-of-{n:05}.tfrecord"),
    }
}

/// Writes the spec's samples (random bytes of the drawn sizes, the same bytes [`generate`]
/// writes as files) as `shards` shards, sample i in shard i % shards, and a manifest of the
/// shard files: `train-SSSSS-of-NNNNN.tfrecord` for [`Format::Tfrecord`], `shard-SSSSSS.tar`
/// for [`Format::Wds`] (per sample `classNNNN/imgNNNNNNN.bin` and its `.cls`). Returns (shards,
/// bytes).
///
/// [`generate`]: crate::generate
pub fn generate_shards(root: &Path, spec: &DatasetSpec, shards: usize, force: bool) -> Result<(usize, u64)> {
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
            let mut rng = Rng::for_sample(spec.seed, i);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Preset;

    #[test]
    fn shards_hold_every_sample_and_a_manifest_of_the_shards() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec =
            DatasetSpec { files: 10, classes: 2, format: Format::Tfrecord, ..DatasetSpec::preset(Preset::Small) };
        let (n, bytes) = generate_shards(dir.path(), &spec, 3, false).expect("tfrecord");
        let manifest = Manifest::load(dir.path()).expect("manifest");
        let keys: Vec<&str> = manifest.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            ["train-00000-of-00003.tfrecord", "train-00001-of-00003.tfrecord", "train-00002-of-00003.tfrecord"]
        );
        assert_eq!((n, bytes), (3, manifest.total_bytes()));
        // A TFRecord frame is 16 bytes around its payload.
        assert_eq!(bytes, sizes(&spec).iter().map(|s| s + 16).sum::<u64>());
        assert!(generate_shards(dir.path(), &spec, 3, false).is_err(), "refuses to overwrite");
        assert!(generate_shards(dir.path(), &spec, 0, true).is_err());

        let wds = DatasetSpec { format: Format::Wds, ..spec };
        let (n, _) = generate_shards(dir.path(), &wds, 2, true).expect("wds");
        let manifest = Manifest::load(dir.path()).expect("manifest");
        assert_eq!(n, 2);
        assert_eq!(manifest.entries[1].key, "shard-000001.tar");
        let tar = std::fs::read(dir.path().join("shard-000001.tar")).expect("read");
        assert!(tar.starts_with(b"class0001/img0000001.bin"), "the first member of shard 1 is sample 1");
    }
}
