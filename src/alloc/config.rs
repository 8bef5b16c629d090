//! The allocator's configuration, parsed from PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax:
//! comma-separated `key:value` pairs, where a value may be a bracketed list
//! (`roundup_power2_divisions:[256:1,512:2,>:8]`).

use thiserror::Error;

use super::{LARGE_BUFFER, MIB, MIN_LARGE_ALLOC};

/// Number of `roundup_power2_divisions` intervals: one per power of two from 1 MiB to 64 GiB
/// (PyTorch's `kRoundUpPowerOfTwoIntervals`).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// A configuration string PyTorch would reject, with the reason in PyTorch's terms. Every
/// variant names the key it concerns.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// A key PyTorch's CUDA allocator does not know (a stray `,` is such a key too).
    #[error("Unrecognized key '{0}' in CUDA allocator config.")]
    UnknownKey(String),
    /// The config ends where PyTorch's parser reads one more token (PyTorch raises an
    /// internal "Index out of bounds in ConfigTokenizer" error there).
    #[error("malformed allocator config: {key} needs {expected} but the config ends (PyTorch: Index out of bounds in ConfigTokenizer)")]
    Truncated {
        /// The key being read.
        key: String,
        /// What was still needed.
        expected: &'static str,
    },
    /// A key's value is out of its allowed range or of the wrong kind.
    #[error("invalid value for {key}: {reason}")]
    BadValue {
        /// The option whose value was rejected.
        key: &'static str,
        /// What was wrong with it, in PyTorch's words where PyTorch has words for it.
        reason: String,
    },
    /// An option gpumem parses but does not implement yet.
    #[error("{0} is not yet supported by gpumem")]
    Unsupported(String),
}

impl ConfigError {
    /// The key the error is about.
    pub fn key(&self) -> &str {
        match self {
            ConfigError::UnknownKey(key) | ConfigError::Truncated { key, .. } => key,
            ConfigError::BadValue { key, .. } => key,
            ConfigError::Unsupported(what) => what.split(':').next().unwrap_or(what),
        }
    }
}

/// The options that change the native caching allocator's behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConf {
    /// Blocks of at least this many bytes are never split, and requests below it never use
    /// them (`max_split_size_mb`). `u64::MAX` = unlimited, PyTorch's default (`SIZE_MAX`).
    pub max_split_size: u64,
    /// A request of at least `max_split_size` may use a cached block only if the block is
    /// smaller than the request plus this (`max_non_split_rounding_mb`; by default the large
    /// segment size, 20 MiB). The sum wraps modulo 2^64 as PyTorch's `size_t` addition does.
    pub max_non_split_rounding_size: u64,
    /// The segment size of large requests below 10 MiB and the page size of the large pool's
    /// expandable segments (`large_segment_size_mb`, PyTorch 2.11's
    /// `AcceleratorAllocatorConfig::large_segment_size`; 20 MiB by default). It is also the
    /// smallest `max_split_size_mb` and `max_non_split_rounding_mb` accepted.
    pub large_segment_size: u64,
    /// Divisions per power-of-two interval for size rounding; 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are garbage-collected before
    /// a new segment is requested; 0 = off. Only active together with a memory fraction.
    pub garbage_collection_threshold: f64,
    /// Whether new memory comes from expandable segments (`expandable_segments:True`): one
    /// growable virtual range per stream and pool, mapped in whole pages.
    pub expandable_segments: bool,
    /// A fraction given in the config (`per_process_memory_fraction`), applied at start.
    pub per_process_memory_fraction: Option<f64>,
    /// The text this was parsed from, for display.
    pub source: String,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            large_segment_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            source: String::new(),
        }
    }
}

/// Keys PyTorch 2.11's device-generic parser (`AcceleratorAllocatorConfig`) reads
/// (`getMutableKeys`).
pub const COMMON_KEYS: [&str; 7] = [
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
];

/// Keys PyTorch 2.11's CUDA parser (`CUDAAllocatorConfig`) reads; the `hip` spellings are
/// accepted on CUDA builds too.
pub const CUDA_KEYS: [&str; 9] = [
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
];

/// Splits a config string as PyTorch's `ConfigTokenizer` does: `,` `:` `[` `]` are tokens of
/// their own and ASCII whitespace (C's `isspace`) is dropped everywhere, even inside words.
fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    tokens.push(std::mem::take(&mut word));
                }
                tokens.push(c.to_string());
            }
            ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

