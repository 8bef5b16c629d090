//! Piped input (`gpumem < transcript.rhai`): lines are read straight from standard input, with
//! no line editor, and grouped into inputs by the same rule as at the prompt
//! ([`super::continuation::needs_more`]). Input that ends inside an unfinished block is an
//! error, never dropped.

use std::io::BufRead;

use rhai::Engine;

use super::continuation::needs_more;
use super::{Flow, Repl};

/// Feeds every input read from `reader` to `repl` until `:quit`, `exit(..)` or the end, and
/// returns how the last input ended.
pub fn run(repl: &mut Repl, reader: impl BufRead) -> std::io::Result<Flow> {
    let parser = Engine::new_raw();
    let mut pending = String::new();
    let mut first_line = 0;
    for (index, line) in reader.lines().enumerate() {
        let line = line?;
        if pending.is_empty() {
            first_line = index + 1;
        } else {
            pending.push('\n');
        }
        pending.push_str(line.strip_suffix('\r').unwrap_or(&line));
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
             of the input); what was read of it:"
        ));
        return Ok(repl.handle(&pending));
    }
    Ok(Flow::Continue)
}
