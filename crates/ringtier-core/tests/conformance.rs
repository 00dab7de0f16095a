//! The conformance suite against the memory and posix tiers and every layer.

use std::sync::Arc;
use std::time::Duration;

use ringtier_core::conformance::Fixture;
use ringtier_core::layers::{FaultInjecting, Metered, Throttle, Throttled};
use ringtier_core::{MemoryTier, PosixConfig, PosixTier, Tier};

fn posix() -> Fixture {
    // Inside the work tree: a real ext4 filesystem, not tmpfs.
    let dir = tempfile::Builder::new().prefix("conf-posix").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tier = PosixTier::new(PosixConfig { threads: 4, ..PosixConfig::new(dir.path()) }).expect("posix tier");
    Fixture::with_guard(Arc::new(tier), dir)
}

mod memory {
    use super::*;
    ringtier_core::conformance_tests!(|| Fixture::new(Arc::new(MemoryTier::new())));
}

mod posix_tier {
    use super::*;
    ringtier_core::conformance_tests!(posix);
}

mod metered {
    use super::*;
    ringtier_core::conformance_tests!(|| {
        let f = posix();
        Fixture::with_guard(Arc::new(Metered::new(f.tier)), f.guard)
    });
}

mod throttled {
    use super::*;
    ringtier_core::conformance_tests!(|| {
        let inner: Arc<dyn Tier> = Arc::new(MemoryTier::new());
        let t = Throttle::bandwidth(2 << 30).with_latency(Duration::from_micros(50));
        Fixture::new(Arc::new(Throttled::new(inner, t)))
    });
}

mod fault_injecting_without_rules {
    use super::*;
    ringtier_core::conformance_tests!(|| {
        let f = posix();
        Fixture::with_guard(Arc::new(FaultInjecting::new(f.tier, vec![], 1)), f.guard)
    });
}

mod power_cut_synced {
    use super::*;
    use ringtier_core::layers::{Durability, PowerCutTier};
    ringtier_core::conformance_tests!(|| {
        Fixture::new(Arc::new(PowerCutTier::new(Arc::new(MemoryTier::new()), Durability::Synced, 1)))
    });
}
