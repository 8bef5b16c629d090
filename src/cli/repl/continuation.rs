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
    fn end_of_code_skips_trailing_blanks() {
        assert_eq!(end_of_code("ab  \n\n  "), (1, 3));
        assert_eq!(end_of_code("a\nbcd"), (2, 4));
        assert_eq!(end_of_code(""), (1, 1));
    }
}
