//! The baselines' helper scripts, built into the binary so that a benchmark finds them
//! wherever it runs from: each is written into the run's own directory before it runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A helper script a baseline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    /// `bench/s3/boto3_baseline.py`: boto3 uploads and thread-pool reads.
    Boto3Baseline,
    /// `bench/decode_vs_pillow.py`: Pillow decode and transforms.
    DecodeVsPillow,
    /// `bench/benchlib.py`: what the TensorFlow scripts import from the directory above them.
    Benchlib,
    /// `bench/tensorflow/read.py`: the read micro-benchmark through tf.data.
    TfRead,
    /// `bench/tensorflow/miniapp.py`: the AlexNet mini-app in Keras.
    TfMiniapp,
    /// `bench/tensorflow/ckpt.py`: TensorFlow's saver with and without the burst buffer.
    TfCkpt,
}

impl Script {
    fn file_name(self) -> &'static str {
        match self {
            Script::Boto3Baseline => "boto3_baseline.py",
            Script::DecodeVsPillow => "decode_vs_pillow.py",
            Script::Benchlib => "benchlib.py",
            Script::TfRead => "read.py",
            Script::TfMiniapp => "miniapp.py",
            Script::TfCkpt => "ckpt.py",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Script::Boto3Baseline => include_str!("../../../../bench/s3/boto3_baseline.py"),
            Script::DecodeVsPillow => include_str!("../../../../bench/decode_vs_pillow.py"),
            Script::Benchlib => include_str!("../../../../bench/benchlib.py"),
            Script::TfRead => include_str!("../../../../bench/tensorflow/read.py"),
            Script::TfMiniapp => include_str!("../../../../bench/tensorflow/miniapp.py"),
            Script::TfCkpt => include_str!("../../../../bench/tensorflow/ckpt.py"),
        }
    }

    /// Writes the script into `dir` (created); returns its path.
    pub(crate) fn write_to(self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(self.file_name());
        std::fs::write(&path, self.text()).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_embedded_and_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        for s in [Script::Boto3Baseline, Script::DecodeVsPillow, Script::TfRead, Script::TfMiniapp, Script::TfCkpt] {
            let p = s.write_to(&dir.path().join("scripts")).expect("write");
            assert!(std::fs::read_to_string(p).expect("read").contains("import argparse"));
        }
        let lib = Script::Benchlib.write_to(&dir.path().join("scripts")).expect("write");
        assert!(std::fs::read_to_string(lib).expect("read").contains("def summary"));
    }
}