/// The tokens with PyTorch's accessors. Like PyTorch's `checkToken`, nothing here checks that a
/// separator is the expected one (PyTorch ignores that result): only that a token exists.
struct Tokens<'a> {
    tokens: &'a [String],
    key: &'a str,
}

impl Tokens<'_> {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The token at `i`, or PyTorch's out-of-bounds failure.
    fn at(&self, i: usize, expected: &'static str) -> Result<&str, ConfigError> {
        self.tokens
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| ConfigError::Truncated {
                key: self.key.to_string(),
                expected,
            })
    }

    /// `std::stoull` of the token at `i`.
    fn size_t(&self, i: usize, key: &'static str) -> Result<u64, ConfigError> {
        let token = self.at(i, "a value")?;
        c_stoull(token).ok_or_else(|| ConfigError::BadValue {
            key,
            reason: format!("expected a non-negative integer, found '{token}' (PyTorch: stoull)"),
        })
    }

    /// `std::stod` of the token at `i`.
    fn double(&self, i: usize, key: &'static str) -> Result<f64, ConfigError> {
        let token = self.at(i, "a value")?;
        c_stod(token).ok_or_else(|| ConfigError::BadValue {
            key,
            reason: format!("expected a number, found '{token}' (PyTorch: stod)"),
        })
    }

    /// PyTorch's `toBool`: exactly `True` or `False`.
    fn boolean(&self, i: usize, key: &'static str) -> Result<bool, ConfigError> {
        match self.at(i, "True or False")? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(ConfigError::BadValue {
                key,
                reason: format!(
                    "Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{other}'"
                ),
            }),
        }
    }

    /// PyTorch's `skipKey`: past the `:` to the value, or to the `]` closing a list value.
    fn skip_value(&self, i: usize) -> Result<usize, ConfigError> {
        self.at(i + 1, "':' and a value")?;
        let mut i = i + 2;
        if self.at(i, "a value")? != "[" {
            return Ok(i);
        }
        loop {
            i += 1;
            if self.at(i, "']'")? == "]" {
                return Ok(i);
            }
        }
    }
}

/// C's `strtoull` in base 10 as `std::stoull` uses it: an optional sign, then digits, and
/// whatever follows is ignored; a negative number wraps modulo 2^64. `None` when there are no
/// digits or the number overflows (stoull throws).
fn c_stoull(token: &str) -> Option<u64> {
    let (negative, digits) = match token.as_bytes().first() {
        Some(b'-') => (true, &token[1..]),
        Some(b'+') => (false, &token[1..]),
        _ => (false, token),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let value = digits[..end].parse::<u64>().ok()?;
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

/// C's `strtod` prefix as `std::stod` uses it: an optional sign, `inf`/`infinity`/`nan`, or a
/// decimal number with an optional exponent; whatever follows is ignored. `None` when no number
/// starts the token or it overflows or underflows (stod throws on `ERANGE`). Hexadecimal floats
/// are read as their leading `0`.
fn c_stod(token: &str) -> Option<f64> {
    let bytes = token.as_bytes();
    let mut end = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let lower = token[end..].to_ascii_lowercase();
    for word in ["infinity", "inf", "nan"] {
        if lower.starts_with(word) {
            let sign = if bytes.first() == Some(&b'-') {
                -1.0
            } else {
                1.0
            };
            return Some(if word == "nan" {
                f64::NAN
            } else {
                sign * f64::INFINITY
            });
        }
    }
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(bytes.len(), |n| from + n)
    };
    let int_end = digits(end);
    let mut mantissa_digits = int_end - end;
    end = int_end;
    if bytes.get(end) == Some(&b'.') {
        let frac_end = digits(end + 1);
        mantissa_digits += frac_end - end - 1;
        end = frac_end;
    }
    if mantissa_digits == 0 {
        return None;
    }
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        let exp_end = digits(end + 1 + sign);
        if exp_end > end + 1 + sign {
            end = exp_end;
        }
    }
    let text = &token[..end];
    let value: f64 = text.parse().ok()?;
    let nonzero = text
        .split(['e', 'E'])
        .next()
        .is_some_and(|m| m.bytes().any(|b| (b'1'..=b'9').contains(&b)));
    let out_of_range = value.is_infinite() || (nonzero && (value == 0.0 || value.is_subnormal()));
    (!out_of_range).then_some(value)
}

