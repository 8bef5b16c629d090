//! `memory_snapshot()`: every segment with its blocks, in PyTorch's shape
//! (`torch.cuda.memory_snapshot()`).

use serde::Serialize;

use super::{CachingAllocator, EventKind, MemPoolId, Pool, DEFAULT_OWNER};

/// A block's state as PyTorch names it (the allocator's blocks, and the blocks a snapshot file
/// lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a user (`"active_allocated"`).
    ActiveAllocated,
    /// Freed by the user, waiting for the streams it was used on (`"active_pending_free"`).
    ActivePendingFree,
    /// Cached, free (`"inactive"`).
    Inactive,
}

impl BlockState {
    /// PyTorch's string for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// The state PyTorch names `name`; `active_awaiting_free` is the name `torch/cuda/memory.py`'s
    /// docstring gives the pending state.
    pub fn from_name(name: &str) -> Option<BlockState> {
        match name {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" | "active_awaiting_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }

    /// Whether a user still holds it or a stream still uses it.
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// Device address.
    pub address: u64,
    /// Bytes covered.
    pub size: u64,
    /// Bytes asked for when the block was last handed out (kept after it is freed, as PyTorch
    /// keeps it).
    pub requested_size: u64,
    /// Allocated, pending free, or cached.
    pub state: BlockState,
}

/// One segment and its blocks, in address order: a `cudaMalloc` segment, or one contiguous
/// mapped range of an expandable segment (PyTorch reports each such range as a segment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// Base address.
    pub address: u64,
    /// Bytes of the segment (of the mapped range, for expandable segments).
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks: allocated, or freed and waiting for their streams
    /// (`record_stream`).
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream the segment serves (0 = default).
    pub stream: u64,
    /// `"small"` or `"large"`.
    pub segment_type: &'static str,
    /// The memory pool owning the segment (`segment_pool_id`): (0, 0) for the default pools.
    pub segment_pool_id: MemPoolId,
    /// Whether the range lies in an expandable segment.
    pub is_expandable: bool,
    /// The blocks, lowest address first.
    pub blocks: Vec<BlockSnapshot>,
}

impl CachingAllocator {
    /// Every segment with its blocks, sorted by address (PyTorch's `snapshot()`): one entry per
    /// `cudaMalloc` segment and one per contiguous mapped range of each expandable segment.
    /// Records a `snapshot` trace entry with the bytes of active blocks.
    pub fn snapshot(&mut self) -> Vec<SegmentSnapshot> {
        let segments = self.segment_snapshots();
        let active: u64 = segments.iter().map(|segment| segment.active_size).sum();
        self.record_snapshot_event(active);
        segments
    }

    /// Emits the `snapshot` event PyTorch's `_snapshot()` records, with the bytes of active
    /// blocks, for callers that build the snapshot's segments themselves.
    pub fn record_snapshot_event(&mut self, active_bytes: u64) {
        self.emit(
            EventKind::Snapshot,
            0,
            active_bytes,
            0,
            0,
            Pool::Large,
            DEFAULT_OWNER,
        );
    }

    /// The segments of [`CachingAllocator::snapshot`], without recording a trace entry.
    pub fn segment_snapshots(&self) -> Vec<SegmentSnapshot> {
        let mut segments = Vec::new();
        for block in self.blocks() {
            // A segment starts at a mapped block with no mapped block before it.
            let starts = block.mapped
                && self
                    .blocks
                    .get(block.prev)
                    .is_none_or(|previous| !previous.mapped);
            if !starts {
                continue;
            }
            let mut segment = SegmentSnapshot {
                address: block.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: block.stream,
                segment_type: block.pool.name(),
                segment_pool_id: self.pool_id(block.owner),
                is_expandable: block.is_expandable(),
                blocks: Vec::new(),
            };
            let mut cursor = Some(block);
            while let Some(block) = cursor.filter(|block| block.mapped) {
                segment.total_size += block.size;
                if block.is_active() {
                    segment.active_size += block.size;
                    segment.requested_size += block.requested_size;
                }
                let state = if block.allocated {
                    segment.allocated_size += block.size;
                    BlockState::ActiveAllocated
                } else if block.pending_free {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                segment.blocks.push(BlockSnapshot {
                    address: block.ptr,
                    size: block.size,
                    requested_size: block.requested_size,
                    state,
                });
                cursor = self.blocks.get(block.next);
            }
            segments.push(segment);
        }
        segments.sort_unstable_by_key(|segment| segment.address);
        segments
    }
}
