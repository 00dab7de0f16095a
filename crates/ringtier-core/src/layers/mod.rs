//! Layers that wrap any [`Tier`](crate::Tier) and are tiers themselves: metered (metrics for
//! every operation) and throttled (emulated slow storage). The test layers (fault-injecting,
//! power cut) live in the test kit, `ringtier-testkit`, and never ship.

mod metered;
mod throttled;

pub use metered::Metered;
pub use throttled::{Throttle, Throttled, TokenBucket};
