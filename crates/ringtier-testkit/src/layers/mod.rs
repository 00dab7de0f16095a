//! Test layers that wrap any [`Tier`](ringtier_core::Tier) and are tiers themselves:
//! fault-injecting (EIO, ENOSPC, EAGAIN, short reads, torn writes, on a schedule or by a
//! seeded chance: [`FaultInjecting`]) and power cut (what survives a machine losing power:
//! [`PowerCutTier`], see [`power_cut`]). The production layers (metered, throttled) are in
//! `ringtier_core::layers`.

mod faults;
pub mod power_cut;

pub use faults::{Fault, FaultInjecting, FaultOp, FaultRule, Trigger};
pub use power_cut::{Durability, PowerCut, PowerCutStats, PowerCutTier, RebootReport};
