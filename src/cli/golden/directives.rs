//! Directives at the top of a golden script: `//! device: cuda`, `//! alloc-conf: ...`.
//!
//! A script pins the device or allocator config it must run under with `//! key: value` lines.
//! Only the leading run of `//!` lines counts (the first other line ends it), so a directive is
//! always visible at a glance. Unknown keys are errors rather than ignored, so a typo such as
//! `//! alloc_conf:` cannot silently run the script under the wrong config.

use thiserror::Error;

use gpumem::device::DeviceSpec;

/// The keys a directive line may use.
pub const KEYS: [&str; 2] = ["device", "alloc-conf"];

/// What a script's header asks for; `None` leaves the command line's choice in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// `//! device: SPEC`: the device this script must run on.
    pub device: Option<DeviceSpec>,
    /// `//! alloc-conf: CONF`: the allocator config, replacing `--alloc-conf` entirely.
    pub alloc_conf: Option<String>,
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

/// Reads the directives from the leading `//!` lines of `source`.
pub fn parse(source: &str) -> Result<Directives, DirectiveError> {
    let mut directives = Directives::default();
    for (index, line) in source.lines().enumerate() {
        let Some(body) = line.trim_start().strip_prefix("//!") else {
            break;
        };
        let line = index + 1;
        let fail = |message: String| DirectiveError { line, message };
        let Some((key, value)) = body.split_once(':') else {
            return Err(fail(format!(
                "expected '//! KEY: VALUE' with KEY one of {}, got '{}'",
                KEYS.join(", "),
                body.trim()
            )));
        };
        let (key, value) = (key.trim(), value.trim());
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
            }
            "alloc-conf" => {
                if directives.alloc_conf.is_some() {
                    return Err(fail("'alloc-conf' is given twice".into()));
                }
                directives.alloc_conf = Some(value.to_string());
            }
            other => {
                return Err(fail(format!(
                    "unknown key '{other}'; expected one of {}",
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
    }

    #[test]
    fn reads_several_leading_directives() {
        let source = "//! device: cuda\n//!   alloc-conf: max_split_size_mb:64 \nprint(1);\n";
        let parsed = parse(source).expect("parses");
        assert_eq!(parsed.device, Some(DeviceSpec::Cuda(0)));
        assert_eq!(parsed.alloc_conf.as_deref(), Some("max_split_size_mb:64"));
    }

    #[test]
    fn only_the_leading_run_counts() {
        let parsed = parse("// first\n//! device: cuda\n").expect("parses");
        assert_eq!(parsed.device, None);
    }

    #[test]
    fn device_with_size_parses() {
        let parsed = parse("//! device: sim:8GiB\n").expect("parses");
        assert_eq!(parsed.device, Some(DeviceSpec::Sim(Some(8 << 30))));
    }

    #[test]
    fn unknown_key_is_an_error_naming_line_and_key() {
        let error = parse("//! device: sim\n//! alloc_conf: x\n").expect_err("rejected");
        assert_eq!(error.line, 2);
        assert!(error.to_string().contains("unknown key 'alloc_conf'"));
        assert!(error.to_string().contains("device, alloc-conf"));
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse("//! just words\n").is_err());
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
