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
use super::start::{StartBlock, StartSegment, StartState};
use crate::alloc::{
    AllocError, Allocation, CachingAllocator, MemPoolId, Pool, PoolFilter, SMALL_SIZE,
};

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
    /// The private pools seeding created, each with one lasting use (as a replay's
    /// `Engine::enter_pool` gives a pool the first time it serves a request).
    pub pools: Vec<MemPoolId>,
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
    /// The private pool its segments belong to, where they are carved (the default id for
    /// the default pools).
    owner: MemPoolId,
    segments: Vec<&'a StartSegment>,
}

/// Runs `carve` with the allocator's mallocs on `stream` routed to the private pool `owner`
/// (nothing to do for the default id), as a capture or `use_mem_pool` routes them: the pool
/// is created the first time with one lasting use, and recorded in `seeded.pools` (also when
/// an earlier attempt, given back, created it).
fn in_pool<T>(
    allocator: &mut CachingAllocator,
    owner: MemPoolId,
    stream: u64,
    seeded: &mut Seeded,
    carve: impl FnOnce(&mut CachingAllocator, &mut Seeded) -> Result<T, String>,
) -> Result<T, String> {
    if owner.is_default() {
        return carve(allocator, seeded);
    }
    let pool_error = |error: AllocError| format!("the private pool {owner}: {error}");
    if allocator.pool_use_count(owner).is_none() {
        allocator.create_pool(owner).map_err(pool_error)?;
    }
    if !seeded.pools.contains(&owner) {
        seeded.pools.push(owner);
    }
    allocator
        .begin_allocate_to_pool(owner, PoolFilter::Stream(stream))
        .map_err(pool_error)?;
    let carved = carve(allocator, seeded);
    allocator.end_allocate_to_pool(owner).map_err(pool_error)?;
    allocator.release_pool(owner).map_err(pool_error)?;
    carved
}

/// Who held a start state: what the replay may take for granted of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    /// The recorded run, replayed under its own config (a memory fraction given taken as the
    /// one it ran under): PyTorch held that memory, whatever the cap says (a fraction set
    /// after the job had reserved more, or memory the cap does not count).
    TheRecordedRun,
    /// A run under another config, a what-if: the state must fit its cap, or the job would
    /// not have reached it.
    AnotherConfig,
}

/// Seeds `allocator` (fresh) with `start`. `hints` (when the replay places segments where
/// they were recorded) receives each `cudaMalloc` segment's address.
pub fn seed(
    allocator: &mut CachingAllocator,
    start: &StartState,
    hints: Option<&Hints>,
    held: HeldBy,
) -> Result<Seeded, String> {
    let expandable = allocator.config().expandable_segments;
    let same_kind = start.segments.iter().all(|s| s.expandable == expandable);
    let carved = if same_kind {
        carve_beyond_the_cap(allocator, start, hints, held)?
    } else {
        None
    };
    let mut seeded = match carved {
        Some(seeded) => seeded,
        None => compact(allocator, start)?,
    };
    seeded.live.sort_by_key(|block| block.addr);
    allocator.reset_accumulated_stats();
    allocator.reset_peak_stats();
    Ok(seeded)
}

