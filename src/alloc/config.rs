//! The allocator's configuration, parsed from PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax:
//! comma-separated `key:value` pairs, where a value may be a bracketed list
//! (`roundup_power2_divisions:[256:1,512:2,>:8]`).

use thiserror::Error;

use super::{LARGE_BUFFER, MIB};

/// Number of `roundup_power2_divisions` intervals: one per power of two from 1 MiB to 64 GiB
/// (PyTorch's `kRoundUpPowerOfTwoIntervals`).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// A configuration string PyTorch would reject, with the reason in PyTorch's terms.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// A key PyTorch's CUDA allocator does not know.
    #[error("Unrecognized key '{0}' in CUDA allocator config.")]
    UnknownKey(String),
    /// The text does not follow `key:value[,key:value...]`.
    #[error("malformed allocator config: {0}")]
    Syntax(String),
    /// A key's value is out of its allowed range or of the wrong kind.
    #[error("invalid value for {key}: {reason}")]
    BadValue {
        /// The option whose value was rejected.
        key: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// An option gpumem parses but does not implement yet.
    #[error("{0} is not yet supported by gpumem")]
    Unsupported(String),
}

/// The options that change the native caching allocator's behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConf {
    /// Blocks of at least this many bytes are never split, and requests below it never use
    /// them (`max_split_size_mb`). `u64::MAX` = unlimited, PyTorch's default (`SIZE_MAX`).
    pub max_split_size: u64,
    /// A request of at least `max_split_size` may use a cached block only if the block is
    /// smaller than the request plus this (`max_non_split_rounding_mb`, default 20 MiB).
    pub max_non_split_rounding_size: u64,
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
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            source: String::new(),
        }
    }
}

/// Splits a config string the way PyTorch's `ConfigTokenizer` does: `,` `:` `[` `]` are tokens
/// of their own, whitespace separates nothing and is dropped.
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
            c if c.is_whitespace() => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

/// A cursor over the tokens with PyTorch-like checks.
struct Tokens {
    tokens: Vec<String>,
    at: usize,
}

impl Tokens {
    fn next(&mut self, what: &str) -> Result<String, ConfigError> {
        let token = self.tokens.get(self.at).cloned().ok_or_else(|| {
            ConfigError::Syntax(format!("expected {what} but reached the end of the config"))
        })?;
        self.at += 1;
        Ok(token)
    }

    fn expect(&mut self, symbol: &str) -> Result<(), ConfigError> {
        let token = self.next(&format!("'{symbol}'"))?;
        if token == symbol {
            Ok(())
        } else {
            Err(ConfigError::Syntax(format!(
                "expected '{symbol}' but found '{token}'"
            )))
        }
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn unsigned(&mut self, key: &'static str) -> Result<u64, ConfigError> {
        let token = self.next("a number")?;
        token.parse::<u64>().map_err(|_| ConfigError::BadValue {
            key,
            reason: format!("expected a non-negative integer, found '{token}'"),
        })
    }

    fn boolean(&mut self, key: &'static str) -> Result<bool, ConfigError> {
        // PyTorch accepts exactly these two spellings.
        match self.next("True or False")?.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(ConfigError::BadValue {
                key,
                reason: format!("expected True or False, found '{other}'"),
            }),
        }
    }

    fn float(&mut self, key: &'static str) -> Result<f64, ConfigError> {
        let token = self.next("a number")?;
        token.parse::<f64>().map_err(|_| ConfigError::BadValue {
            key,
            reason: format!("expected a number, found '{token}'"),
        })
    }
}

impl AllocConf {
    /// Parses PyTorch's allocator config syntax. An empty string gives the defaults.
    pub fn parse(text: &str) -> Result<AllocConf, ConfigError> {
        let mut conf = AllocConf {
            source: text.to_string(),
            ..AllocConf::default()
        };
        let mut tokens = Tokens {
            tokens: tokenize(text),
            at: 0,
        };
        while let Some(key) = tokens.peek().map(str::to_string) {
            tokens.at += 1;
            if key == "," {
                continue;
            }
            tokens.expect(":")?;
            conf.parse_option(&key, &mut tokens)?;
            match tokens.peek() {
                None | Some(",") => {}
                Some(other) => {
                    return Err(ConfigError::Syntax(format!(
                        "expected ',' after the value of {key} but found '{other}'"
                    )))
                }
            }
        }
        Ok(conf)
    }

