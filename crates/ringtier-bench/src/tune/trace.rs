//! Where a request's time goes, from kernel tracepoints through tracefs
//! (`/sys/kernel/tracing`, an instance of our own): `io_uring:io_uring_submit_req`,
//! `block:block_bio_queue` (pairs a read with its sectors: it fires in the submitting thread
//! right after the submit), `block:block_rq_issue`, `block:block_rq_complete` and
//! `io_uring:io_uring_complete`. Per read: submission (submit to the device issue, the block
//! layer and scheduler included), the device (issue to completion) and completion to CQE (the
//! interrupt, task work, posting: what COOP_TASKRUN and DEFER_TASKRUN change). Events are
//! limited to this process's threads (`set_event_pid` with `event-fork`, so io-wq workers
//! count) and to the data's device. Timestamps are tracefs's microseconds. Where tracefs or
//! an event is missing, or we may not write it (not root), the breakdown says so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

const TRACEFS: &str = "/sys/kernel/tracing";
const EVENTS: [&str; 6] = [
    "io_uring/io_uring_submit_req",
    "io_uring/io_uring_queue_async_work",
    "block/block_bio_queue",
    "block/block_rq_issue",
    "block/block_rq_complete",
    "io_uring/io_uring_complete",
];
/// Per-CPU trace buffer of the instance, KiB.
const BUFFER_KB: &str = "16384";
/// Largest trace read back, bytes.
const MAX_TRACE: u64 = 512 << 20;

/// Milliseconds at the median, 99th percentile and maximum.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Stage {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) samples: usize,
}

impl Stage {
    fn of(mut v: Vec<f64>) -> Option<Stage> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[(((v.len() - 1) as f64) * p).round() as usize];
        Some(Stage { p50_ms: q(0.5), p99_ms: q(0.99), max_ms: v[v.len() - 1], samples: v.len() })
    }
}

/// The latency breakdown of one traced pass, or why there is none.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct Breakdown {
    /// io_uring read submit to CQE posted (every traced read).
    pub(crate) in_kernel: Option<Stage>,
    /// Submit to the first block request's issue to the device.
    pub(crate) submission: Option<Stage>,
    /// Block request issue to completion (every block request of the device).
    pub(crate) device: Option<Stage>,
    /// Last block request's completion to the CQE being posted.
    pub(crate) completion_to_cqe: Option<Stage>,
    /// Reads paired with their block requests, of all traced reads.
    pub(crate) paired_reads: usize,
    pub(crate) traced_reads: usize,
    /// Reads the kernel could not issue inline without blocking and handed to io-wq worker
    /// threads (`io_uring_queue_async_work`): their bios are queued by the workers.
    pub(crate) reads_punted_to_io_wq: usize,
    /// Lost events (the trace buffer overflowed), or other caveats.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) notes: Vec<String>,
    /// Why there is no breakdown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unavailable: Option<String>,
}

/// A running trace: two tracefs instances, one for this process's io_uring and bio events
/// (filtered by pid), one for the device's block requests (completions run in interrupt
/// context, on whatever task was running: a pid filter would drop them).
#[derive(Debug)]
pub(crate) struct Tracer {
    dir: PathBuf,
    device_dir: PathBuf,
}

fn write(path: &Path, v: &str) -> Result<(), String> {
    std::fs::write(path, v).map_err(|e| format!("{}: {e}", path.display()))
}

