//! The engine is chosen at run time: io_uring where the kernel lets this process set up a
//! ring, the thread-pool engine ([`PosixTier`]) where it does not.
//!
//! Containers' default seccomp profiles (Docker, containerd, Podman), gVisor and hardened hosts
//! refuse `io_uring_setup` (EPERM or ENOSYS); `kernel.io_uring_disabled` does the same for a
//! whole machine; a small `RLIMIT_MEMLOCK` makes larger rings fail with ENOMEM. Under
//! [`Engine::Auto`] (the default) such a tier is opened with the thread pool instead, with one
//! warning naming the cause and the metric `ringtier_engine_fallbacks_total{reason}`; under
//! [`Engine::Uring`] the open fails with an error that names the cause and the way out. Every
//! on-disk format is the same whichever engine wrote it (the conformance suite reads one
//! engine's files with the other).

use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::{catalog, BufferPool, PosixConfig, PosixTier, Tier};

use crate::config::UringConfig;
use crate::tier::{UringTier, UringTierOptions};

/// Which engine reads and writes a file tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// io_uring where `io_uring_setup` works for this process, the thread pool otherwise.
    #[default]
    Auto,
    /// io_uring, or an error naming why the kernel refused it.
    Uring,
    /// The thread-pool engine: `pread`/`pwrite` on a pool of threads (what tf.data and
    /// DataLoader workers amount to).
    Posix,
}

impl Engine {
    /// The name accepted by `FromStr`: `auto`, `uring` or `posix`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Uring => "uring",
            Engine::Posix => "posix",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Engine::Auto),
            "uring" | "io_uring" => Ok(Engine::Uring),
            "posix" | "threads" => Ok(Engine::Posix),
            _ => Err(format!("unknown engine {s:?} (expected auto, uring or posix)")),
        }
    }
}

/// Why io_uring cannot be used by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UringRefusal {
    /// The sysctl `kernel.io_uring_disabled` is set (1: only the `io_uring_group` may;
    /// 2: nobody may).
    Disabled {
        /// The sysctl's value.
        sysctl: u8,
    },
    /// `io_uring_setup` failed with EPERM: a seccomp filter (containers' default profiles) or
    /// a security module.
    Refused,
    /// `io_uring_setup` failed with ENOSYS: not in this kernel, or a sandbox (gVisor, some
    /// seccomp profiles) hides it.
    Unsupported,
    /// Every ring size tried failed with ENOMEM (locked-memory limit, `ulimit -l`).
    NoMemory,
    /// Another error from `io_uring_setup`.
    Other {
        /// The error's OS code (errno).
        errno: i32,
    },
}

impl UringRefusal {
    /// The bounded label value of `ringtier_engine_fallbacks_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            UringRefusal::Disabled { .. } => "disabled",
            UringRefusal::Refused => "refused",
            UringRefusal::Unsupported => "unsupported",
            UringRefusal::NoMemory => "no_memory",
            UringRefusal::Other { .. } => "other",
        }
    }

    /// What a user can do about it.
    pub fn remedy(&self) -> &'static str {
        match self {
            UringRefusal::Disabled { .. } => "as root: `sysctl kernel.io_uring_disabled=0`",
            UringRefusal::Refused => {
                "allow io_uring_setup, io_uring_enter and io_uring_register in the container's seccomp profile \
                 (e.g. `docker run --security-opt seccomp=PROFILE`)"
            }
            UringRefusal::Unsupported => "use Linux 6.1 or newer outside a sandbox that hides io_uring",
            UringRefusal::NoMemory => "raise the locked-memory limit (`ulimit -l`, or the container's memlock ulimit)",
            UringRefusal::Other { .. } => "see `ringtier doctor`",
        }
    }

    /// The refusal an `io_uring_setup` error means (`disabled` read from the sysctl).
    pub fn from_setup_error(e: &io::Error) -> Self {
        let disabled = disabled_sysctl();
        match e.raw_os_error() {
            Some(libc::EPERM) if disabled.is_some_and(|v| v > 0) => {
                UringRefusal::Disabled { sysctl: disabled.unwrap_or(2) }
            }
            Some(libc::EPERM) | Some(libc::EACCES) => UringRefusal::Refused,
            Some(libc::ENOSYS) => UringRefusal::Unsupported,
            Some(libc::ENOMEM) => UringRefusal::NoMemory,
            Some(errno) => UringRefusal::Other { errno },
            None => UringRefusal::Other { errno: 0 },
        }
    }

    /// The error kind an explicit `engine=uring` open fails with.
    fn kind(&self) -> ErrorKind {
        match self {
            UringRefusal::Disabled { .. } | UringRefusal::Refused => ErrorKind::PermissionDenied,
            UringRefusal::Unsupported => ErrorKind::Unsupported,
            UringRefusal::NoMemory => ErrorKind::ResourceExhausted,
            UringRefusal::Other { .. } => ErrorKind::Io,
        }
    }
}

