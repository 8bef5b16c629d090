//! Directives: the lines at the top of a script that pin what it must run under —
//! `//! device: sim:1GiB`, `//! alloc-conf: max_split_size_mb:64`, `//! devices: 2` (the
//! script runs on exactly two devices: two simulated ones on the simulator, the first two GPUs
//! on CUDA, refused or skipped where there are fewer). One rule for every way a
//! script runs (`gpumem run`, `gpumem test`, the REPL's `:load`):
//!
//! - The *header* is the leading run of comment lines (`//`, `//!`) and blank lines; the first
//!   other line is code and ends it.
//! - In the header, a `//!` line whose text before its first `:` is one lowercase word
//!   (letters, digits, `-`, `_`) is a directive. The word must be a known key ([`KEYS`]); an
//!   unknown one such as `//! devise: sim` is an error, so a typo never goes unnoticed. Every
//!   other `//!` line (`//! Run: gpumem run x.rhai`, `//! Shows what empty_cache() does.`) is
//!   prose.
//! - A directive-shaped `//!` line after the header (after code) is an error: it would
//!   otherwise be silently ignored.
//! - Each key may be given once.
//!
//! A directive wins over the command line: a script that pins its config depends on it
//! (callers say on stderr when they ignore a flag for it).

use thiserror::Error;

use crate::device::spec::MAX_SIM_DEVICES;
use crate::device::DeviceSpec;

/// The keys a directive line may use.
pub const KEYS: [&str; 3] = ["device", "alloc-conf", "devices"];

/// What a script's header asks for; `None` leaves the caller's choice in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// `//! device: SPEC`: the device this script must run on.
    pub device: Option<DeviceSpec>,
    /// The device directive's value as written (`sim:1GiB`), for messages about it.
    pub device_text: Option<String>,
    /// `//! alloc-conf: CONF`: the allocator config, replacing `--alloc-conf` entirely.
    pub alloc_conf: Option<String>,
    /// `//! devices: N`: the script runs on exactly N devices, of the kind the session has.
    pub devices: Option<usize>,
}

impl Directives {
    /// Whether the script pins nothing.
    pub fn is_empty(&self) -> bool {
        self.device.is_none() && self.alloc_conf.is_none() && self.devices.is_none()
    }
}

