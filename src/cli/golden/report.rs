//! How results read: one status line per script, details under each failure, and the closing
//! `N passed, N failed[, N skipped]` line.

use std::fmt::Write;

use super::check::{Failure, ScriptResult, Verdict};
use super::diff;
use crate::cli::paint::{paint, Style};

/// Counts over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Scripts whose output matched (or was blessed).
    pub passed: usize,
    /// Scripts that failed.
    pub failed: usize,
    /// Scripts not run because their device is missing.
    pub skipped: usize,
    /// `.out` files `--bless` wrote (those scripts also count as passed).
    pub blessed: usize,
}

impl Summary {
    /// Adds one result.
    pub fn add(&mut self, result: &ScriptResult) {
        match result.verdict {
            Verdict::Passed => self.passed += 1,
            Verdict::Blessed { .. } => {
                self.passed += 1;
                self.blessed += 1;
            }
            Verdict::Skipped { .. } => self.skipped += 1,
            Verdict::Failed(_) => self.failed += 1,
        }
    }

    /// Whether the run succeeded: nothing failed.
    pub fn success(&self) -> bool {
        self.failed == 0
    }

    /// `N passed, N failed`, with `(N blessed)` after the passes when `--bless` wrote files and
    /// `, N skipped` when any were skipped.
    pub fn closing_line(&self) -> String {
        let mut line = format!("{} passed", self.passed);
        if self.blessed > 0 {
            let _ = write!(line, " ({} blessed)", self.blessed);
        }
        let _ = write!(line, ", {} failed", self.failed);
        if self.skipped > 0 {
            let _ = write!(line, ", {} skipped", self.skipped);
        }
        line
    }
}

/// Indents every line of `text` by two spaces, so details sit under their status line.
fn indented(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}

/// The lines printed for one result: a status word and the script's path, then for a failure
/// what went wrong (the diff, the error, or how to create a missing `.out`).
pub fn render(result: &ScriptResult, color: bool) -> String {
    let path = result.script.display();
    match &result.verdict {
        Verdict::Passed => format!("{} {path}\n", paint(color, "PASS ", Style::Green)),
        Verdict::Blessed { expected, created } => format!(
            "{} {path}: {} {}\n",
            paint(color, "BLESS", Style::Cyan),
            if *created { "created" } else { "updated" },
            expected.display()
        ),
        Verdict::Skipped { reason } => format!(
            "{} {path}: {reason}\n",
            paint(color, "SKIP ", Style::Yellow)
        ),
        Verdict::Failed(failure) => {
            let mut out = format!("{} {path}\n", paint(color, "FAIL ", Style::RedBold));
            out.push_str(&indented(&failure_details(result, failure, color)));
            out
        }
    }
}

/// What went wrong, without the status line (also the message of a `cargo test` failure).
pub fn failure_details(result: &ScriptResult, failure: &Failure, color: bool) -> String {
    let script = result.script.display();
    match failure {
        Failure::Mismatch {
            expected_path,
            expected,
            actual,
            error,
        } => {
            let mut out = String::new();
            if let Some(error) = error {
                out.push_str("the script stopped with an error:\n");
                out.push_str(&indented(error));
            }
            out.push_str("output differs from the expected output:\n");
            out.push_str(&diff::unified(
                expected,
                actual,
                &expected_path.display().to_string(),
                &format!("output of {script}"),
                color,
            ));
            out
        }
        Failure::MissingExpected {
            expected_path,
            actual,
        } => {
            let mut out = format!(
                "no expected output: {} does not exist\n\
                 review the output below, then create it with: gpumem test --bless {script}\n",
                expected_path.display()
            );
            if actual.is_empty() {
                out.push_str("(the script printed nothing)\n");
            } else {
                out.push_str("the script printed:\n");
                out.push_str(
                    &actual
                        .lines()
                        .map(|line| format!("| {line}\n"))
                        .collect::<String>(),
                );
            }
            out
        }
        Failure::ErrorNotBlessed {
            expected_path,
            error,
        } => format!(
            "not blessed: the script stopped with an error, and {} was left as it was:\n{}\
             if the error is what the test expects, bless it on purpose: gpumem test --bless-errors {script}\n",
            expected_path.display(),
            indented(error)
        ),
        Failure::Unrunnable { reason } => format!("{reason}\n"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn result(verdict: Verdict) -> ScriptResult {
        ScriptResult {
            script: PathBuf::from("t/x.rhai"),
            verdict,
        }
    }

    #[test]
    fn closing_line_mentions_blessed_and_skipped_only_when_there_are_some() {
        let mut summary = Summary::default();
        summary.add(&result(Verdict::Passed));
        summary.add(&result(Verdict::Failed(Failure::Unrunnable {
            reason: "x".into(),
        })));
        assert_eq!(summary.closing_line(), "1 passed, 1 failed");
        assert!(!summary.success());
        summary.add(&result(Verdict::Skipped {
            reason: "no GPU".into(),
        }));
        summary.add(&result(Verdict::Blessed {
            expected: PathBuf::from("t/x.out"),
            created: true,
        }));
        assert_eq!(
            summary.closing_line(),
            "2 passed (1 blessed), 1 failed, 1 skipped"
        );
    }

    #[test]
    fn status_lines() {
        assert_eq!(render(&result(Verdict::Passed), false), "PASS  t/x.rhai\n");
        assert_eq!(
            render(
                &result(Verdict::Skipped {
                    reason: "cannot use cuda:0: no GPU".into()
                }),
                false
            ),
            "SKIP  t/x.rhai: cannot use cuda:0: no GPU\n"
        );
        assert_eq!(
            render(
                &result(Verdict::Blessed {
                    expected: PathBuf::from("t/x.out"),
                    created: false
                }),
                false
            ),
            "BLESS t/x.rhai: updated t/x.out\n"
        );
    }

    #[test]
    fn missing_out_says_how_to_create_it() {
        let text = render(
            &result(Verdict::Failed(Failure::MissingExpected {
                expected_path: PathBuf::from("t/x.out"),
                actual: "42\n".into(),
            })),
            false,
        );
        assert!(text.starts_with("FAIL  t/x.rhai\n"), "{text}");
        assert!(text.contains("t/x.out does not exist"), "{text}");
        assert!(text.contains("gpumem test --bless t/x.rhai"), "{text}");
        assert!(text.contains("  | 42\n"), "{text}");
    }

    #[test]
    fn mismatch_shows_the_error_and_the_diff() {
        let text = render(
            &result(Verdict::Failed(Failure::Mismatch {
                expected_path: PathBuf::from("t/x.out"),
                expected: "1\n".into(),
                actual: "2\nx.rhai:1:1: error: boom\n".into(),
                error: Some("x.rhai:1:1: error: boom".into()),
            })),
            false,
        );
        assert!(text.contains("stopped with an error:\n    x.rhai:1:1: error: boom"));
        assert!(text.contains("  --- expected  t/x.out\n"), "{text}");
        assert!(text.contains("  -   1      | 1\n"), "{text}");
        assert!(text.contains("  +        1 | 2\n"), "{text}");
    }
}
