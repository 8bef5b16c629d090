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

use super::ranges::{Ranges, Spans};
use super::scan::{AllocAt, Scan, SegmentEventAt};
use crate::alloc::{CachingAllocator, MemPoolId, Pool, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use crate::snapshot::model::Segment;
use std::collections::{BTreeMap, HashMap};

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
    /// The event that gave it back to the cache (its free's completion, later than
    /// `freed_at` for a free deferred by `record_stream`), or `None` where the trace shows
    /// none (still live, or its free still pending, at the end).
    pub returned_at: Option<u64>,
    /// Whether its size is the file's own (an end-state block, or one whose free the trace
    /// requested and the end state shows still pending), not rebuilt from its request: no
    /// unsplit tail is added to it.
    pub size_known: bool,
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
    /// The private pool it belongs to (a CUDA graph's or a `MemPool`'s, the file's
    /// `segment_pool_id`); the default id for the default pools, and for a segment the trace
    /// releases (its pool is not recorded).
    pub owner: MemPoolId,
    /// Its live blocks, lowest address first; the rest of it is free.
    pub blocks: Vec<StartBlock>,
    /// For a mapped range of an expandable segment: the bytes just below it that are the same
    /// segment's, unmapped at the start (the trace maps them, or the end state shows them
    /// mapped next to this range), down to the lowest such page. PyTorch maps an expandable
    /// segment's lowest unmapped pages first, so a replay's segment must begin there too.
    /// 0 for a `cudaMalloc` segment.
    pub unmapped_below: u64,
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

/// The size and requested size of the end-state block at `addr` whose free is pending (its
/// state `active_pending_free`), if the file's segments hold one.
fn pending_end_block(segments: &[Segment], addr: u64) -> Option<(u64, u64)> {
    segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .find(|block| {
            block.address as u64 == addr
                && crate::alloc::BlockState::from_name(&block.state)
                    == Some(crate::alloc::BlockState::ActivePendingFree)
        })
        .map(|block| {
            let size = block.size.max(0) as u64;
            let requested = match block.requested_size {
                requested if requested > 0 => requested as u64,
                _ => size,
            };
            (size, requested)
        })
}

/// The private pool a file's segment belongs to (the default id for the default pools).
fn owner_of(segment: &Segment) -> MemPoolId {
    let (first, second) = segment.segment_pool_id;
    MemPoolId::new(first.max(0) as u64, second.max(0) as u64)
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
    let total_memory = allocator.device().total_memory();
    let reservation = |pool: Pool| {
        let page = allocator.page_size(pool);
        crate::alloc::expandable::reserved_pages(total_memory, page).saturating_mul(page)
    };
    let mut held = held_segments(scan, segments, &reservation);
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
                returned_at: None,
                size_known: true,
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
        // A block whose free the trace requested and never completed is in the end state,
        // awaiting that completion, with the size PyTorch gave it (its unsplit tail included).
        let still_pending = (!free.free_requested && free.completed_at.is_none())
            .then(|| pending_end_block(segments, free.addr))
            .flatten();
        segment.blocks.push(StartBlock {
            addr: free.addr,
            size: still_pending.map_or_else(
                || allocator.round_size(free.requested.max(1)),
                |(size, _)| size,
            ),
            requested: still_pending.map_or(free.requested, |(_, requested)| requested),
            free_requested: free.free_requested,
            freed_at: Some(free.index),
            returned_at: free.completed_at,
            size_known: still_pending.is_some(),
        });
    }
    let last_event = scan.last;
    for segment in &mut held {
        segment.blocks.sort_by_key(|block| block.addr);
    }
    let served = ServedFrom::new(&held, segments, scan);
    for segment in &mut held {
        settle_sizes(segment, allocator, last_event, scan, &served)?;
    }
    Ok(StartState { segments: held })
}

/// Where the trace's allocations were served from, as far as the tail of a block live at the
/// start is concerned ([`tail_below_allocations`]).
struct ServedFrom<'a> {
    scan: &'a Scan,
    /// Steps left to [`READ_TAILS_BUDGET`].
    steps_left: std::cell::Cell<u64>,
    /// The `cudaMalloc` segments of the large pool held at the start.
    held: Vec<HeldLayout>,
    /// The private pool of each end-state segment.
    owners: BTreeMap<u64, MemPoolId>,
    /// Whether the end state shows a private pool.
    private_pools_at_end: bool,
    /// The `cudaMalloc` segments of the large pool the trace made that last to the end, by
    /// address: (end, stream, private pool, the `segment_alloc` that made it).
    made: BTreeMap<u64, (u64, u64, MemPoolId, u64)>,
}

/// A `cudaMalloc` segment of the large pool held at the start, as [`ServedFrom`] reads it.
struct HeldLayout {
    start: u64,
    end: u64,
    stream: u64,
    owner: MemPoolId,
    /// Its blocks live at the start, lowest first: (address, the event that gave the block
    /// back to the cache, `u64::MAX` for none).
    blocks: Vec<(u64, u64)>,
    /// The event that releases it (`u64::MAX`: none): a block at its addresses after that is
    /// another segment's.
    released_at: u64,
}

/// What an allocation says of the free blocks of its stream and pool at its moment: none of
/// them that `get_free_block` may hand out was at least the request and smaller than
/// `best_fit_at_least` (the block it took, or none: new memory).
struct Served {
    stream: u64,
    owner: MemPoolId,
    best_fit_at_least: u64,
}

