//! The paper's three experiments inside TensorFlow (the report's last section), where a Python
//! with TensorFlow and ringtier is at hand: the scripts of `bench/tensorflow/` (built into the
//! binary, written into the work directory), run at the report's sizes, their JSON kept in the
//! report directory and summarised from it.
//!
//! `--tensorflow auto` (the default) runs them when `--python` imports `tensorflow` and
//! `ringtier.tensorflow`, and otherwise says in the report why they did not run; `on` makes
//! that an error before any experiment; `off` leaves the section out.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::dataset::{self, DatasetSpec, Format, Preset};
use crate::harness::scripts::Script;

use super::sized;

/// Whether the paper runs its experiments inside TensorFlow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TfMode {
    /// When the Python imports TensorFlow and ringtier.tensorflow; the report says why not.
    Auto,
    /// Always: an error before any experiment where the Python cannot.
    On,
    /// Never.
    Off,
}

/// How long the import check may take (TensorFlow's import takes seconds; a broken one can
/// hang).
const PROBE_TIMEOUT: Duration = Duration::from_secs(180);

/// Bytes of a child's output kept for an error message.
const TAIL: usize = 3000;

/// The TensorFlow version `python` imports along with `ringtier.tensorflow`, or why it cannot.
pub(crate) fn probe(python: &Path) -> std::result::Result<String, String> {
    let code = "import tensorflow as tf, ringtier.tensorflow, ringtier; print(tf.__version__, ringtier.__version__)";
    let mut child = Command::new(python)
        .args(["-c", code])
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} cannot be run ({e})", python.display()))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < PROBE_TIMEOUT => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} did not import TensorFlow within {PROBE_TIMEOUT:?}", python.display()));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", python.display())),
        }
    }
    let out = child.wait_with_output().map_err(|e| format!("reading {}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(format!("{} cannot import tensorflow and ringtier.tensorflow ({})", python.display(), last.trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    match (words.next(), words.next()) {
        (Some(tf), Some(rt)) => Ok(format!("TensorFlow {tf}, ringtier {rt}")),
        _ => Err(format!("{} printed no versions", python.display())),
    }
}

/// Sizes and places of the TensorFlow experiments.
#[derive(Debug, Clone)]
pub(crate) struct TfConfig {
    pub(crate) python: PathBuf,
    /// Where the data and the scripts go (removed after).
    pub(crate) work: PathBuf,
    /// Where the JSON reports go.
    pub(crate) out: PathBuf,
    pub(crate) full: bool,
    pub(crate) tiny: bool,
    pub(crate) repeats: usize,
}

/// The three reports, as the scripts wrote them.
#[derive(Debug, Clone)]
pub(crate) struct TfReports {
    /// What `probe` said (TensorFlow's and ringtier's versions).
    pub(crate) versions: String,
    pub(crate) python: PathBuf,
    /// `tf-read.json`.
    pub(crate) read: serde_json::Value,
    /// `tf-miniapp.json`.
    pub(crate) miniapp: serde_json::Value,
    /// `tf-ckpt.json`.
    pub(crate) ckpt: serde_json::Value,
}

/// What the report's TensorFlow section shows.
#[derive(Debug, Clone)]
pub(crate) enum TfOutcome {
    /// The experiments ran.
    Ran(Box<TfReports>),
    /// They did not run, and why (the Python has no TensorFlow, or a script failed).
    NotRun(String),
}

/// Runs `python script args...` with TensorFlow quiet; an error with the end of its output
/// when it fails.
fn run_script(python: &Path, script: &Path, args: &[String]) -> Result<()> {
    let name = script.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    eprintln!("   {name} {}", args.join(" "));
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail = &err[err.len().saturating_sub(TAIL)..];
        bail!("{name} failed ({}): {tail}", out.status);
    }
    Ok(())
}

