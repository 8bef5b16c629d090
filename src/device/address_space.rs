//! Where the H200's driver places segments in the virtual address space: `cudaMalloc`'s
//! chunks and `cuMemAddressReserve`'s ranges, modelled from recorded PyTorch traces
//! (../shared/reference/cuda-address-placement.md) and checked against sequences of
//! `cuMemAlloc`/`cuMemFree` played on the H200 (tests/gpu/placement; the tests of
//! `driver_tests` below). The simulated device places its segments
//! with it; a what-if replay runs two more copies in a recording's own addresses
//! (`snapshot::replay::mirror`): one that follows the recording and learns from it the memory
//! no allocator event shows ([`AddressSpace::adopt`]), and one that places the replay's
//! segments knowing that memory.
//!
//! Only relative placement matters to the allocator: which of two equal free blocks has the
//! lower address decides a best-fit tie.

use std::collections::{BTreeMap, BTreeSet};

const MIB: u64 = 1 << 20;

/// The driver reserves virtual address space in chunks of multiples of 32 MiB.
const VA_CHUNK: u64 = 32 * MIB;
/// The largest segment the driver puts in the same chunks as any other: a chunk opened for a
/// segment of at most this size (PyTorch's small-pool segment, `kSmallBuffer`, 2 MiB) takes
/// no larger one, while small segments go into any chunk with room. This is a rule for a
/// job's process, not the bare driver's: played alone, the driver puts a 20 MiB segment in
/// the 30 MiB left of a chunk opened for a 2 MiB one (tests/gpu/placement, `designed/T4`). Jobs'
/// recordings behave as if such room were held by memory of others the trace does not show
/// (library workspaces, loaded kernels): on the what-if recordings (tests/gpu/whatif/results
/// and results-frac, 15,699 segments) the model, given the state before each recorded
/// `segment_alloc` (`AddressSpace::adopt`), puts 75.9% of them where the driver did with this
/// rule, against 65.3% without it; every fitted trace of tests/pytorch_traces.rs still places
/// as recorded (a 2 MiB segment there lands at the free tail of a 660 MiB segment's chunk).
const SMALL_SEGMENT: u64 = 2 * MIB;
/// The top of the virtual address window segments are placed in (as seen in the recorded
/// traces; only relative placement matters).
pub(super) const VA_TOP: u64 = 0x7FAA_DA00_0000;
/// The bottom of the window: addresses below it are never handed out.
pub(super) const VA_FLOOR: u64 = 1 << 32;
/// Address space below the top that is taken before the first `cudaMalloc` in a PyTorch
/// process on the H200 (context, modules), except two ranges described in
/// `AddressSpace::below`.
pub(super) const VA_PRETAKEN: u64 = 512 * MIB;
/// Where the first 2 MiB segment of a PyTorch process lands, below the window's top: the
/// bottom of the first range free at the start (`AddressSpace::below`).
const FIRST_SMALL_DEPTH: u64 = 98 * MIB;
/// The top of the range above it that is taken at the start, below the window's top.
const PRETAKEN_MIDDLE_TOP: u64 = 24 * MIB;
/// Where the H200's driver put the first range reserved for an expandable segment in a PyTorch
/// process (`cuMemAddressReserve`, measured: tests/fixtures/pytorch-traces/
/// traces_expandable_addr.json.gz); later ranges go above it (see
/// [`AddressSpace::place_reservation`]).
pub(super) const VMM_FLOOR: u64 = 0x3_0200_0000;
/// Reserved ranges start on 32 MiB boundaries (measured: each new range began at the first
/// 32 MiB boundary past the end of the range below it).
pub(super) const VMM_ALIGN: u64 = 32 * MIB;

/// One range of virtual address space the driver reserved, from which segments are carved.
#[derive(Debug, Clone)]
struct Chunk {
    base: u64,
    size: u64,
    /// Addresses at or above this (up to `base + size`) were never used since the chunk's
    /// segments last shrank back.
    bump: u64,
    /// Segments in the chunk, and memory of others held in it: address → size.
    segments: BTreeMap<u64, u64>,
    /// Ranges present before the process's first allocation never return to free space.
    persistent: bool,
    /// Opened for a segment of at most [`SMALL_SEGMENT`] bytes: it takes no larger one (unless
    /// a recording showed one in it, `AddressSpace::large_seen`).
    for_small: bool,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.base + self.size
    }

    fn holds(&self, address: u64, size: u64) -> bool {
        address >= self.base && address.saturating_add(size) <= self.end()
    }

    /// Whether the driver tries this chunk for a segment of `size` bytes: a chunk opened for
    /// a small segment takes no large one, unless `large_seen` (addresses where a recording
    /// showed large segments) puts one inside it. The ranges present at the start take any.
    fn takes(&self, size: u64, large_seen: &BTreeSet<u64>) -> bool {
        self.persistent
            || !self.for_small
            || size <= SMALL_SEGMENT
            || large_seen.range(self.base..self.end()).next().is_some()
    }

    /// Where a segment of `size` fits in this chunk, if anywhere: best fit over the chunk's
    /// free ranges — each hole below the bump and the unused tail above it — the smallest
    /// that holds the segment, the lowest of equal ones; the segment goes at its bottom.
    ///
    /// Measured on the H200 (tests/gpu/placement: 302 sequences of `cuMemAlloc`/`cuMemFree`
    /// played against the driver): with this rule the model puts all 14,817 segments where
    /// the driver did, against 98.6% when the tail comes first and then the lowest hole. Two
    /// designed sequences tell the rules apart: a 20 MiB request goes into a freed 20 MiB
    /// hole above a 28 MiB hole made of two adjacent 14 MiB frees, but into that 28 MiB hole
    /// when the one above is 30 MiB; so holes are merged and the smallest wins.
    fn place(&self, size: u64) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        let mut consider = |length: u64, address: u64| {
            if length >= size && best.is_none_or(|(shortest, _)| length < shortest) {
                best = Some((length, address));
            }
        };
        let mut cursor = self.base;
        for (&address, &length) in &self.segments {
            if address >= self.bump {
                break;
            }
            consider(address - cursor, cursor);
            cursor = address + length;
        }
        consider(self.end() - self.bump, self.bump);
        best.map(|(_, address)| address)
    }

    /// The bump after a segment left: where the highest remaining one ends.
    fn settle_bump(&mut self) {
        self.bump = self
            .segments
            .iter()
            .next_back()
            .map_or(self.base, |(&start, &length)| start + length);
    }
}