impl Tracer {
    /// Starts tracing this process's reads on device `dev` (`major`, `minor`); `Err` says
    /// why it cannot (no tracefs, not root, an event missing).
    pub(crate) fn start(dev: Option<(u64, u64)>) -> Result<Tracer, String> {
        let root = Path::new(TRACEFS);
        if !root.join("instances").is_dir() {
            return Err(format!("tracefs is not mounted at {TRACEFS} (mount -t tracefs nodev {TRACEFS})"));
        }
        let missing: Vec<&str> = EVENTS.iter().copied().filter(|e| !root.join("events").join(e).is_dir()).collect();
        if !missing.is_empty() {
            return Err(format!("this kernel has no tracepoint(s) {}", missing.join(", ")));
        }
        let mk = |name: String| -> Result<PathBuf, String> {
            let dir = root.join(name);
            if !dir.is_dir() {
                std::fs::create_dir(&dir).map_err(|e| format!("creating {} (needs root): {e}", dir.display()))?;
            }
            Ok(dir)
        };
        let pid = std::process::id();
        let t = Tracer {
            dir: mk(format!("instances/ringtier-tune-{pid}"))?,
            device_dir: mk(format!("instances/ringtier-tune-{pid}-dev"))?,
        };
        t.setup(dev)?;
        Ok(t)
    }

    fn setup(&self, dev: Option<(u64, u64)>) -> Result<(), String> {
        for d in [&self.dir, &self.device_dir] {
            write(&d.join("tracing_on"), "0")?;
            write(&d.join("buffer_size_kb"), BUFFER_KB)?;
            write(&d.join("trace"), "")?;
        }
        let d = &self.dir;
        let _ = write(&d.join("options/event-fork"), "1");
        let tids: Vec<String> = std::fs::read_dir("/proc/self/task")
            .map_err(|e| format!("/proc/self/task: {e}"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        write(&d.join("set_event_pid"), &tids.join(" "))?;
        for e in EVENTS {
            // Requests issued and completed: the device instance, any task; the rest: ours.
            let on_device = matches!(e, "block/block_rq_issue" | "block/block_rq_complete");
            let ev = if on_device { self.device_dir.join("events").join(e) } else { d.join("events").join(e) };
            if e.starts_with("block/") {
                if let Some((ma, mi)) = dev {
                    write(&ev.join("filter"), &format!("dev == {}", (ma << 20) | mi))?;
                }
            }
            write(&ev.join("enable"), "1")?;
        }
        write(&self.device_dir.join("tracing_on"), "1")?;
        write(&d.join("tracing_on"), "1")
    }

    /// Adds threads started since [`Tracer::start`] (the engine's drivers).
    pub(crate) fn follow_new_threads(&self) {
        if let Ok(rd) = std::fs::read_dir("/proc/self/task") {
            let tids: Vec<String> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            let _ = std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.join("set_event_pid"))
                .and_then(|mut f| std::io::Write::write_all(&mut f, tids.join(" ").as_bytes()));
        }
    }

    /// Stops, reads and parses the trace.
    pub(crate) fn finish(self) -> Breakdown {
        let _ = write(&self.dir.join("tracing_on"), "0");
        let _ = write(&self.device_dir.join("tracing_on"), "0");
        // Both instances' lines in time order (the same trace clock).
        let text = read_bounded(&self.dir.join("trace")) + &read_bounded(&self.device_dir.join("trace"));
        let mut lines: Vec<(f64, &str)> = text.lines().filter_map(|l| Some((line(l)?.1, l))).collect();
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        let merged: String = lines.iter().flat_map(|(_, l)| [*l, "\n"]).collect();
        let mut b = parse(&merged);
        if text.contains("LOST") {
            b.notes.push("the trace buffer overflowed: some events were lost".into());
        }
        b
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        for d in [&self.dir, &self.device_dir] {
            let _ = write(&d.join("tracing_on"), "0");
            for e in EVENTS {
                let _ = write(&d.join("events").join(e).join("enable"), "0");
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn read_bounded(path: &Path) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_TRACE).read_to_string(&mut s);
    }
    s
}

/// One parsed line: (pid, seconds, event, fields).
fn line(l: &str) -> Option<(u32, f64, &str, &str)> {
    if l.starts_with('#') {
        return None;
    }
    // "  comm-PID  [CPU] flags  TS: event: fields"
    let (head, rest) = l.split_once(": ")?;
    let (event, fields) = rest.split_once(": ").unwrap_or((rest, ""));
    let mut it = head.split_whitespace();
    let task = it.next()?;
    let pid = task.rsplit_once('-')?.1.parse().ok()?;
    let ts: f64 = head.split_whitespace().last()?.parse().ok()?;
    Some((pid, ts, event.trim(), fields))
}

fn field<'a>(fields: &'a str, name: &str) -> Option<&'a str> {
    let i = fields.find(name)? + name.len();
    fields[i..].trim_start().split([',', ' ']).next()
}

