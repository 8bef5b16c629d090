//! Script errors rendered for people: file, line and column, the source line and a caret.

use std::collections::HashMap;

use rhai::{EvalAltResult, ParseError, ParseErrorType, Position};
use thiserror::Error;

use super::limits::MAX_EXPR_DEPTH;
use super::stack::SCRIPT_STACK_BYTES;
use super::stop::Stop;
use super::INTERRUPTED;

/// A script that could not be read, compiled or run to the end.
#[derive(Debug, Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The script's path.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// A syntax error or an uncaught runtime error, located in the source.
    #[error("{rendered}")]
    Script {
        /// The full report with file, line, column and caret.
        rendered: String,
        /// Whether the script did not compile (as opposed to failing while running).
        is_parse: bool,
    },
    /// The script called `exit(code)`: not an error, but the end of the script (and of a
    /// `gpumem run`, or of the REPL) with this exit status.
    #[error("exit({0})")]
    Exit(u8),
}

/// Where script functions defined outside the source being run came from: function name →
/// (the input's name, its source). The REPL fills it, since Rhai attributes a function defined
/// on an earlier line to whichever line is running.
pub type Origins = HashMap<String, (String, String)>;

impl ScriptError {
    /// A syntax error.
    pub fn parse(name: &str, source: &str, error: ParseError) -> ScriptError {
        let position = error.position();
        let message = match error.err_type() {
            ParseErrorType::ExprTooDeep => format!(
                "{} (an expression, e.g. a sum of many terms, nests deeper than --max-expr-depth allows; raise it, up to {MAX_EXPR_DEPTH})",
                error.err_type()
            ),
            other => other.to_string(),
        };
        ScriptError::Script {
            rendered: render(name, source, position, &format!("syntax error: {message}")),
            is_parse: true,
        }
    }

    /// An uncaught runtime error in `source`, whose functions are all its own or modules'.
    pub fn runtime(name: &str, source: &str, error: EvalAltResult) -> ScriptError {
        ScriptError::runtime_with_origins(name, source, error, &Origins::new())
    }

    /// An uncaught runtime error. An error raised inside a script function is shown where it
    /// was raised when that source is known (this one, or an earlier input in `origins`), with
    /// the chain of calls below it; else (a module function) at the call in this source that
    /// led to it, naming the module file and line it came from.
    pub fn runtime_with_origins(
        name: &str,
        source: &str,
        error: EvalAltResult,
        origins: &Origins,
    ) -> ScriptError {
        let is_here = |src: &str| src.is_empty() || src == name;
        // Peel the call frames: (function, the source defining it, the call's position).
        let mut frames: Vec<(String, String, Position)> = Vec::new();
        let mut error = error;
        while let EvalAltResult::ErrorInFunctionCall(function, fn_source, inner, call) = error {
            // Rhai names the running input for functions that earlier inputs defined.
            let fn_source = match origins.get(&function) {
                Some((origin, _)) if is_here(&fn_source) => origin.clone(),
                _ => fn_source,
            };
            frames.push((function, fn_source, call));
            error = *inner;
        }
        let position = error.take_position();
        let message = match &error {
            EvalAltResult::ErrorRuntime(value, _) => super::oom_error::OomError::describe(value),
            EvalAltResult::ErrorTerminated(value, _) => match Stop::of(value) {
                Some(Stop::Exit(code)) => return ScriptError::Exit(code),
                Some(Stop::Interrupted) => INTERRUPTED.to_string(),
                Some(Stop::StackFull) => format!(
                    "Stack overflow: function calls (or expressions inside them) are nested so \
                     deeply that the {} MiB script stack is nearly full; no --max-call-depth can \
                     go deeper",
                    SCRIPT_STACK_BYTES >> 20
                ),
                None => value.to_string(),
            },
            EvalAltResult::ErrorStackOverflow(_) => {
                "Stack overflow: function calls nested too deeply (raise the limit with \
                 --max-call-depth)"
                    .to_string()
            }
            EvalAltResult::ErrorFunctionNotFound(signature, _) => {
                let call = call_text(source, position);
                let own = origins.keys().map(String::as_str);
                format!(
                    "{error}{}",
                    super::suggest::for_missing_function(signature, call, source, own)
                )
            }
            EvalAltResult::ErrorTooManyOperations(_) => {
                "Too many operations: the script ran past its operation budget (raise it with \
                 --max-operations)"
                    .to_string()
            }
            other => other.to_string(),
        };
        // The source each call was made from: this one for the first, then each function's.
        let callers: Vec<&str> = std::iter::once(name)
            .chain(frames.iter().map(|(_, src, _)| src.as_str()))
            .collect();
        let raised_in = callers.last().copied().unwrap_or(name);
        let text_of = |src: &str| -> Option<String> {
            if is_here(src) {
                Some(source.to_string())
            } else {
                origins
                    .values()
                    .find(|(origin, _)| origin == src)
                    .map(|(_, text)| text.clone())
            }
        };
        let rendered = if let Some(text) = text_of(raised_in) {
            let shown = if is_here(raised_in) { name } else { raised_in };
            let mut text = render(shown, &text, position, &message);
            let calls = frames.len();
            for (shown, ((function, _, call), caller)) in
                frames.iter().zip(&callers).rev().enumerate()
            {
                // A deep recursion keeps its innermost and outermost calls.
                if calls > 2 * SHOWN_CALLS && shown >= SHOWN_CALLS && shown < calls - SHOWN_CALLS {
                    if shown == SHOWN_CALLS {
                        text.push_str(&format!(
                            "\n  ... {} more calls ...",
                            calls - 2 * SHOWN_CALLS
                        ));
                    }
                    continue;
                }
                let caller = if is_here(caller) { name } else { caller };
                text.push_str(&format!(
                    "\n  in {function}(), called at {}",
                    at(caller, *call)
                ));
            }
            text
        } else {
            // The deepest call made from this source.
            let call = callers
                .iter()
                .zip(&frames)
                .filter(|(caller, _)| is_here(caller))
                .map(|(_, (_, _, call))| *call)
                .next_back()
                .unwrap_or(position);
            let function = frames.last().map_or("", |(f, _, _)| f.as_str());
            format!(
                "{}\n  raised in {function}() at {}",
                render(name, source, call, &message),
                at(raised_in, position)
            )
        };
        ScriptError::Script {
            rendered,
            is_parse: false,
        }
    }
}

