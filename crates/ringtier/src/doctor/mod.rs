//! What this machine gives the engine, and what the engine will fall back to: the report of
//! `ringtier doctor [PATH ...]` (and, through the Python package, `python -m ringtier doctor`).
//!
//! [`run`] looks at the kernel, io_uring (whether this process may set up a ring, and if so
//! its set-up flags and opcodes), the locked-memory limit, each path's file system (type,
//! O_DIRECT and its alignment, durability, free space, whether it is writable), transparent
//! huge pages, the CUDA driver and the JPEG decoder. Each finding is one line with a
//! [`Status`]; the [`Verdict`] says which engine `auto` opens file tiers with. A missing
//! facility is a finding, never an error: the report always completes.
//!
//! ```
//! let report = ringtier::doctor::run(&[std::env::temp_dir()]);
//! for line in report.lines() {
//!     println!("{line}");
//! }
//! let json: &str = &report.to_json(); // the same findings, machine-readable
//! assert!(json.contains("\"verdict\""));
//! ```
//!
//! * this module: the report ([`Report`], [`Finding`], [`Verdict`]) and [`run`];
//! * `kernel`: the kernel, io_uring and its opcodes, the locked-memory limit, transparent
//!   huge pages;
//! * `paths`: each path's file system, O_DIRECT, durability, free space, writability;
//! * `build`: what this build has: CUDA staging, the JPEG decoder.

mod build;
mod kernel;
mod paths;

use std::fmt;
use std::path::PathBuf;

use serde_json::{json, Map, Value};

use build::{cuda, decoder};
pub use kernel::parse_thp_mode;
use kernel::{io_uring, kernel, memlock, thp};
use paths::path;

/// How a finding bears on the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// The engine gets what it uses.
    Ok,
    /// Worth knowing: a slower path, a fallback that keeps results the same, a choice of the
    /// build.
    Note,
    /// Something fails or falls back in a way the user should act on.
    Warn,
}

impl Status {
    /// `ok`, `note` or `warn`: the first column of a line and the JSON value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Note => "note",
            Status::Warn => "warn",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One finding: one line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What it is about: `kernel`, `io_uring`, `opcodes`, `memlock`, `path`, `thp`, `cuda` or
    /// `decoder`.
    pub topic: &'static str,
    /// How it bears on the engine.
    pub status: Status,
    /// What was found and what it means, in one sentence or two.
    pub text: String,
    /// The path a `path` finding is about.
    pub path: Option<PathBuf>,
}

impl Finding {
    fn new(topic: &'static str, status: Status, text: impl Into<String>) -> Self {
        Finding { topic, status, text: text.into(), path: None }
    }

    /// The finding as one line: status, topic, text.
    pub fn line(&self) -> String {
        format!("{:<4}  {:<8}  {}", self.status, self.topic, self.text)
    }
}

/// The engine that `auto` (the default everywhere an engine is chosen) opens file tiers with
/// on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoEngine {
    /// io_uring: `io_uring_setup` works for this process.
    Uring,
    /// The thread-pool engine (`pread`/`pwrite` on a pool of threads): io_uring is refused,
    /// or this build has no io_uring engine.
    ThreadPool,
}

impl AutoEngine {
    /// `io_uring` or `thread pool`.
    pub fn name(self) -> &'static str {
        match self {
            AutoEngine::Uring => "io_uring",
            AutoEngine::ThreadPool => "thread pool",
        }
    }
}

/// The report's last line: which engine `auto` uses, and whether anything needs acting on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// [`Status::Ok`] where `auto` uses io_uring and nothing warns; [`Status::Warn`] otherwise.
    pub status: Status,
    /// The engine `auto` uses.
    pub engine: AutoEngine,
    /// The verdict in words.
    pub text: String,
}

impl Verdict {
    /// The verdict as one line, `verdict: ...`.
    pub fn line(&self) -> String {
        format!("verdict: {}", self.text)
    }
}

/// What [`run`] found: one [`Finding`] per line, then the [`Verdict`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The findings, in the order printed.
    pub findings: Vec<Finding>,
    /// The verdict.
    pub verdict: Verdict,
    /// The measured values behind the findings (limits in bytes, alignments, flags), by topic.
    facts: Map<String, Value>,
}

impl Report {
    /// The lines to print: one per finding, then the verdict's.
    pub fn lines(&self) -> Vec<String> {
        self.findings.iter().map(Finding::line).chain(std::iter::once(self.verdict.line())).collect()
    }

    /// The number of findings with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }

