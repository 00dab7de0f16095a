//! Small measurement helpers: summaries over repeats, CPU time, cold caches.

use std::path::Path;
use std::time::Duration;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use nix::unistd::{sysconf, SysconfVar};
use serde::Serialize;

/// min / median / max of a set of samples.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Summary {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Summary {
    pub(crate) fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary { min: f64::NAN, median: f64::NAN, max: f64::NAN };
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Summary { min: v[0], median, max: v[n - 1] }
    }
}

/// User plus system CPU time of the whole process (every thread, io_uring workers included).
pub(crate) fn process_cpu() -> Duration {
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let tv = |t: TimeVal| Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000);
    tv(ru.user_time()) + tv(ru.system_time())
}

/// Peak resident memory of the process in bytes.
pub(crate) fn peak_rss_bytes() -> u64 {
    getrusage(UsageWho::RUSAGE_SELF).map_or(0, |ru| ru.max_rss().max(0) as u64 * 1024)
}

/// Evicts `path` from the page cache (`posix_fadvise(DONTNEED)`), the portable way to make
/// the next read cold. Dirty pages must have been written back first.
pub(crate) fn evict(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).map_err(std::io::Error::from)
}

/// Root only: write back and drop the whole page cache.
pub(crate) fn drop_caches() -> std::io::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
}

/// Writes a report as pretty JSON to `path`, when one was asked for, and says so.
pub(crate) fn write_json(path: Option<&Path>, value: &impl Serialize) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Machine facts for reports.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub cpus: usize,
    pub memory_bytes: u64,
    pub kernel: String,
}

impl Machine {
    pub(crate) fn probe() -> Machine {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let conf = |v| sysconf(v).ok().flatten().unwrap_or(0).max(0) as u64;
        let (pages, page) = (conf(SysconfVar::_PHYS_PAGES), conf(SysconfVar::PAGE_SIZE));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        Machine { cpus, memory_bytes: pages * page, kernel }
    }
}

/// A small seedable generator (xorshift64*), so datasets and access orders are reproducible.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fisher-Yates shuffle.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }

    /// Fills `buf` with pseudo-random bytes.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_and_even() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]), Summary { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Summary::of(&[]).median.is_nan());
    }

    #[test]
    fn rng_is_deterministic_and_spreads() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        let mut v: Vec<u32> = (0..100).collect();
        Rng::new(1).shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
        let mean = (0..10_000).map(|_| a.normal()).sum::<f64>() / 10_000.0;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
