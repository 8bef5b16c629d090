//! Puts a rebuilt start state (`super::start`) into a fresh allocator through its public
//! calls, so the replay of a trace that starts mid-run begins where PyTorch's allocator was.
//!
//! Exactly, when the config makes the kind of segments the recording had: each segment is
//! made at once (at its recorded address, through the replay device's placement hints) and
//! carved in address order into pieces — one per live block, one per free gap — while every
//! other segment is wholly allocated, so each request can only land at the next offset. A
//! live block's piece is then freed and asked for again with the block's own request (the
//! counters of requested bytes come out right, and the allocator itself decides what it
//! splits off). Gaps between an expandable segment's mapped ranges are mapped while carving
//! and unmapped by one `empty_cache()`; then the gaps are freed.
//!
//! Otherwise (a replay under another config than the recording's, or a device too small to
//! carve on) the live blocks are allocated in address order with their requests: the same
//! live memory, laid out as that config lays it out.
//!
//! Counters afterwards are reset (accumulated and peaks): what the replay counts is the
//! trace's window.

use serde::Serialize;

use super::device::Hints;
use super::start::{StartSegment, StartState};
use crate::alloc::{AllocError, Allocation, CachingAllocator, Pool, SMALL_SIZE};

/// A block of the start state as the replay holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeededBlock {
    /// Its recorded address.
    pub addr: u64,
    /// gpumem's block for it.
    pub allocation: Allocation,
    /// The bytes it was asked for.
    pub requested: u64,
    /// Whether its free was already requested.
    pub free_requested: bool,
}

/// How the start state was laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Segment by segment and block by block as recorded.
    Exact,
    /// As recorded, except `pieces` pieces (a block or a free gap) that landed elsewhere or
    /// came out another size (a rounding config, or a free gap the allocator cannot make).
    Approximate {
        /// Pieces that differ.
        pieces: u64,
    },
    /// The live blocks allocated in address order under the replay's config (its segments
    /// are not the recording's kind, or the recorded layout could not be carved).
    Compact,
}

/// What seeding made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seeded {
    /// The live blocks, by recorded address.
    pub live: Vec<SeededBlock>,
    /// Live blocks of the start state that did not fit on the device (skipped, as a failed
    /// allocation is).
    pub failed: Vec<u64>,
    /// Pieces that landed elsewhere than recorded (exact carving only).
    mismatches: u64,
    /// Whether the blocks were allocated without the recorded layout.
    compact: bool,
}

impl Seeded {
    /// The layout obtained.
    pub fn layout(&self) -> Layout {
        if self.compact {
            Layout::Compact
        } else if self.mismatches > 0 {
            Layout::Approximate {
                pieces: self.mismatches,
            }
        } else {
            Layout::Exact
        }
    }
}

/// What a piece of a segment is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Free space, freed once every segment is carved.
    Gap,
    /// Unmapped pages between mapped ranges of an expandable segment.
    Hole,
    /// The live block: (index of its segment in the group, index in the segment).
    Block(usize, usize),
}

/// One piece: offset from the first piece of its group, bytes, role.
#[derive(Debug, Clone, Copy)]
struct Piece {
    offset: u64,
    len: u64,
    role: Role,
}

/// Segments carved one after the other into the same address range of the allocator: one
/// `cudaMalloc` segment, or the mapped ranges of one expandable segment (one stream and pool).
struct Group<'a> {
    stream: u64,
    pool: Pool,
    expandable: bool,
    segments: Vec<&'a StartSegment>,
}

/// Seeds `allocator` (fresh) with `start`. `hints` (when the replay places segments where
/// they were recorded) receives each `cudaMalloc` segment's address.
pub fn seed(
    allocator: &mut CachingAllocator,
    start: &StartState,
    hints: Option<&Hints>,
) -> Result<Seeded, String> {
    let expandable = allocator.config().expandable_segments;
    let same_kind = start.segments.iter().all(|s| s.expandable == expandable);
    let mut seeded = if same_kind {
        match carve(allocator, start, hints)? {
            Some(seeded) => seeded,
            None => {
                allocator
                    .empty_cache()
                    .map_err(|error| format!("empty_cache failed: {error}"))?;
                compact(allocator, start)?
            }
        }
    } else {
        compact(allocator, start)?
    };
    seeded.live.sort_by_key(|block| block.addr);
    allocator.reset_accumulated_stats();
    allocator.reset_peak_stats();
    Ok(seeded)
}