    /// The report as JSON: `findings` (`topic`, `status`, `text`, `path` where there is one),
    /// `verdict` (`status`, `auto_engine`, `text`) and `facts`, the measured values by topic
    /// (`kernel`, `io_uring`, `memlock`, `paths`, `thp`, `cuda`, `jpeg_decoder`), with sizes in
    /// bytes and `null` for unlimited or unknown.
    pub fn to_json(&self) -> String {
        let findings: Vec<Value> = self
            .findings
            .iter()
            .map(|f| {
                let mut o = json!({ "topic": f.topic, "status": f.status.as_str(), "text": f.text });
                if let Some(p) = &f.path {
                    o["path"] = json!(p.display().to_string());
                }
                o
            })
            .collect();
        let report = json!({
            "findings": findings,
            "verdict": {
                "status": self.verdict.status.as_str(),
                "auto_engine": self.verdict.engine.name(),
                "text": self.verdict.text,
            },
            "facts": self.facts,
        });
        serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".to_string())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.lines() {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The paths looked at when none is given: the current directory and the temporary
/// directory (`TMPDIR`, else `/tmp`), once each.
pub fn default_paths() -> Vec<PathBuf> {
    let mut paths = vec![PathBuf::from(".")];
    let tmp = std::env::temp_dir();
    let same = std::env::current_dir().ok().zip(tmp.canonicalize().ok()).is_some_and(|(cwd, t)| cwd == t);
    if !same {
        paths.push(tmp);
    }
    paths
}

/// Examines this machine and `paths` ([`default_paths`] where empty). Never fails: what
/// cannot be told is itself a finding.
pub fn run(paths: &[PathBuf]) -> Report {
    let paths = if paths.is_empty() { default_paths() } else { paths.to_vec() };
    let mut findings = Vec::new();
    let mut facts = Map::new();

    findings.push(kernel(&mut facts));
    let (engine, refusal) = io_uring(&mut findings, &mut facts);
    findings.push(memlock(&mut facts));
    let mut path_facts = Vec::new();
    for p in &paths {
        let (finding, fact) = path(p);
        findings.push(finding);
        path_facts.push(fact);
    }
    facts.insert("paths".into(), Value::Array(path_facts));
    findings.push(thp(&mut facts));
    findings.push(cuda(&mut facts));
    findings.push(decoder(&mut facts));

    let warnings = findings.iter().filter(|f| f.status == Status::Warn).count();
    let notes = findings.iter().filter(|f| f.status == Status::Note).count();
    let counts = format!("{warnings} warning{}, {notes} note{}", plural(warnings), plural(notes));
    let verdict = match (engine, refusal) {
        (AutoEngine::Uring, _) if warnings == 0 => {
            Verdict { status: Status::Ok, engine, text: format!("ready: engine auto uses io_uring ({counts})") }
        }
        (AutoEngine::Uring, _) => Verdict {
            status: Status::Warn,
            engine,
            text: format!("engine auto uses io_uring; act on the warn lines ({counts})"),
        },
        (AutoEngine::ThreadPool, Some(why)) => Verdict {
            status: Status::Warn,
            engine,
            text: format!(
                "engine auto uses the thread pool (same files, slower at one thread): {why}; the io_uring line says \
                 how to allow it ({counts})"
            ),
        },
        (AutoEngine::ThreadPool, None) => Verdict {
            status: Status::Warn,
            engine,
            text: format!("engine auto uses the thread pool: this build has no io_uring engine ({counts})"),
        },
    };
    Report { findings, verdict, facts }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `bytes` in binary units: `64 KiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut scale = 1u64;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        scale *= 1024;
        unit += 1;
    }
    if bytes % scale == 0 {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(65_536), "64 KiB");
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(1 << 50), "1 PiB");
    }

    #[test]
    fn a_report_has_one_line_per_finding_and_a_verdict() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("not/yet");
        let report = run(&[dir.path().to_path_buf(), missing.clone()]);
        let lines = report.lines();
        assert_eq!(lines.len(), report.findings.len() + 1);
        assert!(lines.last().is_some_and(|l| l.starts_with("verdict: ")), "{lines:?}");
        for topic in ["kernel", "io_uring", "memlock", "path", "thp", "cuda", "decoder"] {
            assert!(report.findings.iter().any(|f| f.topic == topic), "{topic} missing: {lines:?}");
        }
        let paths: Vec<_> = report.findings.iter().filter(|f| f.topic == "path").collect();
        assert_eq!(paths.len(), 2);
        assert!(paths[0].text.contains("writable"), "{}", paths[0].text);
        assert!(paths[1].text.contains("does not exist") && paths[1].status >= Status::Note, "{}", paths[1].text);
        assert!(lines.iter().all(|l| !l.contains('\n')), "{lines:?}");

        let json: Value = serde_json::from_str(&report.to_json()).expect("json");
        assert_eq!(json["findings"].as_array().map(Vec::len), Some(report.findings.len()));
        assert_eq!(json["verdict"]["auto_engine"], report.verdict.engine.name());
        assert_eq!(json["facts"]["paths"][1]["exists"], false);
        assert_eq!(json["facts"]["paths"][0]["writable"], true);
        assert_eq!(report.to_string().lines().count(), lines.len());
    }

    #[cfg(all(feature = "uring", target_os = "linux"))]
    #[test]
    fn the_verdict_names_the_engine_auto_uses() {
        let report = run(&[std::env::temp_dir()]);
        match ringtier_uring::engine::uring_availability() {
            Ok(()) => {
                assert_eq!(report.verdict.engine, AutoEngine::Uring);
                assert!(report.verdict.text.contains("engine auto uses io_uring"), "{}", report.verdict.text);
                assert!(report.findings.iter().any(|f| f.topic == "opcodes"));
            }
            Err(why) => {
                assert_eq!(report.verdict.engine, AutoEngine::ThreadPool);
                assert!(report.verdict.text.contains(&why.to_string()), "{}", report.verdict.text);
            }
        }
    }
}
