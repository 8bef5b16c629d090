//! The interactive REPL driven through a pseudo-terminal: tab completion, multi-line input,
//! `:vars`, re-`let` freeing the old tensor, Ctrl-C out of `loop {}` with variables intact,
//! Ctrl-D, and history kept across sessions; and nothing a user types may lose the session:
//! syntax errors reported at once, deep recursion, Ctrl-C in a long reduction, a multi-line
//! paste, `exit(code)`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rexpect::session::{spawn_command, PtySession};

const PROMPT: &str = "gpumem> ";

fn start(history: &Path) -> PtySession {
    start_with(history, &[])
}

fn start_with(history: &Path, args: &[&str]) -> PtySession {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    command
        .args(["--device", "sim"])
        .args(args)
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
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gpumem-pty-{}", std::process::id()));
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

/// A history file of its own for each test.
fn history(test: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpumem-pty-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let history = dir.join("history");
    let _ = std::fs::remove_file(&history);
    history
}

#[test]
fn syntax_errors_are_reported_at_once_not_taken_for_unfinished_blocks() {
    let mut repl = start(&history("syntax"));
    for (line, column) in [
        ("let y = 1 2;", "1:11"),
        ("randn([2,3]))", "1:13"),
        ("del x;", "1:5"),
    ] {
        repl.send_line(line).expect("send");
        repl.exp_string(&format!(":{column}: error: syntax error"))
            .expect("the error comes at once");
        repl.exp_string(PROMPT)
            .expect("a prompt, not a continuation");
    }
    // The next line is its own input, not swallowed into the previous one.
    repl.send_line("print(\"after\")").expect("send");
    repl.exp_string("after").expect("ran");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line(":quit").expect("send");
    repl.exp_eof().expect("exits");
}

#[test]
fn deep_recursion_is_an_error_and_the_session_survives() {
    let mut repl = start_with(&history("deep"), &["--max-call-depth", "100000"]);
    repl.send_line("let keep = 41;").expect("send");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } }")
        .expect("send");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("f(60000)").expect("send");
    repl.exp_string("Stack overflow").expect("a clean error");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("print(keep + 1)").expect("send");
    repl.exp_string("42").expect("the session survived");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line(":quit").expect("send");
    repl.exp_eof().expect("exits");
}

#[test]
fn ctrl_c_stops_a_long_reduction_and_keeps_the_tensor() {
    let mut repl = start(&history("reduce"));
    // 915 MiB of generated values: seconds of CPU work on the simulated device.
    repl.send_line("let big = randn([200, 300, 200, 20]);")
        .expect("send");
    repl.exp_string(PROMPT).expect("prompt");
    // The marker is printed only once the line runs (its echo reads `"red" + "uce"`).
    repl.send_line("print(\"red\" + \"uce\"); print(`sum=${big.sum()}`)")
        .expect("send");
    repl.exp_string("reduce").expect("the line runs");
    std::thread::sleep(Duration::from_millis(200));
    repl.send_control('c').expect("ctrl-c");
    let before = repl
        .exp_string("interrupted (Ctrl-C)")
        .expect("the reduction stopped");
    // The typed line echoes `sum=`; a printed result would start a line with it.
    assert!(
        !before.contains("\nsum="),
        "the result must not print: {before}"
    );
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line("print(`bytes=${big.nbytes} alloc=${memory_allocated()}`)")
        .expect("send");
    repl.exp_string("bytes=960000000 alloc=960495616")
        .expect("big and the allocator are intact");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line(":quit").expect("send");
    repl.exp_eof().expect("exits");
}

#[test]
fn a_multi_line_paste_runs_every_line_in_order() {
    let mut repl = start(&history("paste"));
    // A terminal without bracketed paste delivers the lines as one burst of typed input.
    repl.send(
        "let a = 1;\nprint(`a=${a}`);\nfor i in 0..2 {\n  print(`i=${i}`);\n}\nprint(\"last\");\n",
    )
    .expect("send");
    repl.flush().expect("flush");
    repl.exp_string("a=1").expect("line 2 ran");
    repl.exp_string("i=0").expect("the block ran");
    repl.exp_string("i=1").expect("the block ran");
    repl.exp_string("last").expect("the last line ran");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line(":quit").expect("send");
    repl.exp_eof().expect("exits");
}

#[test]
fn exit_ends_the_repl_with_its_status() {
    let mut repl = start(&history("exit"));
    repl.send_line("exit(3)").expect("send");
    repl.exp_eof().expect("exits");
    match repl.process.wait().expect("status") {
        rexpect::process::wait::WaitStatus::Exited(_, code) => assert_eq!(code, 3),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_unfinished_line_continues_at_a_continuation_prompt_and_an_abandoned_block_says_why() {
    let mut repl = start(&history("continue"));
    repl.send_line("for i in 0..3 {").expect("send");
    repl.exp_string("...> ").expect("a continuation prompt");
    repl.send_line("  let x = 1").expect("send");
    repl.exp_string("...> ").expect("still unfinished");
    // A blank line gives the block up: it is discarded, and the message says what was missing.
    repl.send_line("").expect("blank line");
    let said = repl.exp_string(PROMPT).expect("back at the prompt");
    assert!(said.contains("discarded"), "{said}");
    assert!(said.contains("a `}` is missing"), "{said}");
    assert!(!said.contains("Expecting"), "{said}");
    // A finished block still runs, and the session goes on.
    repl.send_line("for i in 0..2 {").expect("send");
    repl.exp_string("...> ").expect("continuation");
    repl.send_line("print(`k=${i}`); }").expect("send");
    repl.exp_string("k=1").expect("the block ran");
    repl.exp_string(PROMPT).expect("prompt");
    repl.send_line(":quit").expect("send");
    repl.exp_eof().expect("exits");
}
