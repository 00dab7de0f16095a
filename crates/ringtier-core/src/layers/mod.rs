//! Layers that wrap any [`Tier`](crate::Tier) and are tiers themselves: metered (metrics for
//! every operation) and throttled (emulated slow storage). Each is a [`LayeredTier`]: it
//! implements what it changes and forwards the rest to the tier it wraps. The test layers
//! (fault-injecting, power cut) live in the test kit, `ringtier-testkit`, and never ship.

mod layered;
mod metered;
mod throttled;

pub use layered::LayeredTier;
pub use metered::Metered;
pub use throttled::{Throttle, Throttled, TokenBucket};
