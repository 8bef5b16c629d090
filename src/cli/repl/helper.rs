//! The rustyline helper: tab completion (bindings, variables, dtypes, stdlib modules, `:`
//! commands, file names after `:load`), hints and syntax highlighting. Multi-line input is the
//! REPL loop's: it reads an unfinished input's next line at a continuation prompt
//! ([`super::CONTINUATION_PROMPT`]).

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::{Hint, Hinter};
use rustyline::validate::Validator;
use rustyline::{Context, Helper};

use super::commands::COMMANDS;
use crate::cli::paint::{paint, Style};
use gpumem::script::docs::{self, Kind, BINDINGS, DTYPES};
use gpumem::script::stdlib::MODULES;

/// Rhai keywords, highlighted and offered by completion.
const KEYWORDS: [&str; 20] = [
    "let", "const", "fn", "if", "else", "for", "in", "while", "loop", "do", "until", "break",
    "continue", "return", "throw", "try", "catch", "import", "true", "false",
];

/// The REPL's line-editor helper.
pub struct ReplHelper {
    /// Names of the variables alive in the REPL's scope, refreshed after every line.
    variables: Rc<RefCell<Vec<String>>>,
    files: FilenameCompleter,
    color: bool,
}

impl ReplHelper {
    /// A helper completing the names in `variables`, colouring when `color` is set.
    pub fn new(variables: Rc<RefCell<Vec<String>>>, color: bool) -> ReplHelper {
        ReplHelper {
            variables,
            files: FilenameCompleter::new(),
            color,
        }
    }
}

impl Helper for ReplHelper {}

/// Completion candidates for `line` with the cursor at `pos`: where the replaced word starts
/// and the words that may replace it.
pub fn candidates(line: &str, pos: usize, variables: &[String]) -> (usize, Vec<String>) {
    let before = &line[..pos];
    if before.starts_with(':') && !before.contains(char::is_whitespace) {
        // A command that takes an argument completes with the space the argument needs.
        let words = COMMANDS
            .iter()
            .filter(|command| command.name.starts_with(before))
            .map(|command| {
                if command.args.is_empty() {
                    command.name.to_string()
                } else {
                    format!("{} ", command.name)
                }
            })
            .collect();
        return (0, words);
    }
    // Inside a string literal: dtypes and module names.
    if before.matches('"').count() % 2 == 1 {
        let start = before.rfind('"').map_or(0, |quote| quote + 1);
        let word = &before[start..];
        let words = DTYPES
            .iter()
            .copied()
            .chain(MODULES.iter().map(|(name, _, _)| *name))
            .filter(|name| name.starts_with(word))
            .map(String::from)
            .collect();
        return (start, words);
    }
    let start = before
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .map_or(0, |index| index + 1);
    let word = &before[start..];
    if let Some((module, prefix)) = word.split_once("::") {
        let words = module_functions(module)
            .into_iter()
            .filter(|name| name.starts_with(prefix))
            .map(|name| format!("{module}::{name}"))
            .collect();
        return (start, words);
    }
    let after_dot = before[..start].ends_with('.');
    let mut words: Vec<String> = if after_dot {
        BINDINGS
            .iter()
            .filter(|doc| doc.kind != Kind::Function)
            .map(|doc| doc.name.to_string())
            .collect()
    } else {
        BINDINGS
            .iter()
            .filter(|doc| doc.kind == Kind::Function)
            .map(|doc| doc.name.to_string())
            .chain(variables.iter().cloned())
            .chain(KEYWORDS.iter().map(|k| k.to_string()))
            .chain(MODULES.iter().map(|(name, _, _)| format!("{name}::")))
            .collect()
    };
    if word.is_empty() && !after_dot {
        return (start, Vec::new());
    }
    words.retain(|name| name.starts_with(word));
    words.sort();
    words.dedup();
    (start, words)
}

/// The functions an embedded module defines, read from its source.
pub fn module_functions(module: &str) -> Vec<String> {
    gpumem::script::stdlib::module_functions(module)
        .into_iter()
        .map(String::from)
        .collect()
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        if line.starts_with(":load ") {
            return self.files.complete(line, pos, ctx);
        }
        let (start, words) = candidates(line, pos, &self.variables.borrow());
        let pairs = words
            .into_iter()
            .map(|word| Pair {
                display: word.clone(),
                replacement: word,
            })
            .collect();
        Ok((start, pairs))
    }
}

/// A hint: either the rest of the only matching name (accepted with the right arrow) or a
/// function's signature after an opening parenthesis (display only).
pub struct ReplHint {
    display: String,
    insert: Option<String>,
}

impl Hint for ReplHint {
    fn display(&self) -> &str {
        &self.display
    }

    fn completion(&self) -> Option<&str> {
        self.insert.as_deref()
    }
}

/// The hint for `line` with the cursor at its end.
pub fn hint_for(line: &str, variables: &[String]) -> Option<(String, bool)> {
    if let Some(call) = line.strip_suffix('(') {
        let start = call
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |index| index + 1);
        let doc = docs::find(&call[start..])?;
        let args = doc.signature.split_once('(').map_or("", |(_, args)| args);
        return Some((format!("{args}  — {}", doc.summary), false));
    }
    let (start, words) = candidates(line, line.len(), variables);
    let typed = line.len() - start;
    match words.as_slice() {
        [only] if typed >= 2 && only.len() > typed => Some((only[typed..].to_string(), true)),
        _ => None,
    }
}

