//! The paper's report, rendered from the experiments' typed reports alone: a measurement it
//! needs that was not made is an error naming the report and the measurement.

use super::*;

/// A measurement a report needs: an error naming the report and the measurement when it was
/// not made.
fn need<T>(v: Option<T>, file: &str, what: &str) -> Result<T> {
    v.with_context(|| format!("{file}: `{what}` was not measured"))
}

/// A list a report needs: an error when it is empty (nothing to report).
fn nonempty<'a, T>(v: &'a [T], file: &str, what: &str) -> Result<&'a [T]> {
    if v.is_empty() {
        bail!("{file}: `{what}` is empty");
    }
    Ok(v)
}

/// The report, from the experiments' reports and the run's facts.
pub(super) fn render(facts: &RunFacts, r: &Results) -> Result<String> {
    let mut md = String::new();
    let _ = writeln!(md, "# ringtier: the experiments of *Characterizing Deep-Learning I/O Workloads in TensorFlow*\n");
    let read = &r.read;
    let _ = writeln!(
        md,
        "Machine: {}. Work directory: `{}` ({}){}. {} per point; figures are medians with min..max.\n",
        read.machine.text(),
        facts.work.display(),
        facts.work_fs,
        facts.work_note.as_ref().map(|n| format!(": {n}")).unwrap_or_default(),
        match read.repeats {
            1 => "1 repeat".to_string(),
            n => format!("{n} repeats"),
        }
    );
    let _ = writeln!(
        md,
        "Kernel I/O path: block device {}; {}.\n",
        read.storage.device_text(),
        read.machine.io_uring_text()
    );
    match facts.engine {
        ringtier_uring::Engine::Auto => {}
        ringtier_uring::Engine::Posix => {
            let _ = writeln!(
                md,
                "Engine asked for: the thread pool (`--engine posix`): the read sweep leaves io_uring out, the \
                 mini-app and the burst buffer run on the thread pool.\n"
            );
        }
        ringtier_uring::Engine::Uring => {
            let _ = writeln!(md, "Engine asked for: io_uring (`--engine uring`).\n");
        }
    }
    read_section(&mut md, read)?;
    train_section(&mut md, facts, &r.train_read, &r.train_decode)?;
    ckpt_section(&mut md, &r.ckpt)?;
    if let Some(remote) = &r.remote {
        remote_section(&mut md, remote)?;
    }
    if let Some(tf) = &r.tensorflow {
        tensorflow_section(&mut md, tf, if r.remote.is_some() { 5 } else { 4 })?;
    }
    let _ = writeln!(md, "Total time: {:.0} s.", facts.total_seconds);
    Ok(md)
}

