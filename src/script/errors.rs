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

    /// An uncaught runtime error.
    pub fn runtime(name: &str, source: &str, mut error: EvalAltResult) -> ScriptError {
        let position = error.take_position();
        let message = match &error {
            EvalAltResult::ErrorRuntime(value, _) => value.to_string(),
            EvalAltResult::ErrorTerminated(value, _) => value.to_string(),
            other => other.to_string(),
        };
        ScriptError::Script {
            rendered: render(name, source, position, &message),
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
