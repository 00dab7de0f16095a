//! What a pass costs: wall time, CPU time of this process and of its children, peak resident
//! memory (one way: the kernel's high-water mark, resettable per pass).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use serde::Serialize;

fn seconds(t: TimeVal) -> Duration {
    Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
}

fn cpu_of(who: UsageWho) -> Duration {
    getrusage(who).map_or(Duration::ZERO, |ru| seconds(ru.user_time()) + seconds(ru.system_time()))
}

/// User plus system CPU time of the whole process (every thread, io_uring workers included).
pub(crate) fn process_cpu() -> Duration {
    cpu_of(UsageWho::RUSAGE_SELF)
}

/// User plus system CPU time of the children this process has waited for.
fn children_cpu() -> Duration {
    cpu_of(UsageWho::RUSAGE_CHILDREN)
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// Peak resident memory of the process in bytes (`VmHWM`): since it started, or since the
/// last [`reset_peak_rss`].
pub(crate) fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Resets the peak resident size to the current one (Linux 4.0+), so the next pass's peak
/// is its own; returns the current resident bytes.
pub(crate) fn reset_peak_rss() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib("VmRSS:") * 1024
}

/// Wall time and CPU seconds of one measured pass.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Usage {
    pub(crate) wall_seconds: f64,
    /// This process's user + system CPU seconds (every thread).
    pub(crate) cpu_seconds: f64,
    /// CPU seconds of the child processes reaped during the pass (baselines run as commands).
    pub(crate) children_cpu_seconds: f64,
}

/// A running measurement: [`Meter::start`], then [`Meter::stop`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter {
    t0: Instant,
    cpu0: Duration,
    children0: Duration,
}

impl Meter {
    /// Starts measuring.
    pub(crate) fn start() -> Meter {
        Meter { t0: Instant::now(), cpu0: process_cpu(), children0: children_cpu() }
    }

    /// What the pass has cost so far.
    pub(crate) fn stop(&self) -> Usage {
        Usage {
            wall_seconds: self.t0.elapsed().as_secs_f64(),
            cpu_seconds: (process_cpu().saturating_sub(self.cpu0)).as_secs_f64(),
            children_cpu_seconds: (children_cpu().saturating_sub(self.children0)).as_secs_f64(),
        }
    }
}

/// Runs `cmd` to completion, measured; an error when it fails.
pub(crate) fn run_child(cmd: &mut Command) -> Result<Usage> {
    let m = Meter::start();
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    let usage = m.stop();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_measured_and_peak_rss_is_read() {
        let u =
            run_child(Command::new("sh").args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])).expect("sh");
        assert!(u.wall_seconds > 0.0 && u.children_cpu_seconds > 0.0, "{u:?}");
        assert!(run_child(&mut Command::new("false")).is_err());
        assert!(peak_rss_bytes() > 0);
        assert!(reset_peak_rss() > 0);
    }
}