fn read_section(md: &mut String, read: &ReadReport) -> Result<()> {
    let rj = "read.json";
    let points = nonempty(&read.points, rj, "points")?;
    let uring =
        [Engine::UringDirect, Engine::UringBuffered].into_iter().find(|e| points.iter().any(|p| p.engine == *e));
    // io_uring refused (a seccomp profile, the sysctl, memlock): the read sweep ran the thread
    // pool alone and says why; otherwise its absence is a measurement that was not made.
    let refused: Vec<&crate::read::SkippedEngine> =
        read.skipped_engines.iter().filter(|s| s.engine.is_uring()).collect();
    if uring.is_none() && refused.is_empty() {
        anyhow::bail!("{rj}: no io_uring points");
    }
    let fs = &read.storage.filesystem;
    let _ = writeln!(md, "## 1. Read micro-benchmark: threads and queue depth\n");
    let _ = writeln!(
        md,
        "{} ImageNet-like files ({:.0} MB, median {:.0} KB) on {fs}, read cold ({} before every pass) in a \
         shuffled order, whole files, concurrency swept. Plot: `read.svg`; data: `read.json`.\n",
        read.dataset.files,
        read.dataset.bytes as f64 / 1e6,
        read.dataset.median_file_bytes as f64 / 1e3,
        read.cold_method
    );
    if let (None, Some(first)) = (uring, refused.first()) {
        let _ = writeln!(md, "io_uring did not run: {}. The thread pool ran alone.\n", first.reason);
    }
    if uring == Some(Engine::UringBuffered) {
        let _ = writeln!(
            md,
            "The work directory's file system ({fs}) has no direct I/O, so the io_uring engine reads through the \
             page cache (uring-buffered) instead of with O_DIRECT.{}\n",
            if fs == "tmpfs" {
                " tmpfs holds the files in memory: \"cold\" reads here are memory copies, not storage reads."
            } else {
                ""
            }
        );
    }
    let mut table =
        crate::harness::Table::new(["engine", "concurrency", "MB/s", "speedup over 1", "CPU s/GiB", "p99 ms"]);
    let mut best_speedup: BTreeMap<Engine, f64> = BTreeMap::new();
    for p in points {
        let sp = need(p.speedup_vs_concurrency_1, rj, "speedup_vs_concurrency_1")?.median;
        let e = best_speedup.entry(p.engine).or_insert(0.0f64);
        *e = e.max(sp);
        table.row([
            p.engine.to_string(),
            p.concurrency.to_string(),
            format!("{:.0} ({:.0}..{:.0})", p.mb_per_sec.median, p.mb_per_sec.min, p.mb_per_sec.max),
            format!("{sp:.2}"),
            format!("{:.2}", p.cpu_seconds_per_gib.median),
            format!("{:.2}", p.latency_p99_ms.median),
        ]);
    }
    md.push_str(&table.markdown());
    let posix = need(best_speedup.get(&Engine::PosixThreads), rj, "posix-threads points")?;
    let Some(uring) = uring else {
        let _ = writeln!(
            md,
            "\n**Paper:** more reader threads raised bandwidth up to 2.3x (workstation) and 7.8x (Lustre node). \
             **Here:** the thread pool's best speedup is {posix:.2}x (io_uring refused on this machine).\n"
        );
        return Ok(());
    };
    let cpu = match uring {
        Engine::UringDirect => read.headline.cpu_per_gib_uring_direct_over_posix,
        _ => read.headline.cpu_per_gib_uring_buffered_over_posix,
    };
    let cpu = need(cpu, rj, &format!("headline.cpu_per_gib_{}_over_posix", uring.as_str().replace('-', "_")))?;
    let _ = writeln!(
        md,
        "\n**Paper:** more reader threads raised bandwidth up to 2.3x (workstation) and 7.8x (Lustre node). \
         **Here:** the thread pool's best speedup is {posix:.2}x; io_uring ({uring}) with one thread reaches {:.2}x by \
         queue depth alone, at {:.2} of the thread pool's CPU per GiB.\n",
        best_speedup[&uring], cpu.median
    );
    Ok(())
}

fn train_section(md: &mut String, facts: &RunFacts, tr_read: &TrainReport, tr: &TrainReport) -> Result<()> {
    let (tj, dj) = ("train-read.json", "train-decode.json");
    let _ = writeln!(md, "## 2. AlexNet mini-app: prefetch hides I/O\n");
    let epochs = tr_read.config.epochs;
    let _ = writeln!(
        md,
        "{} Caltech-101-like JPEGs (median {:.0} KB) on {}, {epochs} epoch{} in batches of {}, {:.1} ms of emulated \
         accelerator compute per batch (AlexNet on a K80-class GPU, about 830 images/s). First the batches are \
         read only (`{tj}`), then also decoded and resized to 224x224 on {} threads (`{dj}`).\n",
        facts.caltech_files,
        facts.caltech_median_bytes as f64 / 1e3,
        tr_read.storage.filesystem,
        if epochs == 1 { "" } else { "s" },
        tr_read.config.batch,
        tr_read.config.compute_ms,
        tr.config.decode_threads
    );
    let mut table = crate::harness::Table::new([
        "input",
        "prefetch",
        "step time s",
        "stall s",
        "stall % of time",
        "stall % after the first batch",
        "images/s",
    ]);
    for (label, report, file) in [("read", tr_read, tj), ("read + decode", tr, dj)] {
        for p in nonempty(&report.points, file, "points")? {
            table.row([
                label.to_string(),
                p.prefetch.to_string(),
                format!("{:.4}", p.step_seconds.median),
                format!("{:.3}", p.stall_seconds.median),
                format!("{:.2}", p.stall_percent_of_time.median),
                format!("{:.2}", p.stall_percent_after_first_batch.median),
                format!("{:.0}", p.images_per_sec.median),
            ]);
        }
    }
    md.push_str(&table.markdown());
    let _ = writeln!(
        md,
        "\n**Paper:** with a prefetcher, input and compute fully overlap. **Here:** with prefetch 2 the stall \
         after the first batch is the share above; without prefetch every read (and decode) is waited for. When \
         the decode's CPU cannot keep up with the step ({} CPUs here), prefetch hides only what the CPU allows.\n",
        tr.machine.cpus
    );
    Ok(())
}

