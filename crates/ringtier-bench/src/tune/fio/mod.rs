//! fio at the same settings as a tuning point: the job file (`ioengine=io_uring`, `iodepth`,
//! `bs`, `direct`, `fixedbufs`, `registerfiles`, `sqthread_poll`), written next to the report
//! so anyone can re-run it, and its run with `--output-format=json`. Two targets: one big
//! file (random reads of `bs` for a fixed time, the same as `bench randread`) and a directory
//! of files (`opendir`, each file read whole, as a pass of `bench read` does). [`compare`]
//! runs both sides, interleaved.

pub(crate) mod compare;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::space::Config;

/// What fio reads.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One file, random reads of the block size for `runtime_secs`.
    BigFile { path: PathBuf, runtime_secs: f64 },
    /// Every file under a directory, each read front to back once, in blocks of the largest
    /// power of two not above the smallest file (fio skips files smaller than one block),
    /// between 4 KiB and 1 MiB.
    Files { dir: PathBuf, files: usize, min_file_bytes: u64 },
}

/// fio's answer.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct FioResult {
    pub(crate) mb_per_sec: f64,
    pub(crate) iops: f64,
    pub(crate) clat_p50_ms: f64,
    pub(crate) clat_p99_ms: f64,
    pub(crate) clat_p999_ms: f64,
    /// fio's user + system CPU over its run, seconds.
    pub(crate) cpu_seconds: f64,
}

