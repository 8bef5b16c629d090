//! Script errors rendered for people: file, line and column, the source line and a caret.

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
        /// What went wrong, without location.
        message: String,
        /// The full report with file, line, column and caret.
        rendered: String,
        /// Whether the script did not compile (as opposed to failing while running).
        is_parse: bool,
    },
}

impl ScriptError {
    /// A syntax error.
    pub fn parse(name: &str, source: &str, error: ParseError) -> ScriptError {
        let position = error.position();
        let message = error.err_type().to_string();
        ScriptError::Script {
            rendered: render(name, source, position, &format!("syntax error: {message}")),
            message,
            is_parse: true,
        }
    }

    /// An uncaught runtime error. An error raised inside a script function is shown where it
    /// was raised when that is in this source (with the chain of calls below it), else at the
    /// call in this source that led to it (naming the module file and line it came from).
    pub fn runtime(name: &str, source: &str, error: EvalAltResult) -> ScriptError {
        // Peel the call frames: (function, the source defining it, the call's position).
        let mut frames: Vec<(String, String, Position)> = Vec::new();
        let mut error = error;
        while let EvalAltResult::ErrorInFunctionCall(function, fn_source, inner, call) = error {
            frames.push((function, fn_source, call));
            error = *inner;
        }
        let position = error.take_position();
        let message = match &error {
            EvalAltResult::ErrorRuntime(value, _) => value.to_string(),
            EvalAltResult::ErrorTerminated(value, _) => value.to_string(),
            other => other.to_string(),
        };
        let is_here = |src: &str| src.is_empty() || src == name;
        let raised_in = frames.last().map_or(name, |(_, src, _)| src.as_str());
        let rendered = if is_here(raised_in) {
            let mut text = render(name, source, position, &message);
            for (function, _, call) in frames.iter().rev() {
                text.push_str(&format!(
                    "\n  in {function}(), called at {}",
                    at(name, *call)
                ));
            }
            text
        } else {
            // The deepest call made from this source.
            let callers = std::iter::once(name).chain(frames.iter().map(|(_, s, _)| s.as_str()));
            let call = callers
                .zip(&frames)
                .filter(|(caller, _)| is_here(caller))
                .map(|(_, (_, _, call))| *call)
                .last()
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
            message,
            is_parse: false,
        }
    }

    /// The message without location.
    pub fn message(&self) -> String {
        match self {
            ScriptError::Io { .. } => self.to_string(),
            ScriptError::Script { message, .. } => message.clone(),
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
