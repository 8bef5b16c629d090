//! What replays of a file learnt about its `MemPool`s (`super::learned_mem_pools`), in a type
//! of its own: the recording keeps it as it is learnt, and a report carries it to a later
//! replay of the same file (`super::replay_tapped`), so neither module needs the other.

use crate::alloc::MemPoolId;

/// What self-replays of a file under one fraction and capacity taught about `MemPool`s
/// (`super::learned_mem_pools`): the claims (the index of the event that made each segment,
/// and its pool), and whether a replay under those conditions may go on inferring pools from
/// its state as it reads. `false` where every self-replay that inferred them went astray and
/// one that inferred none reproduced the recording: the trace read two ways there (an
/// `empty_cache()` then a malloc, or a pool's malloc collecting garbage, say) and the later
/// events told which.
#[derive(Debug, Clone)]
pub(super) struct Lesson {
    /// The claims: (index of the event that made a segment, the pool it belongs to).
    pub(super) claims: std::sync::Arc<[(u64, MemPoolId)]>,
    /// Whether inferring pools as the replay reads is right for this file.
    pub(super) infer_as_read: bool,
    /// Whether a self-replay under those conditions reproduced every recorded segment event
    /// (with these claims, or inferring nothing): the conditions were the recorded run's.
    pub(super) reproduced: bool,
    /// Whether those self-replays read the trace as the recorded run's under a memory
    /// fraction given with the recorded config (the one the job set in code, which the file
    /// does not record, or the one it records) and reproduced it: a replay under that config
    /// and fraction is the recorded run, and reads the trace so too.
    pub(super) as_recorded_run: bool,
}

impl Default for Lesson {
    /// Nothing learnt: no claims, and the replay infers as it reads.
    fn default() -> Lesson {
        Lesson {
            claims: std::sync::Arc::from(Vec::new()),
            infer_as_read: true,
            reproduced: false,
            as_recorded_run: false,
        }
    }
}

impl Lesson {
    /// Whether a replay that takes this lesson differs from one that learnt nothing.
    pub(super) fn teaches(&self) -> bool {
        !self.claims.is_empty() || !self.infer_as_read
    }
}

/// What one self-replay taught: the fraction and capacity it ran under (`None`: the recorded
/// config as it is, on the recording's device), and its [`Lesson`].
pub(super) type LearnedMemPools = (Option<(u64, Option<u64>)>, Lesson);

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