/// A change to the memory of others an address space knows (learnt from a recording by
/// [`AddressSpace::adopt`], passed on to another with [`AddressSpace::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Others {
    /// Something outside the allocator holds `[address, address + size)`.
    Hold { address: u64, size: u64 },
    /// It let that range go: a segment was placed across it.
    Release { address: u64, size: u64 },
    /// A large segment is at `address`, in a chunk the model took for one opened for a small
    /// segment: the chunk there was opened otherwise (e.g. for pinned host memory, which the
    /// trace does not show) and takes large segments.
    Large { address: u64 },
    /// The chunk `[base, base + size)`, which the model let go when its last segment was
    /// freed, was kept by the driver: others' memory in the room its segments left (a kernel
    /// module or library workspace placed there, which no trace shows) held it.
    Kept { base: u64, size: u64 },
}

/// The driver's virtual address placement, modelled from the recorded H200 traces
/// (see docs in the repository's reference notes): chunks of `roundup(size, 32 MiB)` packed
/// top-down, the most recently created chunk tried first, best fit inside a chunk
/// ([`Chunk::place`]).
#[derive(Debug, Clone)]
pub(crate) struct AddressSpace {
    /// The top of the window.
    top: u64,
    /// Chunks in creation order.
    chunks: Vec<Chunk>,
    /// Ranges used by others outside any chunk (base, size).
    taken: Vec<(u64, u64)>,
    /// Addresses of chunk entries that are others' memory, not segments.
    others: BTreeSet<u64>,
    /// Virtual ranges reserved with `cuMemAddressReserve`: base → size.
    reservations: BTreeMap<u64, u64>,
    /// Every range in use (`taken`, the chunks, the reservations) by (base, kind) → size, kept
    /// as they change, so that finding a gap costs no sort (a replay may hold thousands of
    /// chunks and asks at every new one).
    used: BTreeMap<(u64, Used), u64>,
    /// Addresses where a recording showed a large segment in a chunk the model took for one
    /// opened for a small segment ([`Others::Large`]): a chunk holding one takes large ones.
    large_seen: BTreeSet<u64>,
    /// Chunks let go when their last segment was freed, newest last, with where their
    /// segments had ended (`(base, size, used_end)`), while some room was left above that
    /// (room others' memory could have held them by, [`Others::Kept`]). At most
    /// [`RELEASED_KEPT`].
    released: Vec<(u64, u64, u64)>,
}

/// How many released chunks [`AddressSpace::adopt`] remembers: a recording reveals a chunk
/// the driver kept at its next placement there, soon after (an `empty_cache()` releases a few
/// dozen at once).
const RELEASED_KEPT: usize = 256;

/// Which kind of range an entry of `AddressSpace::used` is (two kinds may share a base).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Used {
    Taken,
    Chunk,
    Reservation,
}

impl AddressSpace {
    /// The address space of a fresh PyTorch process on the H200, at the measured addresses.
    pub(crate) fn new() -> Self {
        Self::fresh_below(VA_TOP)
    }

    /// The same at another window's `top`, e.g. a recorded process's; `None` for a top the
    /// window cannot end at (not on a 2 MiB boundary, or too low to hold a process's start).
    pub(crate) fn below(top: u64) -> Option<Self> {
        let plausible =
            top.is_multiple_of(2 * MIB) && (VA_FLOOR + (1 << 30)..=1 << 57).contains(&top);
        plausible.then(|| Self::fresh_below(top))
    }

    fn fresh_below(top: u64) -> Self {
        // In a PyTorch process the top 512 MiB are already in use except two ranges that
        // behave as older chunks with nothing above their bump: [top-98, top-96) MiB, tried
        // first, and [top-24, top) MiB. Below the first, [top-512, top-98) is a chunk of its
        // own that a library holds at first: the what-if recordings
        // (tests/gpu/whatif/results) show that range free from a job's first cuBLAS or cuDNN
        // call on, which no allocator event marks (a replay learns it from its recording,
        // `Others::Release`). The 2 MiB range above it is a chunk of its own, tried before it
        // (under best fit a free range that ends at the 2 MiB segment weighs the same as the
        // range's free top or as a hole, so only that order depends on it).
        let older = Chunk {
            base: top - PRETAKEN_MIDDLE_TOP,
            size: PRETAKEN_MIDDLE_TOP,
            bump: top - PRETAKEN_MIDDLE_TOP,
            segments: BTreeMap::new(),
            persistent: true,
            for_small: false,
        };
        let held_base = top - VA_PRETAKEN;
        let held_size = VA_PRETAKEN - FIRST_SMALL_DEPTH;
        let held = Chunk {
            base: held_base,
            size: held_size,
            bump: held_base + held_size,
            segments: BTreeMap::from([(held_base, held_size)]),
            persistent: true,
            for_small: false,
        };
        let first_small = Chunk {
            base: top - FIRST_SMALL_DEPTH,
            size: 2 * MIB,
            bump: top - FIRST_SMALL_DEPTH,
            segments: BTreeMap::new(),
            persistent: true,
            for_small: true,
        };
        let taken = vec![(
            top - FIRST_SMALL_DEPTH + 2 * MIB,
            FIRST_SMALL_DEPTH - 2 * MIB - PRETAKEN_MIDDLE_TOP,
        )];
        let mut space = AddressSpace {
            top,
            chunks: Vec::new(),
            taken: Vec::new(),
            others: BTreeSet::from([held_base]),
            reservations: BTreeMap::new(),
            used: BTreeMap::new(),
            large_seen: BTreeSet::new(),
            released: Vec::new(),
        };
        for chunk in [older, held, first_small] {
            space.used.insert((chunk.base, Used::Chunk), chunk.size);
            space.chunks.push(chunk);
        }
        for (base, size) in taken {
            space.take(base, size);
        }
        space
    }