impl fmt::Display for UringRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UringRefusal::Disabled { sysctl } => {
                write!(f, "io_uring is disabled by the sysctl kernel.io_uring_disabled={sysctl}")
            }
            UringRefusal::Refused => {
                f.write_str("io_uring_setup was refused (EPERM: a seccomp filter, as containers' default profiles have, or a security module)")
            }
            UringRefusal::Unsupported => {
                f.write_str("io_uring_setup is not available (ENOSYS: not in this kernel, or hidden by a sandbox such as gVisor)")
            }
            UringRefusal::NoMemory => {
                f.write_str("io_uring_setup failed with ENOMEM at every ring size (locked-memory limit too low)")
            }
            UringRefusal::Other { errno } => {
                write!(f, "io_uring_setup failed: {}", io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

/// The value of `/proc/sys/kernel/io_uring_disabled` (None where the kernel has no such sysctl).
pub fn disabled_sysctl() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok().and_then(|s| s.trim().parse().ok())
}

/// Whether this process may set up an io_uring: tried once per process with a small ring
/// (dropped at once, so a later `fork` inherits no ring).
pub fn uring_availability() -> std::result::Result<(), UringRefusal> {
    static PROBED: OnceLock<std::result::Result<(), UringRefusal>> = OnceLock::new();
    PROBED.get_or_init(probe_uring).clone()
}

fn probe_uring() -> std::result::Result<(), UringRefusal> {
    match io_uring::IoUring::new(4) {
        Ok(_) => Ok(()),
        Err(e) => Err(UringRefusal::from_setup_error(&e)),
    }
}

/// The engine that opened a tier, and why where it is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineUsed {
    /// io_uring.
    Uring,
    /// The thread pool, as asked.
    Posix,
    /// The thread pool because io_uring was refused (engine `auto`).
    PosixFallback(UringRefusal),
}

impl EngineUsed {
    /// `uring` or `posix`.
    pub fn name(&self) -> &'static str {
        match self {
            EngineUsed::Uring => "uring",
            EngineUsed::Posix | EngineUsed::PosixFallback(_) => "posix",
        }
    }

    /// One line for reports: the engine, and why where it fell back.
    pub fn describe(&self) -> String {
        match self {
            EngineUsed::Uring => "io_uring".to_string(),
            EngineUsed::Posix => "thread pool (asked for)".to_string(),
            EngineUsed::PosixFallback(why) => format!("thread pool: {why}"),
        }
    }
}

/// The first fallback of this process, for reports and for bindings that warn their own way.
static FIRST_FALLBACK: Mutex<Option<UringRefusal>> = Mutex::new(None);

/// The reason of this process's first fallback to the thread pool, if any happened.
pub fn fallback_reason() -> Option<UringRefusal> {
    FIRST_FALLBACK.lock().map(|g| g.clone()).unwrap_or(None)
}

