//! The allocator state at a trace's first event, rebuilt from the file's end-state `segments`
//! and what the first pass ([`super::scan`]) saw the trace free before allocating.
//!
//! Held at the start: every segment (or mapped range of an expandable segment) the trace
//! releases before acquiring it, and every end-state one the trace did not acquire. Live at
//! the start: every block the trace frees before allocating it, and every end-state active
//! block the trace did not allocate. End-state blocks keep their recorded sizes; a block the
//! trace frees is known only by its request, so its size is the allocator's rounding of it,
//! plus the free space after it when the allocator could not have split that off (1 MiB or
//! less in the large pool, or any remainder of an oversize block).

use std::fmt;

use serde::Serialize;

use super::ranges::Ranges;
use super::scan::{FirstFree, Scan};
use crate::alloc::{CachingAllocator, Pool, SMALL_BUFFER, SMALL_SIZE};
use crate::snapshot::model::Segment;

/// A block live at the trace's first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartBlock {
    /// Its address in the recording.
    pub addr: u64,
    /// Its bytes (rounded).
    pub size: u64,
    /// The bytes asked for.
    pub requested: u64,
    /// Whether its free was requested but not completed (a `record_stream` block).
    pub free_requested: bool,
    /// The event that frees it first, or `None` for a block still live at the end.
    pub freed_at: Option<u64>,
}

/// A segment (or a mapped range of an expandable segment) held at the trace's first event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartSegment {
    /// Its address in the recording.
    pub addr: u64,
    /// Its bytes.
    pub size: u64,
    /// Its stream.
    pub stream: u64,
    /// Its pool.
    pub pool: Pool,
    /// Whether it is a mapped range of an expandable segment.
    pub expandable: bool,
    /// Its live blocks, lowest address first; the rest of it is free.
    pub blocks: Vec<StartBlock>,
}

/// The state a trace starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments held, lowest address first.
    pub segments: Vec<StartSegment>,
}

/// Figures of a [`StartState`], as reports give them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StartFigures {
    /// Segments (or mapped ranges) held.
    pub segments: u64,
    /// Bytes they hold.
    pub reserved_bytes: u64,
    /// Live blocks in them.
    pub blocks: u64,
    /// Bytes of those blocks.
    pub allocated_bytes: u64,
    /// Of those blocks, the ones the trace frees (the rest are still live at the end).
    pub freed_by_trace: u64,
}

impl StartState {
    /// Whether the trace starts from an empty allocator (it holds every event of the job).
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Its figures.
    pub fn figures(&self) -> StartFigures {
        let mut figures = StartFigures {
            segments: self.segments.len() as u64,
            ..StartFigures::default()
        };
        for segment in &self.segments {
            figures.reserved_bytes += segment.size;
            for block in &segment.blocks {
                figures.blocks += 1;
                figures.allocated_bytes += block.size;
                figures.freed_by_trace += u64::from(block.freed_at.is_some());
            }
        }
        figures
    }
}

/// Why the file's end state and its trace do not describe one start state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    /// The event concerned.
    pub index: u64,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {}: {}", self.index, self.message)
    }
}

/// Whether a segment's blocks are named active by its `state`.
fn is_active(state: &str) -> bool {
    state.starts_with("active")
}

