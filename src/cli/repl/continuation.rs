//! Whether REPL input is unfinished and should continue on the next line.
//!
//! Only input that is *genuinely* unfinished continues: Rhai's parser must have run off the
//! end of the text (an open brace, bracket or parenthesis, a trailing operator, `let` without
//! its name, an open backtick string...). Any other syntax error — `let y = 1 2;`,
//! `randn([2,3]))` — is reported at once, since more lines could never fix it.

use rhai::{Engine, ParseErrorType, Position};

/// Whether `input` should continue on the next line. A blank last line always ends the input
/// so a mistake cannot trap you: rustyline passes the text typed so far, so Enter on an empty
/// continuation line gives input whose last line is blank (`"for i in 0..2 {\n"`).
pub fn needs_more(parser: &Engine, input: &str) -> bool {
    let last_line_blank = input
        .rsplit_once('\n')
        .is_some_and(|(_, last)| last.trim().is_empty());
    if input.trim_start().starts_with(':') || last_line_blank || input.trim().is_empty() {
        return false;
    }
    let Err(error) = parser.compile(input) else {
        return false;
    };
    if let ParseErrorType::BadInput(rhai::LexError::UnterminatedString) = error.err_type() {
        return string_continues(input, error.position());
    }
    at_or_after(error.position(), end_of_code(input))
}

/// Where the text ends: the position just after its last non-blank character (1-based line,
/// character column), as Rhai reports a parse that ran out of input.
pub fn end_of_code(input: &str) -> (usize, usize) {
    let lines: Vec<&str> = input.split('\n').collect();
    for (index, line) in lines.iter().enumerate().rev() {
        let trimmed = line.trim_end();
        if !trimmed.is_empty() {
            return (index + 1, trimmed.chars().count() + 1);
        }
    }
    (1, 1)
}

fn at_or_after(position: Position, (line, column): (usize, usize)) -> bool {
    match (position.line(), position.position()) {
        (Some(l), Some(c)) => (l, c) >= (line, column),
        (Some(l), None) => l > line,
        // Rhai gives no position for the end of input in some cases.
        _ => true,
    }
}

/// An unterminated string continues when a newline may be part of it: a backtick string, or
/// a `"` string whose text so far ends with a `\` line continuation.
fn string_continues(input: &str, start: Position) -> bool {
    let (Some(line), Some(column)) = (start.line(), start.position()) else {
        return false;
    };
    let Some(text) = input.split('\n').nth(line - 1) else {
        return false;
    };
    match text.chars().nth(column - 1) {
        Some('`') => true,
        Some('"') => input.trim_end_matches([' ', '\t']).ends_with('\\'),
        _ => false,
    }
}

/// Why `input` is unfinished, for the message that gives it up: the closing characters it
/// lacks and where their openers are (`a `}` is missing (the `{` on line 1 is never
/// closed)`), an unclosed backtick string, or else Rhai's own reason (a trailing operator,
/// `let` without its name).
pub fn why_unfinished(parser: &Engine, input: &str) -> String {
    let open = unclosed(input);
    if let Some(line) = open.string {
        return format!("the backtick string opened on line {line} is not closed (a ` is missing)");
    }
    if !open.brackets.is_empty() {
        let closers: Vec<String> = open
            .brackets
            .iter()
            .rev()
            .map(|&(bracket, _)| format!("a `{}`", closing(bracket)))
            .collect();
        let openers: Vec<String> = open
            .brackets
            .iter()
            .rev()
            .map(|&(bracket, line)| format!("the `{bracket}` on line {line}"))
            .collect();
        let verb = if closers.len() == 1 { "is" } else { "are" };
        return format!(
            "{} {verb} missing ({} {verb} never closed)",
            join_and(&closers),
            join_and(&openers)
        );
    }
    match parser.compile(input) {
        Err(error) => format!("the last statement is not finished ({})", error.err_type()),
        Ok(_) => "it is not finished".to_string(),
    }
}

/// `a`, `a and b`, `a, b and c`.
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The character that closes `bracket`.
fn closing(bracket: char) -> char {
    match bracket {
        '{' => '}',
        '[' => ']',
        _ => ')',
    }
}

/// What is still open at the end of some script text.
#[derive(Debug, Default, PartialEq, Eq)]
struct Unclosed {
    /// Open brackets, outermost first, with their 1-based lines.
    brackets: Vec<(char, usize)>,
    /// The line of a backtick string still open at the end, if any.
    string: Option<usize>,
}

