//! Byte counts for people, in binary units, short enough for map labels and chart axes
//! (`512 B`, `2 MiB`, `915.53 MiB`, `139.8 GiB`). PyTorch's own formatting, which the OOM
//! message and `memory_summary()` must keep, is [`crate::alloc::format::format_size`].

/// The binary units, smallest first, with their size in bytes.
pub const UNITS: [(&str, u64); 5] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// The largest unit that `bytes` reaches (bytes for 0), as (name, size).
pub fn unit_for(bytes: u64) -> (&'static str, u64) {
    UNITS
        .iter()
        .rev()
        .find(|(_, size)| bytes >= *size)
        .copied()
        .unwrap_or(UNITS[0])
}

/// `bytes` in the largest unit it reaches, with at most two decimals and no trailing zeros.
pub fn bytes(bytes: u64) -> String {
    let (name, size) = unit_for(bytes);
    format!("{} {name}", trimmed(bytes as f64 / size as f64))
}

/// A number with at most two decimals, trailing zeros dropped (`2`, `1.5`, `915.53`).
pub fn trimmed(value: f64) -> String {
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_unit_and_trims() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1 << 20), "1 MiB");
        assert_eq!(bytes(3 << 19), "1.5 MiB");
        assert_eq!(bytes(960_000_000), "915.53 MiB");
        assert_eq!(bytes(150_109_880_320), "139.8 GiB");
        assert_eq!(unit_for(5 << 30), ("GiB", 1 << 30));
    }
}
