//! The crash-state explorer.
//!
//! * [`workload`]: runs a checkpoint workload on real directories with the tiers recording
//!   their file-system operations ([`ringtier_core::fs::trace`]), markers for acknowledged saves;
//! * [`image`]: a file-system image built by applying operations (files by id, names,
//!   directories), and its materialisation into a directory;
//! * [`model`]: the persistence models, each turning a crash point of the trace into the crash
//!   states it allows;
//! * [`check`]: recovery and the invariants on a materialised state;
//! * [`explore`](mod@explore): the loop over crash points, models and states, with a replayable descriptor
//!   for every failure.

pub mod check;
pub mod explore;
pub mod image;
pub mod model;
pub mod workload;

pub use explore::{explore, explore_with, Exploration, ExploreConfig, Failure, SeenStates};
pub use model::{Choice, Model, State};
pub use workload::{Engine, Trace, Workload};
