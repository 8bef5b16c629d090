//! What a replay found: counts of what it replayed ([`Counts`]), and the first OOMs, each with
//! its diagnosis ([`FirstOom`], recorded by [`Engine::answer`]).

use serde::Serialize;

use super::super::answer::{self, LiveAllocation, OomSource, UserFrame, Why};
use super::Engine;
use crate::alloc::OutOfMemory;

/// The state when the replay ran out of memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Number ([`super::super::event_number`]) of the event that failed: an `alloc`, or a recorded
    /// `oom` gpumem reproduced.
    pub index: u64,
    /// Which of the two it was.
    pub source: OomSource,
    /// Bytes it asked for.
    pub size: u64,
    /// Bytes allocated then.
    pub allocated: i64,
    /// Bytes reserved then.
    pub reserved: i64,
    /// The device's free bytes then.
    pub device_free: u64,
    /// gpumem's (PyTorch's) OOM message.
    pub message: String,
    /// gpumem's diagnosis: the cause and its figures.
    pub why: Why,
    /// The Python frames of the failing request, the user's first (empty until looked up,
    /// or when the file records none).
    pub frames: Vec<UserFrame>,
    /// Set when the failing event itself has no stack — PyTorch 2.11 records most `oom`
    /// entries without frames even when the history has Python stacks — and [`FirstOom::frames`]
    /// then holds the stack of this earlier event instead: the nearest before the OOM in the
    /// same trace that has one, i.e. the code that was running when the allocation failed.
    pub frames_from: Option<u64>,
    /// The largest allocations live then, largest first.
    pub largest_live: Vec<LiveAllocation>,
}

/// Counts of what was replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Events read from the replayed device's trace.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// `free_completed` events.
    pub frees: u64,
    /// Frees whose `free_completed` did not follow their `free_requested` at once: blocks
    /// used on other streams (`record_stream`).
    pub deferred_frees: u64,
    /// Blocks still waiting for their streams at the end (`free_requested` never completed,
    /// or completed only in the recording).
    pub pending_frees: u64,
    /// Allocations that failed in the replay (each skipped along with its free).
    pub ooms: u64,
    /// `oom` events in the file.
    pub recorded_ooms: u64,
    /// Recorded OOMs that gpumem's allocator also refused.
    pub recorded_ooms_reproduced: u64,
    /// `snapshot` events.
    pub snapshots: u64,
    /// `empty_cache()` calls inferred from the trace.
    pub empty_cache_calls: u64,
    /// CUDA-graph captures seen in the allocations' frames (each began with an
    /// `empty_cache()`, counted in [`Counts::empty_cache_calls`]).
    pub graph_captures: u64,
    /// Allocations routed to a private pool (they lie in a segment the file's segments give
    /// to one).
    pub pooled_allocs: u64,
    /// Allocations routed to a private pool no file segment names, inferred from the trace
    /// (`replay/captures.rs`): a CUDA-graph capture's whose graph went away while the job
    /// ran, or a `MemPool`'s gone by the end; counted in [`Counts::pooled_allocs`] too.
    pub inferred_pool_allocs: u64,
    /// Of those, blocks cudagraph trees' checkpoint restore took back at their recorded
    /// addresses (`setCheckpointPoolState`).
    pub restored_blocks: u64,
    /// Events of other devices' traces (not replayed).
    pub other_device_events: u64,
}

impl Engine {
    /// Records an OOM at event `index` for a request of `size` bytes: counted by cause, and
    /// the first ones kept with their diagnosis and the largest allocations live then.
    pub(super) fn answer(&mut self, index: u64, size: u64, oom: &OutOfMemory, source: OomSource) {
        let why = Why::of(oom);
        self.causes.add(why.cause);
        if self.ooms.len() >= answer::ANSWERED_OOMS {
            return;
        }
        let stats = self.allocator.stats();
        let device_free = self
            .allocator
            .device()
            .mem_get_info()
            .map_or(0, |(free, _)| free);
        let live = self
            .live
            .iter()
            .map(|(&addr, live)| (addr, live.index, live.allocation.size, live.requested));
        let record = FirstOom {
            index,
            source,
            size,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
            device_free,
            message: oom.message.clone(),
            why,
            frames: Vec::new(),
            frames_from: None,
            largest_live: answer::largest(live, answer::LARGEST_LIVE),
        };
        if self.first_oom.is_none() {
            self.first_oom = Some(record.clone());
        }
        self.ooms.push(record);
        if self.ooms.len() >= answer::ANSWERED_OOMS {
            // Later OOMs are only counted by cause: their diagnoses need no trial.
            self.allocator.set_expandable_trials(false);
        }
    }
}
