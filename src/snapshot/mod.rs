//! PyTorch memory snapshots in and out: the snapshot as Rust types ([`model`]), its
//! `allocator_settings` (`settings`), the pickle format ([`pickle`]), gpumem's own state
//! captured in that shape ([`capture`]), the replay of a recorded snapshot through gpumem's
//! allocator ([`replay`], with its config tuning and memory at the peaks), the allocation sites
//! of its frames (`sites`, `stacks`) and the comparison of two jobs ([`diff`]).
//!
//! The allocator knows nothing of this module: it is read through its public snapshot and
//! counters only.

pub mod capture;
pub mod diff;
pub mod model;
pub mod pickle;
pub mod replay;
pub(crate) mod settings;
pub(crate) mod sites;
pub(crate) mod stacks;

pub use model::{Action, Block, Frame, Segment, Snapshot, TraceEvent};
pub use pickle::SnapshotError;
pub use settings::AllocatorSettings;
