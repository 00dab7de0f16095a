//! Layers that wrap any [`Tier`](crate::Tier) and are tiers themselves: metered (metrics for
//! every operation), throttled (emulated slow storage), fault-injecting (EIO, ENOSPC, short
//! reads, torn writes), power cut (what survives a machine losing power).

mod faults;
mod metered;
pub mod power_cut;
mod throttled;

pub use faults::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
pub use metered::Metered;
pub use power_cut::{Durability, PowerCut, PowerCutStats, PowerCutTier, RebootReport};
pub use throttled::{Throttle, Throttled, TokenBucket};