fn alloc_error(error: AllocError) -> String {
    format!("the allocator failed while rebuilding the start state: {error}")
}

/// The live blocks alone, in address order, with their requests.
fn compact(allocator: &mut CachingAllocator, start: &StartState) -> Result<Seeded, String> {
    let mut seeded = Seeded {
        compact: true,
        ..Seeded::default()
    };
    for segment in &start.segments {
        for block in &segment.blocks {
            match allocator.malloc_on(segment.stream, block.requested) {
                Ok(allocation) => seeded.live.push(SeededBlock {
                    addr: block.addr,
                    allocation,
                    requested: block.requested,
                    free_requested: block.free_requested,
                }),
                Err(AllocError::OutOfMemory(_)) => seeded.failed.push(block.addr),
                Err(other) => return Err(alloc_error(other)),
            }
        }
    }
    Ok(seeded)
}

/// The recorded layout; `None` (everything carved so far given back) when the device ran
/// out of memory while carving.
fn carve(
    allocator: &mut CachingAllocator,
    start: &StartState,
    hints: Option<&Hints>,
) -> Result<Option<Seeded>, String> {
    let mut seeded = Seeded::default();
    let mut gaps: Vec<Allocation> = Vec::new();
    let mut holes: Vec<Allocation> = Vec::new();
    for group in groups(start) {
        let outcome = carve_group(allocator, &group, hints, &mut seeded)?;
        let Some(carved) = outcome else {
            for allocation in gaps.into_iter().chain(holes) {
                allocator.free(allocation).map_err(alloc_error)?;
            }
            for block in seeded.live.drain(..) {
                allocator.free(block.allocation).map_err(alloc_error)?;
            }
            return Ok(None);
        };
        for (allocation, role) in carved {
            match role {
                Role::Hole => holes.push(allocation),
                Role::Gap | Role::Block(..) => gaps.push(allocation),
            }
        }
    }
    if !holes.is_empty() {
        for allocation in holes {
            allocator.free(allocation).map_err(alloc_error)?;
        }
        allocator
            .empty_cache()
            .map_err(|error| format!("empty_cache failed: {error}"))?;
    }
    for allocation in gaps {
        allocator.free(allocation).map_err(alloc_error)?;
    }
    Ok(Some(seeded))
}

/// The start state's segments in carving groups: each `cudaMalloc` segment alone, the mapped
/// ranges of each (stream, pool) together.
fn groups(start: &StartState) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    for segment in &start.segments {
        if segment.expandable {
            if let Some(group) = groups
                .iter_mut()
                .find(|g| g.expandable && g.stream == segment.stream && g.pool == segment.pool)
            {
                group.segments.push(segment);
                continue;
            }
        }
        groups.push(Group {
            stream: segment.stream,
            pool: segment.pool,
            expandable: segment.expandable,
            segments: vec![segment],
        });
    }
    groups
}

/// The bytes from a group's lowest address to the end of its highest segment.
fn extent(group: &Group<'_>) -> u64 {
    let low = group.segments.iter().map(|s| s.addr).min().unwrap_or(0);
    let high = group
        .segments
        .iter()
        .map(|s| s.addr.saturating_add(s.size))
        .max()
        .unwrap_or(0);
    high.saturating_sub(low)
}

/// The pieces of a group, lowest first, offsets from its first segment's address.
fn pieces(group: &Group<'_>) -> Vec<Piece> {
    let Some(first) = group.segments.first() else {
        return Vec::new();
    };
    let base = first.addr;
    let mut pieces: Vec<Piece> = Vec::new();
    let mut cursor = base;
    let push = |pieces: &mut Vec<Piece>, start: u64, end: u64, role: Role| {
        if end > start {
            pieces.push(Piece {
                offset: start - base,
                len: end - start,
                role,
            });
        }
    };
    for (which, segment) in group.segments.iter().enumerate() {
        push(&mut pieces, cursor, segment.addr, Role::Hole);
        cursor = cursor.max(segment.addr);
        for (index, block) in segment.blocks.iter().enumerate() {
            push(&mut pieces, cursor, block.addr, Role::Gap);
            push(
                &mut pieces,
                block.addr,
                block.addr + block.size,
                Role::Block(which, index),
            );
            cursor = block.addr + block.size;
        }
        push(&mut pieces, cursor, segment.addr + segment.size, Role::Gap);
        cursor = cursor.max(segment.addr + segment.size);
    }
    fit_to_pool(pieces, group.pool)
}

