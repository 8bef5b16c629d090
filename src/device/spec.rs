//! Parsing of the `--device` argument: `sim`, `sim:SIZE`, `sim:SIZE,SIZE,...` (one simulated
//! device per entry), `cuda`, `cuda:N`.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// The most simulated devices one `--device` value may list. PyTorch numbers devices with a
/// signed byte, and machines have at most a few GPUs; the cap keeps a typo from building
/// thousands of allocators.
pub const MAX_SIM_DEVICES: usize = 64;

/// Which devices a session runs on, as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Simulated GPUs, one entry per device: its capacity, or `None` for the default (the
    /// H200 we measure on). `sim` and `sim:SIZE` are one device, `sim:80GiB,80GiB` two.
    Sim(Vec<Option<u64>>),
    /// Every CUDA GPU the process can see (the driver honours `CUDA_VISIBLE_DEVICES`), with
    /// device N current at the start, as after `torch.cuda.set_device(N)`; `cuda` is `cuda:0`.
    Cuda(usize),
}

impl DeviceSpec {
    /// One simulated H200.
    pub fn sim() -> DeviceSpec {
        DeviceSpec::Sim(vec![None])
    }

    /// One simulated device of `bytes` bytes.
    pub fn sim_of(bytes: u64) -> DeviceSpec {
        DeviceSpec::Sim(vec![Some(bytes)])
    }

    /// The same machine with exactly `count` devices, as a script's `//! devices: N` asks:
    /// simulated devices are dropped from the end or added with the last one's capacity;
    /// a CUDA spec is unchanged (the session uses the first `count` GPUs, or refuses when
    /// there are fewer).
    pub fn with_count(&self, count: usize) -> DeviceSpec {
        match self {
            DeviceSpec::Sim(sizes) => {
                let last = sizes.last().copied().flatten();
                let mut sizes = sizes.clone();
                sizes.resize(count.max(1), last);
                DeviceSpec::Sim(sizes)
            }
            DeviceSpec::Cuda(index) => DeviceSpec::Cuda(*index),
        }
    }
}