/// Reads a report a script wrote (bounded: a report is a few hundred KB).
fn read_json(path: &Path) -> Result<serde_json::Value> {
    const MAX: u64 = 64 << 20;
    let len = std::fs::metadata(path).with_context(|| format!("{} was not written", path.display()))?.len();
    if len > MAX {
        bail!("{} is {len} bytes, more than a report can be", path.display());
    }
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The three experiments: the read micro-benchmark through `tf.data` against
/// `ringtier.tensorflow.dataset`, the AlexNet mini-app in Keras with the prefetcher on and
/// off, and TensorFlow's saver with and without the burst buffer.
pub(crate) fn run(cfg: &TfConfig, versions: String) -> Result<TfReports> {
    let scripts = cfg.work.join("tf-scripts");
    Script::Benchlib.write_to(&scripts)?;
    let tfdir = scripts.join("tensorflow");
    let read_py = Script::TfRead.write_to(&tfdir)?;
    let miniapp_py = Script::TfMiniapp.write_to(&tfdir)?;
    let ckpt_py = Script::TfCkpt.write_to(&tfdir)?;
    let repeats = cfg.repeats.to_string();
    let py = &cfg.python;

    // The read micro-benchmark: the paper's files, tf.data's threads swept.
    let files = sized(cfg.full, cfg.tiny, 16_384, 2_048, 128);
    let spec = DatasetSpec { files, ..DatasetSpec::preset(Preset::Imagenet) };
    let data = dataset::generate(&cfg.work.join("tf-imagenet"), &spec, true, false)?;
    let read_json_path = cfg.out.join("tf-read.json");
    let parallel = if cfg.tiny { "1,autotune" } else { "1,16,autotune" };
    run_script(
        py,
        &read_py,
        &[
            "--dir".into(),
            data.root.display().to_string(),
            "--format".into(),
            "files".into(),
            "--repeats".into(),
            repeats.clone(),
            "--parallel".into(),
            parallel.into(),
            "--json".into(),
            read_json_path.display().to_string(),
        ],
    )?;
    let _ = std::fs::remove_dir_all(&data.root);

    // The mini-app: small JPEGs, Keras AlexNet, prefetch on and off.
    let files = sized(cfg.full, cfg.tiny, 9_144, 2_048, 96);
    let spec = DatasetSpec { files, format: Format::Jpeg, ..DatasetSpec::preset(Preset::Caltech101) };
    let cal = dataset::generate(&cfg.work.join("tf-caltech"), &spec, true, false)?;
    let miniapp_json = cfg.out.join("tf-miniapp.json");
    let (steps, warmup, batch) = if cfg.tiny { ("4", "1", "16") } else { ("40", "5", "64") };
    run_script(
        py,
        &miniapp_py,
        &[
            "--dir".into(),
            cal.root.display().to_string(),
            "--steps".into(),
            steps.into(),
            "--warmup".into(),
            warmup.into(),
            "--batch".into(),
            batch.into(),
            "--repeats".into(),
            repeats.clone(),
            "--json".into(),
            miniapp_json.display().to_string(),
        ],
    )?;
    let _ = std::fs::remove_dir_all(&cal.root);

    // The burst buffer around TensorFlow's saver; the slow tier is the same file system here.
    let base = cfg.work.join("tf-ckpt");
    let mib = sized(cfg.full, cfg.tiny, "600", "256", "8");
    let ckpt_json = cfg.out.join("tf-ckpt.json");
    run_script(
        py,
        &ckpt_py,
        &[
            "--fast".into(),
            base.join("fast").display().to_string(),
            "--slow".into(),
            base.join("slow").display().to_string(),
            "--mib".into(),
            mib.into(),
            "--repeats".into(),
            repeats,
            "--slowdown".into(),
            "1".into(),
            "--slow-kind".into(),
            "the fast tier's file system, not throttled".into(),
            "--json".into(),
            ckpt_json.display().to_string(),
        ],
    )?;
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir_all(&scripts);
    Ok(TfReports {
        versions,
        python: cfg.python.clone(),
        read: read_json(&read_json_path)?,
        miniapp: read_json(&miniapp_json)?,
        ckpt: read_json(&ckpt_json)?,
    })
}
