//! Segments and blocks as the reader keeps them: a few words each instead of a dict of values,
//! made as soon as a segment or block dict is complete (`from_dict.rs`), so that the
//! `segments` of a large job (tens of thousands of blocks, one expandable segment may hold
//! them all) stay in proportion to the file's bytes.

use super::frames::StackId;
use crate::snapshot::model::{Block, Segment};

/// A block's state: the allocator's own type, whose names are PyTorch's.
pub use crate::alloc::BlockState;

/// One block of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRecord {
    /// Its address (worked out from the segment's and the sizes before it when the file does
    /// not record one, as PyTorch 2.0's did not).
    pub address: u64,
    /// Bytes covered.
    pub size: u64,
    /// Bytes asked for (2.0: the `real_size` of its latest `history` entry).
    pub requested_size: u64,
    /// Its state.
    pub state: BlockState,
    /// Where it was allocated.
    pub stack: StackId,
    /// Whether the file recorded the address (PyTorch 2.0's did not; the segment's reader
    /// works it out).
    pub(super) address_recorded: bool,
}

/// One segment (or one mapped range of an expandable segment) and its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Device ordinal (0 when not recorded).
    pub device: i64,
    /// Base address.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// Bytes of allocated blocks (summed from the blocks when not recorded).
    pub allocated_size: u64,
    /// Bytes of active blocks (summed from the blocks when not recorded).
    pub active_size: u64,
    /// Bytes asked for by the active blocks (summed from the blocks when not recorded).
    pub requested_size: u64,
    /// The stream it serves.
    pub stream: i64,
    /// `segment_type == "small"` (the small pool's 2 MiB segments).
    pub small: bool,
    /// `segment_pool_id`, `(0, 0)` for the default pools.
    pub pool: (i64, i64),
    /// `is_expandable`.
    pub expandable: bool,
    /// Where it was allocated.
    pub stack: StackId,
    /// The blocks, lowest address first.
    pub blocks: Vec<BlockRecord>,
}

impl SegmentRecord {
    /// The segment as the snapshot model's type (frames left empty: resolve
    /// [`SegmentRecord::stack`] and [`BlockRecord::stack`] with the reader's stacks).
    pub fn to_model(&self) -> Segment {
        let int = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        Segment {
            device: self.device,
            address: self.address as i64,
            total_size: int(self.total_size),
            allocated_size: int(self.allocated_size),
            active_size: int(self.active_size),
            requested_size: int(self.requested_size),
            stream: self.stream,
            segment_type: if self.small { "small" } else { "large" }.into(),
            segment_pool_id: self.pool,
            is_expandable: self.expandable,
            frames: Vec::new(),
            blocks: self
                .blocks
                .iter()
                .map(|block| Block {
                    address: block.address as i64,
                    size: int(block.size),
                    requested_size: int(block.requested_size),
                    state: block.state.name().into(),
                    frames: Vec::new(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_by_name() {
        assert_eq!(
            BlockState::from_name("active_awaiting_free"),
            Some(BlockState::ActivePendingFree)
        );
        assert_eq!(BlockState::from_name("lost"), None);
        assert!(!BlockState::Inactive.is_active());
        let segment = SegmentRecord {
            device: 0,
            address: 1 << 63,
            total_size: 512,
            allocated_size: 512,
            active_size: 512,
            requested_size: 500,
            stream: 0,
            small: true,
            pool: (0, 0),
            expandable: false,
            stack: StackId::EMPTY,
            blocks: vec![BlockRecord {
                address: 1 << 63,
                size: 512,
                requested_size: 500,
                state: BlockState::ActiveAllocated,
                stack: StackId::EMPTY,
                address_recorded: true,
            }],
        };
        let model = segment.to_model();
        assert_eq!(model.segment_type, "small");
        assert_eq!(model.address as u64, 1 << 63);
        assert_eq!(model.blocks[0].state, "active_allocated");
    }
}