/// A `--device` value or a byte size that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// The device kind is neither `sim` nor `cuda`.
    #[error("unknown device '{0}': expected 'sim', 'sim:SIZE', 'cuda' or 'cuda:N' ('sim:SIZE,SIZE' gives one simulated device per size)")]
    UnknownDevice(String),
    /// The CUDA ordinal is not a non-negative integer.
    #[error("invalid CUDA device index '{0}': expected a non-negative integer, as in 'cuda:0' ('cuda' alone makes every visible GPU available; CUDA_VISIBLE_DEVICES chooses which)")]
    BadIndex(String),
    /// One entry of a `sim:SIZE,SIZE,...` list is wrong.
    #[error("device {device} of '{spec}' (entry {entry}): {error}", entry = device + 1)]
    BadEntry {
        /// The whole `--device` value.
        spec: String,
        /// Which device the entry describes (from 0).
        device: usize,
        /// What is wrong with it.
        error: Box<SpecError>,
    },
    /// More simulated devices than [`MAX_SIM_DEVICES`].
    #[error("'{spec}' lists {count} simulated devices; at most {MAX_SIM_DEVICES}")]
    TooManyDevices {
        /// The whole `--device` value.
        spec: String,
        /// How many it lists.
        count: usize,
    },
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
            ("sim", None) => Ok(DeviceSpec::sim()),
            ("sim", Some(list)) => {
                let entries: Vec<&str> = list.split(',').collect();
                if entries.len() > MAX_SIM_DEVICES {
                    return Err(SpecError::TooManyDevices {
                        spec: text.to_string(),
                        count: entries.len(),
                    });
                }
                let sizes = entries.iter().map(|entry| sim_size(entry));
                if entries.len() == 1 {
                    return sizes
                        .map(|size| size.map(Some))
                        .collect::<Result<_, _>>()
                        .map(DeviceSpec::Sim);
                }
                sizes
                    .enumerate()
                    .map(|(device, size)| {
                        size.map(Some).map_err(|error| SpecError::BadEntry {
                            spec: text.to_string(),
                            device,
                            error: Box::new(error),
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(DeviceSpec::Sim)
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

/// One simulated device's capacity.
fn sim_size(text: &str) -> Result<u64, SpecError> {
    let bytes = parse_size(text)?;
    if bytes > super::sim::MAX_TOTAL_MEMORY {
        return Err(SpecError::SimTooLarge(text.trim().to_string()));
    }
    Ok(bytes)
}

impl fmt::Display for DeviceSpec {
    /// `sim`, `sim:SIZE` or `sim:SIZE,SIZE,...` (an H200 entry as its byte count once there
    /// are several), `cuda:N`. A size is written in the largest binary unit that holds it
    /// exactly (`sim:2GiB`, `sim:150109880320`), so it reads as one would write it and parses
    /// back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Sim(sizes) if sizes.as_slice() == [None] => write!(f, "sim"),
            DeviceSpec::Sim(sizes) => {
                let sizes: Vec<String> = sizes
                    .iter()
                    .map(|size| size_text(size.unwrap_or(super::sim::H200_TOTAL_MEMORY)))
                    .collect();
                write!(f, "sim:{}", sizes.join(","))
            }
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
            let spec = DeviceSpec::sim_of(bytes);
            assert_eq!(spec.to_string(), text);
            assert_eq!(text.parse(), Ok(spec));
        }
    }

    #[test]
    fn parses_device_names() {
        assert_eq!("sim".parse(), Ok(DeviceSpec::sim()));
        assert_eq!("sim:80GiB".parse(), Ok(DeviceSpec::sim_of(80 << 30)));
        assert_eq!(
            "sim:150109880320".parse(),
            Ok(DeviceSpec::sim_of(150_109_880_320))
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
    fn a_list_gives_one_simulated_device_per_entry() {
        assert_eq!(
            "sim:80GiB,40GiB".parse(),
            Ok(DeviceSpec::Sim(vec![Some(80 << 30), Some(40 << 30)]))
        );
        assert_eq!(
            " SIM:1GiB, 2GiB ".parse(),
            Ok(DeviceSpec::Sim(vec![Some(1 << 30), Some(2 << 30)]))
        );
        let spec: DeviceSpec = "sim:1GiB,2GiB".parse().expect("parses");
        assert_eq!(spec.to_string(), "sim:1GiB,2GiB");
        assert_eq!(spec.to_string().parse(), Ok(spec));
        assert_eq!(DeviceSpec::sim().to_string(), "sim");
    }

    #[test]
    fn a_bad_list_entry_is_named() {
        let error = "sim:80GiB,12 parsecs"
            .parse::<DeviceSpec>()
            .expect_err("bad entry");
        assert_eq!(
            error.to_string(),
            "device 1 of 'sim:80GiB,12 parsecs' (entry 2): invalid size '12 parsecs': expected bytes or a number with a unit (B, KB, MB, GB, KiB, MiB, GiB, TiB), e.g. '80GiB'"
        );
        let error = "sim:80GiB,,1GiB".parse::<DeviceSpec>().expect_err("empty");
        assert!(
            error
                .to_string()
                .starts_with("device 1 of 'sim:80GiB,,1GiB' (entry 2): invalid size ''"),
            "{error}"
        );
        let error = "sim:1GiB,100TiB"
            .parse::<DeviceSpec>()
            .expect_err("too large");
        assert!(
            error
                .to_string()
                .ends_with("simulated device size '100TiB' is too large: at most 64 TiB"),
            "{error}"
        );
        let many = format!("sim:{}", vec!["1GiB"; MAX_SIM_DEVICES + 1].join(","));
        assert!(matches!(
            many.parse::<DeviceSpec>(),
            Err(SpecError::TooManyDevices { count: 65, .. })
        ));
        assert!(matches!(
            "cuda:0,1".parse::<DeviceSpec>(),
            Err(SpecError::BadIndex(_))
        ));
    }

    #[test]
    fn a_machine_can_be_given_a_device_count() {
        let one = DeviceSpec::sim_of(1 << 30);
        assert_eq!(one.with_count(3), DeviceSpec::Sim(vec![Some(1 << 30); 3]));
        let two = DeviceSpec::Sim(vec![Some(1), Some(2)]);
        assert_eq!(two.with_count(1), DeviceSpec::Sim(vec![Some(1)]));
        assert_eq!(
            DeviceSpec::sim().with_count(2),
            DeviceSpec::Sim(vec![None, None])
        );
        assert_eq!(DeviceSpec::Cuda(1).with_count(2), DeviceSpec::Cuda(1));
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