fn ckpt_section(md: &mut String, ck: &CkptReport) -> Result<()> {
    let cj = "ckpt.json";
    let _ = writeln!(md, "## 3. Burst buffer: checkpoints to fast storage, drained to slow\n");
    let _ = writeln!(
        md,
        "{} checkpoints of {:.0} MB, one per {} s of emulated training; fast tier: a {} directory (raw {} write + \
         fsync {:.0} MB/s); slow tier: {}, on {}. Data: `{cj}`.\n",
        ck.config.count,
        ck.config.size as f64 / 1e6,
        ck.config.compute_secs,
        ck.fast.filesystem,
        if ck.fast.raw_write_direct { "O_DIRECT" } else { "buffered" },
        ck.fast.raw_write_mb_per_sec,
        ck.slow.kind,
        ck.slow.filesystem
    );
    let mut table = crate::harness::Table::new([
        "slowdown",
        "raw write s",
        "direct blocking s",
        "burst blocking s",
        "burst/raw",
        "speedup",
        "drain MB/s (cap)",
    ]);
    for p in nonempty(&ck.points, cj, "points")? {
        table.row([
            format!("{:.1}x", p.slowdown),
            format!("{:.3}", p.raw_write_seconds.median),
            format!("{:.3}", p.direct_blocking_seconds.median),
            format!("{:.3}", p.burst_blocking_seconds.median),
            format!("{:.2}", p.burst_blocking_over_raw_write.median),
            p.speedup_blocking.text(2),
            // No drain rate when the drain had nothing left to copy at the end (tiny runs).
            match p.drain_mb_per_sec.median {
                mb if mb.is_finite() => format!("{mb:.0} ({:.0})", p.slow_mb_per_sec),
                _ => format!("- ({:.0})", p.slow_mb_per_sec),
            },
        ]);
    }
    md.push_str(&table.markdown());
    let _ = writeln!(
        md,
        "\n**Paper:** 2.6x faster checkpointing through the burst buffer. **Here:** the speedup at each slowdown above.\n"
    );
    Ok(())
}

/// The number at `path` of a script's JSON report; an error naming the file and the path
/// where it is missing or not a number.
fn json_num(v: &serde_json::Value, file: &str, path: &[&str]) -> Result<f64> {
    let mut at = v;
    for key in path {
        at = at.get(key).with_context(|| format!("{file}: `{}` was not measured", path.join(".")))?;
    }
    at.as_f64().with_context(|| format!("{file}: `{}` is not a number", path.join(".")))
}

/// The `(min, median, max)` summary at `path` of a script's JSON report.
fn json_summary(v: &serde_json::Value, file: &str, path: &[&str]) -> Result<(f64, f64, f64)> {
    let at = |k: &str| {
        let mut p = path.to_vec();
        p.push(k);
        json_num(v, file, &p)
    };
    Ok((at("min")?, at("median")?, at("max")?))
}

/// `median (min..max)` of the summary at `path`.
fn json_mmm(v: &serde_json::Value, file: &str, path: &[&str], digits: usize) -> Result<String> {
    let (lo, mid, hi) = json_summary(v, file, path)?;
    Ok(format!("{mid:.digits$} ({lo:.digits$}..{hi:.digits$})"))
}

/// `medianx (min..max)` of a ratio's summary at `path`.
fn json_ratio(v: &serde_json::Value, file: &str, path: &[&str]) -> Result<String> {
    let (lo, mid, hi) = json_summary(v, file, path)?;
    Ok(format!("{mid:.2}x ({lo:.2}..{hi:.2})"))
}