/// Counts a fallback and warns the first time in this process.
fn note_fallback(why: &UringRefusal, root: &Path) {
    metrics::counter!(catalog::ENGINE_FALLBACKS_TOTAL, "reason" => why.reason()).increment(1);
    let first = match FIRST_FALLBACK.lock() {
        Ok(mut g) if g.is_none() => {
            *g = Some(why.clone());
            true
        }
        _ => false,
    };
    if first {
        tracing::warn!(
            "{why}; ringtier uses its thread-pool engine instead (same files, slower at one thread) for {} \
             and every other tier of this process. To use io_uring: {}. `ringtier doctor` says more.",
            root.display(),
            why.remedy()
        );
    }
}

/// How to open a directory as a file tier, whichever engine opens it.
#[derive(Debug, Clone)]
pub struct DirTierOptions {
    /// The engine (default [`Engine::Auto`]).
    pub engine: Engine,
    /// The io_uring engine's settings.
    pub uring: UringConfig,
    /// The tier's name (metric label, errors).
    pub name: Option<String>,
    /// Creates the directory (and its parents) if missing.
    pub create: bool,
    /// Follows links under the root (read-only datasets); a tier that writes never does.
    pub follow_links: bool,
    /// The pool reads land in (io_uring engine: registered as fixed buffers where it can).
    pub pool: Option<BufferPool>,
    /// Threads of the thread-pool engine (0: its default).
    pub posix_threads: usize,
    /// Whether the thread-pool engine fsyncs what it commits (default true).
    pub posix_sync: bool,
}

impl Default for DirTierOptions {
    fn default() -> Self {
        DirTierOptions {
            engine: Engine::Auto,
            uring: UringConfig::default(),
            name: None,
            create: false,
            follow_links: false,
            pool: None,
            posix_threads: 0,
            posix_sync: true,
        }
    }
}

impl DirTierOptions {
    /// Sets the engine.
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }
    /// Sets the io_uring engine's settings.
    pub fn with_uring(mut self, uring: UringConfig) -> Self {
        self.uring = uring;
        self
    }
    /// Sets the tier's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Creates the directory if missing.
    pub fn with_create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }
    /// Follows links under the root (datasets only).
    pub fn with_follow_links(mut self, follow_links: bool) -> Self {
        self.follow_links = follow_links;
        self
    }
    /// Sets the pool reads land in.
    pub fn with_pool(mut self, pool: impl Into<Option<BufferPool>>) -> Self {
        self.pool = pool.into();
        self
    }
    /// Sets the thread-pool engine's thread count (0: its default).
    pub fn with_posix_threads(mut self, threads: usize) -> Self {
        self.posix_threads = threads;
        self
    }
    /// Whether the thread-pool engine fsyncs what it commits.
    pub fn with_posix_sync(mut self, sync: bool) -> Self {
        self.posix_sync = sync;
        self
    }
}

/// A file tier and the engine that opened it.
#[derive(Debug, Clone)]
pub struct DirTier {
    /// The tier.
    pub tier: Arc<dyn Tier>,
    /// The engine behind it.
    pub engine: EngineUsed,
}

/// Opens `root` as a file tier with the engine `options.engine` asks for: under
/// [`Engine::Auto`], io_uring where this process may set up a ring (retried smaller where the
/// locked-memory limit refuses the asked size), else the thread pool with one warning per
/// process and `ringtier_engine_fallbacks_total{reason}`.
pub fn open_dir_tier(root: &Path, options: DirTierOptions) -> Result<DirTier> {
    match options.engine {
        Engine::Posix => Ok(DirTier { tier: Arc::new(open_posix(root, &options)?), engine: EngineUsed::Posix }),
        Engine::Uring => {
            if let Err(why) = uring_availability() {
                return Err(refusal_error(&why, root, &options));
            }
            match open_uring(root, &options) {
                Ok(t) => Ok(DirTier { tier: Arc::new(t), engine: EngineUsed::Uring }),
                Err(e) => Err(match setup_refusal(&e) {
                    Some(why) => refusal_error(&why, root, &options),
                    None => e,
                }),
            }
        }
        Engine::Auto => {
            let refused = match uring_availability() {
                Err(why) => why,
                Ok(()) => match open_uring(root, &options) {
                    Ok(t) => return Ok(DirTier { tier: Arc::new(t), engine: EngineUsed::Uring }),
                    Err(e) => setup_refusal(&e).ok_or(e)?,
                },
            };
            let tier = open_posix(root, &options)?;
            note_fallback(&refused, root);
            Ok(DirTier { tier: Arc::new(tier), engine: EngineUsed::PosixFallback(refused) })
        }
    }
}