/// The recorded layout carved with the memory fraction's cap lifted, then held to it: `None`
/// (the allocator emptied) when the device ran out of memory while carving, or when what was
/// carved holds more than the cap allows under another config than the recorded run's.
///
/// The start state is memory the recorded process held, so under the recording's own fraction
/// it fits the cap; but carving maps, for a moment, more than it keeps (the unmapped pages
/// between an expandable segment's mapped ranges are mapped and released again), and that
/// must not fail a self-replay near its limit. Under a smaller what-if fraction the carved
/// state may hold more than allowed: the live blocks are then allocated again under the cap
/// ([`compact`]), and those that do not fit fail as the job's own allocations would.
fn carve_beyond_the_cap(
    allocator: &mut CachingAllocator,
    start: &StartState,
    hints: Option<&Hints>,
    held: HeldBy,
) -> Result<Option<Seeded>, String> {
    let cap = allocator.allowed_memory_maximum();
    let fraction = (allocator.config().per_process_memory_fraction)
        .unwrap_or_else(|| allocator.memory_fraction());
    let fraction_error = |error: AllocError| format!("the memory fraction: {error}");
    if cap.is_some() {
        allocator.set_memory_fraction(1.0).map_err(fraction_error)?;
    }
    let carved = carve(allocator, start, hints);
    if cap.is_some() {
        // The cap the allocator was made with (`CachingAllocator::new` sets it from the
        // config's fraction the same way), so it is restored to the byte.
        allocator
            .set_memory_fraction(fraction)
            .map_err(fraction_error)?;
    }
    let carved = match carved? {
        Some(seeded)
            if held == HeldBy::AnotherConfig
                && cap.is_some_and(|cap| allocator.total_allocated_memory() > cap) =>
        {
            for block in seeded.live {
                allocator.free(block.allocation).map_err(alloc_error)?;
            }
            None
        }
        carved => carved,
    };
    if carved.is_none() {
        allocator
            .empty_cache()
            .map_err(|error| format!("empty_cache failed: {error}"))?;
    }
    Ok(carved)
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
        in_pool(
            allocator,
            segment.owner,
            segment.stream,
            &mut seeded,
            |allocator, seeded| {
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
                Ok(())
            },
        )?;
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
    let mut holes: Vec<(Allocation, MemPoolId)> = Vec::new();
    for group in groups(start) {
        let outcome = in_pool(
            allocator,
            group.owner,
            group.stream,
            &mut seeded,
            |allocator, seeded| carve_group(allocator, &group, hints, seeded),
        )?;
        let Some(carved) = outcome else {
            let holes = holes.into_iter().map(|(allocation, _)| allocation);
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
                Role::Hole => holes.push((allocation, group.owner)),
                Role::Gap | Role::Block(..) => gaps.push(allocation),
            }
        }
    }
    // The unmapped pages between an expandable segment's mapped ranges, mapped to carve
    // them, go again: the default pools' with empty_cache(), a private pool's (which its
    // empty_cache() keeps while the pool is in use) page range by page range.
    let mut default_holes = false;
    let mut pool_holes: Vec<(MemPoolId, Vec<(u64, u64)>)> = Vec::new();
    for (allocation, owner) in holes {
        allocator.free(allocation).map_err(alloc_error)?;
        if owner.is_default() {
            default_holes = true;
            continue;
        }
        let range = (allocation.ptr.addr(), allocation.size);
        match pool_holes.iter_mut().find(|(pool, _)| *pool == owner) {
            Some((_, ranges)) => ranges.push(range),
            None => pool_holes.push((owner, vec![range])),
        }
    }
    if default_holes {
        allocator
            .empty_cache()
            .map_err(|error| format!("empty_cache failed: {error}"))?;
    }
    for (owner, ranges) in pool_holes {
        if !allocator
            .unmap_free_pages_of_pool(owner, &ranges)
            .map_err(|error| format!("unmapping pool {owner}'s pages failed: {error}"))?
        {
            seeded.mismatches += 1;
        }
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
            if let Some(group) = groups.iter_mut().find(|g| {
                g.expandable
                    && g.stream == segment.stream
                    && g.pool == segment.pool
                    && g.owner == segment.owner
            }) {
                group.segments.push(segment);
                continue;
            }
        }
        groups.push(Group {
            stream: segment.stream,
            pool: segment.pool,
            expandable: segment.expandable,
            owner: segment.owner,
            segments: vec![segment],
        });
    }
    groups
}

