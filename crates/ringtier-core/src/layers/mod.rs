//! Layers that wrap any [`Tier`](crate::Tier) and are tiers themselves: metered (metrics for
//! every operation), throttled (emulated slow storage), fault-injecting (EIO, ENOSPC, short
//! reads, torn writes).

mod faults;
mod metered;
mod throttled;

pub use faults::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
pub use metered::Metered;
pub use throttled::{Throttle, Throttled, TokenBucket};