/// Makes every piece one the pool can hand out: in the small pool, free space in pieces of
/// at most 1 MiB; in the large pool, free space of 1 MiB or less joined to the block before
/// it (whose request then decides whether it is split off again).
fn fit_to_pool(pieces: Vec<Piece>, pool: Pool) -> Vec<Piece> {
    let mut fitted: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let free = matches!(piece.role, Role::Gap | Role::Hole);
        match pool {
            Pool::Small if free && piece.len > SMALL_SIZE => {
                let mut offset = piece.offset;
                let end = piece.offset + piece.len;
                while offset < end {
                    let len = (end - offset).min(SMALL_SIZE);
                    fitted.push(Piece {
                        offset,
                        len,
                        role: piece.role,
                    });
                    offset += len;
                }
            }
            Pool::Large if free && piece.len <= SMALL_SIZE => match fitted.last_mut() {
                Some(previous) if matches!(previous.role, Role::Block(..)) => {
                    previous.len += piece.len;
                }
                _ => fitted.push(piece),
            },
            _ => fitted.push(piece),
        }
    }
    fitted
}

/// The request that makes a `cudaMalloc` segment of exactly `segment.size` bytes.
fn creating_request(allocator: &CachingAllocator, segment: &StartSegment) -> u64 {
    match segment.pool {
        Pool::Small => crate::alloc::MIN_BLOCK_SIZE,
        Pool::Large
            if allocator.round_size(segment.size) == segment.size
                && allocator.allocation_size(segment.size) == segment.size =>
        {
            segment.size
        }
        // A 20 MiB segment serves any large request below 10 MiB.
        Pool::Large => 2 * SMALL_SIZE,
    }
}

