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

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ringtier_core::fs::{dio_align_of_fd, fs_type_name, is_durable_fs, space_of_fd};
use ringtier_core::host;
use ringtier_core::{PoolConfig, Space};
use serde_json::{json, Map, Value};

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

/// `kernel`: the release `uname` reports.
fn kernel(facts: &mut Map<String, Value>) -> Finding {
    match host::kernel() {
        Ok(k) => {
            facts.insert("kernel".into(), json!({ "sysname": k.sysname, "release": k.release, "machine": k.machine }));
            let text = format!("{} {} {}", k.sysname, k.release, k.machine);
            match k.version() {
                Some(v) if v < (5, 6) => Finding::new(
                    "kernel",
                    Status::Warn,
                    format!("{text}: the io_uring engine needs Linux 5.6 or newer (6.1 for every knob)"),
                ),
                _ => Finding::new("kernel", Status::Ok, text),
            }
        }
        Err(e) => {
            facts.insert("kernel".into(), Value::Null);
            Finding::new("kernel", Status::Note, format!("uname failed: {e}"))
        }
    }
}

/// `io_uring` (may this process set up a ring; which engine `auto` uses) and, where it may,
/// `opcodes` (the set-up flags and opcodes the kernel offers). Returns the engine and, where
/// io_uring is refused, why.
#[cfg(all(feature = "uring", target_os = "linux"))]
fn io_uring(findings: &mut Vec<Finding>, facts: &mut Map<String, Value>) -> (AutoEngine, Option<String>) {
    use ringtier_uring::engine::{disabled_sysctl, uring_availability};

    /// The opcodes without which the engine cannot read at all.
    const ESSENTIAL: [&str; 4] = ["READ", "OPENAT2", "STATX", "CLOSE"];
    /// The set-up flags the engine's knobs use (what `probe_kernel` tries).
    const SETUP_FLAGS: [&str; 5] = ["SQPOLL", "COOP_TASKRUN", "TASKRUN_FLAG", "SINGLE_ISSUER", "DEFER_TASKRUN"];

    let sysctl = disabled_sysctl();
    match uring_availability() {
        Err(why) => {
            facts.insert(
                "io_uring".into(),
                json!({
                    "available": false,
                    "reason": why.reason(),
                    "refusal": why.to_string(),
                    "remedy": why.remedy(),
                    "io_uring_disabled_sysctl": sysctl,
                }),
            );
            findings.push(Finding::new(
                "io_uring",
                Status::Warn,
                format!(
                    "refused: {why}. Engine auto uses the thread pool (same files, slower at one thread); engine uring \
                     fails. To use io_uring: {}",
                    why.remedy()
                ),
            ));
            (AutoEngine::ThreadPool, Some(why.to_string()))
        }
        Ok(()) => {
            findings.push(Finding::new(
                "io_uring",
                Status::Ok,
                "available (io_uring_setup works for this process): engine auto uses io_uring",
            ));
            let mut fact = json!({ "available": true, "io_uring_disabled_sysctl": sysctl });
            match ringtier_uring::probe_kernel() {
                Ok(k) => {
                    let absent: Vec<&str> = SETUP_FLAGS.into_iter().filter(|f| !k.setup_flags.contains(f)).collect();
                    let mut text = format!("set-up flags {}", list(&k.setup_flags));
                    if !absent.is_empty() {
                        text += &format!(" (not offered: {}: the knobs needing them fail)", absent.join(", "));
                    }
                    let status = if k.opcodes.is_empty() && k.missing_opcodes.is_empty() {
                        text += "; opcodes not probed (IORING_REGISTER_PROBE refused)";
                        Status::Note
                    } else {
                        text += &format!("; opcodes {}", list(&k.opcodes));
                        if k.missing_opcodes.is_empty() {
                            text += " (all the engine submits)";
                            Status::Ok
                        } else if k.missing_opcodes.iter().any(|op| ESSENTIAL.contains(op)) {
                            text += &format!(
                                "; missing {}: the io_uring engine cannot read here",
                                k.missing_opcodes.join(", ")
                            );
                            Status::Warn
                        } else {
                            text += &format!("; missing {}", k.missing_opcodes.join(", "));
                            Status::Note
                        }
                    };
                    fact["features"] = json!(k.features);
                    fact["setup_flags"] = json!(k.setup_flags);
                    fact["opcodes"] = json!(k.opcodes);
                    fact["missing_opcodes"] = json!(k.missing_opcodes);
                    findings.push(Finding::new("opcodes", status, text));
                }
                Err(e) => findings.push(Finding::new("opcodes", Status::Note, format!("probe failed: {e}"))),
            }
            facts.insert("io_uring".into(), fact);
            (AutoEngine::Uring, None)
        }
    }
}