/// The report's last section: the three experiments inside TensorFlow, or why they did not run.
fn tensorflow_section(md: &mut String, tf: &TfOutcome, number: usize) -> Result<()> {
    let _ = writeln!(md, "## {number}. The experiments inside TensorFlow\n");
    let r = match tf {
        TfOutcome::NotRun(why) => {
            let _ = writeln!(
                md,
                "Not run: {why}. With a Python that imports `tensorflow` and `ringtier.tensorflow` (`pip install \
                 tensorflow-cpu ringtier`), `ringtier paper --python PATH` runs the read micro-benchmark through \
                 `tf.data`, the mini-app in Keras and TensorFlow's saver with the burst buffer; \
                 `--tensorflow off` leaves this section out.\n"
            );
            return Ok(());
        }
        TfOutcome::Ran(r) => r,
    };
    let _ = writeln!(
        md,
        "{} in `{}`: the scripts of `bench/tensorflow/` at this report's sizes, each pass in a fresh process. Data: \
         `tf-read.json`, `tf-miniapp.json`, `tf-ckpt.json`.\n",
        r.versions,
        r.python.display()
    );

    // Read.
    let (rj, read) = ("tf-read.json", &r.read);
    let sides =
        read.get("sides").and_then(|s| s.as_object()).with_context(|| format!("{rj}: `sides` was not measured"))?;
    let files = json_num(read, rj, &["files"])?;
    let mb = json_num(read, rj, &["bytes"])? / 1e6;
    let _ = writeln!(
        md,
        "**Read micro-benchmark.** {files:.0} of the paper's files ({mb:.0} MB), cold (evicted before every pass): \
         `tf.data` (`list_files`, `map(read_file, num_parallel_calls=k)`, `batch(64)`) with `k` swept, against \
         `ringtier.tensorflow.dataset(D, batch_size=64)`.\n"
    );
    let mut table = crate::harness::Table::new(["side", "MB/s", "pass CPU s/GiB"]);
    for name in sides.keys() {
        table.row([
            name.clone(),
            json_mmm(read, rj, &["sides", name, "mb_per_sec"], 0)?,
            format!("{:.2}", json_num(read, rj, &["sides", name, "pass_cpu_seconds_per_gib", "median"])?),
        ]);
    }
    md.push_str(&table.markdown());
    let best = read
        .get("best_tf_data")
        .and_then(|b| b.as_str())
        .with_context(|| format!("{rj}: `best_tf_data` was not measured"))?;
    let _ = writeln!(
        md,
        "\n**Paper:** `tf.data` reads faster with more parallel calls. **Here:** ringtier's dataset at {} the best \
         `tf.data` side (`{best}`), pass by pass, median (min..max).\n",
        json_ratio(read, rj, &["ringtier_over_best_tf_data_mb_per_sec"])?
    );

    // Mini-app.
    let (mj, mini) = ("tf-miniapp.json", &r.miniapp);
    let _ = writeln!(
        md,
        "**AlexNet mini-app in Keras.** {:.0} small JPEGs, batches of {:.0}, {:.0} steps: the share of each step spent \
         waiting for input (stall), with the prefetcher on and off.\n",
        json_num(mini, mj, &["files"])?,
        json_num(mini, mj, &["batch"])?,
        json_num(mini, mj, &["steps"])?
    );
    let mut table = crate::harness::Table::new(["pipeline", "stall %", "images/s"]);
    for name in ["tf.data prefetch on", "tf.data prefetch off", "ringtier prefetch on", "ringtier prefetch off"] {
        table.row([
            name.to_string(),
            json_mmm(mini, mj, &["sides", name, "stall_percent"], 1)?,
            json_mmm(mini, mj, &["sides", name, "images_per_sec"], 0)?,
        ]);
    }
    md.push_str(&table.markdown());
    let _ = writeln!(
        md,
        "\n**Paper:** the prefetcher hides the input pipeline behind the step (stall near zero with it on). \
         **Here:** stall {:.1}% with `tf.data`'s prefetcher on, {:.1}% off; ringtier {:.1}% and {:.1}% (its loader \
         reads ahead on its own).\n",
        json_num(mini, mj, &["sides", "tf.data prefetch on", "stall_percent", "median"])?,
        json_num(mini, mj, &["sides", "tf.data prefetch off", "stall_percent", "median"])?,
        json_num(mini, mj, &["sides", "ringtier prefetch on", "stall_percent", "median"])?,
        json_num(mini, mj, &["sides", "ringtier prefetch off", "stall_percent", "median"])?
    );

    // Checkpoints.
    let (cj, ck) = ("tf-ckpt.json", &r.ckpt);
    let _ = writeln!(
        md,
        "**Burst buffer around TensorFlow's saver.** A `tf.train.Checkpoint` of {:.0} MB: seconds the save blocks.\n",
        json_num(ck, cj, &["checkpoint_bytes"])? / 1e6
    );
    let mut table = crate::harness::Table::new(["save", "blocking s"]);
    for (name, what) in [
        ("tf -> slow", "TensorFlow straight to the slow tier, fsynced"),
        ("tf -> fast", "TensorFlow to the fast tier, fsynced"),
        ("raw fast write", "the same bytes, O_DIRECT to the fast tier"),
        ("burst buffer", "`ringtier.tensorflow.CheckpointManager.save` (durable on the fast tier)"),
        (
            "burst buffer wait=False",
            "`save(step, wait=False)` (TensorFlow's async snapshot; written and committed after)",
        ),
    ] {
        table.row([what.to_string(), json_mmm(ck, cj, &["sides", name, "seconds"], 3)?]);
    }
    md.push_str(&table.markdown());
    let _ = writeln!(
        md,
        "\n**Paper:** the burst buffer blocked 2.6x less than TensorFlow writing straight to a 4x slower tier. \
         **Here** the slow tier is the fast tier's own file system, not slowed (`bench/tensorflow/ckpt_blkio.sh 4` \
         makes a 4x slower one, as root): the burst buffer blocks {} as long as TensorFlow's own save to the fast \
         tier and {} a raw O_DIRECT write of the same bytes; the drain to the slow tier then takes {} s in the \
         background. With `wait=False` the save blocks {} as long as the raw write, counting the copy the next \
         update of the variables pays (copy-on-write), and is durable on the fast tier {} s after the call.\n",
        json_ratio(ck, cj, &["burst_buffer_over_tf_fast_write"])?,
        json_ratio(ck, cj, &["burst_buffer_over_raw_fast_write"])?,
        json_mmm(ck, cj, &["drain_seconds"], 2)?,
        json_ratio(ck, cj, &["burst_buffer_wait_false_plus_update_over_raw_fast_write"])?,
        json_mmm(ck, cj, &["burst_buffer_wait_false_seconds_to_durable"], 2)?
    );
    Ok(())
}