/// Carves one group; `None` when the device ran out of memory (what it carved is given back).
fn carve_group(
    allocator: &mut CachingAllocator,
    group: &Group<'_>,
    hints: Option<&Hints>,
    seeded: &mut Seeded,
) -> Result<Option<Vec<(Allocation, Role)>>, String> {
    // A group wider than the whole device cannot be carved into it (a damaged file's size,
    // say), and its free space would make as many pieces as it has megabytes: the device
    // ran out of memory, as it would have while carving.
    if extent(group) > allocator.device().total_memory() {
        return Ok(None);
    }
    let stream = group.stream;
    let mut carved: Vec<(Allocation, Role)> = Vec::new();
    let give_back = |allocator: &mut CachingAllocator, carved: Vec<(Allocation, Role)>| {
        for (allocation, _) in carved {
            allocator.free(allocation).map_err(alloc_error)?;
        }
        Ok::<_, String>(None)
    };
    let mut base = None;
    if !group.expandable {
        let Some(segment) = group.segments.first() else {
            return Ok(Some(carved));
        };
        if let Some(hints) = hints {
            hints.clear();
            hints.push(segment.addr, segment.size);
        }
        let made = allocator.malloc_on(stream, creating_request(allocator, segment));
        if let Some(hints) = hints {
            hints.clear();
        }
        let made = match made {
            Ok(made) => made,
            Err(AllocError::OutOfMemory(_)) => return Ok(None),
            Err(other) => return Err(alloc_error(other)),
        };
        let made_size = allocator
            .segments()
            .find(|&(addr, _, _)| addr == made.ptr.addr())
            .map(|(_, size, _)| size);
        if made_size != Some(segment.size) {
            seeded.mismatches += 1;
        }
        base = Some(made.ptr.addr());
        allocator.free(made).map_err(alloc_error)?;
    }
    for piece in pieces(group) {
        let allocation = match allocator.malloc_on(stream, piece.len) {
            Ok(allocation) => allocation,
            Err(AllocError::OutOfMemory(_)) => return give_back(allocator, carved),
            Err(other) => return Err(alloc_error(other)),
        };
        let at = allocation.ptr.addr();
        let base = *base.get_or_insert(at.wrapping_sub(piece.offset));
        if at != base.wrapping_add(piece.offset) || allocation.size != piece.len {
            seeded.mismatches += 1;
        }
        carved.push((allocation, piece.role));
    }
    // Each live block's piece, freed and asked for again with the block's request: from the
    // highest down, so the free space a request splits off a piece (a tail of 1 MiB or less
    // joined to it) never lies next to a piece freed after it.
    let mut kept = Vec::with_capacity(carved.len());
    for (allocation, role) in carved.into_iter().rev() {
        let block = match role {
            Role::Block(which, index) => group
                .segments
                .get(which)
                .and_then(|segment| segment.blocks.get(index)),
            Role::Gap | Role::Hole => None,
        };
        let Some(block) = block else {
            kept.push((allocation, role));
            continue;
        };
        allocator.free(allocation).map_err(alloc_error)?;
        let again = allocator
            .malloc_on(stream, block.requested)
            .map_err(alloc_error)?;
        if again.ptr != allocation.ptr {
            seeded.mismatches += 1;
        }
        seeded.live.push(SeededBlock {
            addr: block.addr,
            allocation: again,
            requested: block.requested,
            free_requested: block.free_requested,
        });
    }
    Ok(Some(kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, BlockState};
    use crate::device::sim::SimDevice;
    use crate::snapshot::replay::start::StartBlock;

    const MIB: u64 = 1 << 20;

    /// A segment's address and its blocks as (offset, size, allocated).
    type SegmentLayout = (u64, Vec<(u64, u64, bool)>);

    fn block(addr: u64, size: u64, requested: u64) -> StartBlock {
        StartBlock {
            addr,
            size,
            requested,
            free_requested: false,
            freed_at: None,
        }
    }

    /// A damaged file's segment as wide as the address space: carving it would split its free
    /// space into 2^44 pieces. It cannot fit the device, so its live blocks are allocated
    /// alone, at once.
    #[test]
    fn a_segment_wider_than_the_device_is_not_carved() {
        let base = 0x7f00_0000_0000;
        for expandable in [false, true] {
            let start = StartState {
                segments: vec![StartSegment {
                    addr: base,
                    size: u64::MAX,
                    stream: 0,
                    pool: Pool::Small,
                    expandable,
                    blocks: vec![block(base + 1536, 512, 300)],
                }],
            };
            let conf = AllocConf {
                expandable_segments: expandable,
                ..AllocConf::default()
            };
            let mut allocator =
                CachingAllocator::new(Box::new(SimDevice::new(1 << 34)), conf).expect("allocator");
            let seeded = seed(&mut allocator, &start, None).expect("seeds");
            assert!(seeded.compact);
            assert_eq!(seeded.live.len(), 1);
        }
    }

    #[test]
    fn a_start_state_is_carved_as_recorded() {
        let base = 0x7f00_0000_0000;
        let start = StartState {
            segments: vec![
                StartSegment {
                    addr: base,
                    size: 20 * MIB,
                    stream: 0,
                    pool: Pool::Large,
                    expandable: false,
                    blocks: vec![
                        block(base + 2 * MIB, 3 * MIB, 3 * MIB - 100),
                        block(base + 12 * MIB, 8 * MIB, 8 * MIB),
                    ],
                },
                StartSegment {
                    addr: base + 64 * MIB,
                    size: 2 * MIB,
                    stream: 0,
                    pool: Pool::Small,
                    expandable: false,
                    blocks: vec![block(base + 64 * MIB + 1536, 512, 300)],
                },
            ],
        };
        let hints = Hints::default();
        let device =
            super::super::device::ReplayDevice::new(SimDevice::new(1 << 34), hints.clone());
        let mut allocator =
            CachingAllocator::new(Box::new(device), AllocConf::default()).expect("allocator");
        let seeded = seed(&mut allocator, &start, Some(&hints)).expect("seeds");
        assert_eq!(seeded.layout(), Layout::Exact);
        assert_eq!(seeded.live.len(), 3);
        let layout: Vec<SegmentLayout> = allocator
            .segment_snapshots()
            .iter()
            .map(|segment| {
                (
                    segment.address,
                    segment
                        .blocks
                        .iter()
                        .map(|b| {
                            (
                                b.address - segment.address,
                                b.size,
                                b.state == BlockState::ActiveAllocated,
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            layout,
            [
                (
                    base,
                    vec![
                        (0, 2 * MIB, false),
                        (2 * MIB, 3 * MIB, true),
                        (5 * MIB, 7 * MIB, false),
                        (12 * MIB, 8 * MIB, true)
                    ]
                ),
                (
                    base + 64 * MIB,
                    vec![
                        (0, 1536, false),
                        (1536, 512, true),
                        (2048, 2 * MIB - 2048, false)
                    ]
                ),
            ]
        );
        let stats = allocator.stats();
        assert_eq!(
            stats.requested_bytes.all.current,
            (3 * MIB - 100 + 8 * MIB + 300) as i64
        );
        assert_eq!(
            stats.num_device_alloc, 0,
            "counters start at the trace's first event"
        );
        assert_eq!(stats.reserved_bytes.all.peak, (22 * MIB) as i64);
    }
}
