//! Fail points in the driver's completion path (feature `fail-points`).
//!
//! A [`FailPoints`] set, given to a tier with
//! [`UringTierOptions::fail_points`](crate::UringTierOptions::fail_points), rewrites chosen
//! completions before the driver handles them: a read or write that comes back short, or an
//! operation that fails with `EAGAIN`, `EINTR`, `ECANCELED`, `EIO` or any other errno. The
//! kernel did the real work first; only the result the driver sees changes, so every branch of
//! the completion handling can be forced from a test (the idea of raft-engine's fail points,
//! scoped to one tier so tests running in parallel do not see each other's faults).
//!
//! Without the feature none of this is compiled and the driver pays nothing.
//!
//! ```
//! use ringtier_uring::fail::{FailAction, FailOp, FailPoints, FailRule};
//! let fail = FailPoints::new(7);
//! // The second read completion of the tier comes back with at most 4096 bytes, once.
//! fail.add(FailRule::new(FailOp::Read, FailAction::Short(4096)).after(1).times(1));
//! assert_eq!(fail.fired(), 0);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The operation whose completion a rule rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailOp {
    /// `statx` of a key (batch reads by key).
    Statx,
    /// `openat2` of a key (batch reads by key).
    Open,
    /// A read into a request's buffer.
    Read,
    /// A write of an object writer's buffer.
    Write,
    /// A data fsync (an object writer's commit).
    Fsync,
    /// The `close` after a read by key.
    Close,
}

/// What a matching completion becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailAction {
    /// A successful read or write reports at most this many bytes (a short completion); a
    /// count of 0 on a read means end of file to the driver, as it does from the kernel.
    /// Ignored for other operations and for completions that already failed.
    Short(u32),
    /// The completion fails with this errno (positive, e.g. `libc::EIO`). Where the real
    /// operation opened a file, the driver closes it.
    Errno(i32),
    /// The driver thread panics while handling the completion: what a bug in the driver
    /// would do. Waiters get errors, nothing hangs, and no memory the kernel may still write is
    /// freed.
    Panic,
}

/// One fail point: which completions of an operation it rewrites, and how.
#[derive(Debug, Clone)]
pub struct FailRule {
    op: FailOp,
    action: FailAction,
    skip: u64,
    times: u64,
    probability: f64,
}

impl FailRule {
    /// Rewrites every completion of `op` with `action` (narrow it with the other methods).
    pub fn new(op: FailOp, action: FailAction) -> Self {
        FailRule { op, action, skip: 0, times: u64::MAX, probability: 1.0 }
    }

    /// Lets the first `n` matching completions through untouched. Default 0.
    pub fn after(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Fires at most `n` times, then stays quiet. Default unlimited.
    pub fn times(mut self, n: u64) -> Self {
        self.times = n;
        self
    }

    /// Fires on each eligible completion with probability `p` (0..=1), drawn from the set's
    /// seeded generator, so a run is replayed by its seed. Default 1.
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p.clamp(0.0, 1.0);
        self
    }
}

#[derive(Debug)]
struct RuleState {
    rule: FailRule,
    seen: u64,
    fired: u64,
}

/// A tier's set of fail points. Cheap to share: clone the `Arc`.
pub struct FailPoints {
    rules: Mutex<Vec<RuleState>>,
    rng: Mutex<u64>,
    fired: AtomicU64,
}

impl fmt::Debug for FailPoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailPoints").field("fired", &self.fired()).finish_non_exhaustive()
    }
}

impl FailPoints {
    /// An empty set whose probabilistic rules draw from a generator seeded with `seed`.
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(FailPoints { rules: Mutex::new(Vec::new()), rng: Mutex::new(seed | 1), fired: AtomicU64::new(0) })
    }

    /// Adds a rule; rules are tried in the order they were added and the first that fires wins.
    pub fn add(&self, rule: FailRule) {
        self.lock_rules().push(RuleState { rule, seen: 0, fired: 0 });
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock_rules().clear();
    }

    /// Completions rewritten so far, by every rule.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    fn lock_rules(&self) -> std::sync::MutexGuard<'_, Vec<RuleState>> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_f64(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift64*
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        let x = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The result the driver should see for a completion of `op` whose real result is `res`
    /// (a byte count or a negative errno, as in a CQE).
    pub(crate) fn apply(&self, op: FailOp, res: i32) -> i32 {
        let mut rules = self.lock_rules();
        for st in rules.iter_mut().filter(|st| st.rule.op == op) {
            let applicable = match st.rule.action {
                FailAction::Short(n) => res > 0 && (res as u32) > n && matches!(op, FailOp::Read | FailOp::Write),
                FailAction::Errno(_) | FailAction::Panic => true,
            };
            if !applicable {
                continue;
            }
            st.seen += 1;
            if st.seen <= st.rule.skip || st.fired >= st.rule.times {
                continue;
            }
            if st.rule.probability < 1.0 && self.next_f64() >= st.rule.probability {
                continue;
            }
            st.fired += 1;
            self.fired.fetch_add(1, Ordering::Relaxed);
            return match st.rule.action {
                FailAction::Short(n) => n as i32,
                FailAction::Errno(e) => -e.abs(),
                FailAction::Panic => {
                    drop(rules);
                    panic!("fail point: the io_uring driver panics on a {op:?} completion")
                }
            };
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_and_times_choose_the_completions() {
        let f = FailPoints::new(1);
        f.add(FailRule::new(FailOp::Read, FailAction::Errno(libc::EIO)).after(2).times(2));
        let got: Vec<i32> = (0..6).map(|_| f.apply(FailOp::Read, 100)).collect();
        assert_eq!(got, [100, 100, -libc::EIO, -libc::EIO, 100, 100]);
        assert_eq!(f.apply(FailOp::Write, 100), 100, "other ops untouched");
        assert_eq!(f.fired(), 2);
    }

    #[test]
    fn short_only_shortens_successful_reads_and_writes() {
        let f = FailPoints::new(1);
        f.add(FailRule::new(FailOp::Read, FailAction::Short(10)));
        f.add(FailRule::new(FailOp::Fsync, FailAction::Short(10)));
        assert_eq!(f.apply(FailOp::Read, 100), 10);
        assert_eq!(f.apply(FailOp::Read, 5), 5, "already shorter");
        assert_eq!(f.apply(FailOp::Read, -libc::EIO), -libc::EIO, "errors stay errors");
        assert_eq!(f.apply(FailOp::Fsync, 0), 0);
    }

    #[test]
    fn probability_is_replayed_by_the_seed() {
        let run = |seed| {
            let f = FailPoints::new(seed);
            f.add(FailRule::new(FailOp::Write, FailAction::Errno(libc::EAGAIN)).probability(0.3));
            (0..200).map(|_| f.apply(FailOp::Write, 4096)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        let fired = run(42).iter().filter(|&&r| r < 0).count();
        assert!((20..120).contains(&fired), "about 30% of 200 fire, got {fired}");
    }
}
