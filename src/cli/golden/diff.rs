//! A unified diff of expected against actual output, with both files' line numbers.
//!
//! ```text
//! --- expected  tests/golden/x.out
//! +++ actual    output of tests/golden/x.rhai
//! @@ -2,3 +2,3 @@
//!    2    2 | segments 1
//! -  3      | reserved 2097152
//! +       3 | reserved 20971520
//! ```

use std::fmt::Write;

use similar::{ChangeTag, TextDiff};

use crate::cli::paint::{paint, Style};

/// Unchanged lines shown around each change.
const CONTEXT_LINES: usize = 3;

/// Renders the differences between `expected` and `actual` under the two labels, coloured
/// (red removed, green added, cyan hunk headers) when `color` is set.
pub fn unified(
    expected: &str,
    actual: &str,
    expected_label: &str,
    actual_label: &str,
    color: bool,
) -> String {
    let diff = TextDiff::from_lines(expected, actual);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        paint(
            color,
            &format!("--- expected  {expected_label}"),
            Style::Red
        )
    );
    let _ = writeln!(
        out,
        "{}",
        paint(
            color,
            &format!("+++ actual    {actual_label}"),
            Style::Green
        )
    );
    for group in diff.grouped_ops(CONTEXT_LINES) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let old = first.old_range().start..last.old_range().end;
        let new = first.new_range().start..last.new_range().end;
        let header = format!(
            "@@ -{},{} +{},{} @@",
            old.start + 1,
            old.len(),
            new.start + 1,
            new.len()
        );
        let _ = writeln!(out, "{}", paint(color, &header, Style::Cyan));
        for op in &group {
            for change in diff.iter_changes(op) {
                let number = |index: Option<usize>| {
                    index.map_or_else(|| " ".repeat(4), |i| format!("{:>4}", i + 1))
                };
                let sign = match change.tag() {
                    ChangeTag::Delete => '-',
                    ChangeTag::Insert => '+',
                    ChangeTag::Equal => ' ',
                };
                let mut text = change.value().to_string();
                let missing_newline = !text.ends_with('\n');
                if !missing_newline {
                    text.pop();
                }
                let mut line = format!(
                    "{sign}{} {} | {text}",
                    number(change.old_index()),
                    number(change.new_index())
                );
                if missing_newline {
                    line.push_str("  (no newline at end)");
                }
                let line = match change.tag() {
                    ChangeTag::Delete => paint(color, &line, Style::Red),
                    ChangeTag::Insert => paint(color, &line, Style::Green),
                    ChangeTag::Equal => line,
                };
                let _ = writeln!(out, "{line}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_changed_lines_with_both_numbers() {
        let expected = "a\nb\nc\nd\n";
        let actual = "a\nB\nc\nd\n";
        let text = unified(expected, actual, "x.out", "x.rhai", false);
        assert_eq!(
            text,
            "--- expected  x.out\n\
             +++ actual    x.rhai\n\
             @@ -1,4 +1,4 @@\n    \
             1    1 | a\n\
             -   2      | b\n\
             +        2 | B\n    \
             3    3 | c\n    \
             4    4 | d\n"
        );
    }

    #[test]
    fn far_apart_changes_make_separate_hunks() {
        let expected: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let actual = expected
            .replace("2\n", "two\n")
            .replace("19\n", "nineteen\n");
        let text = unified(&expected, &actual, "e", "a", false);
        assert_eq!(text.matches("@@ -").count(), 2, "{text}");
        assert!(text.contains("@@ -1,5 +1,5 @@"), "{text}");
    }

    #[test]
    fn a_missing_final_newline_is_visible() {
        let text = unified("a\n", "a", "e", "a", false);
        assert!(text.contains("(no newline at end)"), "{text}");
    }

    #[test]
    fn colour_only_when_asked() {
        let text = unified("a\n", "b\n", "e", "a", true);
        assert!(text.contains("\u{1b}["), "{text:?}");
        assert!(!unified("a\n", "b\n", "e", "a", false).contains('\u{1b}'));
    }
}
