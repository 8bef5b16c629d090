//! Piped input (`gpumem < transcript.rhai`): lines are read straight from standard input, with
//! no line editor, and grouped into inputs by the same rules as at the prompt
//! ([`super::continuation::needs_more`]; a blank line gives an unfinished input up). Input that
//! is given up, or that ends inside an unfinished block, is an error that says what is
//! missing; it is never run nor silently dropped.

use std::io::BufRead;

use rhai::Engine;

use super::continuation::{needs_more, why_unfinished};
use super::{Flow, Repl};

/// Feeds every input read from `reader` to `repl` until `:quit`, `exit(..)` or the end, and
/// returns how the last input ended.
pub fn run(repl: &mut Repl, reader: impl BufRead) -> std::io::Result<Flow> {
    let parser = Engine::new_raw();
    let mut pending = String::new();
    let mut first_line = 0;
    for (index, line) in reader.lines().enumerate() {
        let line = line?;
        let line = line.strip_suffix('\r').unwrap_or(&line);
        if pending.is_empty() {
            first_line = index + 1;
        } else if line.trim().is_empty() {
            repl.give_up(&parser, &std::mem::take(&mut pending));
            continue;
        } else {
            pending.push('\n');
        }
        pending.push_str(line);
        if needs_more(&parser, &pending) {
            continue;
        }
        let flow = repl.handle(&std::mem::take(&mut pending));
        if flow != Flow::Continue {
            return Ok(flow);
        }
    }
    if !pending.trim().is_empty() {
        repl.error(&format!(
            "gpumem: the input ended inside an unfinished block (it starts on line {first_line} \
             of the input): {}; it was not run",
            why_unfinished(&parser, &pending)
        ));
    }
    Ok(Flow::Continue)
}