/// Scans `input` as Rhai's lexer would for brackets: skipping `"..."` and `'.'` literals and
/// comments (`//`, nested `/* */`), and treating a backtick string as text except inside its
/// `${ ... }` interpolations, which are code.
fn unclosed(input: &str) -> Unclosed {
    /// Where the scanner is.
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Code,
        /// Inside a backtick string opened on this line.
        Backtick(usize),
    }
    let mut modes = vec![Mode::Code];
    let mut brackets: Vec<(char, usize)> = Vec::new();
    // For each `${` interpolation, the depth of `brackets` when it opened.
    let mut interpolations: Vec<usize> = Vec::new();
    let chars: Vec<char> = input.chars().collect();
    let mut line = 1;
    let mut index = 0;
    while let Some(&c) = chars.get(index) {
        let next = chars.get(index + 1).copied();
        index += 1;
        if c == '\n' {
            line += 1;
        }
        match modes.last().copied().unwrap_or(Mode::Code) {
            Mode::Backtick(_) => match (c, next) {
                ('`', _) => {
                    modes.pop();
                }
                ('\\', Some(_)) => index += 1,
                ('$', Some('{')) => {
                    index += 1;
                    interpolations.push(brackets.len());
                    modes.push(Mode::Code);
                }
                _ => {}
            },
            Mode::Code => match (c, next) {
                ('/', Some('/')) => {
                    while chars.get(index).is_some_and(|&c| c != '\n') {
                        index += 1;
                    }
                }
                ('/', Some('*')) => {
                    index += 1;
                    let mut depth = 1;
                    while depth > 0 {
                        match (chars.get(index), chars.get(index + 1)) {
                            (Some('*'), Some('/')) => {
                                depth -= 1;
                                index += 2;
                            }
                            (Some('/'), Some('*')) => {
                                depth += 1;
                                index += 2;
                            }
                            (Some(&c), _) => {
                                line += usize::from(c == '\n');
                                index += 1;
                            }
                            (None, _) => break,
                        }
                    }
                }
                ('"' | '\'', _) => {
                    while let Some(&inner) = chars.get(index) {
                        index += 1;
                        if inner == '\\' {
                            index += 1;
                        } else if inner == c || inner == '\n' {
                            line += usize::from(inner == '\n');
                            break;
                        }
                    }
                }
                ('`', _) => modes.push(Mode::Backtick(line)),
                ('{' | '[' | '(', _) => brackets.push((c, line)),
                ('}', _) if interpolations.last() == Some(&brackets.len()) => {
                    interpolations.pop();
                    modes.pop();
                }
                ('}' | ']' | ')', _) => {
                    brackets.pop();
                }
                _ => {}
            },
        }
    }
    let string = modes.iter().rev().find_map(|mode| match mode {
        Mode::Backtick(line) => Some(*line),
        Mode::Code => None,
    });
    Unclosed { brackets, string }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_blocks_continue() {
        let parser = Engine::new_raw();
        for input in [
            "for i in 0..3 {",
            "let a = [1,\n2,",
            "fn f(x) {\n  x +",
            "for i in 0..3 {\n  print(i);",
            "let x = 1 +",
            "foo(",
            "if x {\n} else",
            "let x = #{a: 1,",
            "let s = `abc",
            "let s = \"abc\\",
            "let",
            "x.",
        ] {
            assert!(needs_more(&parser, input), "{input:?} should continue");
        }
    }

    #[test]
    fn errors_and_complete_input_do_not() {
        let parser = Engine::new_raw();
        for input in [
            "let y = 1 2;",
            "let y = 1 2",
            "randn([2,3]))",
            "del x;",
            "let x = ;",
            "let x = (1,",
            "let x = 1;",
            "print(1)\nprint(2)",
            "let s = \"abc",
            ":help",
            "",
            // What rustyline passes after Enter on an empty second line.
            "for i in 0..3 {\n",
            "for i in 0..3 {\n  print(i);\n  ",
        ] {
            assert!(!needs_more(&parser, input), "{input:?} should not continue");
        }
    }

    #[test]
    fn the_reason_names_what_is_missing_and_where_it_opened() {
        let parser = Engine::new_raw();
        let why = |input| why_unfinished(&parser, input);
        assert_eq!(
            why("for i in 0..3 {\n  let x = 1"),
            "a `}` is missing (the `{` on line 1 is never closed)"
        );
        assert_eq!(
            why("fn f(x) {\n  g([1,\n"),
            "a `]`, a `)` and a `}` are missing (the `[` on line 2, the `(` on line 2 and the `{` on line 1 are never closed)"
        );
        // Brackets inside strings, comments and closed interpolations do not count.
        assert_eq!(
            why("let s = \"{(\"; // {\n/* { /* ( */ */ let t = `${ [1][0] } {`; f("),
            "a `)` is missing (the `(` on line 2 is never closed)"
        );
        assert_eq!(
            why("let s = `a ${x} b\n c"),
            "the backtick string opened on line 1 is not closed (a ` is missing)"
        );
        assert_eq!(
            why("let x = 1 +"),
            "the last statement is not finished (Script is incomplete)"
        );
    }

    #[test]
    fn end_of_code_skips_trailing_blanks() {
        assert_eq!(end_of_code("ab  \n\n  "), (1, 3));
        assert_eq!(end_of_code("a\nbcd"), (2, 4));
        assert_eq!(end_of_code(""), (1, 1));
    }
}