/// A directive line that could not be understood, with its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("directive on line {line}: {message}")]
pub struct DirectiveError {
    /// The line of the script holding the bad directive.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

/// The key of a directive-shaped `//!` line and the rest after the `:`, else `None` (prose).
fn directive_shape(body: &str) -> Option<(&str, &str)> {
    let (key, value) = body.split_once(':')?;
    let key = key.trim();
    let shaped = key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    shaped.then_some((key, value.trim()))
}

/// Reads the directives of `source` (a leading byte order mark is ignored).
pub fn parse(source: &str) -> Result<Directives, DirectiveError> {
    let source = super::strip_bom(source);
    let mut directives = Directives::default();
    let mut in_header = true;
    for (index, line) in source.lines().enumerate() {
        let line_number = index + 1;
        let fail = |message: String| DirectiveError {
            line: line_number,
            message,
        };
        let trimmed = line.trim_start();
        if in_header && !(trimmed.is_empty() || trimmed.starts_with("//")) {
            in_header = false;
        }
        let Some((key, value)) = trimmed.strip_prefix("//!").and_then(directive_shape) else {
            continue;
        };
        if !in_header {
            return Err(fail(format!(
                "'//! {key}:' comes after code; directives belong in the comment lines at the top \
                 of the script"
            )));
        }
        if value.is_empty() {
            return Err(fail(format!("'{key}' needs a value")));
        }
        match key {
            "device" => {
                if directives.device.is_some() {
                    return Err(fail("'device' is given twice".into()));
                }
                let spec = value
                    .parse::<DeviceSpec>()
                    .map_err(|error| fail(error.to_string()))?;
                directives.device = Some(spec);
                directives.device_text = Some(value.to_string());
            }
            "alloc-conf" => {
                if directives.alloc_conf.is_some() {
                    return Err(fail("'alloc-conf' is given twice".into()));
                }
                directives.alloc_conf = Some(value.to_string());
            }
            "devices" => {
                if directives.devices.is_some() {
                    return Err(fail("'devices' is given twice".into()));
                }
                let count = value
                    .parse::<usize>()
                    .ok()
                    .filter(|count| (1..=MAX_SIM_DEVICES).contains(count))
                    .ok_or_else(|| {
                        fail(format!(
                            "'devices' must be a number of devices from 1 to {MAX_SIM_DEVICES}, got '{value}'"
                        ))
                    })?;
                directives.devices = Some(count);
            }
            other => {
                return Err(fail(format!(
                    "unknown key '{other}'; expected one of {} (a `//!` prose line must not \
                     start with a lowercase word and a colon)",
                    KEYS.join(", ")
                )))
            }
        }
    }
    Ok(directives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_header_means_no_directives() {
        let parsed = parse("// a comment\nprint(1);\n").expect("parses");
        assert_eq!(parsed, Directives::default());
        assert!(parsed.is_empty());
    }

    #[test]
    fn reads_several_leading_directives() {
        let source = "//! device: cuda\n//!   alloc-conf: max_split_size_mb:64 \nprint(1);\n";
        let parsed = parse(source).expect("parses");
        assert_eq!(parsed.device, Some(DeviceSpec::Cuda(0)));
        assert_eq!(parsed.alloc_conf.as_deref(), Some("max_split_size_mb:64"));
    }

    #[test]
    fn directives_after_ordinary_comments_and_prose_count() {
        let source = "\u{feff}// first\n//! Fragmentation: what it shows.\n//! Run: gpumem run x.rhai\n\n//! device: sim:8GiB\nprint(1);\n";
        let parsed = parse(source).expect("parses");
        assert_eq!(parsed.device, Some(DeviceSpec::sim_of(8 << 30)));
    }

    #[test]
    fn a_device_count_is_read_and_checked() {
        let parsed = parse("//! devices: 2\nprint(1);\n").expect("parses");
        assert_eq!(parsed.devices, Some(2));
        assert!(!parsed.is_empty());
        for bad in ["0", "two", "-1", "65"] {
            let error = parse(&format!("//! devices: {bad}\n")).expect_err("rejected");
            assert!(
                error
                    .to_string()
                    .contains("'devices' must be a number of devices from 1 to 64"),
                "{error}"
            );
        }
        assert!(parse("//! devices: 1\n//! devices: 2\n")
            .expect_err("twice")
            .to_string()
            .contains("twice"));
    }

    #[test]
    fn prose_lines_are_not_directives() {
        for line in [
            "//! Run: gpumem run scripts/oom.rhai",
            "//! The seed story, step by step.",
            "//! releases (only wholly free segments) and what `x` changes: run it twice,",
            "//!   gpumem run --alloc-conf max_split_size_mb:256 x.rhai",
        ] {
            assert_eq!(parse(line), Ok(Directives::default()), "{line}");
        }
    }

    #[test]
    fn unknown_key_is_an_error_naming_line_and_key() {
        let error = parse("//! device: sim\n//! alloc_conf: x\n").expect_err("rejected");
        assert_eq!(error.line, 2);
        assert!(error.to_string().contains("unknown key 'alloc_conf'"));
        assert!(error.to_string().contains("device, alloc-conf"));
        let error = parse("//! devise: sim\n").expect_err("rejected");
        assert!(
            error.to_string().contains("unknown key 'devise'"),
            "{error}"
        );
    }

    #[test]
    fn a_directive_after_code_is_an_error() {
        let error = parse("print(1);\n//! device: sim\n").expect_err("rejected");
        assert_eq!(error.line, 2);
        assert!(error.to_string().contains("comes after code"), "{error}");
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse("//! device:\n").is_err());
        assert!(parse("//! device: gpu\n")
            .expect_err("rejected")
            .to_string()
            .contains("unknown device 'gpu'"));
        assert!(parse("//! device: sim\n//! device: cuda\n")
            .expect_err("rejected")
            .to_string()
            .contains("twice"));
    }
}