impl Hinter for ReplHelper {
    type Hint = ReplHint;

    fn hint(&self, line: &str, pos: usize, _ctx: &Context<'_>) -> Option<ReplHint> {
        if pos < line.len() || line.starts_with(':') {
            return None;
        }
        let (text, insertable) = hint_for(line, &self.variables.borrow())?;
        Some(ReplHint {
            insert: insertable.then(|| text.clone()),
            display: text,
        })
    }
}

impl Highlighter for ReplHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        if !self.color {
            return Cow::Borrowed(line);
        }
        Cow::Owned(highlight_code(line))
    }

    fn highlight_prompt<'b, 's: 'b, 'p: 'b>(
        &'s self,
        prompt: &'p str,
        _default: bool,
    ) -> Cow<'b, str> {
        if self.color {
            Cow::Owned(paint(true, prompt, Style::GreenBold))
        } else {
            Cow::Borrowed(prompt)
        }
    }

    fn highlight_hint<'h>(&self, hint: &'h str) -> Cow<'h, str> {
        if self.color {
            Cow::Owned(paint(true, hint, Style::Dimmed))
        } else {
            Cow::Borrowed(hint)
        }
    }

    fn highlight_char(&self, _line: &str, _pos: usize, _kind: CmdKind) -> bool {
        self.color
    }
}

/// Colours a line (always: the helper calls it only when colour is on): `:` commands, keywords, binding names, strings, numbers and comments.
pub fn highlight_code(line: &str) -> String {
    if line.starts_with(':') {
        return paint(true, line, Style::BlueBold);
    }
    let mut out = String::with_capacity(line.len() * 2);
    let mut rest = line;
    while let Some(first) = rest.chars().next() {
        let split = if rest.starts_with("//") {
            out.push_str(&paint(true, rest, Style::Dimmed));
            rest.len()
        } else if first == '"' || first == '`' {
            let end = rest[1..].find(first).map_or(rest.len(), |end| end + 2);
            out.push_str(&paint(true, &rest[..end], Style::Green));
            end
        } else if first.is_ascii_digit() {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
                .unwrap_or(rest.len());
            out.push_str(&paint(true, &rest[..end], Style::Yellow));
            end
        } else if first.is_alphabetic() || first == '_' {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..end];
            if KEYWORDS.contains(&word) {
                out.push_str(&paint(true, word, Style::MagentaBold));
            } else if docs::find(word).is_some() {
                out.push_str(&paint(true, word, Style::Cyan));
            } else {
                out.push_str(word);
            }
            end
        } else {
            out.push(first);
            first.len_utf8()
        };
        rest = &rest[split..];
    }
    out
}

/// Every line is accepted as typed: the REPL loop decides whether input continues, so that it
/// can show the continuation prompt.
impl Validator for ReplHelper {}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        candidates(line, line.len(), &["batch".to_string()]).1
    }

    #[test]
    fn completes_commands_functions_variables_dtypes_and_modules() {
        assert_eq!(words(":va"), [":vars"]);
        // A command that takes an argument completes with the space before it.
        assert_eq!(words(":lo"), [":load "]);
        assert_eq!(words(":he"), [":help "]);
        assert_eq!(words("memory_res"), ["memory_reserved"]);
        assert_eq!(words("let y = ba"), ["batch"]);
        assert_eq!(words("empty(4, \"ui"), ["uint8"]);
        assert_eq!(words("empty(4, \"float"), ["float32", "float16", "float64"]);
        assert_eq!(words("x.resh"), ["reshape"]);
        assert_eq!(words("mem::form"), ["mem::format_size"]);
        assert_eq!(words("import \"ch"), ["check"]);
        assert!(words("").is_empty());
        assert_eq!(candidates("let y = ba", 10, &[]).0, 8);
    }

    #[test]
    fn hints_complete_unique_names_and_show_signatures() {
        assert_eq!(
            hint_for("memory_allo", &[]),
            Some(("cated".to_string(), true))
        );
        let (text, insertable) = hint_for("full(", &[]).expect("signature hint");
        assert!(text.starts_with("shape, value[, dtype])"), "{text}");
        assert!(!insertable);
        assert_eq!(hint_for("m", &[]), None);
    }

    #[test]
    fn highlighting_keeps_the_text() {
        let line = "let t = randn([2, 3], \"float16\"); // c";
        let painted = highlight_code(line);
        assert!(painted.contains("\u{1b}[1;35mlet\u{1b}[0m"), "{painted:?}");
        let mut plain = String::new();
        let mut rest = painted.as_str();
        while let Some(start) = rest.find('\u{1b}') {
            plain.push_str(&rest[..start]);
            let end = rest[start..]
                .find('m')
                .map_or(rest.len(), |m| start + m + 1);
            rest = &rest[end..];
        }
        plain.push_str(rest);
        assert_eq!(plain, line);
    }
}