impl AllocConf {
    /// Parses PyTorch's allocator config syntax exactly as PyTorch 2.11 does: the text goes
    /// through the device-generic parser, then the CUDA one, and either may refuse it. An
    /// empty string gives the defaults.
    pub fn parse(text: &str) -> Result<AllocConf, ConfigError> {
        let mut conf = AllocConf {
            source: text.to_string(),
            ..AllocConf::default()
        };
        let tokens = tokenize(text);
        conf.parse_large_segment_size(&tokens)?;
        for cuda_pass in [false, true] {
            conf.parse_pass(&tokens, cuda_pass)?;
        }
        Ok(conf)
    }

    /// PyTorch 2.11's first loop of `AcceleratorAllocatorConfig::parseArgs`: before any other
    /// key, every token equal to `large_segment_size_mb` is read with its value (the last one
    /// wins), because the other size options are checked against it; then
    /// `max_non_split_rounding_size` takes its value as its default. This loop looks at every
    /// token, separators and values included, and checks nothing else.
    fn parse_large_segment_size(&mut self, all: &[String]) -> Result<(), ConfigError> {
        const KEY: &str = "large_segment_size_mb";
        let mut i = 0;
        while i < all.len() {
            if all[i] == KEY {
                let tokens = Tokens {
                    tokens: all,
                    key: KEY,
                };
                tokens.at(i + 1, "':' and a value")?;
                i += 2;
                let megabytes = tokens.size_t(i, KEY)?;
                // PyTorch's parseLargeSegmentSize: more than kMinLargeAlloc (10 MiB), capped
                // at SIZE_MAX / MiB so the byte count fits.
                let minimum = MIN_LARGE_ALLOC / MIB;
                if megabytes <= minimum {
                    return Err(ConfigError::BadValue {
                        key: KEY,
                        reason: format!(
                            "CachingAllocator option large_segment_size_mb must be > {minimum} MB (got {megabytes})"
                        ),
                    });
                }
                self.large_segment_size = megabytes.min(u64::MAX / MIB) * MIB;
            }
            i += 1;
        }
        self.max_non_split_rounding_size = self.large_segment_size;
        Ok(())
    }

    /// One of PyTorch's two loops over the tokens (`AcceleratorAllocatorConfig::parseArgs`,
    /// then `CUDAAllocatorConfig::parseArgs`): a key at `i`, its value, and then one token
    /// taken as the `,` without looking at it. Each loop skips the other's keys.
    fn parse_pass(&mut self, all: &[String], cuda_pass: bool) -> Result<(), ConfigError> {
        let mut i = 0;
        while i < all.len() {
            let key = all[i].as_str();
            let tokens = Tokens { tokens: all, key };
            let mine = if cuda_pass {
                CUDA_KEYS.contains(&key)
            } else {
                COMMON_KEYS.contains(&key)
            };
            i = if mine {
                self.parse_option(&tokens, i)?
            } else if cuda_pass && !COMMON_KEYS.contains(&key) {
                return Err(ConfigError::UnknownKey(key.to_string()));
            } else {
                tokens.skip_value(i)?
            };
            if i + 1 < tokens.len() {
                i += 1;
            }
            i += 1;
        }
        Ok(())
    }