#[cfg(not(all(feature = "uring", target_os = "linux")))]
fn io_uring(findings: &mut Vec<Finding>, facts: &mut Map<String, Value>) -> (AutoEngine, Option<String>) {
    facts.insert("io_uring".into(), json!({ "available": false, "reason": "not_built" }));
    findings.push(Finding::new(
        "io_uring",
        Status::Note,
        "this build has no io_uring engine (feature `uring` off, or not Linux): engine auto uses the thread pool",
    ));
    (AutoEngine::ThreadPool, None)
}

#[cfg(all(feature = "uring", target_os = "linux"))]
fn list(items: &[&str]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// `memlock`: the locked-memory limit and whether this process is held to it.
fn memlock(facts: &mut Map<String, Value>) -> Finding {
    let pool = PoolConfig::default();
    let pool_bytes = (pool.buf_size as u64).saturating_mul(pool.count as u64);
    let creds = host::credentials();
    let limit = match host::memlock_limit() {
        Ok(l) => l,
        Err(e) => {
            facts.insert("memlock".into(), Value::Null);
            return Finding::new("memlock", Status::Note, format!("RLIMIT_MEMLOCK unknown: {e}"));
        }
    };
    facts.insert(
        "memlock".into(),
        json!({
            "soft_bytes": limit.soft,
            "hard_bytes": limit.hard,
            "euid": creds.map(|c| c.euid),
            "cap_ipc_lock": creds.map(|c| c.cap_ipc_lock),
            "default_pool_bytes": pool_bytes,
        }),
    );
    let amount = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), format_bytes);
    let limits = format!("RLIMIT_MEMLOCK soft {}, hard {}", amount(limit.soft), amount(limit.hard));
    let who = match creds {
        Some(c) if c.cap_ipc_lock && c.euid == 0 => "root with CAP_IPC_LOCK",
        Some(c) if c.cap_ipc_lock => "CAP_IPC_LOCK",
        Some(c) if c.euid == 0 => "root without CAP_IPC_LOCK",
        Some(_) => "no CAP_IPC_LOCK",
        None => "capabilities unknown",
    };
    let unbound = creds.is_some_and(|c| c.cap_ipc_lock);
    if limit.soft.is_none() || unbound {
        let why = if limit.soft.is_none() { "unlimited" } else { "not held to it" };
        return Finding::new(
            "memlock",
            Status::Ok,
            format!(
                "{limits}; {who}: {why}: buffer pools are registered as fixed buffers and pinned staging pools \
                 locked, rings get their full size"
            ),
        );
    }
    if limit.allows(pool_bytes) {
        return Finding::new(
            "memlock",
            Status::Ok,
            format!(
                "{limits}; {who}: the default buffer pool ({}) is registered as fixed buffers; a pool larger than the \
                 limit is read into plain buffers instead",
                format_bytes(pool_bytes)
            ),
        );
    }
    let raise = match limit.hard {
        None => "with `ulimit -l unlimited`".to_string(),
        Some(h) if limit.soft.is_some_and(|s| h > s) => format!("with `ulimit -l {}` (the hard limit)", h / 1024),
        Some(_) => "as root (`ulimit -l unlimited`, `memlock` in limits.conf) or with the container's `--ulimit \
                    memlock=-1`"
            .to_string(),
    };
    Finding::new(
        "memlock",
        Status::Note,
        format!(
            "{limits}; {who}: registered buffers need the pool's size locked (the default pool: {}), so \
             registration falls back to plain buffers (same results, more work per read) and pinned staging pools \
             stay unlocked; a ring refused with ENOMEM is retried smaller, and the thread pool is used where none \
             fits. Raise it {raise}",
            format_bytes(pool_bytes)
        ),
    )
}

