//! What replays of a file learnt about its `MemPool`s (`super::learned_mem_pools`), in a type
//! of its own: the recording keeps it as it is learnt, and a report carries it to a later
//! replay of the same file (`super::replay_tapped`), so neither module needs the other.

use crate::alloc::MemPoolId;

/// What one self-replay taught about `MemPool`s: the fraction and capacity it ran under
/// (`None`: the recorded config as it is), and the claims (the index of the event that made
/// each segment, and its pool).
pub(super) type LearnedMemPools = (
    Option<(u64, Option<u64>)>,
    std::sync::Arc<[(u64, MemPoolId)]>,
);

/// What the replays of one recording learnt about its `MemPool`s, kept with a report so that
/// a later replay of the same file for that report (its peaks' sites, a timeline) routes as
/// the report's replay did, without replaying the file again to learn it.
#[derive(Debug, Clone, Default)]
pub struct MemPoolLessons {
    learned: Vec<LearnedMemPools>,
    infers: bool,
}

/// Bookkeeping, not part of a report's answer: two reports of the same replay are equal
/// whatever their replays had learnt on the way (one read the file as it replayed it, the
/// other after).
impl PartialEq for MemPoolLessons {
    fn eq(&self, _other: &MemPoolLessons) -> bool {
        true
    }
}

impl MemPoolLessons {
    /// The lessons `learned`, and whether the first pass over the file inferred a pool.
    pub(super) fn new(learned: Vec<LearnedMemPools>, infers: bool) -> MemPoolLessons {
        MemPoolLessons { learned, infers }
    }

    /// What each self-replay taught.
    pub(super) fn learned(&self) -> &[LearnedMemPools] {
        &self.learned
    }

    /// Whether the first pass over the file inferred a `MemPool`.
    pub(super) fn infers(&self) -> bool {
        self.infers
    }
}