    /// Reads the value of the key at `i` (PyTorch's `parseXxx` functions) and returns the index
    /// of its last token.
    fn parse_option(&mut self, tokens: &Tokens<'_>, i: usize) -> Result<usize, ConfigError> {
        tokens.at(i + 1, "':' and a value")?;
        let value = i + 2;
        let large_segment_size = self.large_segment_size;
        match tokens.key {
            // Read before every other key (`parse_large_segment_size`); skipped here as
            // PyTorch's second loop skips it.
            "large_segment_size_mb" => return tokens.skip_value(i),
            "max_split_size_mb" => {
                self.max_split_size =
                    split_limit(tokens, value, "max_split_size_mb", large_segment_size)?;
            }
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding_size = split_limit(
                    tokens,
                    value,
                    "max_non_split_rounding_mb",
                    large_segment_size,
                )?;
            }
            "garbage_collection_threshold" => {
                let threshold = tokens.double(value, "garbage_collection_threshold")?;
                if !(threshold > 0.0 && threshold < 1.0) {
                    return Err(ConfigError::BadValue {
                        key: "garbage_collection_threshold",
                        reason: format!(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0) (got {threshold})"
                        ),
                    });
                }
                self.garbage_collection_threshold = threshold;
            }
            "roundup_power2_divisions" => {
                return parse_roundup_divisions(tokens, value, &mut self.roundup_power2_divisions)
            }
            "expandable_segments" => {
                self.expandable_segments = tokens.boolean(value, "expandable_segments")?;
            }
            "per_process_memory_fraction" => {
                let fraction = tokens.double(value, "per_process_memory_fraction")?;
                if !(0.0..=1.0).contains(&fraction) {
                    return Err(ConfigError::BadValue {
                        key: "per_process_memory_fraction",
                        reason: format!(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0] (got {fraction})"
                        ),
                    });
                }
                self.per_process_memory_fraction = Some(fraction);
            }
            "backend" => match tokens.at(value, "a backend name")? {
                "native" => {}
                "cudaMallocAsync" => {
                    return Err(ConfigError::Unsupported("backend:cudaMallocAsync".into()))
                }
                other => {
                    return Err(ConfigError::BadValue {
                        key: "backend",
                        reason: format!(
                            "Unknown allocator backend, options are native and cudaMallocAsync (got '{other}')"
                        ),
                    })
                }
            },
            // Options that exist in PyTorch but change nothing this allocator counts on one
            // stream: the lock around cudaMalloc, graph-capture reuse and the host (pinned)
            // allocator. They are validated as PyTorch validates them and otherwise ignored.
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                tokens.boolean(value, "release_lock_on_cudamalloc")?;
            }
            "graph_capture_record_stream_reuse" => {
                tokens.boolean(value, "graph_capture_record_stream_reuse")?;
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                tokens.boolean(value, "pinned_use_cuda_host_register")?;
            }
            "pinned_use_background_threads" => {
                tokens.boolean(value, "pinned_use_background_threads")?;
            }
            "pinned_num_register_threads" => {
                let threads = tokens.size_t(value, "pinned_num_register_threads")?;
                let reason = if !threads.is_power_of_two() {
                    format!("Number of register threads has to be power of 2, got {threads}")
                } else if threads > 128 {
                    format!("Number of register threads should be less than or equal to 128, got {threads}")
                } else {
                    String::new()
                };
                if !reason.is_empty() {
                    return Err(ConfigError::BadValue {
                        key: "pinned_num_register_threads",
                        reason,
                    });
                }
            }
            "pinned_reserve_segment_size_mb" => {
                if tokens.size_t(value, "pinned_reserve_segment_size_mb")? == 0 {
                    return Err(ConfigError::BadValue {
                        key: "pinned_reserve_segment_size_mb",
                        reason: "Pinned reserve segment size has to be greater than 0".into(),
                    });
                }
            }
            other => return Err(ConfigError::UnknownKey(other.to_string())),
        }
        Ok(value)
    }

    /// The config as PyTorch-syntax text naming only what differs from the defaults; parsing
    /// it gives back an equal config (apart from [`AllocConf::source`]).
    pub fn canonical(&self) -> String {
        let defaults = AllocConf::default();
        let mut parts = Vec::new();
        if self.large_segment_size != defaults.large_segment_size {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size / MIB
            ));
        }
        if self.max_split_size != defaults.max_split_size {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size / MIB));
        }
        // Its default is the large segment size.
        if self.max_non_split_rounding_size != self.large_segment_size {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding_size / MIB
            ));
        }
        if self.roundup_power2_divisions != defaults.roundup_power2_divisions {
            let list: Vec<String> = self
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(index, divisions)| format!("{}:{divisions}", 1_u64 << index))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
        if self.garbage_collection_threshold != defaults.garbage_collection_threshold {
            parts.push(format!(
                "garbage_collection_threshold:{:?}",
                self.garbage_collection_threshold
            ));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if let Some(fraction) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{fraction:?}"));
        }
        parts.join(",")
    }

    /// Whether `max_split_size_mb` was set (PyTorch compares with `SIZE_MAX`).
    pub fn has_split_limit(&self) -> bool {
        self.max_split_size != u64::MAX
    }

    /// The value `memory_stats()["max_split_size"]` reports: the limit in bytes, or -1 when
    /// unlimited (`SIZE_MAX` cast to a signed 64-bit integer).
    pub fn max_split_size_stat(&self) -> i64 {
        self.max_split_size as i64
    }

    /// Divisions to use when rounding a request of `size` bytes (PyTorch's
    /// `roundup_power2_divisions(size)`): interval 0 covers everything below 2 MiB, interval
    /// `k` covers `[2^(20+k), 2^(21+k))`, the last one everything from 32 GiB up.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log_size = 63 - u64::from(size.max(1).leading_zeros());
        let index = log_size
            .saturating_sub(20)
            .min(ROUNDUP_POWER2_INTERVALS as u64 - 1);
        self.roundup_power2_divisions[index as usize]
    }
}