/// `path`: one path's file system, O_DIRECT, durability, free space and writability.
fn path(p: &Path) -> (Finding, Value) {
    let shown = p.display().to_string();
    let mut fact = json!({ "path": shown });
    let finding = |status, text: String| Finding { topic: "path", status, text, path: Some(p.to_path_buf()) };

    let meta = match std::fs::metadata(p) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            fact["exists"] = Value::Null;
            return (finding(Status::Warn, format!("{shown}: cannot be examined: {e}")), fact);
        }
    };
    fact["exists"] = json!(meta.is_some());
    // A missing path is created on first use (a checkpoint tier): look at where it would be.
    let (probed, mut text, mut status) = match &meta {
        Some(_) => (p.to_path_buf(), format!("{shown}: "), Status::Ok),
        None => {
            let Some(anc) = nearest_existing_ancestor(p) else {
                return (finding(Status::Warn, format!("{shown}: does not exist, nor does any parent")), fact);
            };
            fact["probed"] = json!(anc.display().to_string());
            let text = format!("{shown}: does not exist (a tier creates it), on {}: ", anc.display());
            (anc, text, Status::Note)
        }
    };
    let is_dir = meta.as_ref().is_none_or(|m| m.is_dir());
    fact["kind"] = json!(match &meta {
        None => "missing",
        Some(m) if m.is_dir() => "directory",
        Some(m) if m.is_file() => "file",
        Some(_) => "other",
    });

    let fs_type = fs_type_name(&probed);
    let durable = is_durable_fs(&probed);
    fact["fs_type"] = json!(fs_type);
    fact["durable"] = json!(durable);
    text += fs_type;
    if durable {
        text += ", durable";
    } else {
        text += ", not durable (held in memory: checkpoints there are lost at reboot)";
        status = status.max(Status::Note);
    }

    // Writability and the O_DIRECT alignment of a file there.
    let probe = if is_dir { probe_dir(&probed) } else { probe_file(&probed) };
    fact["writable"] = json!(probe.writable.is_ok());
    match probe.dio {
        Some((mem, off)) if mem > 0 && off > 0 => {
            fact["direct_io"] = json!({ "mem_align": mem, "offset_align": off });
            text += &format!(", O_DIRECT (alignment: memory {mem} B, offset {off} B{})", probe.dio_from);
        }
        Some(_) => {
            fact["direct_io"] = Value::Null;
            text += &format!(
                ", no O_DIRECT alignment reported (statx DIOALIGN{}): reads and writes go through the page cache",
                probe.dio_from
            );
            status = status.max(Status::Note);
        }
        None => {
            fact["direct_io"] = Value::Null;
            text += ", O_DIRECT not probed (no file to ask)";
        }
    }
    match &probe.writable {
        Ok(()) => text += ", writable",
        Err(e) => {
            text += &format!(", not writable ({e})");
            // A dataset may be read-only; a tier that must be created cannot be.
            status = status.max(if meta.is_none() { Status::Warn } else { Status::Note });
        }
    }

    // Free space.
    match File::open(&probed).map_err(ringtier_core::Error::from).and_then(|f| space_of_fd(f.as_raw_fd())) {
        Ok(Space { total_bytes: 0, .. }) => {
            fact["free_bytes"] = Value::Null;
            fact["total_bytes"] = Value::Null;
            text += ", no free space reported (a pseudo file system)";
        }
        Ok(Space { free_bytes, total_bytes }) => {
            fact["free_bytes"] = json!(free_bytes);
            fact["total_bytes"] = json!(total_bytes);
            text += &format!(", {} free of {}", format_bytes(free_bytes), format_bytes(total_bytes));
            if free_bytes < LOW_SPACE_BYTES {
                text += ": nearly full";
                status = Status::Warn;
            }
        }
        Err(e) => {
            fact["free_bytes"] = Value::Null;
            fact["total_bytes"] = Value::Null;
            text += &format!(", free space unknown ({e})");
        }
    }
    (finding(status, text), fact)
}

/// Free space below which a path warns.
const LOW_SPACE_BYTES: u64 = 1 << 30;

/// What creating (or opening) a file at a path told.
struct FileProbe {
    /// Whether a file could be created there (or, for a file, opened for writing).
    writable: Result<(), String>,
    /// `statx(STATX_DIOALIGN)` of that file: `(mem_align, offset_align)`, zeros where not
    /// reported; `None` where there was no file to ask.
    dio: Option<(u32, u32)>,
    /// Where the alignment was read from, where not from a new file (`", of FILE"`).
    dio_from: String,
}

/// A directory: an unnamed temporary file there (`O_TMPFILE`, as the io_uring tier probes),
/// else a named one removed at once, else (read-only) the first regular file in it.
fn probe_dir(dir: &Path) -> FileProbe {
    let tmpfile = OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(dir);
    let created = match tmpfile {
        Ok(f) => Ok(f),
        // Refused for this user or this mount: a named file would be too.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM)) => Err(e),
        // No O_TMPFILE on this file system (EOPNOTSUPP, EISDIR, ...): a named file.
        Err(_) => {
            let name = dir.join(format!(".ringtier-doctor-{}", std::process::id()));
            let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&name);
            let _ = std::fs::remove_file(&name);
            f
        }
    };
    match created {
        Ok(f) => FileProbe { writable: Ok(()), dio: dio_of(&f), dio_from: String::new() },
        Err(e) => {
            let existing = std::fs::read_dir(dir).ok().and_then(|entries| {
                entries
                    .take(256)
                    .filter_map(|e| e.ok())
                    .find(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| e.path())
            });
            let (dio, dio_from) = match existing.and_then(|p| File::open(&p).ok().map(|f| (p, f))) {
                Some((p, f)) => (dio_of(&f), format!(", of {}", p.display())),
                None => (None, String::new()),
            };
            FileProbe { writable: Err(describe(&e)), dio, dio_from }
        }
    }
}

