//! gpumem's allocator state in PyTorch's snapshot shape: every segment with every key
//! PyTorch 2.11 writes.

use super::model::{int, Block, Frame, Segment};
use crate::alloc::{BlockSnapshot, CachingAllocator, SegmentSnapshot};

/// Looks up the frames of the allocation at an address (empty when unknown).
pub type FramesOf<'a> = dyn Fn(u64) -> Vec<Frame> + 'a;

/// The allocator's segments as PyTorch's `memory_snapshot()` lists them, for device `device`;
/// `frames_of` gives each allocated block's allocation frames.
pub fn segments(
    allocator: &CachingAllocator,
    device: usize,
    frames_of: &FramesOf<'_>,
) -> Vec<Segment> {
    allocator
        .segment_snapshots()
        .iter()
        .map(|segment| convert_segment(segment, device, frames_of))
        .collect()
}

fn convert_segment(segment: &SegmentSnapshot, device: usize, frames_of: &FramesOf<'_>) -> Segment {
    Segment {
        device: int(device as u64),
        address: int(segment.address),
        total_size: int(segment.total_size),
        allocated_size: int(segment.allocated_size),
        active_size: int(segment.active_size),
        requested_size: int(segment.requested_size),
        stream: int(segment.stream),
        segment_type: segment.segment_type.to_string(),
        segment_pool_id: (
            int(segment.segment_pool_id.first),
            int(segment.segment_pool_id.second),
        ),
        is_expandable: segment.is_expandable,
        frames: Vec::new(),
        blocks: segment
            .blocks
            .iter()
            .map(|block| convert_block(block, frames_of))
            .collect(),
    }
}

fn convert_block(block: &BlockSnapshot, frames_of: &FramesOf<'_>) -> Block {
    let allocated = block.state.name() == "active_allocated";
    Block {
        address: int(block.address),
        size: int(block.size),
        requested_size: int(block.requested_size),
        state: block.state.name().to_string(),
        frames: if allocated {
            frames_of(block.address)
        } else {
            Vec::new()
        },
    }
}
