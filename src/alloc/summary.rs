//! `memory_summary()`: PyTorch's `torch.cuda.memory_summary()` table, byte for byte.

use super::stats::{DeviceStats, Stat, StatArray};

/// Width of a table line between the outer bars.
const WIDTH: usize = 75;

/// PyTorch's Python `_format_size(sz, pref_sz)`: steps to the next unit while the "all" row's
/// value (`pref`) is at least 768 KiB of the current unit, flooring the value at each step.
fn format_size(mut size: i64, pref: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = UNITS[0];
    let mut pref = pref as f64;
    for next in &UNITS[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        size = size.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{size:6} {unit}")
}

/// PyTorch's `_format_count(cnt, pref_cnt)`: thousands (K, M) once the "all" value reaches
/// 750,000 of the current unit.
fn format_count(mut count: i64, pref: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let mut unit = UNITS[0];
    let mut pref = pref as f64;
    for next in &UNITS[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        unit = next;
        count = count.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{count:7} {unit} ")
}

/// Formats one value against the "all" row's value of the same column.
type Formatter = fn(i64, i64) -> String;

fn row(label: &str, stat: &Stat, pref: &Stat, format: Formatter) -> String {
    format!(
        " {label:<21} | {} | {} | {} | {} ",
        format(stat.current, pref.current),
        format(stat.peak, pref.peak),
        format(stat.allocated, pref.allocated),
        format(stat.freed, pref.freed),
    )
}

/// Renders the summary for device `device`; `abbreviated` drops the per-pool rows, as
/// PyTorch's `abbreviated=True` does.
pub fn memory_summary(stats: &DeviceStats, device: usize, abbreviated: bool) -> String {
    let dashes = "-".repeat(WIDTH);
    let equals = "=".repeat(WIDTH);
    let mut lines = vec![
        equals.clone(),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {device:<17} ",
            ""
        ),
        dashes.clone(),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        equals.clone(),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    let metrics: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.requested_bytes, "Requested memory", format_size),
        (&stats.reserved_bytes, "GPU reserved memory", format_size),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_size,
        ),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    for (array, label, format) in metrics {
        lines.push(dashes.clone());
        lines.push(row(label, &array.all, &array.all, format));
        if !abbreviated {
            lines.push(row(
                "      from large pool",
                &array.large,
                &array.all,
                format,
            ));
            lines.push(row(
                "      from small pool",
                &array.small,
                &array.all,
                format,
            ));
        }
    }
    for (stat, label) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push(dashes.clone());
        lines.push(row(label, stat, stat, format_count));
    }
    lines.push(equals);
    format!("|{}|\n", lines.join("|\n|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_the_all_rows_unit_and_floor() {
        assert_eq!(format_size(1000, 1000), "  1000 B  ");
        assert_eq!(format_size(1000, 27_262_976), "     0 KiB");
        assert_eq!(format_size(1_920_991_232, 1_920_991_232), "  1832 MiB");
        assert_eq!(format_count(4, 4), "      4   ");
        assert_eq!(format_count(1_500_000, 1_500_000), "   1500 K ");
    }

    #[test]
    fn every_line_is_77_characters() {
        let text = memory_summary(&DeviceStats::new(-1), 0, false);
        assert!(text.lines().all(|line| line.chars().count() == 77));
        assert_eq!(text.lines().count(), 47);
        assert!(text.ends_with("|\n"));
    }
}