impl<'a> ServedFrom<'a> {
    fn new(held: &[StartSegment], segments: &[Segment], scan: &'a Scan) -> ServedFrom<'a> {
        let owners: BTreeMap<u64, MemPoolId> = segments
            .iter()
            .map(|s| (s.address as u64, owner_of(s)))
            .collect();
        ServedFrom {
            scan,
            steps_left: std::cell::Cell::new(READ_TAILS_BUDGET),
            held: held
                .iter()
                .filter(|s| !s.expandable && s.pool == Pool::Large)
                .map(|s| HeldLayout {
                    start: s.addr,
                    end: s.addr + s.size,
                    stream: s.stream,
                    owner: s.owner,
                    blocks: s
                        .blocks
                        .iter()
                        .map(|b| (b.addr, b.returned_at.unwrap_or(u64::MAX)))
                        .collect(),
                    released_at: scan
                        .first_segment_frees
                        .iter()
                        .find(|free| free.addr == s.addr)
                        .map_or(u64::MAX, |free| free.index),
                })
                .collect(),
            private_pools_at_end: owners.values().any(|o| *o != MemPoolId::default()),
            owners,
            made: segments
                .iter()
                .filter(|s| !s.is_expandable && pool_of(&s.segment_type) == Pool::Large)
                .filter_map(|s| {
                    let addr = s.address as u64;
                    let made_at = scan.made_at(addr).filter(|_| scan.made_segment(addr))?;
                    let end = addr.saturating_add(s.total_size.max(0) as u64);
                    Some((addr, (end, s.stream as u64, owner_of(s), made_at)))
                })
                .collect(),
        }
    }

    /// Takes `steps` from the budget; false once it is spent.
    fn spend(&self, steps: u64) -> bool {
        let left = self.steps_left.get();
        self.steps_left.set(left.saturating_sub(steps));
        left >= steps
    }

    /// What `alloc` says, where it can be read: from a segment made for it (its pool is the
    /// end state's where that segment lasted to the end, else the default pools' where the end
    /// state shows no private pool), from a free block starting at its address in a
    /// segment held at the start, which reached at least to the next block live at the start
    /// if the trace had allocated nothing in between before, or from one in a segment the
    /// trace made before it that lasts to the end, which reached the segment's end if the
    /// trace had allocated nothing in between since (the segment was all free when made).
    fn served(&self, alloc: &AllocAt) -> Option<Served> {
        if let Some(made_at) = alloc.made_segment_at {
            let lasted = self.scan.made_segment(alloc.addr)
                && self.scan.made_at(alloc.addr) == Some(made_at);
            let owner = match self.owners.get(&alloc.addr) {
                Some(owner) if lasted => *owner,
                // Released before the end (another segment may have been made at its address
                // since): its pool is not recorded.
                _ if !self.private_pools_at_end => MemPoolId::default(),
                _ => return None,
            };
            return Some(Served {
                stream: alloc.stream,
                owner,
                best_fit_at_least: u64::MAX,
            });
        }
        if !self.spend(self.held.len() as u64) {
            return None;
        }
        let Some(segment) = self
            .held
            .iter()
            .find(|s| s.start <= alloc.addr && alloc.addr < s.end && alloc.index < s.released_at)
        else {
            return self.served_in_a_made_segment(alloc);
        };
        // The free block taken reached the next block still held then: one given back to
        // the cache before (its free completed) had merged into it.
        let next = segment
            .blocks
            .iter()
            .copied()
            .find(|&(addr, returned_at)| addr > alloc.addr && returned_at > alloc.index)
            .map_or(segment.end, |(addr, _)| addr);
        if self
            .scan
            .first_alloc_from(alloc.addr + 1, next, alloc.index)
            .is_some()
        {
            return None;
        }
        Some(Served {
            stream: segment.stream,
            owner: segment.owner,
            best_fit_at_least: next - alloc.addr,
        })
    }

    /// [`ServedFrom::served`] for an allocation in a `cudaMalloc` segment the trace made
    /// before it and which lasts to the end (the last made at its address, so the one there
    /// at the allocation's moment).
    fn served_in_a_made_segment(&self, alloc: &AllocAt) -> Option<Served> {
        let (_, &(end, stream, owner, made_at)) = self.made.range(..=alloc.addr).next_back()?;
        // At the segment's start too: the free block taken there began at the start, and
        // reached the end where nothing was allocated after the start since.
        if alloc.addr >= end || alloc.index <= made_at {
            return None;
        }
        let (landed, steps) = self
            .scan
            .first_alloc_from_counted(alloc.addr + 1, end, alloc.index);
        if !self.spend(steps) || landed.is_some() {
            return None;
        }
        Some(Served {
            stream,
            owner,
            best_fit_at_least: end - alloc.addr,
        })
    }
}

/// Checks that a segment's blocks do not overlap and gives each block the trace freed the
/// free space after it that the allocator could not have split off. An overlap is reported at
/// the event that frees the block, or at `last_event` for a block live at the end.
///
/// That free space ends at the next block live at the start or, closer, at the first address
/// the trace allocated after the block's end while the block was still held: an allocation
/// starts a free block, so the bytes between the two belonged to no free block of their own
/// (in a `cudaMalloc` segment of the large pool every block is larger than 1 MiB, since
/// PyTorch splits off only remainders larger than that): they were the block's tail.
///
/// Where no allocation bounds that tail from above, the requests served elsewhere while the
/// free space after the block lay untouched bound it from below ([`tail_below_allocations`]).
fn settle_sizes(
    segment: &mut StartSegment,
    allocator: &CachingAllocator,
    last_event: u64,
    scan: &Scan,
    served: &ServedFrom,
) -> Result<(), StartError> {
    let max_split_size = allocator.config().max_split_size;
    let end = segment.addr + segment.size;
    for i in 0..segment.blocks.len() {
        let next_start = segment.blocks.get(i + 1).map_or(end, |next| next.addr);
        // The blocks after it, each bounding the free space after it until given back.
        let bounds: Vec<Bound> = segment.blocks[i + 1..]
            .iter()
            .map(|next| Bound {
                addr: next.addr,
                returned_at: next.returned_at.unwrap_or(u64::MAX),
            })
            .chain(std::iter::once(Bound {
                addr: end,
                returned_at: u64::MAX,
            }))
            .collect();
        let block = &mut segment.blocks[i];
        let block_end = block.addr.saturating_add(block.size);
        if block_end > next_start {
            return Err(StartError {
                index: block.freed_at.unwrap_or(last_event),
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
        if block.size_known || segment.expandable || segment.pool == Pool::Small {
            continue;
        }
        let oversize = block.size >= max_split_size;
        let reach = if oversize {
            next_start
        } else {
            next_start.min(block_end.saturating_add(SMALL_SIZE + 1))
        };
        // Held until its free completes, not just until it is requested: a free deferred by
        // `record_stream` leaves the block out of the cache (unmerged with the space after
        // it) until its events complete, and a block whose completion the trace never shows
        // is held to the end.
        let held_until = block
            .freed_at
            .map(|_| block.returned_at.unwrap_or(u64::MAX));
        let boundary = held_until
            .and_then(|until| scan.first_alloc_from(block_end, reach, until))
            .unwrap_or(next_start);
        let gap = boundary - block_end;
        if gap > 0 && (gap <= SMALL_SIZE || oversize) {
            block.size += gap;
        } else if gap > SMALL_SIZE && boundary == next_start {
            let free_space = FreeSpaceAfter {
                start: block_end,
                bounds,
                held_until: held_until.unwrap_or(u64::MAX),
            };
            block.size += tail_below_allocations(
                &free_space,
                (segment.stream, segment.owner),
                allocator,
                scan,
                served,
            );
        }
    }
    Ok(())
}

/// The free space after a block live at the trace's start, as far as the next live block,
/// and further as the blocks after it are given back to the cache (a free block merges with
/// its free neighbours).
struct FreeSpaceAfter {
    /// The block's end as rounded from its request (its unsplit tail, if any, lies here).
    start: u64,
    /// The live blocks after it, lowest address first, then the segment's end.
    bounds: Vec<Bound>,
    /// The event that gives the block back to the cache (its free's completion, later than
    /// its request for a free deferred by `record_stream`).
    held_until: u64,
}

/// What ends a free space: a block live at the trace's start, or the segment's end.
struct Bound {
    /// Its address.
    addr: u64,
    /// The event that gave it back to the cache (`u64::MAX`: never, or the segment's end).
    returned_at: u64,
}

/// The least unsplit tail (at most [`SMALL_SIZE`], a multiple of [`MIN_BLOCK_SIZE`]) a block
/// must have had for the free space after it to have been no better fit than what PyTorch
/// chose for each request of its segment's stream and pool, while the block was held; 0
/// where no request bounds it, or where no tail PyTorch
/// leaves unsplit would explain them. The space reaches the next block live at the start,
/// and further once that block is given back to the cache (its free space merges with the
/// space after it, up to the next block still held), and no further than the lowest address
/// the trace has allocated in it since.
///
/// PyTorch serves a request from the smallest cached free block that is at least as large
/// (`get_free_block`) and makes a segment only where none would serve it. A request served
/// from a larger block, or from new memory, while the space after the block would have served
/// it means that space was smaller than the request's rounded size. A tail rebuilt as 0 makes
/// the space as large as the trace allows, and a replay then serves from it what PyTorch
/// could not.
fn tail_below_allocations(
    free_space: &FreeSpaceAfter,
    (stream, owner): (u64, MemPoolId),
    allocator: &CachingAllocator,
    scan: &Scan,
    served: &ServedFrom,
) -> u64 {
    let mut tail = 0;
    // The block bounding the space now (the first of `bounds` not yet given back).
    let mut bound = 0;
    // Until the block is freed.
    for alloc in scan
        .allocs
        .iter()
        .take_while(|alloc| alloc.index < free_space.held_until)
    {
        if !served.spend(1) {
            return 0;
        }
        while bound + 1 < free_space.bounds.len()
            && free_space.bounds[bound].returned_at < alloc.index
        {
            bound += 1;
        }
        // An allocation that landed in the space since bounds it at its address (PyTorch
        // carves a block at the start of the free block it takes, so the space reaches no
        // further while that block is held; taken as held still, which only lowers the
        // bound).
        let bound_addr = free_space.bounds[bound].addr;
        let (landed, steps) =
            scan.first_alloc_from_counted(free_space.start, bound_addr, alloc.index);
        if !served.spend(steps) {
            return 0;
        }
        let end = landed.unwrap_or(bound_addr);
        let room = end.saturating_sub(free_space.start);
        let size = allocator.round_size(alloc.requested.max(1));
        let space = room.saturating_sub(tail);
        if alloc.stream != stream || size <= SMALL_SIZE || size > space {
            continue;
        }
        let Some(served) = served.served(alloc) else {
            continue;
        };
        if served.stream != stream
            || served.owner != owner
            || space >= served.best_fit_at_least
            || !allocator.may_serve(size, space)
        {
            continue;
        }
        // The space must have been smaller than `size`.
        let needed = (room - size + 1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE;
        if needed > SMALL_SIZE {
            return 0;
        }
        tail = tail.max(needed);
    }
    tail
}

/// The segments and mapped ranges held when the trace starts, without their blocks.
/// `reservation`: the bytes of address space an expandable segment of a pool reserves.
fn held_segments(
    scan: &Scan,
    segments: &[Segment],
    reservation: &dyn Fn(Pool) -> u64,
) -> Vec<StartSegment> {
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
                owner: owner_of(segment),
                blocks: Vec::new(),
                unmapped_below: 0,
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
            owner: MemPoolId::default(),
            blocks: Vec::new(),
            unmapped_below: 0,
        });
    }
    held.extend(mapped_ranges(scan, segments, reservation));
    held.sort_by_key(|segment| segment.addr);
    // A segment's unmapped pages never reach into the segment held below it.
    let mut below_end = 0;
    for segment in &mut held {
        let room = segment.addr.saturating_sub(below_end);
        segment.unmapped_below = segment.unmapped_below.min(room);
        below_end = below_end.max(segment.addr.saturating_add(segment.size));
    }
    held
}

/// Mapped pages of an expandable segment at the trace's start, as one piece of a run.
struct MappedPiece {
    start: u64,
    end: u64,
    stream: u64,
    /// Its pool and owner, from the end state; `None` for pages the trace unmaps, whose pool
    /// is not recorded.
    known: Option<(Pool, MemPoolId)>,
}

/// Expandable segments' pages mapped when the trace starts, as contiguous runs: the pages it
/// unmaps before mapping them, and the end state's mapped pages it never touched.
/// `reservation`: the bytes of address space an expandable segment of a pool reserves.
fn mapped_ranges(
    scan: &Scan,
    segments: &[Segment],
    reservation: &dyn Fn(Pool) -> u64,
) -> Vec<StartSegment> {
    let mut pieces: Vec<MappedPiece> = Vec::new();
    for segment in segments.iter().filter(|s| s.is_expandable) {
        let start = segment.address as u64;
        let end = start.saturating_add(segment.total_size.max(0) as u64);
        for (gap_start, gap_end) in scan.touched_pages.gaps(start, end) {
            pieces.push(MappedPiece {
                start: gap_start,
                end: gap_end,
                stream: segment.stream as u64,
                known: Some((pool_of(&segment.segment_type), owner_of(segment))),
            });
        }
    }
    for unmap in &scan.first_unmaps {
        pieces.push(MappedPiece {
            start: unmap.addr,
            end: unmap.addr + unmap.size,
            stream: unmap.stream,
            known: None,
        });
    }
    let mut runs = Ranges::default();
    for piece in &pieces {
        runs.insert(piece.start, piece.end);
    }
    // The address ranges known to be expandable segments' (mapped at the start, at the end, or
    // by the trace at some point), adjacent ones joined: pages joined to a run below it are
    // its segment's, unmapped at the start.
    // Each range carries its lowest address.
    let mut known: Spans<u64> = Spans::default();
    let mut add = |start: u64, end: u64| known.insert_with(start, end, start, u64::min);
    for (start, end) in runs.iter().chain(scan.touched_pages.iter()) {
        add(start, end);
    }
    for segment in segments.iter().filter(|s| s.is_expandable) {
        let start = segment.address as u64;
        add(
            start,
            start.saturating_add(segment.total_size.max(0) as u64),
        );
    }
    let joined_floor = |start: u64| known.value_at(start).unwrap_or(start);
    // PyTorch holds one expandable segment per stream, pool and private pool at a time (its
    // address range is larger than the device), so a segment that lasts to the end holds the
    // end state's ranges of the same three, wherever they are. (One released in the window,
    // all its pages unmapped, may be followed by another, anywhere.)
    let same_segment_floor = |stream: u64, pool: Pool, owner: MemPoolId| {
        segments
            .iter()
            .filter(|s| {
                s.is_expandable
                    && s.stream as u64 == stream
                    && pool_of(&s.segment_type) == pool
                    && owner_of(s) == owner
            })
            .map(|s| s.address as u64)
            .min()
    };
    let known_of = |(start, end): (u64, u64)| {
        pieces
            .iter()
            .filter(|p| p.start >= start && p.end <= end)
            .find_map(|p| p.known.map(|(pool, owner)| (p.stream, pool, owner)))
    };
    // The (stream, pool, private pool) of the runs whose segments last to the end.
    let lasting: Vec<(u64, Pool, MemPoolId)> = runs.iter().filter_map(known_of).collect();
    // Each run's stream, pool and private pool: the end state's where it shows them; a run of
    // pages only the trace unmaps is taken, in whole 20 MiB pages, as the large pool's, of the
    // default pools.
    let identity_of = |(start, end): (u64, u64)| {
        let known = known_of((start, end));
        let identity = known.unwrap_or_else(|| {
            let stream = pieces
                .iter()
                .find(|p| p.start >= start && p.end <= end)
                .map_or(0, |p| p.stream);
            let pool = if (end - start) % crate::alloc::LARGE_BUFFER == 0 {
                Pool::Large
            } else {
                Pool::Small
            };
            (stream, pool, MemPoolId::default())
        });
        (known, identity)
    };
    // Whose pages each joined range holds, by the range's lowest address: the start's runs,
    // and the end state's segments.
    let held_at_start: Vec<(u64, (u64, Pool, MemPoolId))> = runs
        .iter()
        .map(|run| (joined_floor(run.0), identity_of(run).1))
        .collect();
    let held_at_end: Vec<(u64, (u64, Pool, MemPoolId))> = segments
        .iter()
        .filter(|s| s.is_expandable)
        .map(|s| {
            let identity = (s.stream as u64, pool_of(&s.segment_type), owner_of(s));
            (joined_floor(s.address as u64), identity)
        })
        .collect();
    // A map at `addr` can be the pages of `identity`'s segment, held from the start on pages
    // `start..end` (and to the end where it `lasts`), unless:
    // - the two lie further apart than the segment's reservation (PyTorch reserves 1 1/8 of
    //   the device's memory for each, `address_space_size`);
    // - its pages are joined to pages of a segment of another stream, pool or private pool
    //   held together with this one (at the start; at the end too where it lasts): they are
    //   that segment's, as segments held together never share an address range (one gone
    //   before the end may leave its range to a later one);
    // - pages such a segment held at the start lie between it and `start`.
    // The lowest page of each map's segment that the trace shows: one unmap covers pages of
    // one segment, so the first unmap of a map's pages reaches as low as its segment does.
    let segment_floors = map_segment_floors(scan);
    let claimable = |map: &SegmentEventAt,
                     (start, end): (u64, u64),
                     identity: (u64, Pool, MemPoolId),
                     lasts: bool| {
        let addr = map.addr;
        let lowest = segment_floors
            .get(&map.index)
            .map_or(addr, |&floor| floor.min(addr));
        if end.saturating_sub(lowest) > reservation(identity.1) {
            return false;
        }
        let floor = joined_floor(addr);
        let joined_to_another = held_at_start
            .iter()
            .chain(held_at_end.iter().filter(|_| lasts))
            .any(|&(at, other)| at == floor && other != identity);
        let another_between = runs
            .iter()
            .any(|run| run.0 < start && run.1 > addr && identity_of(run).1 != identity);
        !joined_to_another && !another_between
    };
    // Following each run's pages reads every map and unmap once per run (and each map's
    // claim reads the runs): bounded, so a file of many runs and events costs no more than
    // this; past it, a segment is taken as gone when its last start page is unmapped.
    let follow = runs
        .iter()
        .count()
        .saturating_mul(scan.maps.len() + scan.unmaps.len())
        <= FOLLOW_PAGES_BUDGET;
    runs.iter()
        .map(|(start, end)| {
            let (known, (stream, pool, owner)) = identity_of((start, end));
            // Pages the trace never touches and the end state shows mapped: the run's segment
            // lasts to the end. So does a run the trace unmaps whole where another run of the
            // same stream and pool lasts: PyTorch held one segment for them at the start.
            let identity = (stream, pool, owner);
            // Otherwise the pages it held, followed through the trace, tell: a segment goes
            // only when the last of them is unmapped.
            let released = if known.is_some() || lasting.contains(&identity) {
                None
            } else {
                let claimable =
                    |map: &SegmentEventAt| claimable(map, (start, end), identity, false);
                // The other runs of the same stream, pool and private pool held at the start
                // are the same segment's (PyTorch holds one such segment at a time): it goes
                // only once all of them are unmapped.
                let same_segment: Vec<(u64, u64)> = runs
                    .iter()
                    .filter(|&run| identity_of(run).1 == identity)
                    .collect();
                Some(released_at(
                    scan,
                    &same_segment,
                    identity,
                    follow,
                    &claimable,
                ))
            };
            let lasts = match released {
                None => true,
                Some(Release::At(_)) => false,
                Some(Release::Never) => segments.iter().any(|s| {
                    s.is_expandable
                        && (s.stream as u64, pool_of(&s.segment_type), owner_of(s)) == identity
                }),
            };
            let floor = if lasts {
                let floor = same_segment_floor(stream, pool, owner).map_or(start, |f| f.min(start));
                // The pages the trace touched next to that lowest range are the segment's
                // too (one map or unmap covers pages of one segment).
                let floor = floor.min(joined_floor(start)).min(joined_floor(floor));
                // So are pages the trace mapped below it on the same stream, in pages of the
                // pool's kind, even with unmapped pages between: the segment was held through
                // the whole window, and PyTorch maps a request into the stream's segment,
                // lowest unmapped pages first (`find_expandable_block`).
                let claimable = |map: &SegmentEventAt| claimable(map, (floor, end), identity, true);
                own_map_below(scan, segments, floor, identity, u64::MAX, &claimable)
                    .map_or(floor, |lowest| lowest.min(floor))
            } else {
                // Gone in the window: pages joined to its range by maps after it went may be
                // a new segment's, at a reused address range.
                let claimable =
                    |map: &SegmentEventAt| claimable(map, (start, end), identity, false);
                // Held to the end, yet no segment of its kind there: the pages followed were
                // not all its own; it went at the unmap of its last start page at the latest.
                let held_until = match released {
                    Some(Release::At(index)) => index,
                    _ => last_page_unmapped(scan, (start, end)).unwrap_or(u64::MAX),
                };
                own_map_below(scan, segments, start, identity, held_until, &claimable)
                    .map_or(start, |lowest| lowest.min(start))
            };
            StartSegment {
                addr: start,
                size: end - start,
                stream,
                pool,
                expandable: true,
                owner,
                blocks: Vec::new(),
                unmapped_below: start - floor,
            }
        })
        .collect()
}

/// The most steps (allocations read for the blocks whose tails are read, and segments looked
/// through for where each was served) [`tail_below_allocations`] takes for one start state:
/// 16 million, well under a second. Past it, tails not yet read are taken as 0, as before the
/// rule.
const READ_TAILS_BUDGET: u64 = 1 << 24;

/// The most (runs × maps and unmaps) for which [`released_at`] follows the runs' pages
/// through the trace: 32 million steps, well under a second.
const FOLLOW_PAGES_BUDGET: usize = 1 << 25;

/// When the segment holding the pages `run` at the trace's start was released.
enum Release {
    /// At this event, the unmap of its last mapped page.
    At(u64),
    /// Never: it held pages to the end.
    Never,
}

/// For runs of pages mapped at the trace's start (`runs`, one segment's) whose pool the end
/// state does not show, of `(stream, pool, owner)`: when their segment went. PyTorch releases an expandable
/// segment once all its pages are unmapped and holds it till then (`release_blocks`,
/// `release_expandable_segment`), so its mapped pages are followed through the trace: a map on
/// the same stream, in pages of the pool's kind, joined to pages it has held since the start
/// (mapped still or unmapped since: one segment's pages are contiguous in its address range,
/// and segments held together never share one), and that
/// `claimable` allows, adds to them; an unmap takes pages away. Where the trace's maps or
/// unmaps were too many to keep ([`super::scan::MAX_KEPT_CALLS`]) or to follow for every run
/// (`follow` false: [`FOLLOW_PAGES_BUDGET`]), the segment is taken as gone at the unmap of the
/// runs' last page.
fn released_at(
    scan: &Scan,
    runs: &[(u64, u64)],
    (stream, pool, _): (u64, Pool, MemPoolId),
    follow: bool,
    claimable: &dyn Fn(&SegmentEventAt) -> bool,
) -> Release {
    let kept_all = scan.maps.len() < super::scan::MAX_KEPT_CALLS
        && scan.unmaps.len() < super::scan::MAX_KEPT_CALLS;
    if !kept_all || !follow {
        return runs
            .iter()
            .map(|&run| last_page_unmapped(scan, run))
            .try_fold(0, |latest, unmapped| unmapped.map(|at| latest.max(at)))
            .map_or(Release::Never, Release::At);
    }
    let kind = |bytes: u64| bytes.is_multiple_of(crate::alloc::LARGE_BUFFER);
    let mut pages = Ranges::default();
    for &(start, end) in runs {
        pages.insert(start, end);
    }
    // Every page the segment has held since the start, unmapped ones included: they lie in its
    // reservation, which no other segment's pages share while it is held, so a map joined to
    // them is its own even where the pages between were unmapped (PyTorch maps a request at the
    // segment's lowest unmapped pages, below what it still holds).
    let mut reserved = pages.clone();
    let (mut maps, mut unmaps) = (scan.maps.iter().peekable(), scan.unmaps.iter().peekable());
    loop {
        let map_first = match (maps.peek(), unmaps.peek()) {
            (Some(map), Some(unmap)) => map.index < unmap.index,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return Release::Never,
        };
        if map_first {
            let Some(map) = maps.next() else {
                return Release::Never;
            };
            let map_end = map.addr.saturating_add(map.size);
            let joined = reserved
                .iter()
                .any(|(from, to)| map.addr <= to && map_end >= from);
            if joined
                && map.stream == stream
                && kind(map.size) == (pool == Pool::Large)
                && claimable(map)
            {
                pages.insert(map.addr, map_end);
                reserved.insert(map.addr, map_end);
            }
        } else {
            let Some(unmap) = unmaps.next() else {
                return Release::Never;
            };
            pages.remove(unmap.addr, unmap.addr.saturating_add(unmap.size));
            if pages.is_empty() {
                return Release::At(unmap.index);
            }
        }
    }
}

/// For each map of the trace (by its event), the lowest address the trace shows its segment
/// reaching, where that lies below the map. One event's pages are one expandable segment's:
/// a map's, an unmap's (PyTorch unmaps a free block's pages, in one segment), and a block's
/// (an allocation lies in one segment). So maps whose pages one unmap or one allocation
/// covers while they are mapped are one segment's, and that segment reaches down to the
/// lowest of them: a segment held elsewhere whose reservation does not reach that far cannot
/// have made the map.
fn map_segment_floors(scan: &Scan) -> HashMap<u64, u64> {
    let mut segments = JoinedMaps::default();
    // Mapped page ranges by their first address: (end, the map that mapped them).
    let mut mapped: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let (mut maps, mut unmaps, mut allocs) = (
        scan.maps.iter().peekable(),
        scan.unmaps.iter().peekable(),
        scan.allocs.iter().peekable(),
    );
    loop {
        let next = [
            maps.peek().map(|map| map.index),
            unmaps.peek().map(|unmap| unmap.index),
            allocs.peek().map(|alloc| alloc.index),
        ];
        let Some(first) = next.iter().flatten().min().copied() else {
            break;
        };
        if next[0] == Some(first) {
            let Some(map) = maps.next() else { break };
            let node = segments.add(map.addr);
            mapped.insert(map.addr, (map.addr.saturating_add(map.size), node));
        } else if next[1] == Some(first) {
            let Some(unmap) = unmaps.next() else { break };
            let end = unmap.addr.saturating_add(unmap.size);
            let covered = overlapping(&mapped, unmap.addr, end);
            let mut joined: Option<usize> = None;
            for (start, (range_end, node)) in covered {
                mapped.remove(&start);
                // What the unmap leaves of the range stays mapped.
                if start < unmap.addr {
                    mapped.insert(start, (unmap.addr, node));
                }
                if range_end > end {
                    mapped.insert(end, (range_end, node));
                }
                segments.lower_to(node, unmap.addr);
                if let Some(other) = joined {
                    segments.join(other, node);
                }
                joined = Some(node);
            }
        } else {
            let Some(alloc) = allocs.next() else { break };
            let end = alloc.addr.saturating_add(alloc.requested.max(1));
            let nodes: Vec<usize> = overlapping(&mapped, alloc.addr, end)
                .into_iter()
                .map(|(_, (_, node))| node)
                .collect();
            for pair in nodes.windows(2) {
                segments.join(pair[0], pair[1]);
            }
        }
    }
    scan.maps
        .iter()
        .enumerate()
        .filter_map(|(node, map)| {
            let floor = segments.floor(node);
            (floor < map.addr).then_some((map.index, floor))
        })
        .collect()
}

/// The mapped ranges of `mapped` that share pages with `start..end`, lowest first.
fn overlapping(
    mapped: &BTreeMap<u64, (u64, usize)>,
    start: u64,
    end: u64,
) -> Vec<(u64, (u64, usize))> {
    // The range beginning at or below `start` may reach into it; later ones begin inside.
    let below = mapped
        .range(..=start)
        .next_back()
        .filter(|(_, &(range_end, _))| range_end > start);
    let inside = mapped.range(start.saturating_add(1)..end);
    below
        .into_iter()
        .chain(inside)
        .map(|(&at, &value)| (at, value))
        .collect()
}

/// Maps joined into segments (union-find), each segment with the lowest address known to be
/// its own.
#[derive(Default)]
struct JoinedMaps {
    parent: Vec<usize>,
    floor: Vec<u64>,
}

impl JoinedMaps {
    /// A new map's segment, reaching down to `addr`; its node.
    fn add(&mut self, addr: u64) -> usize {
        self.parent.push(self.parent.len());
        self.floor.push(addr);
        self.parent.len() - 1
    }

    fn root(&mut self, mut node: usize) -> usize {
        while self.parent[node] != node {
            self.parent[node] = self.parent[self.parent[node]];
            node = self.parent[node];
        }
        node
    }

    /// Makes `a`'s and `b`'s segments one.
    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        if a != b {
            self.parent[b] = a;
            self.floor[a] = self.floor[a].min(self.floor[b]);
        }
    }

    /// `node`'s segment reaches down to `addr` at least.
    fn lower_to(&mut self, node: usize, addr: u64) {
        let root = self.root(node);
        self.floor[root] = self.floor[root].min(addr);
    }

    /// The lowest address known of `node`'s segment.
    fn floor(&mut self, node: usize) -> u64 {
        let root = self.root(node);
        self.floor[root]
    }
}

/// The event that unmapped the last of the pages `run` held at the trace's start, if the
/// trace unmaps them all.
fn last_page_unmapped(scan: &Scan, (start, end): (u64, u64)) -> Option<u64> {
    scan.first_unmaps
        .iter()
        .filter(|unmap| unmap.addr >= start && unmap.addr + unmap.size <= end)
        .map(|unmap| unmap.index)
        .max()
}

/// The lowest page below `start` that the trace mapped on `stream` (the map may reach past
/// `start`, into pages the segment unmapped since), in pages of `pool`'s kind,
/// before the event `held_until` (the segment's pages from `start` up were held till then),
/// where no segment of the end state of another stream, pool or private pool (or a
/// `cudaMalloc` one) lies in between, unless the trace mapped that after `held_until`, and
/// that `claimable` allows (a map names no pool, and a graph's or `MemPool`'s segment can
/// share the stream: see `mapped_ranges`). Those pages were the same expandable segment's:
/// PyTorch holds one per stream, pool and private pool at a time. `None` where no such map
/// came.
fn own_map_below(
    scan: &Scan,
    segments: &[Segment],
    start: u64,
    (stream, pool, owner): (u64, Pool, MemPoolId),
    held_until: u64,
    claimable: &dyn Fn(&SegmentEventAt) -> bool,
) -> Option<u64> {
    let large = |bytes: u64| bytes.is_multiple_of(crate::alloc::LARGE_BUFFER);
    let lowest = scan
        .maps
        .iter()
        .take_while(|map| map.index < held_until)
        .filter(|map| {
            map.stream == stream
                // Below `start`, or reaching into pages the segment held there and unmapped
                // since: a map covers the lowest unmapped pages first.
                && map.addr < start
                && large(map.size) == (pool == Pool::Large)
                && claimable(map)
        })
        .map(|map| map.addr)
        .min()?;
    // One the trace mapped after the segment went may be a new one at a reused address
    // range: no sign of another segment while this one was held.
    let mapped_after = |at: u64| {
        scan.maps
            .iter()
            .any(|map| map.index > held_until && map.addr <= at && at < map.addr + map.size)
    };
    let another_between = segments.iter().any(|segment| {
        let at = segment.address as u64;
        let other = segment.stream as u64 != stream
            || pool_of(&segment.segment_type) != pool
            || owner_of(segment) != owner
            || !segment.is_expandable;
        other
            && at < start
            && at.saturating_add(segment.total_size.max(0) as u64) > lowest
            && !mapped_after(at.max(lowest))
    });
    (!another_between).then_some(lowest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::snapshot::model::{Action, Block};
    use crate::snapshot::pickle::{Emitted, Entry, RawEvent, Stacks, Trace};

    const MIB: i64 = 1 << 20;
    const BASE: i64 = 0x7f00_0000_0000;

    fn scan(events: &[(Action, i64, i64)]) -> Scan {
        let mut scan = Scan::default();
        let stacks = Stacks::default();
        for (index, &(action, addr, size)) in events.iter().enumerate() {
            let mut event = RawEvent::new(action);
            event.addr = addr;
            event.size = size;
            scan.see(&Emitted {
                list: 1,
                trace: Trace::Device(0),
                index: index as u64,
                offset: 0,
                entry: Entry::Memory(event),
                stacks: &stacks,
            });
        }
        scan
    }

    fn segment(address: i64, blocks: &[(i64, i64, &str)]) -> Segment {
        Segment {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.1).sum(),
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
                .map(|&(address, size, state)| Block {
                    address,
                    size,
                    requested_size: size,
                    state: state.into(),
                    frames: Vec::new(),
                })
                .collect(),
        }
    }

    fn allocator() -> CachingAllocator {
        CachingAllocator::new(Box::new(SimDevice::new(1 << 34)), AllocConf::default())
            .expect("allocator")
    }

    /// Three maps, 40, 20 and 20 MiB, one above the other. The top one is unmapped alone; one
    /// unmap takes the two below, so the middle map's segment reaches the bottom one's base.
    /// The top map joins them only through a block allocated across its first page.
    #[test]
    fn one_unmap_or_one_block_joins_maps_into_a_segment() {
        let events = |across: bool| {
            let mut events = vec![
                (Action::SegmentMap, BASE, 40 * MIB),
                (Action::SegmentMap, BASE + 40 * MIB, 20 * MIB),
                (Action::SegmentMap, BASE + 60 * MIB, 20 * MIB),
            ];
            if across {
                events.push((Action::Alloc, BASE + 40 * MIB + 512, 22 * MIB));
            }
            events.push((Action::SegmentUnmap, BASE + 60 * MIB, 20 * MIB));
            events.push((Action::SegmentUnmap, BASE, 60 * MIB));
            events
        };
        let floors = |across: bool| {
            let mut floors: Vec<(u64, u64)> = map_segment_floors(&scan(&events(across)))
                .into_iter()
                .collect();
            floors.sort_unstable();
            floors
        };
        // Events are counted from 1: the maps are events 1, 2 and 3.
        assert_eq!(floors(false), [(2, BASE as u64)]);
        assert_eq!(floors(true), [(2, BASE as u64), (3, BASE as u64)]);
    }

    #[test]
    fn the_end_state_and_the_first_frees_make_the_start() {
        // At the end: 4 MiB live since before the trace, 16 MiB free. The trace frees a block
        // of 3,000,000 bytes right after it, and allocates and frees one at its own address.
        let end = [segment(
            BASE,
            &[
                (BASE, 4 * MIB, "active_allocated"),
                (BASE + 4 * MIB, 16 * MIB, "inactive"),
            ],
        )];
        let scan = scan(&[
            (Action::FreeRequested, BASE + 4 * MIB, 3_000_000),
            (Action::FreeCompleted, BASE + 4 * MIB, 3_000_000),
            (Action::Alloc, BASE + 4 * MIB, 2 * MIB),
            (Action::FreeRequested, BASE + 4 * MIB, 2 * MIB),
            (Action::FreeCompleted, BASE + 4 * MIB, 2 * MIB),
        ]);
        let start = rebuild(&scan, &end, &allocator()).expect("one start state");
        assert_eq!(start.segments.len(), 1);
        let blocks = &start.segments[0].blocks;
        let sizes: Vec<(u64, u64, Option<u64>)> = blocks
            .iter()
            .map(|b| (b.addr, b.size, b.freed_at))
            .collect();
        assert_eq!(
            sizes,
            [
                (BASE as u64, 4 << 20, None),
                ((BASE + 4 * MIB) as u64, 3_000_320, Some(1)),
            ]
        );
        let figures = start.figures();
        assert_eq!(
            (figures.segments, figures.blocks, figures.freed_by_trace),
            (1, 2, 1)
        );
        assert_eq!(figures.reserved_bytes, 20 << 20);
    }

    /// A block live at the start (3 MiB asked for) with free space after it to the segment's
    /// end, the whole segment free at the end. While the block is held, the trace allocates
    /// 0.5 MiB past its rounded end: that allocation began a free block, so the half MiB
    /// before it was no block of its own (a large-pool block is larger than 1 MiB) but the
    /// held block's unsplit tail. An allocation there only after the block's free, or more
    /// than 1 MiB past its end, says nothing of its tail.
    #[test]
    fn a_tail_is_read_from_where_the_trace_allocates_while_the_block_is_held() {
        let end = [segment(BASE, &[(BASE, 20 * MIB, "inactive")])];
        let size_of_first = |events: &[(Action, i64, i64)]| {
            let start = rebuild(&scan(events), &end, &allocator()).expect("one start state");
            start.segments[0].blocks.first().expect("a block").size
        };
        // A 4 MiB block allocated and freed at `at`, and the held block's free, in that order
        // or the other.
        let events = |at: i64, held_freed_first: bool| {
            let other = [
                (Action::Alloc, at, 4 * MIB),
                (Action::FreeRequested, at, 4 * MIB),
                (Action::FreeCompleted, at, 4 * MIB),
            ];
            let held = [
                (Action::FreeRequested, BASE, 3 * MIB),
                (Action::FreeCompleted, BASE, 3 * MIB),
            ];
            if held_freed_first {
                [&held[..], &other[..]].concat()
            } else {
                [&other[..], &held[..]].concat()
            }
        };
        let tail = BASE + 3 * MIB + MIB / 2;
        assert_eq!(
            size_of_first(&events(tail, false)),
            (3 * MIB + MIB / 2) as u64
        );
        assert_eq!(
            size_of_first(&events(tail, true)),
            (3 * MIB) as u64,
            "allocated there after the block's free"
        );
        assert_eq!(
            size_of_first(&events(BASE + 5 * MIB, false)),
            (3 * MIB) as u64,
            "2 MiB past its end"
        );
    }

    /// A block freed by the trace (9.5 MiB asked) with 10.5 MiB free after it and no
    /// allocation there while it is held: its tail is not read from above. A 10 MiB request
    /// served while it is held from a larger block, or from a segment made for it, says the
    /// space was smaller than 10 MiB, so the block kept at least 0.5 MiB + 512 bytes unsplit.
    /// A request served from a smaller block, or one that would need a tail over 1 MiB
    /// (PyTorch would have split it off), says nothing.
    #[test]
    fn a_request_served_elsewhere_bounds_a_held_blocks_tail_from_below() {
        const OTHER: i64 = BASE + 64 * MIB;
        let held_request = 9 * MIB + MIB / 2;
        let size_of_first = |other_size: i64, request: i64, made_for_it: bool| {
            let end = [
                segment(BASE, &[(BASE, 20 * MIB, "inactive")]),
                segment(OTHER, &[(OTHER, other_size, "inactive")]),
            ];
            let mut events = Vec::new();
            if made_for_it {
                events.push((Action::SegmentAlloc, OTHER, other_size));
            }
            events.extend([
                (Action::Alloc, OTHER, request),
                (Action::FreeRequested, OTHER, request),
                (Action::FreeCompleted, OTHER, request),
                (Action::FreeRequested, BASE, held_request),
                (Action::FreeCompleted, BASE, held_request),
            ]);
            let start = rebuild(&scan(&events), &end, &allocator()).expect("one start state");
            let block = start
                .segments
                .iter()
                .find(|s| s.addr == BASE as u64)
                .and_then(|s| s.blocks.first())
                .expect("the held block");
            block.size
        };
        let bounded = (10 * MIB + 512) as u64;
        assert_eq!(size_of_first(12 * MIB, 10 * MIB, false), bounded);
        assert_eq!(size_of_first(10 * MIB, 10 * MIB, true), bounded);
        assert_eq!(
            size_of_first(10 * MIB, 10 * MIB, false),
            held_request as u64,
            "a better fit than the space"
        );
        assert_eq!(
            size_of_first(9 * MIB, 9 * MIB, true),
            held_request as u64,
            "a tail over 1 MiB"
        );
    }

    #[test]
    fn an_unsplit_tail_is_kept_and_contradictions_are_errors() {
        // A block freed by the trace with 0.5 MiB free after it: the allocator would not have
        // split that off, so the block had it.
        let end = [segment(BASE, &[(BASE, 20 * MIB, "inactive")])];
        let scan_tail = scan(&[
            (Action::FreeCompleted, BASE, 15 * MIB),
            (Action::FreeCompleted, BASE + 15 * MIB, 4 * MIB + MIB / 2),
        ]);
        let start = rebuild(&scan_tail, &end, &allocator()).expect("one start state");
        let last = start.segments[0].blocks.last().expect("two blocks");
        assert_eq!(last.size, 5 << 20);
        // A free outside every held segment.
        let stray = scan(&[(Action::FreeRequested, BASE + 64 * MIB, MIB)]);
        let error = rebuild(&stray, &end, &allocator()).expect_err("in no segment");
        assert_eq!(error.index, 1, "events are numbered from 1");
        assert!(
            error
                .message
                .contains("lies in no segment held when it starts"),
            "{error}"
        );
        // Two live blocks over each other.
        let overlap = scan(&[
            (Action::FreeCompleted, BASE, 8 * MIB),
            (Action::FreeCompleted, BASE + 4 * MIB, 8 * MIB),
        ]);
        let error = rebuild(&overlap, &end, &allocator()).expect_err("overlap");
        assert!(error.message.contains("overlaps the block at"), "{error}");
    }
}