/// Whether `fio` runs here.
pub(crate) fn available() -> bool {
    Command::new("fio").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The fio job equivalent to `config` on `target`, submitting in batches as ringtier does.
pub(crate) fn job(config: &Config, target: &Target) -> String {
    job_with(config, target, true)
}

/// The fio job equivalent to `config` on `target`; `batched` false leaves fio's own submission
/// (one I/O per `io_uring_enter`, reaping at least one), its better setting on some runs: a
/// comparison runs both and takes fio's better, repeat by repeat (the baseline at its best).
pub(crate) fn job_with(config: &Config, target: &Target, batched: bool) -> String {
    let direct = config.get("io") != Some("buffered");
    let depth = config.num("depth").max(1);
    let mut j = String::from("; written by `ringtier tune`: the same settings as the point it names\n[global]\n");
    j.push_str("ioengine=io_uring\n");
    j.push_str(&format!("direct={}\n", u8::from(direct)));
    // ringtier submits what it has in one io_uring_enter and reaps all that completed: fio's
    // batch options do the same (its default submits and reaps one at a time).
    if batched {
        j.push_str(&format!("iodepth={depth}\niodepth_batch_submit={depth}\niodepth_batch_complete_max={depth}\n"));
    } else {
        j.push_str(&format!("iodepth={depth}\n; fio's own submission: one I/O at a time\n"));
    }
    j.push_str(&format!("fixedbufs={}\n", u8::from(config.flag("register_buffers"))));
    j.push_str(&format!("registerfiles={}\n", u8::from(config.flag("register_files"))));
    if let Some(idle) = config.sqpoll() {
        j.push_str(&format!("sqthread_poll=1\n; SQPOLL idle {idle} ms in ringtier (fio keeps its own)\n"));
    }
    j.push_str("iomem_align=4096\nthread=1\ngroup_reporting=1\n");
    j.push_str(
        "; ringtier's buffers are on huge pages: for the same memory, run fio with\n\
         ; /sys/kernel/mm/transparent_hugepage/enabled set to always (tune does, then puts it back)\n",
    );
    match target {
        Target::BigFile { path, runtime_secs } => {
            let bs = match config.num("read_size") {
                0 => 128 << 10,
                n => n,
            };
            j.push_str(&format!(
                "rw=randread\nbs={bs}\nnorandommap=1\nrandrepeat=0\ntime_based=1\nruntime={}ms\n\n[bigfile]\nfilename={}\n",
                (runtime_secs * 1000.0).round() as u64,
                path.display()
            ));
        }
        Target::Files { dir, files, min_file_bytes } => {
            let bs = files_block_size(*min_file_bytes);
            j.push_str(&format!(
                "rw=read\nbs={bs}\nfile_service_type=sequential\nopenfiles={depth}\n; {files} files\n\n[files]\nopendir={}\n",
                dir.display()
            ));
        }
    }
    j
}

/// fio's block size for a set of files whose smallest has `min_file_bytes`.
pub(crate) fn files_block_size(min_file_bytes: u64) -> u64 {
    let p = if min_file_bytes < 2 { 1 } else { 1u64 << (63 - min_file_bytes.leading_zeros()) };
    p.clamp(4096, 1 << 20)
}

/// Writes `job` to `path` and runs it; fio's JSON parsed.
pub(crate) fn run(job_text: &str, path: &Path) -> Result<FioResult> {
    std::fs::write(path, job_text).with_context(|| format!("writing {}", path.display()))?;
    let out = Command::new("fio")
        .arg("--output-format=json")
        .arg(path)
        .output()
        .context("running fio (apt-get install fio)")?;
    if !out.status.success() {
        bail!("fio {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Reads fio's JSON output (text before the JSON, such as warnings, is skipped).
pub(crate) fn parse(text: &str) -> Result<FioResult> {
    let start = text.find('{').context("fio printed no JSON")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).context("parsing fio's JSON")?;
    let job = v.get("jobs").and_then(|j| j.get(0)).context("fio's JSON has no jobs")?;
    let read = job.get("read").context("fio's job has no read section")?;
    let num = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
    let pct = |p: &str| num(read.get("clat_ns").and_then(|c| c.get("percentile")).and_then(|p2| p2.get(p))) / 1e6;
    let runtime_s = num(job.get("job_runtime")) / 1e3;
    let cpu = (num(job.get("usr_cpu")) + num(job.get("sys_cpu"))) / 100.0 * runtime_s;
    Ok(FioResult {
        mb_per_sec: num(read.get("bw_bytes")) / 1e6,
        iops: num(read.get("iops")),
        clat_p50_ms: pct("50.000000"),
        clat_p99_ms: pct("99.000000"),
        clat_p999_ms: pct("99.900000"),
        cpu_seconds: cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_says_every_setting_and_fio_json_parses() {
        let mut c = Config::default();
        for (k, v) in [("depth", "16"), ("read_size", "65536"), ("sqpoll", "50"), ("register_files", "true")] {
            c.0.insert(k, v.to_string());
        }
        let j = job(&c, &Target::BigFile { path: "/data/big".into(), runtime_secs: 2.0 });
        for want in [
            "ioengine=io_uring",
            "direct=1",
            "iodepth=16",
            "bs=65536",
            "fixedbufs=1",
            "registerfiles=1",
            "sqthread_poll=1",
            "runtime=2000ms",
            "filename=/data/big",
        ] {
            assert!(j.contains(want), "{want} missing from\n{j}");
        }
        let f = job(&Config::default(), &Target::Files { dir: "/d".into(), files: 10, min_file_bytes: 100_000 });
        assert!(f.contains("opendir=/d") && f.contains("bs=65536") && !f.contains("sqthread"), "{f}");
        let plain = job_with(&c, &Target::BigFile { path: "/data/big".into(), runtime_secs: 2.0 }, false);
        assert!(plain.contains("iodepth=16") && !plain.contains("iodepth_batch"), "{plain}");
        assert!(j.contains("iodepth_batch_submit=16"), "{j}");
        assert_eq!((files_block_size(0), files_block_size(5000), files_block_size(1 << 30)), (4096, 4096, 1 << 20));
        let json = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs":[{"job_runtime":2000,"usr_cpu":10.0,"sys_cpu":40.0,
 "read":{"bw_bytes":500000000,"iops":3814.7,"clat_ns":{"percentile":{"50.000000":1000000,"99.000000":4000000,"99.900000":9000000}}}}]}"#;
        let r = parse(json).expect("parse");
        assert_eq!(r.mb_per_sec, 500.0);
        assert_eq!((r.clat_p50_ms, r.clat_p99_ms, r.clat_p999_ms), (1.0, 4.0, 9.0));
        assert!((r.cpu_seconds - 1.0).abs() < 1e-9);
        assert!(parse("no json").is_err());
        if !available() {
            eprintln!("skipped running fio: not installed (apt-get install fio)");
        } else {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir(dir.path().join("d")).expect("mkdir");
            std::fs::write(dir.path().join("d/a"), vec![7u8; 65536]).expect("write");
            std::fs::write(dir.path().join("d/b"), vec![7u8; 100_000]).expect("write");
            let c = Config([("io", "buffered".to_string())].into_iter().collect());
            let t = Target::Files { dir: dir.path().join("d"), files: 2, min_file_bytes: 65536 };
            let r = run(&job(&c, &t), &dir.path().join("job.fio")).expect("fio runs");
            assert!(r.mb_per_sec > 0.0, "{r:?}");
        }
    }
}