/// The source from `position` to the end of its line (the call an error points at), or "".
fn call_text(source: &str, position: Position) -> &str {
    let (Some(line), Some(column)) = (position.line(), position.position()) else {
        return "";
    };
    let text = source.split('\n').nth(line - 1).unwrap_or("");
    text.char_indices()
        .nth(column - 1)
        .map_or("", |(start, _)| &text[start..])
}

/// `name:line:column`, or just `name` when the position is unknown.
fn at(name: &str, position: Position) -> String {
    match (position.line(), position.position()) {
        (Some(line), Some(column)) => format!("{name}:{line}:{column}"),
        (Some(line), None) => format!("{name}:{line}"),
        _ => name.to_string(),
    }
}

/// Calls shown at each end of a call chain under an error; the middle of a deeper chain is
/// summarised in one line.
pub const SHOWN_CALLS: usize = 10;

/// Longest source line shown whole under an error; longer lines are cut around the caret.
pub const SHOWN_LINE_CHARS: usize = 120;

/// `name:line:column: message`, then the source line and a caret under the column.
pub fn render(name: &str, source: &str, position: Position, message: &str) -> String {
    let (Some(line), column) = (position.line(), position.position()) else {
        return format!("{name}: error: {message}");
    };
    let column = column.unwrap_or(1);
    let text = source.split('\n').nth(line - 1).unwrap_or("");
    let (shown, caret) = excerpt(text, column);
    let gutter = line.to_string();
    // Rhai's positions are 16-bit and stop counting there.
    let note = if column >= usize::from(u16::MAX) {
        " (Rhai counts columns only up to 65535: the error is at or after this one)"
    } else {
        ""
    };
    format!(
        "{name}:{line}:{column}: error: {message}{note}\n{gutter} | {shown}\n{} | {}^",
        " ".repeat(gutter.len()),
        " ".repeat(caret)
    )
}

/// The part of `text` to show with the caret at 1-based character `column`: the whole line
/// when it is short, else [`SHOWN_LINE_CHARS`] characters around the column with `…` where the
/// line was cut. Returns the text and the caret's offset in characters.
fn excerpt(text: &str, column: usize) -> (String, usize) {
    let chars: Vec<char> = text.chars().collect();
    let at = column.saturating_sub(1);
    if chars.len() <= SHOWN_LINE_CHARS {
        return (text.to_string(), at);
    }
    let at = at.min(chars.len());
    let end = (at.saturating_sub(SHOWN_LINE_CHARS / 2) + SHOWN_LINE_CHARS).min(chars.len());
    let start = end.saturating_sub(SHOWN_LINE_CHARS);
    let mut shown = String::new();
    if start > 0 {
        shown.push('…');
    }
    shown.extend(&chars[start..end]);
    if end < chars.len() {
        shown.push('…');
    }
    (shown, at - start + usize::from(start > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_around_the_caret() {
        let line = format!("{}bad{}", "a".repeat(60_000), "b".repeat(440_000));
        let rendered = render("x", &line, Position::new(1, 60_001), "oops");
        let lines: Vec<&str> = rendered.lines().collect();
        assert!(lines[1].len() < 200, "{}", lines[1].len());
        assert!(lines[1].starts_with("1 | …a") && lines[1].ends_with("b…"));
        // Columns count characters: `…` is one wide.
        let caret = lines[2].find('^').expect("caret");
        let under: String = lines[1].chars().skip(caret).take(3).collect();
        assert_eq!(under, "bad");
    }

    #[test]
    fn short_lines_are_shown_whole() {
        let rendered = render("x", "let a = 1 2;", Position::new(1, 11), "oops");
        assert!(
            rendered.ends_with("1 | let a = 1 2;\n  |           ^"),
            "{rendered}"
        );
    }
}