    /// Others hold `[base, base + size)` outside every chunk.
    fn take(&mut self, base: u64, size: u64) {
        self.taken.push((base, size));
        self.used.insert((base, Used::Taken), size);
    }

    /// Lets go of the ranges of `taken` that `release` picks; returns them.
    fn untake(&mut self, release: impl Fn(u64, u64) -> bool) -> Vec<(u64, u64)> {
        let mut released = Vec::new();
        self.taken.retain(|&(base, size)| {
            let gone = release(base, size);
            if gone {
                released.push((base, size));
            }
            !gone
        });
        for &(base, _) in &released {
            if !self.taken.iter().any(|&(other, _)| other == base) {
                self.used.remove(&(base, Used::Taken));
            }
        }
        released
    }

    /// The top of the window.
    pub(crate) fn top(&self) -> u64 {
        self.top
    }

    /// The chunk of address space the driver reserves for a segment of `size` bytes that fits
    /// in no chunk it holds: `roundup(size, 32 MiB)`, the segment at its bottom.
    pub(crate) fn chunk_for(size: u64) -> u64 {
        size.div_ceil(VA_CHUNK).saturating_mul(VA_CHUNK)
    }

    /// How far below its window's top a fresh process puts its first segment of `size` bytes:
    /// where a recording's window ends, from its first `segment_alloc`.
    pub(crate) fn first_segment_depth(size: u64) -> Option<u64> {
        let address = AddressSpace::new().allocate(size)?;
        Some(VA_TOP - address)
    }

