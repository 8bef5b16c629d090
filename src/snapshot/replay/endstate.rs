//! gpumem's segments at the end of a replay against the `segments` the file records (the
//! state PyTorch's allocator was in when the snapshot was taken): a check that costs nothing
//! more than the file already holds. Segments are paired in address order and compared by
//! size, pool and their blocks' sizes and states (active or not); addresses are counted apart,
//! since only placed `cudaMalloc` segments can share them.

use serde::Serialize;

use crate::alloc::{BlockState, SegmentSnapshot};
use crate::snapshot::model::Segment;

/// One side's segment, as a difference shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentShape {
    /// Base address.
    pub address: u64,
    /// Bytes.
    pub total_size: u64,
    /// `"small"` or `"large"`.
    pub segment_type: String,
    /// Its blocks' (bytes, active), lowest address first.
    pub blocks: Vec<(u64, bool)>,
}

impl SegmentShape {
    fn recorded(segment: &Segment) -> SegmentShape {
        SegmentShape {
            address: segment.address as u64,
            total_size: segment.total_size.max(0) as u64,
            segment_type: segment.segment_type.clone(),
            blocks: segment
                .blocks
                .iter()
                .map(|b| (b.size.max(0) as u64, b.state.starts_with("active")))
                .collect(),
        }
    }

    fn replayed(segment: &SegmentSnapshot) -> SegmentShape {
        SegmentShape {
            address: segment.address,
            total_size: segment.total_size,
            segment_type: segment.segment_type.to_string(),
            blocks: segment
                .blocks
                .iter()
                // Active: allocated, or freed and waiting for its streams
                // (`active_pending_free`), as the recorded side reads its states.
                .map(|b| (b.size, b.state != BlockState::Inactive))
                .collect(),
        }
    }

    /// What differs between `self` (recorded) and `other` (replayed), if anything.
    fn difference(&self, other: &SegmentShape) -> Option<String> {
        if self.total_size != other.total_size {
            return Some(format!(
                "{} bytes recorded, {} replayed",
                self.total_size, other.total_size
            ));
        }
        if self.segment_type != other.segment_type {
            return Some(format!(
                "a {} segment recorded, a {} one replayed",
                self.segment_type, other.segment_type
            ));
        }
        if self.blocks != other.blocks {
            let position = self
                .blocks
                .iter()
                .zip(&other.blocks)
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| self.blocks.len().min(other.blocks.len()));
            let show = |blocks: &[(u64, bool)]| match blocks.get(position) {
                Some((size, true)) => format!("an active block of {size} bytes"),
                Some((size, false)) => format!("a free block of {size} bytes"),
                None => "no block".into(),
            };
            return Some(format!(
                "block {position}: {} recorded, {} replayed",
                show(&self.blocks),
                show(&other.blocks)
            ));
        }
        None
    }
}

/// The first pair that differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndDifference {
    /// Position in address order (0-based).
    pub position: u64,
    /// What differs.
    pub what: String,
    /// The recorded segment there, if any.
    pub recorded: Option<SegmentShape>,
    /// gpumem's segment there, if any.
    pub replayed: Option<SegmentShape>,
}

/// The comparison.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EndStateComparison {
    /// Segments the file records for the replayed device.
    pub recorded: u64,
    /// Segments gpumem ends with.
    pub replayed: u64,
    /// Pairs equal in size, pool and blocks.
    pub equal: u64,
    /// Of those, pairs at the same address.
    pub same_address: u64,
    /// Blocks recorded.
    pub recorded_blocks: u64,
    /// Blocks gpumem ends with.
    pub replayed_blocks: u64,
    /// The first pair that differs (or a segment without a partner).
    pub first_difference: Option<EndDifference>,
}

impl EndStateComparison {
    /// Compares `recorded` (the file's segments of the replayed device) with `replayed`.
    pub fn of(recorded: &[Segment], replayed: &[SegmentSnapshot]) -> EndStateComparison {
        let mut recorded: Vec<SegmentShape> = recorded.iter().map(SegmentShape::recorded).collect();
        recorded.sort_by_key(|segment| segment.address);
        let mut replayed: Vec<SegmentShape> = replayed.iter().map(SegmentShape::replayed).collect();
        replayed.sort_by_key(|segment| segment.address);
        let mut comparison = EndStateComparison {
            recorded: recorded.len() as u64,
            replayed: replayed.len() as u64,
            recorded_blocks: recorded.iter().map(|s| s.blocks.len() as u64).sum(),
            replayed_blocks: replayed.iter().map(|s| s.blocks.len() as u64).sum(),
            ..EndStateComparison::default()
        };
        for position in 0..recorded.len().max(replayed.len()) {
            let (a, b) = (recorded.get(position), replayed.get(position));
            let what = match (a, b) {
                (Some(a), Some(b)) => match a.difference(b) {
                    None => {
                        comparison.equal += 1;
                        comparison.same_address += u64::from(a.address == b.address);
                        continue;
                    }
                    Some(what) => what,
                },
                (Some(_), None) => "recorded, but gpumem has no segment there".into(),
                (None, Some(_)) => "gpumem has a segment the file does not record".into(),
                (None, None) => continue,
            };
            if comparison.first_difference.is_none() {
                comparison.first_difference = Some(EndDifference {
                    position: position as u64,
                    what,
                    recorded: a.cloned(),
                    replayed: b.cloned(),
                });
            }
        }
        comparison
    }

    /// Whether every segment has an equal partner.
    pub fn matches(&self) -> bool {
        self.first_difference.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::BlockSnapshot;
    use crate::snapshot::model::Block;

    fn recorded(address: i64, blocks: &[(i64, &str)]) -> Segment {
        Segment {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.0).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large".into(),
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Vec::new(),
            blocks: blocks
                .iter()
                .map(|&(size, state)| Block {
                    address: 0,
                    size,
                    requested_size: size,
                    state: state.into(),
                    frames: Vec::new(),
                })
                .collect(),
        }
    }

    fn replayed(address: u64, blocks: &[(u64, bool)]) -> SegmentSnapshot {
        SegmentSnapshot {
            address,
            total_size: blocks.iter().map(|b| b.0).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large",
            segment_pool_id: crate::alloc::MemPoolId::default(),
            is_expandable: false,
            blocks: blocks
                .iter()
                .map(|&(size, active)| BlockSnapshot {
                    address: 0,
                    size,
                    requested_size: size,
                    state: if active {
                        BlockState::ActiveAllocated
                    } else {
                        BlockState::Inactive
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn equal_segments_and_the_first_difference() {
        let file = [
            recorded(100, &[(4096, "active_allocated"), (8192, "inactive")]),
            recorded(900, &[(4096, "active_pending_free")]),
        ];
        // A block freed and waiting for its streams is active on both sides.
        let mut pending = replayed(950, &[(4096, true)]);
        pending.blocks[0].state = BlockState::ActivePendingFree;
        let same = [replayed(100, &[(4096, true), (8192, false)]), pending];
        let comparison = EndStateComparison::of(&file, &same);
        assert!(comparison.matches());
        assert_eq!((comparison.equal, comparison.same_address), (2, 1));
        let other = [replayed(100, &[(4096, false), (8192, false)])];
        let comparison = EndStateComparison::of(&file, &other);
        assert_eq!(comparison.equal, 0);
        let first = comparison.first_difference.expect("a difference");
        assert_eq!(first.position, 0);
        assert!(first.what.contains("block 0: an active block of 4096 bytes recorded, a free block of 4096 bytes replayed"), "{}", first.what);
    }
}