/// `(dev, sector)` of a block event: `254,0 R 131072 () 123456 + 256 ...` or `254,0 RA 123 + 8 [comm]`.
fn block_key(fields: &str) -> Option<(String, u64, u64)> {
    let mut it = fields.split_whitespace();
    let dev = it.next()?.to_string();
    let toks: Vec<&str> = it.collect();
    let plus = toks.iter().position(|t| *t == "+")?;
    let sector = toks.get(plus.checked_sub(1)?)?.parse().ok()?;
    let n = toks.get(plus + 1)?.parse().ok()?;
    Some((dev, sector, n))
}

/// The `(device, sector)` of each bio a read queued.
type Sectors = Vec<(String, u64)>;

/// The breakdown from tracefs text.
pub(crate) fn parse(text: &str) -> Breakdown {
    #[derive(Default)]
    struct Req {
        submit: f64,
        sectors: Vec<(String, u64)>,
    }
    let mut open: HashMap<String, Req> = HashMap::new();
    // Thread -> the read it last submitted (bios queued in that thread belong to it).
    let mut last_by_pid: HashMap<u32, String> = HashMap::new();
    let mut issue: HashMap<(String, u64), (f64, u64)> = HashMap::new();
    // (dev, start sector) -> (issue, complete, sectors)
    let mut done_rq: Vec<(String, u64, u64, f64, f64)> = Vec::new();
    // (submitted, CQE posted, its bios' (device, sector))
    let mut finished: Vec<(f64, f64, Sectors)> = Vec::new();
    let mut device = Vec::new();
    let mut punted = 0usize;
    for l in text.lines() {
        let Some((pid, ts, event, fields)) = line(l) else { continue };
        match event {
            "io_uring_submit_req" => {
                let op = field(fields, "opcode").unwrap_or("");
                if op.starts_with("READ") {
                    if let Some(req) = field(fields, "req") {
                        open.insert(req.to_string(), Req { submit: ts, sectors: Vec::new() });
                        last_by_pid.insert(pid, req.to_string());
                    }
                } else {
                    last_by_pid.remove(&pid);
                }
            }
            "io_uring_queue_async_work" if field(fields, "opcode").unwrap_or("").starts_with("READ") => {
                punted += 1;
                // The worker, not this thread, queues its bios.
                last_by_pid.remove(&pid);
            }
            "block_bio_queue" => {
                if let (Some(req), Some((dev, sector, _))) = (last_by_pid.get(&pid), block_key(fields)) {
                    if let Some(r) = open.get_mut(req) {
                        r.sectors.push((dev, sector));
                    }
                }
            }
            "block_rq_issue" => {
                if let Some((dev, sector, n)) = block_key(fields) {
                    issue.insert((dev, sector), (ts, n));
                }
            }
            "block_rq_complete" => {
                if let Some((dev, sector, _)) = block_key(fields) {
                    if let Some((t0, n)) = issue.remove(&(dev.clone(), sector)) {
                        device.push((ts - t0) * 1e3);
                        done_rq.push((dev, sector, n, t0, ts));
                    }
                }
            }
            "io_uring_complete" => {
                if let Some(req) = field(fields, "req") {
                    if let Some(r) = open.remove(req) {
                        finished.push((r.submit, ts, r.sectors));
                    }
                }
            }
            _ => {}
        }
    }
    // Block requests by device, sorted by start sector, to find the one holding a bio.
    let mut by_dev: HashMap<String, Vec<(u64, u64, f64, f64)>> = HashMap::new();
    for (dev, s, n, t0, t1) in done_rq {
        by_dev.entry(dev).or_default().push((s, n, t0, t1));
    }
    for v in by_dev.values_mut() {
        v.sort_by_key(|r| r.0);
    }
    let holding = |dev: &str, sector: u64, after: f64| -> Option<(f64, f64)> {
        let v = by_dev.get(dev)?;
        let i = v.partition_point(|r| r.0 <= sector);
        v[..i].iter().rev().take(64).find(|r| sector < r.0 + r.1.max(1) && r.2 >= after).map(|r| (r.2, r.3))
    };
    let (mut total, mut sub, mut comp) = (Vec::new(), Vec::new(), Vec::new());
    let mut paired = 0;
    for (t_submit, t_cqe, sectors) in &finished {
        total.push((t_cqe - t_submit) * 1e3);
        let rqs: Vec<(f64, f64)> = sectors.iter().filter_map(|(d, s)| holding(d, *s, *t_submit)).collect();
        if rqs.is_empty() || rqs.len() < sectors.len() {
            continue;
        }
        paired += 1;
        let first_issue = rqs.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let last_done = rqs.iter().map(|r| r.1).fold(f64::NEG_INFINITY, f64::max);
        sub.push((first_issue - t_submit) * 1e3);
        comp.push((t_cqe - last_done).max(0.0) * 1e3);
    }
    let mut notes = Vec::new();
    if !finished.is_empty() && paired * 2 < finished.len() {
        notes.push(format!(
            "most reads were not paired with their block requests: {punted} of {} were handed to io-wq workers \
             (their bios are queued by a worker, which runs several requests), and buffered reads served from \
             the page cache or its read-ahead queue no bios of their own; the device and submit->CQE figures \
             cover every request",
            finished.len()
        ));
    }
    Breakdown {
        in_kernel: Stage::of(total),
        submission: Stage::of(sub),
        device: Stage::of(device),
        completion_to_cqe: Stage::of(comp),
        paired_reads: paired,
        traced_reads: finished.len(),
        reads_punted_to_io_wq: punted,
        notes,
        unavailable: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_split_into_submission_device_and_completion() {
        let text = "\
# tracer: nop
 ringtier-uring--4242  [001] ..... 100.000100: io_uring_submit_req: ring 0000000000000001, req 00000000000000aa, user_data 0x1, opcode OPENAT2, flags 0x0, sq_thread 0
 ringtier-uring--4242  [001] ..... 100.000200: io_uring_submit_req: ring 0000000000000001, req 00000000000000bb, user_data 0x2, opcode READ_FIXED, flags 0x0, sq_thread 0
 ringtier-uring--4242  [001] ..... 100.000210: block_bio_queue: 254,0 R 1000 + 256 [ringtier-uring-]
 ringtier-uring--4242  [001] ..... 100.000300: block_rq_issue: 254,0 R 131072 () 1000 + 256 none,0,0 [ringtier-uring-]
          <idle>-0     [000] ..... 100.001300: block_rq_complete: 254,0 R () 1000 + 256 none,0,0 [0]
 ringtier-uring--4242  [001] ..... 100.001350: io_uring_complete: ring 0000000000000001, req 00000000000000bb, user_data 0x2, result 131072, cflags 0x0 extra1 0 extra2 0
 ringtier-uring--4242  [001] ..... 100.002000: io_uring_submit_req: ring 0000000000000001, req 00000000000000cc, user_data 0x3, opcode READ, flags 0x0, sq_thread 0
 ringtier-uring--4242  [001] ..... 100.002500: io_uring_complete: ring 0000000000000001, req 00000000000000cc, user_data 0x3, result 4096, cflags 0x0 extra1 0 extra2 0
";
        let b = parse(text);
        assert_eq!((b.traced_reads, b.paired_reads), (2, 1));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        let s = b.submission.expect("submission");
        assert!(close(s.p50_ms, 0.1), "{s:?}");
        assert!(close(b.device.expect("device").p50_ms, 1.0));
        assert!(close(b.completion_to_cqe.expect("completion").p50_ms, 0.05));
        assert_eq!(b.in_kernel.expect("total").samples, 2);
        assert!(parse("garbage\n: :\n").in_kernel.is_none());
    }
}