    /// Every range in use (pre-taken, `cudaMalloc` chunks, reservations), lowest first.
    fn used_ranges(&self) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        self.used.iter().map(|(&(base, _), &size)| (base, size))
    }

    /// Where `cuMemAddressReserve` puts a range of `size` bytes, and records it there; `None`
    /// when the window has no room.
    ///
    /// Measured on the H200 (driver 580) in PyTorch processes with `expandable_segments:True`
    /// (tests/fixtures/pytorch-traces/traces_expandable_addr.json.gz, 6 traces): ranges are
    /// placed bottom-up, first fit: the lowest address from [`VMM_FLOOR`] on, on a
    /// [`VMM_ALIGN`] boundary, where the range fits below everything above it — far below the
    /// `cudaMalloc` window, which is filled top-down. A range freed earlier is reused by the
    /// next reservation that fits in it. This order matters to the allocator: PyTorch maps
    /// into the lowest-addressed expandable segment with room, so where a range left reserved
    /// by a failed request lands decides which segment later allocations grow.
    pub(super) fn place_reservation(&mut self, size: u64, align: u64) -> Option<u64> {
        let align = align.max(VMM_ALIGN);
        let mut candidate = VMM_FLOOR.div_ceil(align) * align;
        for (base, length) in self.used_ranges() {
            let end = base.checked_add(length)?;
            if end <= candidate {
                continue;
            }
            if base >= candidate.checked_add(size)? {
                break;
            }
            candidate = end.div_ceil(align).checked_mul(align)?;
        }
        if candidate.checked_add(size)? > self.top {
            return None;
        }
        self.reservations.insert(candidate, size);
        self.used.insert((candidate, Used::Reservation), size);
        Some(candidate)
    }

    /// Forgets the reservation at `base`; `false` unless it exists with exactly `size` bytes.
    pub(super) fn free_reservation(&mut self, base: u64, size: u64) -> bool {
        if self.reservations.get(&base) != Some(&size) {
            return false;
        }
        self.reservations.remove(&base);
        self.used.remove(&(base, Used::Reservation));
        true
    }

    /// The reservation holding `[address, address + size)`, as (base, size).
    pub(super) fn reservation_holding(&self, address: u64, size: u64) -> Option<(u64, u64)> {
        let (&base, &length) = self.reservations.range(..=address).next_back()?;
        (address.checked_add(size)? <= base + length).then_some((base, length))
    }

    /// Places a segment of `size` bytes; `None` when the address window has no room left.
    pub(crate) fn allocate(&mut self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        for chunk in self.chunks.iter_mut().rev() {
            if !chunk.takes(size, &self.large_seen) {
                continue;
            }
            if let Some(address) = chunk.place(size) {
                chunk.segments.insert(address, size);
                chunk.bump = chunk.bump.max(address + size);
                return Some(address);
            }
        }
        let chunk_size = size.div_ceil(VA_CHUNK).checked_mul(VA_CHUNK)?;
        let base = self.highest_gap(chunk_size)? - chunk_size;
        self.open_chunk(base, chunk_size, size);
        Some(base)
    }

    fn open_chunk(&mut self, base: u64, chunk_size: u64, size: u64) {
        self.used.insert((base, Used::Chunk), chunk_size);
        self.chunks.push(Chunk {
            base,
            size: chunk_size,
            bump: base + size,
            segments: BTreeMap::from([(base, size)]),
            persistent: false,
            for_small: size <= SMALL_SEGMENT,
        });
    }

    /// The top of the highest free gap strictly larger than `size`, if any.
    fn highest_gap(&self, size: u64) -> Option<u64> {
        self.gaps()
            .find(|&(base, top)| top - base > size)
            .map(|(_, top)| top)
    }

    /// The free gaps between used ranges, highest first, as (base, top); the lowest ends at
    /// the window's floor.
    fn gaps(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut used = self.used_ranges().rev();
        let mut gap_top = self.top;
        let mut floor_given = false;
        std::iter::from_fn(move || {
            for (base, length) in used.by_ref() {
                let end = base.saturating_add(length);
                let top = gap_top;
                gap_top = gap_top.min(base);
                if top > end {
                    return Some((end, top));
                }
            }
            if !floor_given && gap_top > VA_FLOOR {
                floor_given = true;
                return Some((VA_FLOOR, gap_top));
            }
            None
        })
    }

    /// Frees the segment at `address`; `false` if there is none (others' memory is not a
    /// segment).
    pub(crate) fn free(&mut self, address: u64) -> bool {
        if self.others.contains(&address) {
            return false;
        }
        let Some(position) = self
            .chunks
            .iter()
            .position(|chunk| chunk.segments.contains_key(&address))
        else {
            return false;
        };
        let chunk = &mut self.chunks[position];
        let size = chunk.segments.remove(&address).unwrap_or(0);
        let used_end = chunk.bump;
        if address + size == chunk.bump {
            chunk.settle_bump();
        }
        if chunk.segments.is_empty() && !chunk.persistent {
            let (base, chunk_size) = (chunk.base, chunk.size);
            self.chunks.remove(position);
            self.used.remove(&(base, Used::Chunk));
            if used_end < base + chunk_size {
                if self.released.len() == RELEASED_KEPT {
                    self.released.remove(0);
                }
                self.released.push((base, chunk_size, used_end));
            }
        }
        true
    }

    /// A segment of `size` bytes is at `address`, placed there by another (the replay put it
    /// at a recorded address): the model takes it as its own placement, and memory of others
    /// across it as let go. Returns what it let go.
    pub(crate) fn insert(&mut self, address: u64, size: u64) -> Vec<Others> {
        let released = self.release_across(address, size);
        if self.put_in_chunk(address, size).is_some() {
            return released;
        }
        if self.chunk_across(address, size) {
            // Half inside a chunk the model made otherwise: no chunk can hold it.
            return released;
        }
        let chunk_size = self.chunk_size_at(address, size);
        self.open_chunk(address, chunk_size, size);
        released
    }

    /// The recorded driver put a segment of `size` bytes at `address`: placed there as
    /// [`AddressSpace::insert`] does, and the memory of others the placement reveals learnt,
    /// so that the model, from the same state, would have chosen `address` itself:
    /// - inside a chunk, above its bump: what lies between the bump and `address` is held;
    /// - inside a chunk, in a hole: the part of the hole below `address` is held (the driver
    ///   takes a hole's bottom);
    /// - in a new chunk: the rest of the gap above the chunk is held (the driver opens a chunk
    ///   at the top of the highest gap larger than it), and so is every higher gap larger
    ///   than the chunk;
    /// - in a chunk the model let go, larger than a new chunk for it would be: the driver kept
    ///   that chunk ([`Others::Kept`], `kept_chunk_at`).
    ///
    /// Returns every change to others' memory, for another address space to [`apply`].
    ///
    /// [`apply`]: AddressSpace::apply
    pub(crate) fn adopt(&mut self, address: u64, size: u64) -> Vec<Others> {
        let mut changes = self.release_across(address, size);
        if let Some(position) = self
            .chunks
            .iter()
            .rposition(|chunk| chunk.holds(address, size))
        {
            let chunk = &self.chunks[position];
            if overlaps_any(&chunk.segments, address, size) {
                return changes;
            }
            if !chunk.takes(size, &self.large_seen) {
                self.large_seen.insert(address);
                changes.push(Others::Large { address });
            }
            // What lies below the segment down to the bump (above it) or to its hole's bottom.
            let held_base = if address >= chunk.bump {
                chunk.bump
            } else {
                chunk
                    .segments
                    .range(..address)
                    .next_back()
                    .map_or(chunk.base, |(&start, &length)| start + length)
            };
            let chunk = &mut self.chunks[position];
            if address > held_base {
                chunk.segments.insert(held_base, address - held_base);
                self.others.insert(held_base);
                changes.push(Others::Hold {
                    address: held_base,
                    size: address - held_base,
                });
            }
            chunk.segments.insert(address, size);
            chunk.bump = chunk.bump.max(address + size);
            return changes;
        }
        if self.chunk_across(address, size) {
            return changes;
        }
        if let Some(kept) = self.kept_chunk_at(address, size) {
            changes.extend(kept);
            return changes;
        }
        let chunk_size = self.chunk_size_at(address, size);
        let chunk_top = address + chunk_size;
        let mut held = Vec::new();
        for (base, top) in self.gaps() {
            if base <= address && address < top {
                // The chunk's own gap: the driver would have opened it at the gap's top.
                if top > chunk_top {
                    held.push((chunk_top, top - chunk_top));
                }
                break;
            }
            if base >= chunk_top && top - base > chunk_size {
                // A higher gap the chunk would have fitted in.
                held.push((base, top - base));
            }
        }
        for (base, length) in held {
            self.take(base, length);
            changes.push(Others::Hold {
                address: base,
                size: length,
            });
        }
        self.open_chunk(address, chunk_size, size);
        changes
    }

    /// A segment recorded outside every chunk, inside a chunk the model let go and the driver
    /// must have kept: the newest released chunk that holds it below where its segments had
    /// ended, over a range no chunk uses now, where the model would have put the segment
    /// elsewhere. The chunk is opened again, the segment put in it, the room above where its
    /// segments had ended held by others (what kept the chunk), and so is the part below the
    /// segment down to the chunk's base (the driver takes a hole's bottom). Returns the
    /// changes for another address space, `None` (nothing changed) when no released chunk
    /// fits.
    ///
    /// Only a released chunk larger than the chunk the driver would open for the segment
    /// (`roundup(size, 32 MiB)` from its base) counts: where the two are the same size, a new
    /// chunk explains the placement without memory of others inside it (taken for kept there,
    /// the recorded `prefetch` runs of tests/gpu/whatif/results, whose pinned host memory comes
    /// and goes, lost 1,000 of their placements).
    ///
    /// Seen after an `empty_cache()` in tests/gpu/whatif/results-wave10 (`finetune`): the
    /// driver packs the next segments upward from the base of the chunk of the last 282 MiB
    /// segment freed, a 288 MiB chunk, as in a chunk it kept with its 282 MiB hole, where a
    /// chunk opened anew would be filled from the top of the highest gap. The same job recorded
    /// again on an H100 shows it again, with kernels loaded on first use and with
    /// `CUDA_MODULE_LOADING=EAGER` (all loaded when the context starts), so what holds the
    /// chunk is not a kernel module loaded midway; no trace shows what it is.
    fn kept_chunk_at(&mut self, address: u64, size: u64) -> Option<Vec<Others>> {
        let end = address.checked_add(size)?;
        let position = self
            .released
            .iter()
            .rposition(|&(base, length, used_end)| {
                base <= address
                    && end <= used_end
                    && length > Self::chunk_for(end - base)
                    && !self
                        .chunks
                        .iter()
                        .any(|chunk| chunk.base < base + length && base < chunk.end())
            })?;
        // Only where the model, from this state, would not have put the segment there itself.
        if self.clone().allocate(size) == Some(address) {
            return None;
        }
        let (base, length, used_end) = self.released.remove(position);
        let mut changes = self.release_across(base, length);
        changes.push(Others::Kept { base, size: length });
        self.grow_chunk(base, length);
        let mut holds = vec![(used_end, base + length - used_end)];
        if address > base {
            holds.push((base, address - base));
        }
        for (hold, hold_size) in holds {
            if self.put_in_chunk(hold, hold_size) == Some(true) {
                self.others.insert(hold);
                changes.push(Others::Hold {
                    address: hold,
                    size: hold_size,
                });
            }
        }
        self.put_in_chunk(address, size);
        Some(changes)
    }

    /// Makes the chunk at `base` (or a new, empty one there) `size` bytes long.
    fn grow_chunk(&mut self, base: u64, size: u64) {
        if let Some(chunk) = self.chunks.iter_mut().find(|chunk| chunk.base == base) {
            chunk.size = chunk.size.max(size);
            self.used.insert((base, Used::Chunk), chunk.size);
            return;
        }
        self.open_empty_chunk(base, size);
    }

    /// Opens a chunk with nothing in it yet (one the driver kept, [`Others::Kept`]).
    fn open_empty_chunk(&mut self, base: u64, size: u64) {
        self.used.insert((base, Used::Chunk), size);
        self.chunks.push(Chunk {
            base,
            size,
            bump: base,
            segments: BTreeMap::new(),
            persistent: false,
            for_small: false,
        });
    }

    /// Takes on a change to others' memory another address space learnt.
    pub(crate) fn apply(&mut self, change: Others) {
        match change {
            Others::Large { address } => {
                self.large_seen.insert(address);
            }
            Others::Kept { base, size } => {
                let end = base.saturating_add(size);
                if !self
                    .chunks
                    .iter()
                    .any(|chunk| chunk.base != base && chunk.base < end && base < chunk.end())
                {
                    self.grow_chunk(base, size);
                }
            }
            Others::Hold { address, size } => match self.put_in_chunk(address, size) {
                Some(true) => {
                    self.others.insert(address);
                }
                Some(false) => {}
                None if !self.chunk_across(address, size)
                    && !self.taken.iter().any(|&(base, length)| {
                        base < address.saturating_add(size) && address < base + length
                    }) =>
                {
                    self.take(address, size);
                }
                None => {}
            },
            Others::Release { address, size } => {
                self.untake(|base, length| (base, length) == (address, size));
                if self.others.remove(&address) {
                    for chunk in &mut self.chunks {
                        if chunk.segments.get(&address) == Some(&size) {
                            chunk.segments.remove(&address);
                            chunk.settle_bump();
                        }
                    }
                }
            }
        }
    }

    /// Puts an entry of `size` bytes at `address` in the chunk that holds it, unless it
    /// overlaps one there: `None` when no chunk holds it, else whether it was put.
    fn put_in_chunk(&mut self, address: u64, size: u64) -> Option<bool> {
        let chunk = self
            .chunks
            .iter_mut()
            .rev()
            .find(|chunk| chunk.holds(address, size))?;
        if overlaps_any(&chunk.segments, address, size) {
            return Some(false);
        }
        chunk.segments.insert(address, size);
        chunk.bump = chunk.bump.max(address + size);
        Some(true)
    }

    /// Lets go of every range of others' memory that overlaps `[address, address + size)`.
    fn release_across(&mut self, address: u64, size: u64) -> Vec<Others> {
        let end = address.saturating_add(size);
        let mut released: Vec<Others> = self
            .untake(|base, length| base < end && address < base + length)
            .into_iter()
            .map(|(base, length)| Others::Release {
                address: base,
                size: length,
            })
            .collect();
        for chunk in &mut self.chunks {
            if chunk.base >= end || chunk.end() <= address {
                continue;
            }
            let across: Vec<(u64, u64)> = chunk
                .segments
                .range(..end)
                .filter(|&(&start, &length)| {
                    self.others.contains(&start) && start + length > address
                })
                .map(|(&start, &length)| (start, length))
                .collect();
            for (start, length) in across {
                chunk.segments.remove(&start);
                self.others.remove(&start);
                released.push(Others::Release {
                    address: start,
                    size: length,
                });
            }
            chunk.settle_bump_if_above();
        }
        released
    }

    /// Whether `[address, address + size)` overlaps a chunk without lying inside it.
    fn chunk_across(&self, address: u64, size: u64) -> bool {
        let end = address.saturating_add(size);
        self.chunks
            .iter()
            .any(|chunk| chunk.base < end && address < chunk.end() && !chunk.holds(address, size))
    }

    /// The chunk the driver opened for a segment of `size` bytes found at `address` outside
    /// every chunk: `roundup(size, 32 MiB)`, cut short by the next used range above.
    fn chunk_size_at(&self, address: u64, size: u64) -> u64 {
        size.div_ceil(VA_CHUNK)
            .saturating_mul(VA_CHUNK)
            .min(self.room_above(address))
            .max(size)
    }

    /// The free room from `address` up to the next used range (or the window's top).
    fn room_above(&self, address: u64) -> u64 {
        let above = address.saturating_add(1);
        self.used
            .range((above, Used::Taken)..)
            .next()
            .map_or(self.top, |(&(base, _), _)| base)
            .saturating_sub(address)
    }
}