fn remote_section(md: &mut String, rv: &S3Report) -> Result<()> {
    let rj = "remote.json";
    let rows = nonempty(&rv.rows, rj, "rows")?;
    let crate::s3::RunSettings::Read { objects, object_size, latency_ms: latency, server_latency_ms, .. } = &rv.config
    else {
        bail!("{rj}: not the report of an S3 read experiment");
    };
    let _ = writeln!(md, "## 4. Remote storage: the latency-bound regime\n");
    let _ = writeln!(
        md,
        "{objects} objects of {:.0} KB, read cold three ways: from an S3 server on loopback (s3s-fs, a separate process, \
         answering each request {server_latency_ms} ms late, as a remote endpoint's round trip) by ringtier's S3 tier with one driver thread and the requests in flight swept, and by a boto3 \
         `ThreadPoolExecutor` (what a Python user would write) with its threads swept; and the same bytes from \
         local files through ringtier's file tier behind the throttled layer adding {latency} ms per request, \
         as a parallel file system's round trip does. Storage: {}. CPU: the client process's user+system time. \
         Data: `{rj}`.\n",
        *object_size as f64 / 1e3,
        rv.storage,
    );
    let mut table = crate::harness::Table::new(["client", "in flight", "MB/s", "speedup over 1", "CPU s/GiB"]);
    // Per client: (MB/s median at the lowest setting, best MB/s median, CPU s/GiB there).
    let mut by_client: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
    for row in rows {
        let (mb, cpu) = (row.mb_per_s.median, row.cpu_s_per_gib.median);
        let e = by_client.entry(row.client.clone()).or_insert((mb, 0.0, f64::NAN));
        if mb > e.1 {
            (e.1, e.2) = (mb, cpu);
        }
        table.row([
            row.client.clone(),
            row.setting.to_string(),
            format!("{mb:.1} ({:.1}..{:.1})", row.mb_per_s.min, row.mb_per_s.max),
            format!("{:.1}", mb / e.0),
            format!("{cpu:.2}"),
        ]);
    }
    md.push_str(&table.markdown());
    let get = |prefix: &str| {
        by_client
            .iter()
            .find(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .with_context(|| format!("{rj}: no rows of `{prefix}`"))
    };
    let (s3_lo, s3_best, s3_cpu) = get("ringtier S3")?;
    let (_, boto_best, boto_cpu) = get("boto3")?;
    let (files_lo, files_best, _) = get("ringtier files")?;
    let _ = writeln!(
        md,
        "\n**Paper:** on a Lustre node, where every request pays a network round trip, more reader threads raised \
         bandwidth 7.8x. **Here:** with {latency} ms per request, more requests in flight raise the file tier's \
         bandwidth {:.1}x from one driver thread; on S3 {:.1}x. ringtier's S3 tier (one driver thread) at its best \
         reaches {:.2}x the boto3 pool's best bandwidth at {:.2}x its CPU per GiB.\n",
        files_best / files_lo,
        s3_best / s3_lo,
        s3_best / boto_best,
        s3_cpu / boto_cpu
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ckpt::{CkptBenchConfig, CkptPoint, FastTier, SlowTier};
    use crate::harness::{ColdMethod, Machine, Storage, Summary};
    use crate::paper::tensorflow::TfReports;
    use crate::read::{DatasetInfo, Headline, Point};
    use crate::s3::{Row, RunSettings};
    use crate::train::{TrainConfig, TrainPoint};

    fn summary(x: f64) -> Summary {
        Summary { min: x * 0.9, median: x, max: x * 1.1 }
    }

    fn machine() -> Machine {
        Machine {
            cpus: 7,
            memory_bytes: 8 << 30,
            kernel: "6.1.0-test".into(),
            io_uring: crate::harness::machine::IoUringOffer::default(),
            engine: "io_uring".into(),
        }
    }

    fn storage(path: &str) -> Storage {
        Storage { path: path.into(), filesystem: "xfs".into(), device: None, device_note: None }
    }

    /// Reports of the shapes the experiments return, with made-up measurements.
    fn results(uring: Engine) -> Results {
        let point = |engine: Engine, c: usize, mb: f64| Point {
            engine,
            concurrency: c,
            rings: 1,
            unit: engine.concurrency_unit(),
            mb_per_sec: summary(mb),
            files_per_sec: summary(9.0),
            cpu_seconds_per_gib: summary(1.5),
            latency_p50_ms: summary(1.0),
            latency_p99_ms: summary(2.0),
            speedup_vs_concurrency_1: Some(summary(mb / 100.0)),
            ratio_to_posix_best: None,
            skipped_files: 0,
            runs: Vec::new(),
        };
        let cpu = Some(summary(0.25));
        let read = ReadReport {
            schema: "ringtier.bench.read/1",
            machine: machine(),
            storage: storage("/w/imagenet"),
            dataset: DatasetInfo {
                files: 4096,
                bytes: 548_000_000,
                median_file_bytes: 110_000,
                max_file_bytes: 1 << 20,
                checksums: true,
            },
            repeats: 3,
            cold: true,
            cold_method: ColdMethod::Fadvise,
            knobs: Knobs::default(),
            skipped_engines: Vec::new(),
            points: vec![
                point(Engine::PosixThreads, 1, 100.0),
                point(Engine::PosixThreads, 8, 230.0),
                point(uring, 1, 120.0),
                point(uring, 8, 400.0),
            ],
            headline: Headline {
                best_overall: None,
                posix_best: None,
                uring_direct_best: None,
                uring_direct_one_ring_over_best: None,
                cpu_per_gib_uring_direct_over_posix: if uring == Engine::UringDirect { cpu } else { None },
                uring_buffered_best: None,
                cpu_per_gib_uring_buffered_over_posix: if uring == Engine::UringBuffered { cpu } else { None },
            },
            peak_rss_bytes: 0,
            buffer_pool_bytes_max: 0,
        };
        let train = |decode: bool| TrainReport {
            schema: "ringtier.bench.train/1",
            machine: machine(),
            storage: storage("/w/caltech"),
            decoder: "zune-jpeg",
            config: TrainConfig {
                dir: PathBuf::from("/w/caltech"),
                batch: 64,
                epochs: 2,
                prefetch: vec![2, 0],
                compute_ms: 76.8,
                decode,
                decode_threads: 2,
                ckpt_every: 0,
                ckpt_bytes: 0,
                ckpt_dirs: None,
                ckpt_slow_bytes_per_sec: None,
                repeats: 3,
                json: None,
                engine: Default::default(),
            },
            points: [2, 0]
                .map(|p| TrainPoint {
                    prefetch: p,
                    step_seconds: summary(0.08),
                    stall_seconds: summary(0.5),
                    stall_percent_of_time: summary(3.0),
                    exposed_io_percent: summary(3.0),
                    stall_percent_after_first_batch: summary(2.0),
                    ckpt_blocking_seconds: summary(0.0),
                    images_per_sec: summary(800.0),
                    read_seconds: summary(0.1),
                    decode_seconds: summary(0.0),
                })
                .to_vec(),
            runs: Vec::new(),
        };
        let ckpt = CkptReport {
            schema: "ringtier.bench.ckpt/1",
            machine: machine(),
            fast: FastTier {
                path: "/w/ckpt/fast".into(),
                filesystem: "xfs".into(),
                raw_write_direct: true,
                raw_write_mb_per_sec: 1500.0,
                raw_write_seconds: summary(0.2),
            },
            slow: SlowTier {
                path: "/w/ckpt/slow".into(),
                filesystem: "xfs".into(),
                kind: "throttled layer (token bucket)".into(),
            },
            config: CkptBenchConfig {
                base: PathBuf::from("/w/ckpt"),
                fast_dir: None,
                slow_dir: None,
                slow_kernel_bps: None,
                keep_last: 1,
                count: 3,
                size: 244_000_000,
                compute_secs: 1.0,
                ratios: vec![1.0, 4.0],
                repeats: 3,
                buffered_writes: Default::default(),
                json: None,
                engine: Default::default(),
            },
            points: [1.0, 4.0]
                .map(|s| CkptPoint {
                    slowdown: s,
                    slow_mb_per_sec: 1500.0 / s,
                    raw_write_seconds: summary(0.2),
                    direct_blocking_seconds: summary(0.2 * s),
                    burst_blocking_seconds: summary(0.2),
                    speedup_blocking: summary(s),
                    burst_blocking_over_raw_write: summary(1.0),
                    drain_mb_per_sec: summary(1000.0 / s),
                    drain_fraction_of_cap: 0.66,
                    burst_all_on_slow_seconds: summary(3.0),
                })
                .to_vec(),
            peak_rss_over_data_bytes: 0,
            runs: Vec::new(),
        };
        let row = |client: &str, setting: usize, mb: f64, cpu: f64| Row {
            client: client.into(),
            setting,
            mb_per_s: summary(mb),
            cpu_s_per_gib: summary(cpu),
        };
        let remote = S3Report {
            schema: "ringtier.bench.s3.read/1",
            benchmark: "s3 read",
            machine: machine(),
            server: crate::s3server::ServerKind::S3sFs,
            storage: "dataset files and server files on /w/remote (xfs)".into(),
            cold: ColdMethod::Fadvise,
            config: RunSettings::Read {
                objects: 1024,
                object_size: 114_688,
                depths: vec![1, 64],
                threads: vec![1, 64],
                latency_ms: 4.0,
                server_latency_ms: 4.0,
                repeats: 3,
            },
            rows: vec![
                row("boto3 thread pool", 1, 3.0, 28.0),
                row("boto3 thread pool", 64, 40.0, 20.0),
                row("ringtier S3 tier", 1, 2.5, 5.0),
                row("ringtier S3 tier", 64, 80.0, 2.0),
                row("ringtier files +4ms/request", 1, 20.0, 2.0),
                row("ringtier files +4ms/request", 64, 300.0, 0.3),
            ],
            runs: Vec::new(),
            bandwidth_ratio: 2.0,
            cpu_per_gib_ratio: 0.1,
        };
        Results {
            read,
            train_read: train(false),
            train_decode: train(true),
            ckpt,
            remote: Some(remote),
            tensorflow: None,
        }
    }

    fn facts() -> RunFacts {
        RunFacts {
            work: PathBuf::from("/w"),
            work_fs: "xfs".into(),
            work_note: Some("the temp dir /tmp (tmpfs) has no direct I/O".into()),
            caltech_files: 2048,
            caltech_median_bytes: 10_000,
            total_seconds: 300.0,
            engine: Default::default(),
        }
    }

    #[test]
    fn the_report_states_what_it_measured() {
        let md = render(&facts(), &results(Engine::UringDirect)).expect("render");
        assert!(md.contains("Machine: 7 CPUs, 8 GiB, kernel 6.1.0-test"), "{md}");
        assert!(md.contains("(xfs): the temp dir /tmp (tmpfs) has no direct I/O"), "{md}");
        assert!(md.contains("on xfs, read cold (posix_fadvise(DONTNEED) before every pass)"), "{md}");
        assert!(md.contains("(7 CPUs here)"), "the core count measured, not fixed text: {md}");
        assert!(md.contains("fast tier: a xfs directory (raw O_DIRECT write"), "{md}");
        assert!(md.contains("io_uring (uring-direct) with one thread reaches 4.00x"), "{md}");
        assert!(md.contains("at 0.25 of the thread pool's CPU"), "{md}");
        assert!(md.contains("| 4.0x | 0.200 | 0.800 | 0.200 | 1.00 | 4.00 (3.60..4.40) | 250 (375) |"), "{md}");
        assert!(!md.contains("NaN") && !md.contains("ext4"), "{md}");
        assert!(md.contains("## 4. Remote storage"), "{md}");
        assert!(md.contains("adding 4 ms per request"), "{md}");
        assert!(md.contains("answering each request 4 ms late"), "{md}");
        assert!(md.contains("raise the file tier's bandwidth 15.0x from one driver thread; on S3 32.0x"), "{md}");
        assert!(md.contains("reaches 2.00x the boto3 pool's best bandwidth at 0.10x its CPU per GiB"), "{md}");
        assert!(md.contains("| ringtier S3 tier | 64 | 80.0 (72.0..88.0) | 32.0 | 2.00 |"), "{md}");
        let without = render(&facts(), &Results { remote: None, ..results(Engine::UringDirect) }).expect("render");
        assert!(!without.contains("## 4."), "no remote section unless it ran: {without}");
        let md = render(&facts(), &results(Engine::UringBuffered)).expect("render buffered");
        assert!(md.contains("reads through the page cache (uring-buffered)"), "{md}");
        assert!(md.contains("io_uring (uring-buffered) with one thread"), "{md}");
    }

    #[test]
    fn a_measurement_that_was_not_made_fails_naming_it() {
        let mut r = results(Engine::UringDirect);
        r.read.headline.cpu_per_gib_uring_direct_over_posix = None;
        let e = format!("{:#}", render(&facts(), &r).expect_err("missing"));
        assert!(e.contains("read.json") && e.contains("cpu_per_gib_uring_direct_over_posix"), "{e}");
        let mut r = results(Engine::UringDirect);
        r.read.points[1].speedup_vs_concurrency_1 = None;
        let e = format!("{:#}", render(&facts(), &r).expect_err("missing"));
        assert!(e.contains("read.json") && e.contains("speedup_vs_concurrency_1"), "{e}");
        let mut r = results(Engine::UringDirect);
        r.ckpt.points.clear();
        let e = format!("{:#}", render(&facts(), &r).expect_err("empty"));
        assert!(e.contains("ckpt.json: `points` is empty"), "{e}");
        let mut r = results(Engine::UringDirect);
        r.read.points.retain(|p| p.engine != Engine::UringDirect);
        assert!(format!("{:#}", render(&facts(), &r).expect_err("no uring")).contains("no io_uring points"));
        // io_uring refused: the thread pool alone, and the report says why.
        r.read.skipped_engines.push(crate::read::SkippedEngine {
            engine: Engine::UringDirect,
            reason: "io_uring is disabled by the sysctl kernel.io_uring_disabled=2".into(),
        });
        let md = render(&facts(), &r).expect("render without io_uring");
        assert!(md.contains("io_uring did not run: io_uring is disabled by the sysctl"), "{md}");
        assert!(md.contains("(io_uring refused on this machine)"), "{md}");
    }

    fn tf_reports() -> TfReports {
        // The committed results of bench/tensorflow/ (the same scripts the paper runs).
        let json = |t: &str| serde_json::from_str::<serde_json::Value>(t).expect("committed JSON");
        TfReports {
            versions: "TensorFlow 2.21.0, ringtier 0.1.0".into(),
            python: PathBuf::from("/venv/bin/python"),
            read: json(include_str!("../../../../bench/results/tensorflow/read-files-8192.json")),
            miniapp: json(include_str!("../../../../bench/results/tensorflow/miniapp.json")),
            ckpt: json(include_str!("../../../../bench/results/tensorflow/ckpt-blkio-4x.json")),
        }
    }

    #[test]
    fn the_tensorflow_section_comes_from_the_scripts_reports() {
        let r = Results { tensorflow: Some(TfOutcome::Ran(Box::new(tf_reports()))), ..results(Engine::UringDirect) };
        let md = render(&facts(), &r).expect("render");
        assert!(md.contains("## 5. The experiments inside TensorFlow"), "after the remote section: {md}");
        assert!(md.contains("TensorFlow 2.21.0, ringtier 0.1.0 in `/venv/bin/python`"), "{md}");
        assert!(md.contains("8192 of the paper's files"), "{md}");
        assert!(md.contains("| ringtier | 1255 (789..1391) | 0.74 |"), "{md}");
        assert!(md.contains("the best `tf.data` side (`tf.data 16 malloc`)"), "{md}");
        assert!(md.contains("| ringtier prefetch on |"), "{md}");
        assert!(md.contains("burst buffer blocks"), "{md}");
        assert!(md.contains("With `wait=False` the save blocks"), "{md}");
        assert!(md.contains("| `save(step, wait=False)` (TensorFlow's async snapshot"), "{md}");
        assert!(!md.contains("NaN"), "{md}");
        let r = Results { remote: None, ..r };
        assert!(render(&facts(), &r).expect("render").contains("## 4. The experiments inside TensorFlow"));
        // A report without a figure the section needs: an error naming the file and the figure.
        let mut bad = tf_reports();
        bad.ckpt.as_object_mut().expect("object").remove("drain_seconds");
        let r = Results { tensorflow: Some(TfOutcome::Ran(Box::new(bad))), ..results(Engine::UringDirect) };
        let e = format!("{:#}", render(&facts(), &r).expect_err("missing"));
        assert!(e.contains("tf-ckpt.json: `drain_seconds.min` was not measured"), "{e}");
    }

    #[test]
    fn the_tensorflow_section_says_why_it_did_not_run() {
        let why = "python3 cannot import tensorflow and ringtier.tensorflow (ModuleNotFoundError: No module named 'tensorflow')";
        let r = Results { tensorflow: Some(TfOutcome::NotRun(why.into())), ..results(Engine::UringDirect) };
        let md = render(&facts(), &r).expect("render");
        assert!(md.contains(&format!("Not run: {why}.")), "{md}");
        assert!(md.contains("--tensorflow off"), "{md}");
        let md = render(&facts(), &results(Engine::UringDirect)).expect("render");
        assert!(!md.contains("inside TensorFlow"), "no section with --tensorflow off: {md}");
    }
}
