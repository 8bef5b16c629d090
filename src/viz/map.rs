//! `memory_map()`: every segment drawn as a row of cells, one cell per fixed slice of bytes
//! (the same slice for every segment, so rows compare), sized so the largest segment fills
//! the width. A cell shows what its bytes hold; colour is optional and never carries meaning
//! the characters do not.
//!
//! ```text
//! memory map: 2 segments, 22 MiB reserved, 4 MiB allocated; 1 cell = 512 KiB
//!   address         size  pool   allocated
//!   0x7f0000000000  2 MiB small      512 B |1...|
//! ```

use std::fmt::Write as _;

use super::layout::{MemoryLayout, Region, SegmentLayout};
use super::units;

/// How to draw the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOptions {
    /// Total line width in characters (the terminal's width); at least room for 8 cells is
    /// kept whatever it says.
    pub width: usize,
    /// Whether to paint cells with ANSI colours (never when output is piped or `NO_COLOR` is
    /// set: the caller decides).
    pub color: bool,
}

impl Default for MapOptions {
    /// 80 columns, no colour: what golden tests and pipes get.
    fn default() -> MapOptions {
        MapOptions {
            width: 80,
            color: false,
        }
    }
}

/// The smallest slice a cell stands for.
const MIN_CELL: u64 = 512;
/// Fewest cells a row may have, however narrow the terminal.
const MIN_CELLS: usize = 8;

/// The character for a cell: `#` wholly allocated, `1`-`9` partly allocated (tenths, at
/// least 1), else the free kind covering most of it: `-` split free, `.` cached free,
/// `_` unmapped.
fn glyph(bytes: &[u64; 4], capacity: u64) -> (char, Region) {
    let [allocated, split, cached, unmapped] = *bytes;
    if allocated >= capacity {
        return ('#', Region::Allocated);
    }
    if allocated > 0 {
        let tenths = (allocated * 10 / capacity).clamp(1, 9) as u32;
        return (
            char::from_digit(tenths, 10).unwrap_or('9'),
            Region::Allocated,
        );
    }
    let most = split.max(cached).max(unmapped);
    if most == split {
        ('-', Region::SplitFree)
    } else if most == cached {
        ('.', Region::CachedFree)
    } else {
        ('_', Region::Unmapped)
    }
}

/// The ANSI style of a region's cells: white on red, black on yellow, black on green, dim.
fn ansi(region: Region) -> &'static str {
    match region {
        Region::Allocated => "97;41",
        Region::SplitFree => "30;43",
        Region::CachedFree => "30;42",
        Region::Unmapped => "2",
    }
}

fn index(region: Region) -> usize {
    match region {
        Region::Allocated => 0,
        Region::SplitFree => 1,
        Region::CachedFree => 2,
        Region::Unmapped => 3,
    }
}

/// Bytes of each region in each cell of `segment`, cells of `cell` bytes from its base.
fn cell_bytes(segment: &SegmentLayout, cell: u64) -> Vec<[u64; 4]> {
    let count = segment.size.div_ceil(cell).max(1) as usize;
    let mut cells = vec![[0_u64; 4]; count];
    for span in &segment.spans {
        let start = span.address.saturating_sub(segment.address);
        let end = start + span.size;
        let mut at = start;
        while at < end {
            let index_in_row = (at / cell) as usize;
            let cell_end = (at / cell + 1) * cell;
            let piece = end.min(cell_end) - at;
            if let Some(counts) = cells.get_mut(index_in_row) {
                counts[index(span.region)] += piece;
            }
            at += piece;
        }
    }
    cells
}

/// One row of cells, painted when `color` is set (runs of one region share one escape).
fn row(segment: &SegmentLayout, cell: u64, color: bool) -> String {
    let cells = cell_bytes(segment, cell);
    let mut text = String::new();
    let mut open: Option<Region> = None;
    for (position, counts) in cells.iter().enumerate() {
        let start = position as u64 * cell;
        let capacity = cell.min(segment.size - start);
        let (character, region) = glyph(counts, capacity);
        if color && open != Some(region) {
            if open.is_some() {
                text.push_str("\u{1b}[0m");
            }
            let _ = write!(text, "\u{1b}[{}m", ansi(region));
            open = Some(region);
        }
        text.push(character);
    }
    if color && open.is_some() {
        text.push_str("\u{1b}[0m");
    }
    text
}

/// The slice one cell stands for: the smallest power of two (at least 512 bytes) that fits
/// the largest segment in `cells` cells.
pub fn cell_size(largest: u64, cells: usize) -> u64 {
    let mut cell = MIN_CELL;
    while largest.div_ceil(cell) > cells as u64 {
        cell *= 2;
    }
    cell
}