impl Chunk {
    /// Lowers the bump to the highest entry's end when entries above it were removed.
    fn settle_bump_if_above(&mut self) {
        let highest_end = self
            .segments
            .iter()
            .next_back()
            .map_or(self.base, |(&start, &length)| start + length);
        if highest_end < self.bump {
            self.bump = highest_end;
        }
    }
}

/// Whether `[address, address + size)` overlaps an entry of `entries` (address → size).
fn overlaps_any(entries: &BTreeMap<u64, u64>, address: u64, size: u64) -> bool {
    let end = address.saturating_add(size);
    entries
        .range(..end)
        .next_back()
        .is_some_and(|(&start, &length)| start + length > address)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOP: u64 = 0x7F00_0000_0000;

    fn space() -> AddressSpace {
        AddressSpace::below(TOP).expect("a plausible top")
    }

    /// A recording's copy that adopted `segments` (address, size), and a replay's copy that
    /// took on everything it learnt, and also holds those segments when `replay_holds_them`.
    fn recording_and_replay(
        segments: &[(u64, u64)],
        replay_holds_them: bool,
    ) -> (AddressSpace, AddressSpace) {
        let mut recording = space();
        let mut replay = space();
        for &(address, size) in segments {
            for change in recording.adopt(address, size) {
                replay.apply(change);
            }
            if replay_holds_them {
                replay.insert(address, size);
            }
        }
        (recording, replay)
    }

    /// Allocates each (size, depth) in MiB in turn and asserts it lands `depth` below `TOP`.
    fn assert_places(space: &mut AddressSpace, steps: &[(u64, u64)]) {
        for &(size, depth) in steps {
            assert_eq!(
                space.allocate(size * MIB),
                Some(TOP - depth * MIB),
                "{size} MiB"
            );
        }
    }

    #[test]
    fn a_window_is_placed_as_the_measured_one_wherever_its_top_is() {
        let mut measured = AddressSpace::new();
        let mut moved = space();
        for size in [2 * MIB, 20 * MIB, 2 * MIB, 100 * MIB, 20 * MIB, 64 * MIB] {
            let here = measured.allocate(size).map(|address| VA_TOP - address);
            let there = moved.allocate(size).map(|address| TOP - address);
            assert_eq!(here, there, "{size}");
        }
        assert_eq!(AddressSpace::first_segment_depth(2 * MIB), Some(98 * MIB));
        assert_eq!(AddressSpace::first_segment_depth(20 * MIB), Some(24 * MIB));
        assert!(
            AddressSpace::below(TOP + MIB).is_none(),
            "not on a 2 MiB boundary"
        );
        assert!(
            AddressSpace::below(VA_FLOOR).is_none(),
            "too low for a process's start"
        );
    }

    #[test]
    fn a_recorded_segment_in_the_startup_hold_releases_it_and_the_part_below_stays_held() {
        let mut recording = space();
        assert_eq!(recording.adopt(TOP - 98 * MIB, 2 * MIB), vec![]);
        let changes = recording.adopt(TOP - 448 * MIB, 32 * MIB);
        assert_eq!(
            changes,
            vec![
                Others::Release {
                    address: TOP - 512 * MIB,
                    size: 414 * MIB
                },
                Others::Hold {
                    address: TOP - 512 * MIB,
                    size: 64 * MIB
                },
            ]
        );
        // From then on the range is used as any chunk: its free tail above the segment, and
        // the holes its freed segments leave.
        assert_places(&mut recording, &[(64, 416), (20, 352)]);
        assert!(recording.free(TOP - 416 * MIB));
        // Best fit: the 64 MiB hole before the 234 MiB tail; the tail for what only it holds;
        // the hole's 24 MiB rest before the 40 MiB left of the tail; then the tail, exactly.
        assert_places(
            &mut recording,
            &[(40, 416), (194, 332), (20, 376), (40, 138)],
        );
    }

    #[test]
    fn a_gap_the_driver_skipped_is_learnt_as_held() {
        let mut recording = space();
        recording.adopt(TOP - 98 * MIB, 2 * MIB);
        // The model would open the first large chunk right below the 512 MiB taken at the
        // start; the driver put it 1 GiB lower, so something held the range between.
        let first_chunk_top = TOP - 512 * MIB;
        let changes = recording.adopt(first_chunk_top - 1024 * MIB - 32 * MIB, 20 * MIB);
        assert_eq!(
            changes,
            vec![Others::Hold {
                address: first_chunk_top - 1024 * MIB,
                size: 1024 * MIB
            }]
        );
        // A segment above a chunk's bump: the space between was held.
        let changes = recording.adopt(first_chunk_top - 1024 * MIB - 32 * MIB + 24 * MIB, 8 * MIB);
        assert_eq!(
            changes,
            vec![Others::Hold {
                address: first_chunk_top - 1024 * MIB - 12 * MIB,
                size: 4 * MIB
            }]
        );
        // The next chunk goes below the learnt one, as the driver's would.
        assert_eq!(
            recording.allocate(40 * MIB),
            Some(first_chunk_top - 1024 * MIB - 32 * MIB - 64 * MIB)
        );
    }

    #[test]
    fn a_chunk_the_driver_kept_after_its_segment_went_is_learnt_and_passed_on() {
        let mut recording = space();
        let mut replay = space();
        // The startup's 24 MiB range at the top taken first, so that no other range takes the
        // sizes below; then a 282 MiB segment in a chunk of its own (288 MiB) in both copies,
        // freed: the model lets the chunk go.
        for copy in [&mut recording, &mut replay] {
            assert_eq!(copy.allocate(24 * MIB), Some(TOP - 24 * MIB));
        }
        let base = recording.allocate(282 * MIB).expect("room");
        assert_eq!(base, TOP - 800 * MIB);
        assert_eq!(replay.allocate(282 * MIB), Some(base));
        assert!(recording.free(base) && replay.free(base));
        // The model would open a new chunk at the top of the freed range; the driver put the
        // next segment at the old chunk's base: it kept the chunk, held by what lies in the
        // 6 MiB its segment left.
        assert_eq!(recording.clone().allocate(20 * MIB), Some(TOP - 544 * MIB));
        let changes = recording.adopt(base, 20 * MIB);
        assert_eq!(
            changes,
            vec![
                Others::Kept {
                    base,
                    size: 288 * MIB
                },
                Others::Hold {
                    address: base + 282 * MIB,
                    size: 6 * MIB
                },
            ]
        );
        // Both copies now fill the chunk's hole from the bottom, best fit, as the driver does;
        // the replay's own segments (another config's sizes) too.
        assert_eq!(recording.allocate(12 * MIB), Some(base + 20 * MIB));
        for change in changes {
            replay.apply(change);
        }
        assert_eq!(replay.allocate(12 * MIB), Some(base));
        assert_eq!(replay.allocate(94 * MIB), Some(base + 12 * MIB));
        // What would not fit in the hole opens a chunk as before, below the kept one.
        assert_eq!(replay.allocate(200 * MIB), Some(base - 224 * MIB));
    }

    #[test]
    fn a_released_chunk_no_larger_than_a_new_one_is_not_taken_for_kept() {
        let mut recording = space();
        let base = recording.allocate(20 * MIB).expect("room");
        assert!(recording.free(base));
        // An 18 MiB segment at the base of the freed 32 MiB chunk: a new chunk explains it,
        // with the rest of the gap above held, and nothing inside the chunk.
        let changes = recording.adopt(base - 64 * MIB, 18 * MIB);
        assert!(changes
            .iter()
            .all(|change| !matches!(change, Others::Kept { .. })));
        let mut again = space();
        let base = again.allocate(20 * MIB).expect("room");
        assert!(again.free(base));
        let changes = again.adopt(base, 18 * MIB);
        assert!(
            changes
                .iter()
                .all(|change| !matches!(change, Others::Kept { .. })),
            "{changes:?}"
        );
    }

    #[test]
    fn another_space_places_around_what_the_recording_taught() {
        let (_, mut replay) = recording_and_replay(
            &[(TOP - 98 * MIB, 2 * MIB), (TOP - 448 * MIB, 32 * MIB)],
            false,
        );
        // The replay's config made other segments than the recording: the first 64 MiB goes
        // where the driver would put it, above what the library still holds.
        assert_eq!(replay.allocate(64 * MIB), Some(TOP - 448 * MIB));
        // A hold that overlaps the replay's own segments is not taken on.
        replay.apply(Others::Hold {
            address: TOP - 420 * MIB,
            size: 4 * MIB,
        });
        assert_eq!(replay.allocate(4 * MIB), Some(TOP - 384 * MIB));
        // A release lets the range go: once the chunk's tail is used, its hole is next.
        replay.apply(Others::Release {
            address: TOP - 512 * MIB,
            size: 64 * MIB,
        });
        assert_eq!(replay.allocate(282 * MIB), Some(TOP - 380 * MIB));
        assert_eq!(replay.allocate(64 * MIB), Some(TOP - 512 * MIB));
    }

    #[test]
    fn a_segment_inserted_across_held_memory_releases_it_and_others_memory_is_never_freed() {
        let mut replay = space();
        let released = replay.insert(TOP - 300 * MIB, 10 * MIB);
        assert_eq!(
            released,
            vec![Others::Release {
                address: TOP - 512 * MIB,
                size: 414 * MIB
            }]
        );
        assert!(!replay.free(TOP - 512 * MIB), "the hold was others' memory");
        assert!(replay.free(TOP - 300 * MIB));
        assert!(!replay.free(TOP - 300 * MIB), "freed once");
    }

    #[test]
    fn a_large_segment_skips_a_chunk_opened_for_a_small_one_and_a_small_one_takes_any() {
        let mut space = space();
        assert_places(&mut space, &[(2, 98), (20, 24), (2, 4), (2, 2)]);
        // The start's ranges are full: a chunk for a small segment, below them.
        assert_places(&mut space, &[(2, 544)]);
        // Its 30 MiB of room take no 20 MiB segment: a chunk of its own, lower down.
        assert_places(&mut space, &[(20, 576)]);
        // A small one goes into the newest chunk with room, whatever it was opened for.
        assert_places(&mut space, &[(2, 556), (4, 554)]);
    }

    #[test]
    fn a_large_segment_recorded_in_a_small_chunk_lets_the_chunk_there_take_large_ones() {
        let (mut recording, mut replay) = recording_and_replay(
            &[(TOP - 98 * MIB, 2 * MIB), (TOP - 600 * MIB, 2 * MIB)],
            true,
        );
        let learnt = recording.adopt(TOP - 598 * MIB, 4 * MIB);
        assert_eq!(
            learnt,
            vec![Others::Large {
                address: TOP - 598 * MIB
            }]
        );
        let mut unaware = replay.clone();
        assert_eq!(
            unaware.allocate(4 * MIB),
            Some(TOP - 24 * MIB),
            "without the lesson the chunk is passed over"
        );
        for change in learnt {
            replay.apply(change);
        }
        assert_eq!(replay.allocate(4 * MIB), Some(TOP - 598 * MIB));
    }

    #[test]
    fn the_startup_range_places_in_the_smallest_of_its_free_top_and_its_holes() {
        let mut space = space();
        assert_eq!(space.adopt(TOP - 98 * MIB, 2 * MIB), vec![]);
        space.adopt(TOP - 512 * MIB, 74 * MIB);
        space.adopt(TOP - 438 * MIB, 84 * MIB);
        assert!(space.free(TOP - 512 * MIB));
        // A 74 MiB hole at the bottom, a 256 MiB free top up to the 2 MiB range at top-98 MiB
        // (a chunk of its own, whose segment does not turn that top into a hole).
        assert_places(&mut space, &[(20, 512), (236, 354), (40, 492)]);
        // The hole's last 14 MiB, then the free top's last 20 MiB, each an exact fit.
        assert_places(&mut space, &[(14, 452), (20, 118)]);
    }
}

