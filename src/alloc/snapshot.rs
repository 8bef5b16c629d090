//! `memory_snapshot()`: every segment with its blocks, in PyTorch's shape
//! (`torch.cuda.memory_snapshot()`).

use serde::Serialize;

use super::{CachingAllocator, Pool};

/// A block's state as PyTorch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a user (`"active_allocated"`).
    ActiveAllocated,
    /// Cached, free (`"inactive"`).
    Inactive,
}

impl BlockState {
    /// PyTorch's string for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::Inactive => "inactive",
        }
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
    /// Allocated or cached.
    pub state: BlockState,
}

/// One segment (one device allocation) and its blocks, in address order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// Base address.
    pub address: u64,
    /// Bytes held from the device.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (equal to allocated on one stream).
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// `"small"` or `"large"`.
    pub segment_type: &'static str,
    /// The blocks, lowest address first.
    pub blocks: Vec<BlockSnapshot>,
}

impl CachingAllocator {
    /// Every segment with its blocks, sorted by address.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut blocks: Vec<_> = self.blocks().collect();
        blocks.sort_unstable_by_key(|block| block.ptr);
        let mut blocks = blocks.into_iter().peekable();
        let mut segments = Vec::new();
        for (address, total_size, pool) in self.segments() {
            let end = address + total_size;
            let mut segment = SegmentSnapshot {
                address,
                total_size,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                segment_type: match pool {
                    Pool::Small => "small",
                    Pool::Large => "large",
                },
                blocks: Vec::new(),
            };
            while let Some(block) = blocks.next_if(|block| block.ptr < end) {
                let state = if block.allocated {
                    segment.allocated_size += block.size;
                    segment.active_size += block.size;
                    segment.requested_size += block.requested_size;
                    BlockState::ActiveAllocated
                } else {
                    BlockState::Inactive
                };
                segment.blocks.push(BlockSnapshot {
                    address: block.ptr,
                    size: block.size,
                    requested_size: block.requested_size,
                    state,
                });
            }
            segments.push(segment);
        }
        segments
    }
}
