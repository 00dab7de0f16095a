//! The kernel's findings: its release, io_uring (may this process set up a ring; its set-up
//! flags and opcodes), the locked-memory limit, transparent huge pages.

use ringtier_core::host;
use ringtier_core::PoolConfig;
use serde_json::{json, Map, Value};

use super::{format_bytes, AutoEngine, Finding, Status};

/// `kernel`: the release `uname` reports.
pub(super) fn kernel(facts: &mut Map<String, Value>) -> Finding {
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
pub(super) fn io_uring(findings: &mut Vec<Finding>, facts: &mut Map<String, Value>) -> (AutoEngine, Option<String>) {
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
pub(super) fn io_uring(findings: &mut Vec<Finding>, facts: &mut Map<String, Value>) -> (AutoEngine, Option<String>) {
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
pub(super) fn memlock(facts: &mut Map<String, Value>) -> Finding {
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
pub(super) fn thp(facts: &mut Map<String, Value>) -> Finding {
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
}