/// A file: opened for writing (nothing is written) and read.
fn probe_file(file: &Path) -> FileProbe {
    let writable = OpenOptions::new().write(true).open(file).map(|_| ()).map_err(|e| describe(&e));
    let dio = File::open(file).ok().and_then(|f| dio_of(&f));
    FileProbe { writable, dio, dio_from: String::new() }
}

fn dio_of(f: &File) -> Option<(u32, u32)> {
    dio_align_of_fd(f.as_raw_fd()).ok()
}

fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EROFS) => "read-only file system".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        _ => e.to_string(),
    }
}

/// The nearest ancestor of `p` that exists (`.` for a relative path with none).
fn nearest_existing_ancestor(p: &Path) -> Option<PathBuf> {
    p.ancestors()
        .skip(1)
        .map(|a| if a.as_os_str().is_empty() { Path::new(".") } else { a })
        .find(|a| a.exists())
        .map(Path::to_path_buf)
}

/// Where the kernel says whether transparent huge pages are on.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The selected mode of a THP setting file (`always [madvise] never`: `madvise`).
pub fn parse_thp_mode(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let len = text[start..].find(']')?;
    let mode = text[start..start + len].trim();
    (!mode.is_empty()).then_some(mode)
}

/// `thp`: transparent huge pages, which the buffer pools ask for (`MADV_HUGEPAGE`).
fn thp(facts: &mut Map<String, Value>) -> Finding {
    let mode = std::fs::read_to_string(THP_ENABLED).ok().and_then(|t| parse_thp_mode(&t).map(str::to_string));
    facts.insert("thp".into(), json!(mode));
    match mode.as_deref() {
        Some(m @ ("always" | "madvise")) => Finding::new(
            "thp",
            Status::Ok,
            format!("transparent huge pages: {m}: buffer pools get 2 MiB pages (MADV_HUGEPAGE), fewer device segments per direct read"),
        ),
        Some(m) => Finding::new(
            "thp",
            Status::Note,
            format!("transparent huge pages: {m}: buffer pools use 4 KiB pages (more device segments per direct read)"),
        ),
        None => Finding::new("thp", Status::Note, format!("transparent huge pages: unknown ({THP_ENABLED} unreadable)")),
    }
}

/// `cuda`: whether this build stages to CUDA devices and the driver loads.
fn cuda(facts: &mut Map<String, Value>) -> Finding {
    let present = ringtier_stage::cuda_driver_present();
    facts.insert("cuda".into(), json!({ "built": present.is_some(), "driver": present }));
    match present {
        Some(true) => Finding::new(
            "cuda",
            Status::Ok,
            "CUDA driver (libcuda) found: batches are staged to the GPU (cuda:N) through pinned host memory",
        ),
        Some(false) => Finding::new(
            "cuda",
            Status::Note,
            "built with CUDA staging, but no CUDA driver (libcuda) loads: staging to cuda:N fails; the host target \
             (pinned host memory) works",
        ),
        None => Finding::new(
            "cuda",
            Status::Note,
            "built without CUDA staging (feature `cuda`): batches are staged into pinned host memory",
        ),
    }
}

/// `decoder`: the JPEG decoder this build runs.
fn decoder(facts: &mut Map<String, Value>) -> Finding {
    let name = ringtier_loader::JPEG_DECODER;
    facts.insert("jpeg_decoder".into(), json!(name));
    if name == "libjpeg-turbo" {
        Finding::new("decoder", Status::Ok, "libjpeg-turbo (SIMD, DCT-domain downscaling)")
    } else {
        Finding::new(
            "decoder",
            Status::Note,
            format!(
                "{name} (pure Rust); libjpeg-turbo (feature `turbojpeg`, about 1.5x the images per core) is not in \
                 this build"
            ),
        )
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
    fn thp_mode_is_the_bracketed_value() {
        assert_eq!(parse_thp_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(parse_thp_mode("[always] madvise never"), Some("always"));
        assert_eq!(parse_thp_mode("always madvise [never]\n"), Some("never"));
        assert_eq!(parse_thp_mode("always madvise never"), None);
        assert_eq!(parse_thp_mode("[]"), None);
        assert_eq!(parse_thp_mode("[open"), None);
    }

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