/// The model against the H200's own placements (tests/gpu/placement): each sequence of
/// `cudaMalloc`/`cudaFree` calls played against the driver, and each segment's predicted
/// address compared with the driver's, given the state before it.
#[cfg(test)]
mod driver_tests {
    use super::*;
    use std::io::Read;

    /// One call: ("a" | "f", size, index of the malloc a free releases, address).
    type Call = (String, u64, i64, u64);

    fn sequences(file: &str) -> BTreeMap<String, Vec<Call>> {
        let path = format!(
            "{}/tests/gpu/placement/data/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("probe data"))
            .read_to_string(&mut text)
            .expect("gzip");
        serde_json::from_str(&text).expect("probe JSON")
    }

    /// (segments placed as the driver did, segments) over every sequence of `file`: each
    /// prediction is made from the state the driver's own placements so far left, learnt as a
    /// what-if replay's mirror learns its recording (`adopt`). `GPUMEM_PROBE_VERBOSE=1` prints
    /// each miss.
    fn agreement(file: &str) -> (usize, usize) {
        let verbose = std::env::var_os("GPUMEM_PROBE_VERBOSE").is_some();
        let (mut same, mut total) = (0, 0);
        for (name, calls) in sequences(file) {
            let Some((_, first_size, _, first_address)) = calls.first().cloned() else {
                continue;
            };
            let Some(mut space) = AddressSpace::first_segment_depth(first_size)
                .and_then(|depth| AddressSpace::below(first_address + depth))
            else {
                continue;
            };
            for (step, (call, size, _, address)) in calls.iter().enumerate() {
                if call == "a" {
                    let predicted = space.clone().allocate(*size);
                    total += 1;
                    if predicted == Some(*address) {
                        same += 1;
                    } else if verbose {
                        let depth = |a: u64| (space.top() as i64 - a as i64) / MIB as i64;
                        eprintln!(
                            "{name} #{step}: {} MiB at depth {} predicted {:?} ({})",
                            size / MIB,
                            depth(*address),
                            predicted.map(depth),
                            miss_kind(&space, *address, predicted, *size)
                        );
                    }
                    space.adopt(*address, *size);
                } else {
                    space.free(*address);
                }
            }
        }
        (same, total)
    }

    /// Which choice a miss got wrong: the chunk (an existing one, or a new one), or the free
    /// range inside the right chunk, or the gap a new chunk opened in.
    fn miss_kind(space: &AddressSpace, actual: u64, predicted: Option<u64>, size: u64) -> &str {
        let chunk_of = |address: u64| {
            space
                .chunks
                .iter()
                .position(|chunk| chunk.holds(address, size))
        };
        match (chunk_of(actual), predicted.and_then(chunk_of)) {
            (Some(driver), Some(model)) if driver == model => "same chunk, another free range",
            (Some(_), Some(_)) => "another existing chunk",
            (Some(_), None) => "driver: an existing chunk, model: a new one",
            (None, Some(_)) => "driver: a new chunk, model: an existing one",
            (None, None) => "both a new chunk, in another gap",
        }
    }

    /// Every segment of a sequence played in a bare process (CUDA started through the driver
    /// API alone, so no memory but the allocations' own moves): 302 sequences, random ones
    /// and two designed to tell placement rules apart.
    #[test]
    fn the_model_places_every_segment_of_the_bare_driver_where_it_did() {
        let (same, total) = agreement("probe-bare.json.gz");
        assert_eq!((same, total), (14_817, 14_817));
    }

    /// The designed sequences again (tests/gpu/placement/probe.py), T3 and T4 with them: 2 MiB
    /// segments until chunks are opened for them, then a 20 MiB one. In T4 the last such chunk
    /// has 30 MiB of room, and the bare driver puts the 20 MiB segment there, and the next 2
    /// MiB one above it: the small-chunk rule ([`SMALL_SEGMENT`]) is not the driver's. The
    /// model keeps it because jobs' recordings behave as if such room were others' memory
    /// (their placements: 75.9% with it, 65.3% without), so it misses
    /// exactly that 20 MiB one (and, having learnt from it that the chunk takes large ones,
    /// `Others::Large`, places the next where the driver did).
    #[test]
    fn the_model_places_the_designed_sequences_as_the_driver_did_but_for_the_small_chunk_rule() {
        let (same, total) = agreement("probe-designed.json.gz");
        assert_eq!((same, total), (93 - 1, 93));
    }

    /// The two designed sequences and the first 60 random ones in processes that started CUDA
    /// through PyTorch (`import torch`, its primary context). The 5
    /// misses are one sequence whose first segment went above the window a PyTorch process
    /// starts with (its start differed).
    #[test]
    fn the_model_places_all_but_one_sequence_of_a_pytorch_process_where_the_driver_did() {
        let (same, total) = agreement("probe-torch.json.gz");
        assert_eq!(total, 2_912);
        assert!(same >= 2_907, "{same} of {total}");
    }

    /// The segments of the what-if recordings (tests/gpu/whatif/results and results-frac:
    /// real jobs, whose libraries hold and free memory no trace shows, which the model learns
    /// only as far as each recorded placement reveals it): a floor, so that a rule that
    /// places fewer of them where the driver did fails.
    #[test]
    fn the_model_places_three_quarters_of_the_recorded_segments_where_the_driver_did() {
        let (same, total) = agreement("probe-recorded.json.gz");
        assert_eq!(total, 15_699);
        assert!(same >= 11_910, "{same} of {total}");
    }
}