fn open_uring(root: &Path, o: &DirTierOptions) -> Result<UringTier> {
    let options = UringTierOptions::default()
        .with_name(o.name.clone())
        .with_create_root(o.create)
        .with_follow_links(o.follow_links)
        .with_pool(o.pool.clone());
    UringTier::with_options(root, o.uring.clone(), options)
}

fn open_posix(root: &Path, o: &DirTierOptions) -> Result<PosixTier> {
    let mut cfg =
        PosixConfig::new(root).with_create(o.create).with_follow_links(o.follow_links).with_sync(o.posix_sync);
    if let Some(name) = &o.name {
        cfg = cfg.with_name(name.clone());
    }
    if o.posix_threads > 0 {
        cfg = cfg.with_threads(o.posix_threads);
    }
    PosixTier::new(cfg)
}

/// The refusal a tier's set-up error means, if it is io_uring's own set-up that failed.
pub(crate) fn setup_refusal(e: &Error) -> Option<UringRefusal> {
    if e.operation() != Some(Operation::Setup) || !e.key().is_some_and(|k| k.starts_with("io_uring_setup")) {
        return None;
    }
    let errno = e.os_code()?;
    Some(UringRefusal::from_setup_error(&io::Error::from_raw_os_error(errno)))
}

fn refusal_error(why: &UringRefusal, root: &Path, o: &DirTierOptions) -> Error {
    let name = o.name.clone().unwrap_or_else(|| root.display().to_string());
    Error::new(
        why.kind(),
        format!(
            "engine \"uring\" asked for {}, but {why}. Use engine \"auto\" (io_uring where it works, the thread pool \
             otherwise) or \"posix\", or to use io_uring: {}",
            root.display(),
            why.remedy()
        ),
    )
    .with_operation(Operation::Setup)
    .with_tier(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip() {
        for e in [Engine::Auto, Engine::Uring, Engine::Posix] {
            assert_eq!(e.as_str().parse::<Engine>(), Ok(e));
        }
        assert!("fast".parse::<Engine>().expect_err("unknown").contains("auto, uring or posix"));
    }

    #[test]
    fn setup_errors_map_to_refusals() {
        let of = |errno| UringRefusal::from_setup_error(&io::Error::from_raw_os_error(errno));
        assert_eq!(of(libc::ENOSYS), UringRefusal::Unsupported);
        assert_eq!(of(libc::ENOMEM), UringRefusal::NoMemory);
        assert_eq!(of(libc::EINVAL), UringRefusal::Other { errno: libc::EINVAL });
        // EPERM is the sysctl's where it is set, a filter's otherwise.
        let eperm = of(libc::EPERM);
        match disabled_sysctl() {
            Some(v) if v > 0 => assert_eq!(eperm, UringRefusal::Disabled { sysctl: v }),
            _ => assert_eq!(eperm, UringRefusal::Refused),
        }
        for r in [UringRefusal::Refused, UringRefusal::Unsupported, UringRefusal::NoMemory] {
            assert!(!r.remedy().is_empty() && !r.to_string().is_empty());
        }
    }

    #[test]
    fn auto_opens_io_uring_where_the_kernel_allows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = open_dir_tier(dir.path(), DirTierOptions::default()).expect("open");
        match uring_availability() {
            Ok(()) => assert_eq!(t.engine, EngineUsed::Uring),
            Err(why) => assert_eq!(t.engine, EngineUsed::PosixFallback(why)),
        }
        let p = open_dir_tier(dir.path(), DirTierOptions::default().with_engine(Engine::Posix)).expect("posix");
        assert_eq!(p.engine, EngineUsed::Posix);
    }
}