fn pool_of(segment_type: &str) -> Pool {
    if segment_type == "small" {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// Rebuilds the state at the first event of the trace `scan` read, from the file's end-state
/// `segments` of the replayed device; block sizes are rounded as `allocator` rounds.
pub fn rebuild(
    scan: &Scan,
    segments: &[Segment],
    allocator: &CachingAllocator,
) -> Result<StartState, StartError> {
    let mut held = held_segments(scan, segments);
    // End-state blocks the trace never allocated were live all along.
    for segment in segments {
        for block in &segment.blocks {
            let addr = block.address as u64;
            if !is_active(&block.state) || scan.live_at_end(addr) {
                continue;
            }
            let size = block.size.max(0) as u64;
            let start_block = StartBlock {
                addr,
                size,
                requested: match block.requested_size {
                    requested if requested > 0 => requested as u64,
                    _ => size,
                },
                free_requested: block.state != "active_allocated",
                freed_at: None,
            };
            match held.iter_mut().find(|s| s.addr <= addr && addr < s.addr + s.size) {
                Some(start) => start.blocks.push(start_block),
                None => {
                    return Err(StartError {
                        index: scan.events.saturating_sub(1),
                        message: format!(
                            "the end-state block at {addr:#x} was never allocated by the trace, yet the segment holding it was made by the trace: the file's segments and trace disagree"
                        ),
                    })
                }
            }
        }
    }
    for free in &scan.first_frees {
        let Some(segment) = held
            .iter_mut()
            .find(|s| s.addr <= free.addr && free.addr < s.addr + s.size)
        else {
            return Err(StartError {
                index: free.index,
                message: format!(
                    "{} of address {:#x}, which was never allocated in this trace and lies in no segment held when it starts (neither in the file's end-state segments nor released by the trace)",
                    if free.free_requested { "free_completed" } else { "free_requested" },
                    free.addr
                ),
            });
        };
        segment.blocks.push(StartBlock {
            addr: free.addr,
            size: allocator.round_size(free.requested.max(1)),
            requested: free.requested,
            free_requested: free.free_requested,
            freed_at: Some(free.index),
        });
    }
    let oversize = allocator.config().max_split_size;
    for segment in &mut held {
        segment.blocks.sort_by_key(|block| block.addr);
        settle_sizes(segment, oversize, first_free_index(&scan.first_frees))?;
    }
    Ok(StartState { segments: held })
}

/// The index reported for a block found overlapping another: the event that freed it.
fn first_free_index(frees: &[FirstFree]) -> impl Fn(&StartBlock) -> u64 + '_ {
    move |block| {
        block
            .freed_at
            .or_else(|| frees.first().map(|free| free.index))
            .unwrap_or(0)
    }
}

/// Checks that a segment's blocks do not overlap and gives each block the trace freed the
/// free space after it that the allocator could not have split off.
fn settle_sizes(
    segment: &mut StartSegment,
    max_split_size: u64,
    index_of: impl Fn(&StartBlock) -> u64,
) -> Result<(), StartError> {
    let end = segment.addr + segment.size;
    for i in 0..segment.blocks.len() {
        let next_start = segment.blocks.get(i + 1).map_or(end, |next| next.addr);
        let block = &mut segment.blocks[i];
        let block_end = block.addr.saturating_add(block.size);
        if block_end > next_start {
            return Err(StartError {
                index: index_of(block),
                message: format!(
                    "the block at {:#x} ({} bytes) overlaps {} when the trace starts: the file's segments and trace disagree",
                    block.addr,
                    block.size,
                    if next_start == end {
                        "the end of its segment".to_string()
                    } else {
                        format!("the block at {next_start:#x}")
                    }
                ),
            });
        }
        if block.freed_at.is_none() || segment.expandable || segment.pool == Pool::Small {
            continue;
        }
        let gap = next_start - block_end;
        if gap > 0 && (gap <= SMALL_SIZE || block.size >= max_split_size) {
            block.size += gap;
        }
    }
    Ok(())
}

/// The segments and mapped ranges held when the trace starts, without their blocks.
fn held_segments(scan: &Scan, segments: &[Segment]) -> Vec<StartSegment> {
    let mut held = Vec::new();
    for segment in segments.iter().filter(|s| !s.is_expandable) {
        let addr = segment.address as u64;
        if !scan.made_segment(addr) {
            held.push(StartSegment {
                addr,
                size: segment.total_size.max(0) as u64,
                stream: segment.stream as u64,
                pool: pool_of(&segment.segment_type),
                expandable: false,
                blocks: Vec::new(),
            });
        }
    }
    for free in &scan.first_segment_frees {
        held.push(StartSegment {
            addr: free.addr,
            size: free.size,
            stream: free.stream,
            pool: if free.size == SMALL_BUFFER {
                Pool::Small
            } else {
                Pool::Large
            },
            expandable: false,
            blocks: Vec::new(),
        });
    }
    held.extend(mapped_ranges(scan, segments));
    held.sort_by_key(|segment| segment.addr);
    held
}

/// Expandable segments' pages mapped when the trace starts, as contiguous runs: the pages it
/// unmaps before mapping them, and the end state's mapped pages it never touched.
fn mapped_ranges(scan: &Scan, segments: &[Segment]) -> Vec<StartSegment> {
    // (start, end, stream, pool) of each piece; the pool of a piece the trace unmaps is
    // not recorded: a range of whole 20 MiB pages is taken as the large pool's.
    let mut pieces: Vec<(u64, u64, u64, Option<Pool>)> = Vec::new();
    for segment in segments.iter().filter(|s| s.is_expandable) {
        let start = segment.address as u64;
        let end = start.saturating_add(segment.total_size.max(0) as u64);
        for (gap_start, gap_end) in scan.touched_pages.gaps(start, end) {
            pieces.push((
                gap_start,
                gap_end,
                segment.stream as u64,
                Some(pool_of(&segment.segment_type)),
            ));
        }
    }
    for unmap in &scan.first_unmaps {
        pieces.push((unmap.addr, unmap.addr + unmap.size, unmap.stream, None));
    }
    let mut runs = Ranges::default();
    for &(start, end, _, _) in &pieces {
        runs.insert(start, end);
    }
    runs.iter()
        .map(|(start, end)| {
            let inside = pieces.iter().filter(|p| p.0 >= start && p.1 <= end);
            let known = inside.clone().find_map(|p| p.3.map(|pool| (p.2, pool)));
            let (stream, pool) = known.unwrap_or_else(|| {
                let stream = inside.clone().next().map_or(0, |p| p.2);
                let pool = if (end - start) % crate::alloc::LARGE_BUFFER == 0 {
                    Pool::Large
                } else {
                    Pool::Small
                };
                (stream, pool)
            });
            StartSegment {
                addr: start,
                size: end - start,
                stream,
                pool,
                expandable: true,
                blocks: Vec::new(),
            }
        })
        .collect()
}
