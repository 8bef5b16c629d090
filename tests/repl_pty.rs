//! The interactive REPL driven through a pseudo-terminal: tab completion, multi-line input,
//! `:vars`, re-`let` freeing the old tensor, Ctrl-C out of `loop {}` with variables intact,
//! Ctrl-D, and history kept across sessions.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rexpect::session::{spawn_command, PtySession};

const PROMPT: &str = "gpumem> ";

fn start(history: &Path) -> PtySession {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    command
        .args(["--device", "sim"])
        .env("GPUMEM_HISTORY", history)
        .env("NO_COLOR", "1")
        .env("TERM", "xterm")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    let mut session = spawn_command(command, Some(15_000)).expect("gpumem starts in a pty");
    session.exp_string(PROMPT).expect("first prompt");
    session
}

#[test]
fn interactive_session() {
    let dir = std::env::temp_dir().join(format!("gpumem-pty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let history = dir.join("history");
    let _ = std::fs::remove_file(&history);

    let mut repl = start(&history);
    repl.send_line("let big = empty(1048576, \"uint8\");")
        .expect("send");
    repl.exp_string(PROMPT).expect("prompt");

    // Tab completes the only binding starting with `memory_allo`.
    repl.send("print(\"A=\" + memory_allo").expect("send");
    repl.flush().expect("flush");
    repl.send("\t").expect("tab");
    std::thread::sleep(Duration::from_millis(200));
    repl.flush().expect("flush");
    repl.send("());\r").expect("send");
    repl.flush().expect("flush");
    repl.exp_string("A=1048576").expect("completed call ran");
    repl.exp_string(PROMPT).expect("prompt");

    // An unfinished block continues on the next line.
    repl.send_line("for i in 0..2 {").expect("send");
    repl.send_line("  print(`row ${i * 10}`);").expect("send");
    repl.send_line("}").expect("send");
    repl.exp_string("row 10")
        .expect("the block ran once complete");
    repl.exp_string(PROMPT).expect("prompt");

    repl.send_line(":vars").expect("send");
    repl.exp_regex(r"big\s+1024\.00 KiB\s+tensor\(shape=\[1048576\]")
        .expect(":vars lists big");
    repl.exp_string(PROMPT).expect("prompt");

    // Re-`let` frees the old tensor.
    repl.send_line("let big = empty(2097152, \"uint8\");")
        .expect("send");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("print(\"B=\" + memory_allocated())")
        .expect("send");
    repl.exp_string("B=2097152")
        .expect("only the new tensor is allocated");
    repl.exp_string(PROMPT).expect("prompt");

    // Ctrl-C stops a running loop; variables survive.
    repl.send_line("loop { }").expect("send");
    std::thread::sleep(Duration::from_millis(300));
    repl.send_control('c').expect("ctrl-c");
    repl.exp_string("interrupted (Ctrl-C)")
        .expect("interrupted");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("print(\"C=\" + big.nbytes)").expect("send");
    repl.exp_string("C=2097152").expect("big survived");
    repl.exp_string(PROMPT).expect("prompt");

    // Ctrl-D leaves.
    repl.send_control('d').expect("ctrl-d");
    repl.exp_eof().expect("exits");

    let saved = std::fs::read_to_string(&history).expect("history saved");
    assert!(saved.contains("loop { }"), "{saved}");

    // A new session recalls the last line with the up arrow: `big` no longer exists there.
    let mut again = start(&history);
    again.send("\x1b[A").expect("up");
    again.flush().expect("flush");
    again.send("\r").expect("enter");
    again.flush().expect("flush");
    again
        .exp_string("Variable not found: big")
        .expect("recalled line ran in the new session");
    again.exp_string(PROMPT).expect("prompt");
    again.send_line(":quit").expect("send");
    again.exp_eof().expect("exits");
}
