//! `gpumem test` end to end: the binary run on scratch folders of scripts, checking its status
//! lines, diffs, closing line and exit codes.

use std::path::Path;

mod common;
use common::{gpumem_in, scratch, write};

/// Runs `gpumem --device sim test ARGS` in `dir` with colour forced off by the environment.
fn gpumem_test(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--device", "sim", "test"];
    all.extend_from_slice(args);
    let output = gpumem_in(Some(dir), &all, "");
    (
        output.status.code().expect("exit code"),
        String::from_utf8(output.stdout).expect("utf-8 stdout"),
        String::from_utf8(output.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn all_passing_exits_zero_with_the_closing_line() {
    let dir = scratch("pass");
    write(
        &dir,
        "a.rhai",
        "let t = empty(513, \"uint8\");\nprint(memory_allocated());\n",
    );
    write(&dir, "a.out", "1024\n");
    write(&dir, "sub/b.rhai", "print(\"b\");\n");
    write(&dir, "sub/b.out", "b\n");
    let (code, stdout, _) = gpumem_test(&dir, &["."]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        stdout,
        "PASS  ./a.rhai\nPASS  ./sub/b.rhai\n2 passed, 0 failed\n"
    );
}

#[test]
fn a_mismatch_fails_with_a_numbered_diff_and_no_colour_when_piped() {
    let dir = scratch("mismatch");
    write(&dir, "a.rhai", "print(1);\nprint(2);\nprint(3);\n");
    write(&dir, "a.out", "1\ntwo\n3\n");
    let (code, stdout, _) = gpumem_test(&dir, &["a.rhai"]);
    assert_eq!(code, 1);
    assert!(stdout.starts_with("FAIL  a.rhai\n"), "{stdout}");
    assert!(stdout.contains("  --- expected  a.out\n"), "{stdout}");
    assert!(
        stdout.contains("  +++ actual    output of a.rhai\n"),
        "{stdout}"
    );
    assert!(stdout.contains("  @@ -1,3 +1,3 @@\n"), "{stdout}");
    assert!(stdout.contains("  -   2      | two\n"), "{stdout}");
    assert!(stdout.contains("  +        2 | 2\n"), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "colour escape in piped output");
    assert!(stdout.ends_with("0 passed, 1 failed\n"), "{stdout}");
}

#[test]
fn a_missing_out_says_how_to_bless_and_bless_writes_it() {
    let dir = scratch("bless");
    write(&dir, "new.rhai", "print(\"hello\");\n");
    let (code, stdout, _) = gpumem_test(&dir, &["new.rhai"]);
    assert_eq!(code, 1);
    assert!(stdout.contains("new.out does not exist"), "{stdout}");
    assert!(stdout.contains("gpumem test --bless new.rhai"), "{stdout}");
    assert!(stdout.contains("  | hello\n"), "{stdout}");

    let (code, stdout, _) = gpumem_test(&dir, &["--bless", "new.rhai"]);
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        "BLESS new.rhai: created new.out\n1 passed (1 blessed), 0 failed\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("new.out")).expect("read"),
        "hello\n"
    );

    write(&dir, "new.out", "stale\n");
    let (_, stdout, _) = gpumem_test(&dir, &["new.rhai", "--bless"]);
    assert!(
        stdout.starts_with("BLESS new.rhai: updated new.out\n"),
        "{stdout}"
    );
    let (code, stdout, _) = gpumem_test(&dir, &["new.rhai"]);
    assert_eq!(
        (code, stdout.as_str()),
        (0, "PASS  new.rhai\n1 passed, 0 failed\n")
    );
}

#[test]
fn a_script_error_is_shown_and_can_be_expected() {
    let dir = scratch("error");
    write(
        &dir,
        "oom.rhai",
        "//! device: sim:1GiB\nprint(\"start\");\nlet t = empty(2147483648, \"uint8\");\n",
    );
    write(&dir, "oom.out", "start\n");
    let (code, stdout, _) = gpumem_test(&dir, &["oom.rhai"]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("the script stopped with an error:\n    oom.rhai:3:9: error: CUDA out of memory. Tried to allocate 2.00 GiB."),
        "{stdout}"
    );
    // A plain --bless refuses an output that ends in an error, naming it: a typo must not
    // become a passing test.
    let (code, stdout, _) = gpumem_test(&dir, &["--bless", "oom.rhai"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("not blessed: the script stopped with an error"),
        "{stdout}"
    );
    assert!(
        stdout.contains("oom.rhai:3:9: error: CUDA out of memory."),
        "{stdout}"
    );
    assert!(stdout.contains("--bless-errors"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.join("oom.out")).expect("read"),
        "start\n",
        "the .out file is left as it was"
    );
    // --bless-errors pins the error on purpose; from then on the script passes.
    let (code, _, _) = gpumem_test(&dir, &["--bless-errors", "oom.rhai"]);
    assert_eq!(code, 0);
    let expected = std::fs::read_to_string(dir.join("oom.out")).expect("read");
    assert!(expected.starts_with("start\noom.rhai:3:9: error: CUDA out of memory."));
    assert!(expected.ends_with("3 | let t = empty(2147483648, \"uint8\");\n  |         ^\n"));
    let (code, _, _) = gpumem_test(&dir, &["oom.rhai"]);
    assert_eq!(code, 0);
}

#[test]
fn a_typo_is_never_blessed_into_a_passing_test() {
    let dir = scratch("typo");
    write(&dir, "t.rhai", "print(1);\nprnt(2);\n");
    let (code, stdout, _) = gpumem_test(&dir, &["--bless", "."]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("Function not found: prnt"), "{stdout}");
    assert!(!dir.join("t.out").exists(), "no .out written");
    assert!(stdout.ends_with("0 passed, 1 failed\n"), "{stdout}");
    // Output without an error is blessed as before.
    write(&dir, "t.rhai", "print(1);\nprint(2);\n");
    let (code, stdout, _) = gpumem_test(&dir, &["--bless", "."]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        std::fs::read_to_string(dir.join("t.out")).expect("read"),
        "1\n2\n"
    );
}

#[test]
fn syntax_errors_fail_and_are_not_blessed() {
    let dir = scratch("syntax");
    write(&dir, "bad.rhai", "let x = ;\n");
    let (code, stdout, _) = gpumem_test(&dir, &["--bless", "."]);
    assert_eq!(code, 1);
    assert!(stdout.contains("FAIL  ./bad.rhai\n"), "{stdout}");
    assert!(stdout.contains("syntax error"), "{stdout}");
    assert!(!dir.join("bad.out").exists());
}

#[test]
fn cuda_pinned_scripts_are_skipped_with_the_reason_without_a_gpu() {
    let dir = scratch("skip");
    write(&dir, "gpu.rhai", "//! device: cuda\nprint(1);\n");
    write(&dir, "gpu.out", "1\n");
    write(&dir, "plain.rhai", "print(2);\n");
    write(&dir, "plain.out", "2\n");
    let (code, stdout, _) = gpumem_test(&dir, &["."]);
    if stdout.contains("SKIP") {
        assert_eq!(code, 0, "{stdout}");
        assert!(
            stdout.contains("SKIP  ./gpu.rhai: cannot use cuda:0: "),
            "{stdout}"
        );
        assert!(
            stdout.ends_with("1 passed, 0 failed, 1 skipped\n"),
            "{stdout}"
        );
    } else {
        // A machine with a GPU runs it.
        assert!(stdout.ends_with("2 passed, 0 failed\n"), "{stdout}");
    }
}

#[test]
fn directives_pin_config_over_the_flag() {
    let dir = scratch("directives");
    write(
        &dir,
        "conf.rhai",
        "//! device: sim:8GiB\n//! alloc-conf: max_split_size_mb:64\nprint(memory_stats()[\"max_split_size\"]);\nprint(mem_get_info()[1]);\n",
    );
    write(&dir, "conf.out", "67108864\n8589934592\n");
    write(
        &dir,
        "flag.rhai",
        "print(memory_stats()[\"max_split_size\"]);\n",
    );
    write(&dir, "flag.out", "134217728\n");
    let output = gpumem_in(
        Some(&dir),
        &[
            "test",
            "--alloc-conf",
            "max_split_size_mb:128",
            "--device",
            "sim",
            ".",
        ],
        "",
    );
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.ends_with("2 passed, 0 failed\n"), "{stdout}");
}

#[test]
fn a_bad_directive_fails_the_script() {
    let dir = scratch("baddirective");
    write(&dir, "x.rhai", "//! devise: sim\nprint(1);\n");
    write(&dir, "x.out", "1\n");
    let (code, stdout, _) = gpumem_test(&dir, &["x.rhai"]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("directive on line 1: unknown key 'devise'"),
        "{stdout}"
    );
}

#[test]
fn unusable_paths_and_options_are_usage_errors() {
    let dir = scratch("usage");
    let (code, _, stderr) = gpumem_test(&dir, &["missing"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read missing"), "{stderr}");
    let (code, _, stderr) = gpumem_test(&dir, &["."]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no .rhai scripts found under ."),
        "{stderr}"
    );
    write(&dir, "a.rhai", "print(1);\n");
    let output = gpumem_in(
        Some(&dir),
        &[
            "test",
            "--device",
            "sim",
            "--alloc-conf",
            "bogus:1",
            "a.rhai",
        ],
        "",
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).expect("utf-8");
    assert!(stderr.contains("Unrecognized key 'bogus'"), "{stderr}");
}

#[test]
fn results_come_in_sorted_order() {
    let dir = scratch("order");
    for name in ["c", "a", "b", "e", "d"] {
        write(
            &dir,
            &format!("{name}.rhai"),
            &format!("print(\"{name}\");\n"),
        );
        write(&dir, &format!("{name}.out"), &format!("{name}\n"));
    }
    let (code, stdout, _) = gpumem_test(&dir, &["e.rhai", "."]);
    assert_eq!(code, 0);
    let order: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        order,
        [
            "PASS  ./a.rhai",
            "PASS  ./b.rhai",
            "PASS  ./c.rhai",
            "PASS  ./d.rhai",
            "PASS  e.rhai",
            "5 passed, 0 failed"
        ]
    );
}

#[test]
fn engine_limits_from_the_command_line_reach_golden_scripts() {
    let dir = scratch("limits");
    write(&dir, "spin.rhai", "print(1);\nloop {}\n");
    write(&dir, "spin.out", "1\n");
    let (code, stdout, _) = gpumem_test(&dir, &["--max-operations", "5000", "spin.rhai"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("Too many operations"), "{stdout}");
    assert!(stdout.ends_with("0 passed, 1 failed\n"), "{stdout}");
    write(
        &dir,
        "deep.rhai",
        "fn down(n) { if n == 0 { 0 } else { down(n - 1) } }\nprint(down(10));\n",
    );
    write(&dir, "deep.out", "0\n");
    let (code, stdout, _) = gpumem_test(&dir, &["--max-call-depth", "5", "deep.rhai"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("--max-call-depth"), "{stdout}");
}