/// `max_split_size_mb` and `max_non_split_rounding_mb`: megabytes, at least the large segment
/// size (20 by default; PyTorch 2.11's `parseMaxSplitSize` and `parseMaxNonSplitRoundingSize`
/// compare with `large_segment_size_ / kMB`), capped at `SIZE_MAX / MiB` so the byte count
/// fits.
fn split_limit(
    tokens: &Tokens<'_>,
    i: usize,
    key: &'static str,
    large_segment_size: u64,
) -> Result<u64, ConfigError> {
    let megabytes = tokens.size_t(i, key)?;
    let minimum = large_segment_size / MIB;
    if megabytes < minimum {
        return Err(ConfigError::BadValue {
            key,
            reason: format!(
                "CachingAllocator option {key} too small, must be >= {minimum} (got {megabytes})"
            ),
        });
    }
    Ok(megabytes.min(u64::MAX / MIB) * MIB)
}

/// `roundup_power2_divisions` at token `i`: either one power of two for every interval, or a
/// list `[MB:divisions, ..., >:divisions]` whose keys are interval starts in MiB (powers of
/// two). The first pair also fills every interval below it; `>` fills every interval above the
/// last. Returns the index of the value's last token (the `]` of a list).
fn parse_roundup_divisions(
    tokens: &Tokens<'_>,
    mut i: usize,
    table: &mut [u64; ROUNDUP_POWER2_INTERVALS],
) -> Result<usize, ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let bad = |reason: &str| ConfigError::BadValue {
        key: KEY,
        reason: reason.to_string(),
    };
    if tokens.at(i, "a value")? != "[" {
        let value = tokens.size_t(i, KEY)?;
        if !value.is_power_of_two() {
            return Err(bad("For roundups, the divisions has to be power of 2"));
        }
        *table = [value; ROUNDUP_POWER2_INTERVALS];
        return Ok(i);
    }
    let mut first = true;
    let mut last_index = 0_usize;
    loop {
        i += 1;
        if i >= tokens.len() {
            return Err(ConfigError::Truncated {
                key: KEY.into(),
                expected: "']'",
            });
        }
        if tokens.at(i, "']'")? == "]" {
            return Ok(i);
        }
        let bound_index = i;
        tokens.at(i + 1, "':' and a value")?;
        i += 2;
        let value = tokens.size_t(i, KEY)?;
        if value != 0 && !value.is_power_of_two() {
            return Err(bad(
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup",
            ));
        }
        if tokens.at(bound_index, "an interval")? == ">" {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = value;
            }
        } else {
            let megabytes = tokens.size_t(bound_index, KEY)?;
            if !megabytes.is_power_of_two() {
                return Err(bad("For roundups, the intervals have to be power of 2"));
            }
            let index = (63 - megabytes.leading_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
            if first {
                for slot in table.iter_mut().take(index) {
                    *slot = value;
                }
                first = false;
            }
            table[index] = value;
            last_index = index;
        }
        if tokens.at(i + 1, "',' or ']'")? != "]" {
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_default() {
        assert_eq!(AllocConf::parse("").map(|c| c.max_split_size), Ok(u64::MAX));
        assert_eq!(AllocConf::default().max_split_size_stat(), -1);
    }

    #[test]
    fn parses_every_supported_option() {
        let conf = AllocConf::parse(
            "max_split_size_mb:64, roundup_power2_divisions:4,garbage_collection_threshold:0.6",
        )
        .expect("valid config");
        assert_eq!(conf.max_split_size, 64 * MIB);
        assert_eq!(conf.roundup_power2_divisions, [4; 16]);
        assert_eq!(conf.garbage_collection_threshold, 0.6);
        assert_eq!(conf.max_split_size_stat(), 64 * MIB as i64);
    }

    #[test]
    fn parses_roundup_list_form() {
        let conf = AllocConf::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
            .expect("valid config");
        let table = conf.roundup_power2_divisions;
        assert_eq!(&table[..9], &[1; 9]);
        assert_eq!(table[9], 2);
        assert_eq!(table[10], 4);
        assert_eq!(&table[11..], &[8; 5]);
        assert_eq!(conf.divisions_for(300 << 20), 1);
        assert_eq!(conf.divisions_for(600 << 20), 2);
        assert_eq!(conf.divisions_for(100 << 30), 8);
    }

    #[test]
    fn rejects_bad_input_with_reasons() {
        let err = |text| AllocConf::parse(text).expect_err(text).to_string();
        assert!(err("max_split_size_mb:10").contains("too small, must be >= 20"));
        assert!(err("max_split_size_mb:x").contains("non-negative integer"));
        assert!(err("garbage_collection_threshold:1.5").contains("(0.0, 1.0)"));
        assert!(err("roundup_power2_divisions:3").contains("power of 2"));
        assert!(err("bogus:1").contains("Unrecognized key 'bogus'"));
        assert!(err("expandable_segments:yes").contains("Expected 'True' or 'False' at index 2"));
        assert!(err("max_split_size_mb").contains("config ends"));
        assert!(err("max_split_size_mb:64:32").contains("config ends"));
        assert!(err("roundup_power2_divisions:[256:1").contains("config ends"));
        assert!(AllocConf::parse("expandable_segments:False").is_ok());
        assert_eq!(
            AllocConf::parse("expandable_segments:True").map(|c| c.expandable_segments),
            Ok(true)
        );
        assert_eq!(
            AllocConf::parse("max_split_size_mb:64,expandable_segments:True")
                .map(|c| (c.expandable_segments, c.max_split_size)),
            Ok((true, 64 * MIB))
        );
        assert!(err("backend:cudaMallocAsync").contains("not yet supported"));
    }

    #[test]
    fn stray_commas_are_unrecognized_keys_as_in_pytorch() {
        for text in [
            ",max_split_size_mb:64",
            "max_split_size_mb:64,,garbage_collection_threshold:0.5",
        ] {
            assert_eq!(
                AllocConf::parse(text),
                Err(ConfigError::UnknownKey(",".into())),
                "{text}"
            );
        }
        // A trailing comma is taken as the separator PyTorch skips without looking at it; a
        // lone comma is a key without a value.
        assert!(AllocConf::parse("max_split_size_mb:64,").is_ok());
        assert!(matches!(
            AllocConf::parse(","),
            Err(ConfigError::Truncated { .. })
        ));
    }

    #[test]
    fn accepts_every_key_pytorch_2_11_accepts() {
        let conf = AllocConf::parse(
            "pinned_reserve_segment_size_mb:64,release_lock_on_hipmalloc:True,\
             pinned_use_hip_host_register:False,pinned_use_cuda_host_register:True,\
             pinned_num_register_threads:8,pinned_use_background_threads:True,\
             release_lock_on_cudamalloc:False,graph_capture_record_stream_reuse:True,\
             per_process_memory_fraction:0.5,backend:native",
        )
        .expect("PyTorch accepts all of these");
        assert_eq!(conf.per_process_memory_fraction, Some(0.5));
        let err = |text| AllocConf::parse(text).expect_err(text).to_string();
        assert!(err("pinned_reserve_segment_size_mb:0").contains("greater than 0"));
        assert!(err("pinned_num_register_threads:3").contains("power of 2, got 3"));
        assert!(err("pinned_num_register_threads:256").contains("less than or equal to 128"));
        assert!(err("release_lock_on_hipmalloc:1").contains("'True' or 'False'"));
        assert!(err("throw_on_cudamalloc_oom:True").contains("Unrecognized key"));
    }

    #[test]
    fn numbers_are_read_as_cs_stoull_and_stod_read_them() {
        // A leading number is enough; a minus sign wraps as an unsigned conversion does.
        let conf = AllocConf::parse("max_split_size_mb:64MB").expect("prefix");
        assert_eq!(conf.max_split_size, 64 * MIB);
        let conf = AllocConf::parse("max_split_size_mb:-1").expect("wraps");
        assert_eq!(conf.max_split_size, (u64::MAX / MIB) * MIB);
        let conf = AllocConf::parse("garbage_collection_threshold:.5x").expect("prefix");
        assert_eq!(conf.garbage_collection_threshold, 0.5);
        assert!(AllocConf::parse("max_split_size_mb:99999999999999999999").is_err());
        assert!(AllocConf::parse("garbage_collection_threshold:1e-400").is_err());
        assert!(AllocConf::parse("garbage_collection_threshold:nan").is_err());
        assert_eq!(c_stoull("+12"), Some(12));
        assert_eq!(c_stoull("x"), None);
        assert_eq!(c_stod("-2.5e1z"), Some(-25.0));
        assert_eq!(c_stod("e5"), None);
    }

    #[test]
    fn separators_are_not_checked_as_in_pytorch() {
        // PyTorch's checkToken only checks that a token exists, not which one it is.
        let conf = AllocConf::parse("max_split_size_mb,64").expect("PyTorch accepts this");
        assert_eq!(conf.max_split_size, 64 * MIB);
        let conf = AllocConf::parse("roundup_power2_divisions:[256:1:512:2]").expect("PyTorch too");
        assert_eq!(conf.roundup_power2_divisions[9], 2);
    }

    #[test]
    fn canonical_text_round_trips() {
        for text in [
            "",
            "max_split_size_mb:64,max_non_split_rounding_mb:40",
            "roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6",
            "per_process_memory_fraction:0.25,roundup_power2_divisions:4",
            "large_segment_size_mb:40,max_split_size_mb:64",
            "large_segment_size_mb:12,max_non_split_rounding_mb:20",
        ] {
            let conf = AllocConf::parse(text).expect(text);
            let again = AllocConf::parse(&conf.canonical()).expect("canonical parses");
            assert_eq!(
                AllocConf {
                    source: String::new(),
                    ..again
                },
                AllocConf {
                    source: String::new(),
                    ..conf
                },
                "{text}"
            );
        }
    }

    #[test]
    fn large_segment_size_is_read_first_and_bounds_the_split_options() {
        let conf = AllocConf::parse("large_segment_size_mb:40").expect("valid");
        assert_eq!(conf.large_segment_size, 40 * MIB);
        assert_eq!(
            conf.max_non_split_rounding_size,
            40 * MIB,
            "max_non_split_rounding_mb defaults to the large segment size"
        );
        assert_eq!(
            AllocConf::parse("large_segment_size_mb:11").map(|c| c.large_segment_size),
            Ok(11 * MIB)
        );
        // The last one wins, wherever the other keys are.
        let conf = AllocConf::parse(
            "large_segment_size_mb:40,max_split_size_mb:12,large_segment_size_mb:12",
        )
        .expect("12 >= 12");
        assert_eq!(
            (conf.large_segment_size, conf.max_split_size),
            (12 * MIB, 12 * MIB)
        );
        let err = |text| AllocConf::parse(text).expect_err(text).to_string();
        assert!(err("large_segment_size_mb:10").contains("must be > 10 MB"));
        assert!(err("large_segment_size_mb:x").contains("non-negative integer"));
        assert!(err("large_segment_size_mb").contains("config ends"));
        // Read before max_split_size_mb even when written after it.
        assert!(err("max_split_size_mb:30,large_segment_size_mb:40").contains("must be >= 40"));
        assert!(err("large_segment_size_mb:40,max_non_split_rounding_mb:30")
            .contains("max_non_split_rounding_mb too small, must be >= 40"));
        // Its errors come before any other key's, an unknown key's included.
        assert!(err("bogus:1,large_segment_size_mb:5").contains("must be > 10 MB"));
        // A smaller large segment lowers the other options' minimum.
        assert_eq!(
            AllocConf::parse("large_segment_size_mb:12,max_non_split_rounding_mb:12")
                .map(|c| c.max_non_split_rounding_size),
            Ok(12 * MIB)
        );
        assert_eq!(
            AllocConf::parse("large_segment_size_mb:18446744073709551615")
                .map(|c| c.large_segment_size),
            Ok(u64::MAX / MIB * MIB)
        );
    }

    #[test]
    fn every_error_names_a_key() {
        for text in [
            "bogus:1",
            "max_split_size_mb",
            "roundup_power2_divisions:[1:3]",
            "backend:x",
        ] {
            let error = AllocConf::parse(text).expect_err(text);
            assert!(text.contains(error.key()), "{text}: {error}");
            assert!(error.to_string().contains(error.key()), "{error}");
        }
    }
}
