//! Script errors rendered for people: file, line and column, the source line and a caret.

use std::collections::HashMap;

use rhai::{EvalAltResult, ParseError, Position};
use thiserror::Error;

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
}

/// Where script functions defined outside the source being run came from: function name →
/// (the input's name, its source). The REPL fills it, since Rhai attributes a function defined
/// on an earlier line to whichever line is running.
pub type Origins = HashMap<String, (String, String)>;

impl ScriptError {
    /// A syntax error.
    pub fn parse(name: &str, source: &str, error: ParseError) -> ScriptError {
        let position = error.position();
        let message = error.err_type().to_string();
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
            EvalAltResult::ErrorTerminated(value, _) => value.to_string(),
            EvalAltResult::ErrorStackOverflow(_) => {
                "Stack overflow: function calls nested too deeply (raise the limit with \
                 --max-call-depth)"
                    .to_string()
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
            for ((function, _, call), caller) in frames.iter().zip(&callers).rev() {
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

/// `name:line:column`, or just `name` when the position is unknown.
fn at(name: &str, position: Position) -> String {
    match (position.line(), position.position()) {
        (Some(line), Some(column)) => format!("{name}:{line}:{column}"),
        (Some(line), None) => format!("{name}:{line}"),
        _ => name.to_string(),
    }
}

/// `name:line:column: message`, then the source line and a caret under the column.
pub fn render(name: &str, source: &str, position: Position, message: &str) -> String {
    let (Some(line), column) = (position.line(), position.position()) else {
        return format!("{name}: error: {message}");
    };
    let column = column.unwrap_or(1);
    let text = source.split('\n').nth(line - 1).unwrap_or("");
    let gutter = line.to_string();
    format!(
        "{name}:{line}:{column}: error: {message}\n{gutter} | {text}\n{} | {}^",
        " ".repeat(gutter.len()),
        " ".repeat(column.saturating_sub(1))
    )
}