/// Draws the map of `layout`.
pub fn render(layout: &MemoryLayout, options: &MapOptions) -> String {
    let segments = &layout.segments;
    let allocated = layout.bytes(Region::Allocated);
    if segments.is_empty() {
        return "memory map: no segments (nothing reserved)".to_string();
    }
    let addresses: Vec<String> = segments
        .iter()
        .map(|s| format!("{:#x}", s.address))
        .collect();
    let sizes: Vec<String> = segments.iter().map(|s| units::bytes(s.size)).collect();
    let used: Vec<String> = segments
        .iter()
        .map(|s| units::bytes(s.bytes(Region::Allocated)))
        .collect();
    let width_of = |column: &[String], title: &str| {
        column
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let (address_w, size_w, used_w) = (
        width_of(&addresses, "address"),
        width_of(&sizes, "size"),
        width_of(&used, "allocated"),
    );
    // "  ADDRESS  SIZE  POOL   ALLOCATED |cells|"
    let prefix = 2 + address_w + 2 + size_w + 2 + 5 + 2 + used_w + 2;
    let cells = options.width.saturating_sub(prefix + 1).max(MIN_CELLS);
    let largest = segments.iter().map(|s| s.size).max().unwrap_or(0);
    let cell = cell_size(largest, cells);

    let count = segments.len();
    let mut text = format!(
        "memory map: {count} segment{}, {} reserved, {} allocated; 1 cell = {}\n",
        if count == 1 { "" } else { "s" },
        units::bytes(layout.reserved()),
        units::bytes(allocated),
        units::bytes(cell),
    );
    let _ = writeln!(
        text,
        "  {:<address_w$}  {:>size_w$}  pool   {:>used_w$}",
        "address", "size", "allocated"
    );
    for (position, segment) in segments.iter().enumerate() {
        // A private pool's segment names it after the row.
        let private = if segment.pool_id.is_default() {
            String::new()
        } else {
            format!(" private pool {}", segment.pool_id)
        };
        let _ = writeln!(
            text,
            "  {:<address_w$}  {:>size_w$}  {:<5}  {:>used_w$} |{}|{private}",
            addresses[position],
            sizes[position],
            segment.pool.name(),
            used[position],
            row(segment, cell, options.color),
        );
    }
    text.push_str(&legend(layout, options.color));
    text
}

/// The legend: one entry per kind of cell (unmapped only where some are).
fn legend(layout: &MemoryLayout, color: bool) -> String {
    let sample = |character: &str, region: Region| {
        if color {
            format!("\u{1b}[{}m{character}\u{1b}[0m", ansi(region))
        } else {
            character.to_string()
        }
    };
    let mut text = format!(
        "legend: {} allocated   {} partly allocated: digit N = at least N tenths of the cell (1 = less than 2)\n        {} free in a segment still in use: cached, empty_cache() cannot return it\n        {} free segment: cached, empty_cache() returns it",
        sample("#", Region::Allocated),
        sample("1-9", Region::Allocated),
        sample("-", Region::SplitFree),
        sample(".", Region::CachedFree),
    );
    if layout.bytes(Region::Unmapped) > 0 {
        let _ = write!(
            text,
            "\n        {} unmapped: addresses of an expandable segment with no memory behind them",
            sample("_", Region::Unmapped)
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Pool;
    use crate::viz::layout::Span;

    fn segment(address: u64, spans: &[(u64, Region)]) -> SegmentLayout {
        let mut at = address;
        let spans: Vec<Span> = spans
            .iter()
            .map(|&(size, region)| {
                let span = Span {
                    address: at,
                    size,
                    region,
                };
                at += size;
                span
            })
            .collect();
        SegmentLayout {
            address,
            size: at - address,
            pool: Pool::Large,
            pool_id: crate::alloc::MemPoolId::DEFAULT,
            spans,
        }
    }

    /// A private pool's segments name the pool, and while the pool is in use its free
    /// segments are not what `empty_cache()` returns.
    #[test]
    fn private_pool_segments_are_named_and_kept() {
        use crate::alloc::{AllocConf, CachingAllocator, PoolFilter};
        use crate::device::sim::SimDevice;
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::h200()), AllocConf::default())
                .expect("allocator");
        let id = allocator.new_mem_pool_id();
        allocator
            .begin_allocate_to_pool(id, PoolFilter::AllStreams)
            .expect("use");
        let pooled = allocator.malloc(12 << 20).expect("alloc");
        allocator.end_allocate_to_pool(id).expect("end");
        allocator.free(pooled).expect("free");
        let plain = allocator.malloc(12 << 20).expect("alloc");
        allocator.free(plain).expect("free");
        let layout = MemoryLayout::of(&allocator);
        let text = render(&layout, &MapOptions::default());
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("12 MiB"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines
                .iter()
                .any(|line| line.ends_with("| private pool (0, 1)") && line.contains("|------")),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|line| line.ends_with("|") && line.contains("|......")),
            "{text}"
        );
    }

    #[test]
    fn cells_show_full_partial_and_free_kinds() {
        let mib = 1 << 20;
        let layout = MemoryLayout {
            segments: vec![segment(
                0x1000_0000,
                &[
                    (4 * mib, Region::Allocated),
                    (mib / 2, Region::Allocated),
                    (mib / 2 + 3 * mib, Region::SplitFree),
                ],
            )],
        };
        let text = render(
            &layout,
            &MapOptions {
                width: 0,
                color: false,
            },
        );
        // 8 MiB over the minimum 8 cells: 1 MiB per cell.
        assert!(text.contains("1 cell = 1 MiB"), "{text}");
        assert!(text.contains("|####5---|"), "{text}");
        // The legend says what a digit means: the 5 is half a cell allocated.
        assert!(
            text.contains("digit N = at least N tenths of the cell"),
            "{text}"
        );
    }

    #[test]
    fn colour_wraps_runs_and_plain_has_no_escapes() {
        let mib = 1 << 20;
        let layout = MemoryLayout {
            segments: vec![segment(0, &[(2 * mib, Region::CachedFree)])],
        };
        let plain = render(&layout, &MapOptions::default());
        assert!(!plain.contains('\u{1b}'));
        let painted = render(
            &layout,
            &MapOptions {
                width: 80,
                color: true,
            },
        );
        assert!(painted.contains("\u{1b}[30;42m"), "{painted}");
    }

    #[test]
    fn cell_size_is_the_smallest_power_of_two_that_fits() {
        assert_eq!(cell_size(0, 10), 512);
        assert_eq!(cell_size(20 << 20, 20), 1 << 20);
        assert_eq!(cell_size((20 << 20) + 1, 20), 2 << 20);
    }
}