    fn parse_option(&mut self, key: &str, tokens: &mut Tokens) -> Result<(), ConfigError> {
        match key {
            "max_split_size_mb" => {
                self.max_split_size = parse_split_limit(tokens, "max_split_size_mb")?;
            }
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding_size =
                    parse_split_limit(tokens, "max_non_split_rounding_mb")?;
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = parse_roundup_divisions(tokens)?;
            }
            "garbage_collection_threshold" => {
                let value = tokens.float("garbage_collection_threshold")?;
                // PyTorch: "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".
                if !(value > 0.0 && value < 1.0) {
                    return Err(ConfigError::BadValue {
                        key: "garbage_collection_threshold",
                        reason: format!("{value} is outside (0.0, 1.0)"),
                    });
                }
                self.garbage_collection_threshold = value;
            }
            "expandable_segments" => {
                self.expandable_segments = tokens.boolean("expandable_segments")?;
            }
            "per_process_memory_fraction" => {
                let value = tokens.float("per_process_memory_fraction")?;
                if !(0.0..=1.0).contains(&value) {
                    return Err(ConfigError::BadValue {
                        key: "per_process_memory_fraction",
                        reason: format!("{value} is outside [0.0, 1.0]"),
                    });
                }
                self.per_process_memory_fraction = Some(value);
            }
            "backend" => {
                let backend = tokens.next("a backend name")?;
                match backend.as_str() {
                    "native" => {}
                    "cudaMallocAsync" => {
                        return Err(ConfigError::Unsupported("backend:cudaMallocAsync".into()))
                    }
                    other => {
                        return Err(ConfigError::BadValue {
                            key: "backend",
                            reason: format!("expected native or cudaMallocAsync, found '{other}'"),
                        })
                    }
                }
            }
            // Options that exist in PyTorch but change nothing the allocator counts on one
            // stream: the lock around cudaMalloc, graph-capture reuse, and the host (pinned)
            // allocator. They are validated and otherwise ignored.
            "release_lock_on_cudamalloc" => {
                tokens.boolean("release_lock_on_cudamalloc")?;
            }
            "graph_capture_record_stream_reuse" => {
                tokens.boolean("graph_capture_record_stream_reuse")?;
            }
            "pinned_use_cuda_host_register" => {
                tokens.boolean("pinned_use_cuda_host_register")?;
            }
            "pinned_use_background_threads" => {
                tokens.boolean("pinned_use_background_threads")?;
            }
            "pinned_num_register_threads" => {
                let threads = tokens.unsigned("pinned_num_register_threads")?;
                if !threads.is_power_of_two() || threads > 128 {
                    return Err(ConfigError::BadValue {
                        key: "pinned_num_register_threads",
                        reason: format!("{threads} is not a power of two up to 128"),
                    });
                }
            }
            other => return Err(ConfigError::UnknownKey(other.to_string())),
        }
        Ok(())
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

/// `max_split_size_mb` and `max_non_split_rounding_mb`: megabytes, at least 20 (the large
/// segment size, `kLargeBuffer`), capped so the byte count fits.
fn parse_split_limit(tokens: &mut Tokens, key: &'static str) -> Result<u64, ConfigError> {
    let megabytes = tokens.unsigned(key)?;
    let minimum = LARGE_BUFFER / MIB;
    if megabytes < minimum {
        return Err(ConfigError::BadValue {
            key,
            reason: format!("{megabytes} is too small, must be >= {minimum}"),
        });
    }
    Ok(megabytes.min(u64::MAX / MIB) * MIB)
}

/// `roundup_power2_divisions`: either one power of two for every interval, or a list
/// `[MB:divisions, ..., >:divisions]` whose keys are interval starts in MiB (powers of two).
/// The first pair also fills every interval below it; `>` fills every interval above the last.
fn parse_roundup_divisions(
    tokens: &mut Tokens,
) -> Result<[u64; ROUNDUP_POWER2_INTERVALS], ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let mut table = [0_u64; ROUNDUP_POWER2_INTERVALS];
    if tokens.peek() != Some("[") {
        let value = tokens.unsigned(KEY)?;
        if !value.is_power_of_two() {
            return Err(ConfigError::BadValue {
                key: KEY,
                reason: format!("{value} is not a power of 2"),
            });
        }
        return Ok([value; ROUNDUP_POWER2_INTERVALS]);
    }
    tokens.expect("[")?;
    let mut first = true;
    let mut last_index = 0_usize;
    loop {
        let bound = tokens.next("an interval or ']'")?;
        if bound == "]" {
            break;
        }
        tokens.expect(":")?;
        let value = tokens.unsigned(KEY)?;
        if value != 0 && !value.is_power_of_two() {
            return Err(ConfigError::BadValue {
                key: KEY,
                reason: format!("divisions must be a power of 2 or 0, found {value}"),
            });
        }
        if bound == ">" {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = value;
            }
        } else {
            let megabytes: u64 = bound.parse().map_err(|_| ConfigError::BadValue {
                key: KEY,
                reason: format!("expected an interval in MB or '>', found '{bound}'"),
            })?;
            if !megabytes.is_power_of_two() {
                return Err(ConfigError::BadValue {
                    key: KEY,
                    reason: format!("interval {megabytes} is not a power of 2"),
                });
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
        match tokens.peek() {
            Some("]") => {}
            _ => tokens.expect(",")?,
        }
    }
    Ok(table)
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
        assert!(err("max_split_size_mb:10").contains("too small"));
        assert!(err("max_split_size_mb:-1").contains("non-negative integer"));
        assert!(err("garbage_collection_threshold:1.5").contains("(0.0, 1.0)"));
        assert!(err("roundup_power2_divisions:3").contains("power of 2"));
        assert!(err("bogus:1").contains("Unrecognized key 'bogus'"));
        assert!(err("expandable_segments:yes").contains("True or False"));
        assert!(err("max_split_size_mb").contains("end of the config"));
        assert!(err("max_split_size_mb:64:32").contains("expected ','"));
        assert!(err("roundup_power2_divisions:[256:1").contains("end of the config"));
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
}
