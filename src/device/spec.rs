//! Parsing of the `--device` argument: `sim`, `sim:SIZE`, `cuda`, `cuda:N`.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Which device a session runs on, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The simulated GPU; `None` means the default capacity (the H200 we measure on).
    Sim(Option<u64>),
    /// A real CUDA device by ordinal.
    Cuda(usize),
}

/// A `--device` value or a byte size that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// The device kind is neither `sim` nor `cuda`.
    #[error("unknown device '{0}': expected 'sim', 'sim:SIZE', 'cuda' or 'cuda:N'")]
    UnknownDevice(String),
    /// The CUDA ordinal is not a non-negative integer.
    #[error("invalid CUDA device index '{0}': expected a non-negative integer, as in 'cuda:0'")]
    BadIndex(String),
    /// The size is not a number with an optional unit.
    #[error("invalid size '{0}': expected bytes or a number with a unit (B, KB, MB, GB, KiB, MiB, GiB, TiB), e.g. '80GiB'")]
    BadSize(String),
    /// A simulated device larger than the simulator's address window.
    #[error("simulated device size '{0}' is too large: at most 64 TiB")]
    SimTooLarge(String),
    /// The size is zero or does not fit in 64 bits.
    #[error("size '{0}' is out of range: it must be at least 1 byte and below 16 EiB")]
    SizeOutOfRange(String),
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (kind, arg) = match text.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg)),
            None => (text, None),
        };
        match (kind.to_ascii_lowercase().as_str(), arg) {
            ("sim", None) => Ok(DeviceSpec::Sim(None)),
            ("sim", Some(size)) => {
                let bytes = parse_size(size)?;
                if bytes > super::sim::MAX_TOTAL_MEMORY {
                    return Err(SpecError::SimTooLarge(size.to_string()));
                }
                Ok(DeviceSpec::Sim(Some(bytes)))
            }
            ("cuda", None) => Ok(DeviceSpec::Cuda(0)),
            ("cuda", Some(index)) => index
                .trim()
                .parse::<usize>()
                .map(DeviceSpec::Cuda)
                .map_err(|_| SpecError::BadIndex(index.to_string())),
            _ => Err(SpecError::UnknownDevice(text.to_string())),
        }
    }
}

impl fmt::Display for DeviceSpec {
    /// As `--device` takes it, a simulated size in the largest binary unit that holds it
    /// exactly (`sim:2GiB`, `sim:150109880320`), so it reads as one would write it and parses
    /// back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Sim(None) => write!(f, "sim"),
            DeviceSpec::Sim(Some(bytes)) => write!(f, "sim:{}", size_text(*bytes)),
            DeviceSpec::Cuda(index) => write!(f, "cuda:{index}"),
        }
    }
}

/// `bytes` in the largest of TiB, GiB and MiB that divides it (`2GiB`, `1536MiB`), else in
/// bytes (a count of KiB would read no better than the bytes).
fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a byte count such as `150109880320`, `80GiB`, `512 MiB` or `1.5GB`.
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000.
pub fn parse_size(text: &str) -> Result<u64, SpecError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000_u64.pow(2),
        "g" | "gb" => 1000_u64.pow(3),
        "t" | "tb" => 1000_u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(SpecError::BadSize(text.to_string())),
    };
    if number.is_empty() {
        return Err(SpecError::BadSize(text.to_string()));
    }
    let bytes = if let Ok(whole) = number.parse::<u64>() {
        whole.checked_mul(multiplier)
    } else {
        let value: f64 = number
            .parse()
            .map_err(|_| SpecError::BadSize(text.to_string()))?;
        let bytes = value * multiplier as f64;
        // 2^64 as f64: anything at or above it cannot be a u64.
        (bytes.is_finite() && bytes < 18_446_744_073_709_551_616.0).then_some(bytes as u64)
    };
    match bytes {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(SpecError::SizeOutOfRange(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_one_would_write_them_and_parse_back() {
        for (bytes, text) in [
            (2 << 30, "sim:2GiB"),
            (1536 << 20, "sim:1536MiB"),
            (150_109_880_320, "sim:150109880320"),
            (3 << 40, "sim:3TiB"),
            (1000, "sim:1000"),
            (3 << 10, "sim:3072"),
        ] {
            let spec = DeviceSpec::Sim(Some(bytes));
            assert_eq!(spec.to_string(), text);
            assert_eq!(text.parse(), Ok(spec));
        }
    }

    #[test]
    fn parses_device_names() {
        assert_eq!("sim".parse(), Ok(DeviceSpec::Sim(None)));
        assert_eq!("sim:80GiB".parse(), Ok(DeviceSpec::Sim(Some(80 << 30))));
        assert_eq!(
            "sim:150109880320".parse(),
            Ok(DeviceSpec::Sim(Some(150_109_880_320)))
        );
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:1".parse(), Ok(DeviceSpec::Cuda(1)));
        assert!(matches!(
            "tpu".parse::<DeviceSpec>(),
            Err(SpecError::UnknownDevice(_))
        ));
        assert!(matches!(
            "sim:1000TiB".parse::<DeviceSpec>(),
            Err(SpecError::SimTooLarge(_))
        ));
        assert!(matches!(
            "cuda:-1".parse::<DeviceSpec>(),
            Err(SpecError::BadIndex(_))
        ));
    }

    #[test]
    fn parses_sizes_with_units() {
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(matches!(
            parse_size("12 parsecs"),
            Err(SpecError::BadSize(_))
        ));
        assert!(matches!(parse_size("0"), Err(SpecError::SizeOutOfRange(_))));
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SpecError::SizeOutOfRange(_))
        ));
        assert!(matches!(parse_size("-5"), Err(SpecError::BadSize(_))));
    }
}