/// The bytes from a group's lowest address to the end of its highest segment.
fn extent(group: &Group<'_>) -> u64 {
    let low = group
        .segments
        .iter()
        .map(|s| s.addr.saturating_sub(s.unmapped_below))
        .min()
        .unwrap_or(0);
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
    // An expandable segment begins at its lowest unmapped pages (a hole, mapped while carving).
    let base = first.addr.saturating_sub(first.unmapped_below);
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

/// For a `cudaMalloc` segment of the large pool of at least `max_split_size_mb` whose first
/// piece's request does not make it: the offset, within a piece boundary or a free gap,
/// where the request PyTorch made it for may have ended. That request was below
/// `max_split_size_mb` (else its block is never split, and the segment holds one block), its
/// allocation is the segment's size, and more than 1 MiB of the segment was left after it
/// (PyTorch's `should_split` for a large block: `remaining > kSmallSize`). The lowest such
/// offset that no live block straddles, and that leaves none or more than 1 MiB of a free gap
/// below it (which carving gives back to the block before it otherwise); else the lowest
/// inside a live block; `None` where there is none (the layout is carved
/// from the cached segment, as any other, and comes out approximate).
fn oversize_split(
    allocator: &CachingAllocator,
    segment: &StartSegment,
    pieces: &[Piece],
) -> Option<u64> {
    let max_split_size = allocator.config().max_split_size;
    if segment.pool != Pool::Large || segment.size < max_split_size {
        return None;
    }
    let size = segment.size;
    let made_it = |at: u64| {
        at < max_split_size
            && size.saturating_sub(at) > SMALL_SIZE
            && allocator.allocation_size(at) == size
    };
    let granule = crate::alloc::MIN_BLOCK_SIZE;
    // The lowest offset inside `piece` whose allocation is the segment's (it grows with the
    // offset): found by halving, in whole blocks.
    let lowest_inside = |piece: &Piece| {
        let end = piece.offset + piece.len;
        let (mut low, mut high) = (piece.offset / granule + 1, end.div_ceil(granule));
        while low < high {
            let middle = low + (high - low) / 2;
            if allocator.allocation_size(middle * granule) >= size {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        low * granule
    };
    for piece in pieces {
        let end = piece.offset + piece.len;
        if matches!(piece.role, Role::Gap) {
            // The part of the gap below the cut is carved after the block before it, from
            // the prefix's block once freed: 1 MiB or less would stay in that block (a large
            // block's remainder is split off only above 1 MiB), so the cut leaves more.
            let at = lowest_inside(piece).max(piece.offset + SMALL_SIZE + granule);
            if at < end && made_it(at) {
                return Some(at);
            }
        }
        if end < size && made_it(end) {
            return Some(end);
        }
    }
    // Every such offset lies inside a live block: the blocks made since merged the request's
    // boundary away. The block is carved in two parts, one on each side, joined again when
    // it is asked for with its own request (`carve_group`); its lower part, carved last from
    // the prefix, is more than 1 MiB, as a gap's, else the piece before would keep it.
    pieces
        .iter()
        .filter(|piece| matches!(piece.role, Role::Block(..)))
        .map(|piece| {
            let at = lowest_inside(piece).max(piece.offset + SMALL_SIZE + granule);
            (at, piece.offset + piece.len)
        })
        .find(|&(at, end)| at < end && made_it(at))
        .map(|(at, _)| at)
}

/// `pieces` with the one that spans `at` (a free gap, or a live block) cut in two there.
fn split_at(pieces: Vec<Piece>, at: u64) -> Vec<Piece> {
    let mut cut = Vec::with_capacity(pieces.len() + 1);
    for piece in pieces {
        let end = piece.offset + piece.len;
        if piece.offset < at && at < end {
            cut.push(Piece {
                len: at - piece.offset,
                ..piece
            });
            cut.push(Piece {
                offset: at,
                len: end - at,
                role: piece.role,
            });
        } else {
            cut.push(piece);
        }
    }
    cut
}

/// The live block of a `cudaMalloc` segment that spans it whole and whose request makes a
/// segment of its size: PyTorch's `alloc_block` hands a new segment to the request that made
/// it, the remainder it could not split off left in the block (1 MiB or less, or any
/// remainder of an oversize block, which is never split). Such a segment is made the same way:
/// carved and asked for again, its block's request could not take it back from the cache when
/// it is smaller than `max_split_size_mb` and the block is not.
fn made_for_its_block<'a>(
    allocator: &CachingAllocator,
    segment: &'a StartSegment,
) -> Option<&'a StartBlock> {
    let [block] = segment.blocks.as_slice() else {
        return None;
    };
    (block.addr == segment.addr
        && block.size == segment.size
        && allocator.allocation_size(allocator.round_size(block.requested)) == segment.size)
        .then_some(block)
}

/// Makes `segment` with its one block's request, at the recorded address (through `hints`);
/// `false` when the device ran out of memory.
fn make_for_its_block(
    allocator: &mut CachingAllocator,
    segment: &StartSegment,
    block: &StartBlock,
    hints: Option<&Hints>,
    seeded: &mut Seeded,
) -> Result<bool, String> {
    let made = at_recorded_address(hints, segment, || {
        allocator.malloc_on(segment.stream, block.requested)
    });
    let Some(allocation) = unless_out_of_memory(made)? else {
        return Ok(false);
    };
    if allocation.size != segment.size {
        seeded.mismatches += 1;
    }
    seeded.live.push(SeededBlock {
        addr: block.addr,
        allocation,
        requested: block.requested,
        free_requested: block.free_requested,
    });
    Ok(true)
}

/// Runs `make` (the malloc that makes `segment`) with the placement hint that puts the new
/// segment at its recorded address, when the replay places segments as recorded.
fn at_recorded_address<T>(
    hints: Option<&Hints>,
    segment: &StartSegment,
    make: impl FnOnce() -> T,
) -> T {
    if let Some(hints) = hints {
        hints.clear();
        hints.push(segment.addr, segment.size);
    }
    let made = make();
    if let Some(hints) = hints {
        hints.clear();
    }
    made
}

/// A malloc's allocation; `None` when the device ran out of memory; any other failure as the
/// error it is.
fn unless_out_of_memory(
    made: Result<Allocation, AllocError>,
) -> Result<Option<Allocation>, String> {
    match made {
        Ok(allocation) => Ok(Some(allocation)),
        Err(AllocError::OutOfMemory(_)) => Ok(None),
        Err(other) => Err(alloc_error(other)),
    }
}

/// The size of the segment `allocation` begins.
fn segment_size_at(allocator: &CachingAllocator, allocation: &Allocation) -> Option<u64> {
    allocator
        .segments()
        .find(|&(addr, _, _)| addr == allocation.ptr.addr())
        .map(|(_, size, _)| size)
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
    let pieces = pieces(group);
    let mut base = None;
    // The segment, when its first piece's request makes it (below).
    let mut made_by_first_piece = None;
    if !group.expandable {
        let Some(segment) = group.segments.first() else {
            return Ok(Some(carved));
        };
        if let Some(block) = made_for_its_block(allocator, segment) {
            return make_for_its_block(allocator, segment, block, hints, seeded)
                .map(|made| made.then_some(carved));
        }
        // A cached segment of at least max_split_size_mb serves no smaller request
        // (get_free_block keeps oversize blocks for oversize requests), so its pieces cannot
        // be carved from it once made and freed. When its first piece is smaller, the
        // segment is made by that piece's request, as PyTorch made it for the request whose
        // block it split; the next pieces come from the remainder.
        let max_split_size = allocator.config().max_split_size;
        if segment.size >= max_split_size
            && pieces.first().is_some_and(|first| {
                first.len < max_split_size && allocator.allocation_size(first.len) == segment.size
            })
        {
            made_by_first_piece = Some(*segment);
        }
    }
    // Otherwise, an oversize segment is made by a request that ends inside it, as PyTorch
    // made it for a request whose block it split: where that request's block lay is carved
    // after the remainder, from the block once it is freed (smaller than the segment, it
    // serves smaller requests).
    let made_by_prefix = match (
        group.expandable,
        made_by_first_piece,
        group.segments.first(),
    ) {
        (false, None, Some(segment)) => {
            oversize_split(allocator, segment, &pieces).map(|split| (segment, split))
        }
        _ => None,
    };
    let pieces = match made_by_prefix {
        Some((_, split)) => split_at(pieces, split),
        None => pieces,
    };
    let mut prefix = None;
    if let (false, None, Some(segment)) = (
        group.expandable,
        made_by_first_piece,
        group.segments.first(),
    ) {
        let made = at_recorded_address(hints, segment, || match made_by_prefix {
            Some((_, split)) => allocator.malloc_unrounded_on(stream, split, group.pool),
            None => allocator.malloc_on(stream, creating_request(allocator, segment)),
        });
        let Some(made) = unless_out_of_memory(made)? else {
            return Ok(None);
        };
        if segment_size_at(allocator, &made) != Some(segment.size) {
            seeded.mismatches += 1;
        }
        base = Some(made.ptr.addr());
        match made_by_prefix {
            Some(_) => prefix = Some(made),
            None => allocator.free(made).map_err(alloc_error)?,
        }
    }
    // The remainder's pieces first where a prefix made the segment; then, the prefix freed,
    // its own.
    let split = made_by_prefix.map_or(0, |(_, split)| split);
    let (below, above): (Vec<Piece>, Vec<Piece>) =
        pieces.into_iter().partition(|piece| piece.offset < split);
    for (pass, pieces) in [above, below].into_iter().enumerate() {
        if pass == 1 {
            if let Some(made) = prefix.take() {
                allocator.free(made).map_err(alloc_error)?;
            }
        }
        for piece in pieces {
            let first = made_by_first_piece.take();
            let malloc = |allocator: &mut CachingAllocator| {
                allocator.malloc_unrounded_on(stream, piece.len, group.pool)
            };
            let made = match first {
                Some(segment) => at_recorded_address(hints, segment, || malloc(allocator)),
                None => malloc(allocator),
            };
            let Some(allocation) = unless_out_of_memory(made)? else {
                if let Some(made) = prefix.take() {
                    allocator.free(made).map_err(alloc_error)?;
                }
                return give_back(allocator, carved);
            };
            if let Some(segment) = first {
                if segment_size_at(allocator, &allocation) != Some(segment.size) {
                    seeded.mismatches += 1;
                }
            }
            let at = allocation.ptr.addr();
            let base = *base.get_or_insert(at.wrapping_sub(piece.offset));
            if at != base.wrapping_add(piece.offset) || allocation.size != piece.len {
                seeded.mismatches += 1;
            }
            carved.push((allocation, piece.role));
        }
    }
    carved.sort_by_key(|(allocation, _)| allocation.ptr.addr());
    // Each live block's piece, freed and asked for again with the block's request: from the
    // highest down, so the free space a request splits off a piece (a tail of 1 MiB or less
    // joined to it) never lies next to a piece freed after it.
    let mut kept = Vec::with_capacity(carved.len());
    let mut carved = carved.into_iter().rev().peekable();
    while let Some((allocation, role)) = carved.next() {
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
        // A block carved in two parts (an oversize segment's cut inside it) is freed whole.
        let mut lowest = allocation.ptr;
        while let Some((part, _)) = carved.next_if(|&(_, next)| next == role) {
            allocator.free(part).map_err(alloc_error)?;
            lowest = part.ptr;
        }
        let again = allocator
            .malloc_on(stream, block.requested)
            .map_err(alloc_error)?;
        if again.ptr != lowest {
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
            returned_at: None,
            size_known: true,
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
                segments: vec![small_segment(
                    base,
                    u64::MAX,
                    expandable,
                    vec![block(base + 1536, 512, 300)],
                )],
            };
            let conf = AllocConf {
                expandable_segments: expandable,
                ..AllocConf::default()
            };
            let mut allocator =
                CachingAllocator::new(Box::new(SimDevice::new(1 << 34)), conf).expect("allocator");
            let seeded = seed(&mut allocator, &start, None, HeldBy::AnotherConfig).expect("seeds");
            assert!(seeded.compact);
            assert_eq!(seeded.live.len(), 1);
        }
    }

    /// A 20 MiB segment of the default large pool on stream 0.
    fn large_segment(addr: u64, expandable: bool, blocks: Vec<StartBlock>) -> StartSegment {
        StartSegment {
            addr,
            size: 20 * MIB,
            stream: 0,
            pool: Pool::Large,
            expandable,
            owner: MemPoolId::default(),
            blocks,
            unmapped_below: 0,
        }
    }

    /// A default-pool segment of the small pool on stream 0, of `size` bytes.
    fn small_segment(
        addr: u64,
        size: u64,
        expandable: bool,
        blocks: Vec<StartBlock>,
    ) -> StartSegment {
        StartSegment {
            size,
            pool: Pool::Small,
            ..large_segment(addr, expandable, blocks)
        }
    }

    /// Each segment's blocks as (offset, size, allocated).
    fn layout_of(allocator: &CachingAllocator) -> Vec<SegmentLayout> {
        allocator
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
            .collect()
    }

    fn allocator_with(conf: &str, total: u64) -> (CachingAllocator, Hints) {
        let hints = Hints::default();
        let device = super::super::device::ReplayDevice::new(SimDevice::new(total), hints.clone());
        let conf = AllocConf::parse(conf).expect("config");
        let allocator = CachingAllocator::new(Box::new(device), conf).expect("allocator");
        (allocator, hints)
    }

    /// `start` seeded into a fresh allocator under `conf` on a 16 GiB device, placed as
    /// recorded: the allocator and what was seeded, once the layout is checked to be exact.
    fn carved_exactly(conf: &str, start: &StartState, held: HeldBy) -> (CachingAllocator, Seeded) {
        let (mut allocator, hints) = allocator_with(conf, 1 << 34);
        let seeded = seed(&mut allocator, start, Some(&hints), held).expect("seeds");
        assert_eq!(seeded.layout(), Layout::Exact);
        (allocator, seeded)
    }

    /// Under `roundup_power2_divisions:4` no request rounds to 5.5 MiB (requests between 4
    /// and 8 MiB round to whole MiB), yet a recorded segment's free space between two blocks
    /// may be that wide: the pieces are carved at their exact sizes, and the blocks still
    /// carry their own requests.
    #[test]
    fn free_space_no_request_rounds_to_is_carved_under_power2_divisions() {
        let base = 0x7f00_0000_0000;
        let start = StartState {
            segments: vec![large_segment(
                base,
                false,
                vec![
                    block(base, 3 * MIB, 3 * MIB - 100),
                    block(base + 8 * MIB + MIB / 2, 4 * MIB, 4 * MIB),
                ],
            )],
        };
        let (allocator, _) =
            carved_exactly("roundup_power2_divisions:4", &start, HeldBy::AnotherConfig);
        assert_eq!(
            layout_of(&allocator),
            [(
                base,
                vec![
                    (0, 3 * MIB, true),
                    (3 * MIB, 5 * MIB + MIB / 2, false),
                    (8 * MIB + MIB / 2, 4 * MIB, true),
                    (12 * MIB + MIB / 2, 7 * MIB + MIB / 2, false),
                ]
            )]
        );
        assert_eq!(
            allocator.stats().requested_bytes.all.current,
            (7 * MIB - 100) as i64
        );
    }

    /// An expandable segment's start state: two mapped ranges with unmapped pages between.
    /// Carving maps those pages for a moment, beyond a memory fraction the recorded process
    /// stayed within; the start state is still carved as recorded. Under a smaller fraction
    /// (a what-if) it holds more than allowed, and its blocks are allocated again under the
    /// cap instead, those that do not fit failing; the recorded run's own state is kept.
    #[test]
    fn a_start_state_at_the_fractions_cap_is_carved_as_recorded() {
        let total: u64 = 1 << 34;
        let start = |base: u64| StartState {
            segments: [0, 40 * MIB]
                .into_iter()
                .map(|offset| {
                    large_segment(
                        base + offset,
                        true,
                        vec![block(base + offset, 16 * MIB, 16 * MIB)],
                    )
                })
                .collect(),
        };
        let base = 0x7f00_0000_0000;
        // The start state seeded on an allocator capped at `cap` bytes.
        let seeded_under = |cap: u64, held: HeldBy| {
            let conf = format!(
                "expandable_segments:True,per_process_memory_fraction:{}",
                cap as f64 / total as f64
            );
            let (mut allocator, hints) = allocator_with(&conf, total);
            let before = allocator.allowed_memory_maximum();
            let seeded = seed(&mut allocator, &start(base), Some(&hints), held).expect("seeds");
            assert_eq!(
                allocator.allowed_memory_maximum(),
                before,
                "the cap is restored"
            );
            (seeded, allocator.total_allocated_memory())
        };

        let (seeded, mapped) = seeded_under(41 * MIB, HeldBy::AnotherConfig);
        assert_eq!(seeded.layout(), Layout::Exact);
        assert!(seeded.failed.is_empty());
        assert_eq!(mapped, 40 * MIB);

        let (seeded, mapped) = seeded_under(30 * MIB, HeldBy::AnotherConfig);
        assert_eq!(seeded.layout(), Layout::Compact);
        assert_eq!(seeded.failed.len(), 1);
        assert!(mapped <= 30 * MIB);

        // The recorded run itself held it (its fraction set after it had reserved more, or
        // memory its cap does not count): kept as carved.
        let (seeded, mapped) = seeded_under(30 * MIB, HeldBy::TheRecordedRun);
        assert_eq!(seeded.layout(), Layout::Exact);
        assert_eq!(mapped, 40 * MIB);
    }

    /// Next to unmapped pages (of 20 MiB in the large pool) an expandable segment may hold a
    /// free block of 1 MiB or less, which a request of its size would take from the small
    /// pool: it is carved from the large pool all the same.
    #[test]
    fn a_large_pool_piece_of_one_mib_is_carved_from_the_large_pool() {
        let base = 0x7f00_0000_0000;
        let start = StartState {
            segments: vec![
                large_segment(base, true, vec![block(base, 16 * MIB, 16 * MIB)]),
                large_segment(
                    base + 40 * MIB,
                    true,
                    vec![block(base + 41 * MIB, 16 * MIB, 16 * MIB)],
                ),
            ],
        };
        let (allocator, _) =
            carved_exactly("expandable_segments:True", &start, HeldBy::AnotherConfig);
        let offsets: Vec<Vec<(u64, u64, bool)>> = layout_of(&allocator)
            .into_iter()
            .map(|(_, blocks)| blocks)
            .collect();
        assert_eq!(
            offsets,
            [
                vec![(0, 16 * MIB, true), (16 * MIB, 4 * MIB, false)],
                vec![
                    (0, MIB, false),
                    (MIB, 16 * MIB, true),
                    (17 * MIB, 3 * MIB, false)
                ],
            ]
        );
        assert_eq!(allocator.stats().reserved_bytes.small.current, 0);
    }

    /// Segments of private pools at the trace's start (a CUDA graph's, and a `MemPool`'s two:
    /// `cudaMalloc` segments, or with expandable segments two mapped ranges with unmapped
    /// pages between) are carved in their pools, each created with one lasting use; the
    /// pages between the ranges are unmapped again although the pool is in use.
    #[test]
    fn private_pools_segments_are_carved_in_their_pools() {
        let base = 0x7f00_0000_0000;
        let graph = MemPoolId::new(1, 0);
        let mem_pool = MemPoolId::new(0, 1);
        let segment = |addr: u64, expandable: bool, owner: MemPoolId| StartSegment {
            owner,
            ..large_segment(
                addr,
                expandable,
                vec![block(addr + 2 * MIB, 8 * MIB, 8 * MIB)],
            )
        };
        for expandable in [false, true] {
            let start = StartState {
                segments: vec![
                    segment(base, expandable, graph),
                    segment(base + 64 * MIB, expandable, mem_pool),
                    segment(base + 104 * MIB, expandable, mem_pool),
                ],
            };
            let conf = if expandable {
                "expandable_segments:True"
            } else {
                ""
            };
            let (mut allocator, hints) = allocator_with(conf, 1 << 34);
            let seeded =
                seed(&mut allocator, &start, Some(&hints), HeldBy::AnotherConfig).expect("seeds");
            assert_eq!(seeded.layout(), Layout::Exact, "expandable {expandable}");
            assert_eq!(seeded.pools, [graph, mem_pool]);
            assert_eq!(allocator.pool_use_count(graph), Some(1));
            assert_eq!(allocator.pool_use_count(mem_pool), Some(1));
            let owners: Vec<(u64, MemPoolId)> = allocator
                .segment_snapshots()
                .iter()
                .map(|segment| (segment.total_size, segment.segment_pool_id))
                .collect();
            assert_eq!(
                owners,
                [
                    (20 * MIB, graph),
                    (20 * MIB, mem_pool),
                    (20 * MIB, mem_pool)
                ],
                "expandable {expandable}"
            );
            assert_eq!(
                allocator.stats().reserved_bytes.all.current,
                (60 * MIB) as i64
            );
        }
    }

    /// Under `max_split_size_mb:40`, a 40 MiB segment made by a request of 38 to 39 MiB (the
    /// allocation is 40 MiB, and more than 1 MiB was left to split off) whose last live block,
    /// 37.5 to 40 MiB (1.5 MiB asked for, its 1 MiB tail left unsplit), covers every offset
    /// where that request could have ended: the cut goes inside it, 1 MiB and more from its
    /// start, and the layout comes out exact.
    #[test]
    fn an_oversize_segment_is_cut_inside_a_live_block_where_it_must() {
        let base = 0x7f00_0000_0000;
        let half = MIB / 2;
        let start = StartState {
            segments: vec![StartSegment {
                size: 40 * MIB,
                ..large_segment(
                    base,
                    false,
                    vec![
                        block(base + 32 * MIB, 2 * MIB, 2 * MIB),
                        block(base + 34 * MIB, 3 * MIB + half, 3 * MIB + half),
                        block(base + 37 * MIB + half, 2 * MIB + half, MIB + half),
                    ],
                )
            }],
        };
        let (allocator, _) = carved_exactly("max_split_size_mb:40", &start, HeldBy::TheRecordedRun);
        assert_eq!(
            layout_of(&allocator),
            [(
                base,
                vec![
                    (0, 32 * MIB, false),
                    (32 * MIB, 2 * MIB, true),
                    (34 * MIB, 3 * MIB + half, true),
                    (37 * MIB + half, 2 * MIB + half, true),
                ]
            )]
        );
    }

    #[test]
    fn a_start_state_is_carved_as_recorded() {
        let base = 0x7f00_0000_0000;
        let start = StartState {
            segments: vec![
                large_segment(
                    base,
                    false,
                    vec![
                        block(base + 2 * MIB, 3 * MIB, 3 * MIB - 100),
                        block(base + 12 * MIB, 8 * MIB, 8 * MIB),
                    ],
                ),
                small_segment(
                    base + 64 * MIB,
                    2 * MIB,
                    false,
                    vec![block(base + 64 * MIB + 1536, 512, 300)],
                ),
            ],
        };
        let (allocator, seeded) = carved_exactly("", &start, HeldBy::AnotherConfig);
        assert_eq!(seeded.live.len(), 3);
        let layout = layout_of(&allocator);
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
