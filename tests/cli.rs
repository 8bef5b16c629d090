//! End-to-end tests of the `gpumem` binary on the simulated device: piped REPL transcripts,
//! `:` commands, the experiment scripts, every error class and the exit codes.

use std::path::Path;

use serde_json::Value;

mod common;
use common::{gpumem, outcome, scratch, tests_path, text};

/// Pipes `input` into the REPL on sim; returns (stdout, stderr, exit code).
fn repl(input: &str) -> (String, String, i32) {
    outcome(&gpumem(&["--device", "sim"], input))
}

/// Runs a script file on sim; returns (stdout, stderr, exit code).
fn run_script(extra: &[&str], source: &str) -> (String, String, i32) {
    let path = common::write(&scratch("cli"), "script.rhai", source);
    let path = path.display().to_string();
    let mut args = vec!["run", "--device", "sim"];
    args.extend_from_slice(extra);
    args.push(&path);
    outcome(&gpumem(&args, ""))
}

#[test]
fn piped_seed_walkthrough_prints_pytorchs_counters() {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/pytorch-seed-walkthrough.json").expect("fixture"),
    )
    .expect("fixture is JSON");
    let steps = fixture["steps"].as_array().expect("steps");
    let mut input = String::new();
    for step in steps {
        input.push_str(step["rhai"].as_str().expect("rhai step"));
        input.push('\n');
        for key in step["stats"].as_object().expect("stats").keys() {
            input.push_str(&format!("print(\"{key}=\" + memory_stats()[\"{key}\"]);\n"));
        }
        input.push_str("print(\"--\");\n");
    }
    for line in fixture["summary_steps_rhai"]
        .as_array()
        .expect("summary steps")
    {
        input.push_str(line.as_str().expect("summary step"));
        input.push('\n');
    }
    let (stdout, stderr, code) = repl(&input);
    assert_eq!(code, 0, "stderr: {stderr}");
    let mut blocks = stdout.split("--\n");
    for (index, step) in steps.iter().enumerate() {
        let block = blocks.next().expect("one block per step");
        for (key, expected) in step["stats"].as_object().expect("stats") {
            let line = format!("{key}={expected}");
            assert!(
                block.lines().any(|l| l == line),
                "step {index} ({}): expected {line}, got:\n{block}",
                step["rhai"]
            );
        }
    }
    let summary = blocks.next().expect("the summary");
    assert_eq!(
        summary.trim_end(),
        fixture["memory_summary"]
            .as_str()
            .expect("summary")
            .trim_end()
    );
}

#[test]
fn every_experiment_script_runs_on_sim() {
    let mut scripts: Vec<_> = std::fs::read_dir("scripts")
        .expect("scripts/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rhai"))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 4, "{scripts:?}");
    for script in &scripts {
        let header = std::fs::read_to_string(script).expect("script");
        assert!(
            header.starts_with("//!"),
            "{} lacks a //! header",
            script.display()
        );
        for conf in [None, Some("max_split_size_mb:256")] {
            let path = script.display().to_string();
            let mut args = vec!["run", "--device", "sim"];
            if let Some(conf) = conf {
                args.extend(["--alloc-conf", conf]);
            }
            args.push(&path);
            let output = gpumem(&args, "");
            assert!(
                output.status.success(),
                "{path} with {conf:?} failed:\n{}{}",
                text(&output.stdout),
                text(&output.stderr)
            );
        }
    }
    // Scripts compute their expectations from the device and config, not the defaults'.
    for args in [
        ["run", "--device", "sim:80GiB", "scripts/oom.rhai"].as_slice(),
        &[
            "run",
            "--device",
            "sim",
            "--alloc-conf",
            "max_split_size_mb:2048",
            "scripts/fragmentation.rhai",
        ],
        &[
            "run",
            "--device",
            "sim",
            "--alloc-conf",
            "max_split_size_mb:1024",
            "scripts/fragmentation.rhai",
        ],
        &[
            "run",
            "--device",
            "sim",
            "--alloc-conf",
            "expandable_segments:True",
            "scripts/fragmentation.rhai",
        ],
    ] {
        let output = gpumem(args, "");
        assert!(
            output.status.success(),
            "{args:?} failed:\n{}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
    }
}

#[test]
fn colon_commands_work_when_piped() {
    let file = common::write(
        &scratch("load"),
        "load.rhai",
        "let loaded = empty(4096, \"uint8\");\n",
    );
    let input = format!(
        ":help\n:help slice\nlet small = empty(1024, \"uint8\");\nlet big = empty([1024, 1024]);\nlet many = [empty(2048, \"uint8\")];\n:vars\n:mem\n:summary\n:load {}\nloaded.nbytes\n:reset\n:vars\nmemory_reserved()\n:bogus\n:quit\nprint(\"not reached\");\n",
        file.display()
    );
    let (stdout, stderr, code) = repl(&input);
    assert!(stdout.contains("Commands:") && stdout.contains("memory_snapshot()"));
    assert!(stdout.contains("t.slice(dim, start, end)\n  a view of start..end"));
    let vars: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("big "))
        .take(3)
        .collect();
    assert!(
        vars[0].starts_with("big ") && vars[0].contains("4.00 MiB"),
        "{vars:?}"
    );
    assert!(vars[1].starts_with("many[0] "), "{vars:?}");
    assert!(vars[2].starts_with("small "), "{vars:?}");
    assert!(stdout.contains("allocated 4.00 MiB, reserved 22.00 MiB, cudaMemGetInfo used"));
    assert!(stdout.contains("PyTorch CUDA memory summary, device ID 0"));
    assert!(stdout.contains("\n4096\n"), "{stdout}");
    assert!(
        stdout.contains("reset: every variable and function dropped; every device as a new process finds it: no segments, counters and peaks at zero, generator at its default seed, no CUDA context until a call needs one\nallocated 0 bytes, reserved 0 bytes, no CUDA context yet\n"),
        "{stdout}"
    );
    assert!(stdout.contains("no live tensors\n0\n"), "{stdout}");
    assert!(stderr.contains("unknown command ':bogus'"), "{stderr}");
    assert!(!stdout.contains("not reached"));
    assert_eq!(code, 1, "a piped transcript with an error exits 1");
}

#[test]
fn piped_repl_frees_rebound_tensors_and_continues_blocks() {
    let input = "let x = empty(1048576, \"uint8\");\nlet x = empty(2097152, \"uint8\");\nmemory_allocated()\nfor i in 0..2 {\n  print(`i=${i}`);\n}\nfn twice(v) { v * 2 }\ntwice(21)\nx\n";
    let (stdout, stderr, code) = repl(input);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "2097152\ni=0\ni=1\n42\ntensor(shape=[2097152], dtype=uint8, device=sim, 2.00 MiB)\n"
    );
}

#[test]
fn script_errors_are_located_with_a_caret_and_exit_1() {
    let (_, stderr, code) = run_script(&[], "let a = 1;\nlet t = randn([2, -3]);\n");
    assert_eq!(code, 1);
    assert!(stderr.contains(":2:9: error: randn: invalid shape: dimension 1 is -3; sizes must be non-negative\n2 | let t = randn([2, -3]);\n  |         ^"), "{stderr}");

    let (_, stderr, code) = run_script(&[], "let x = ;\n");
    assert_eq!(code, 1);
    assert!(stderr.contains(":1:9: error: syntax error:"), "{stderr}");
    assert!(stderr.contains("1 | let x = ;\n  |         ^"), "{stderr}");
}

#[test]
fn every_error_class_names_the_function_and_argument() {
    let cases = [
        ("randn([2, -3])", "randn: invalid shape: dimension 1 is -3; sizes must be non-negative"),
        ("zeros([2, 1.5])", "zeros: shape element 1 must be an integer, got f64"),
        ("empty([1 << 62, 1 << 62])", "empty: invalid shape: the number of elements of"),
        ("ones(\"big\")", "ones: shape must be an integer or an array of integers, got string"),
        ("empty(4, \"float8\")", "empty: unknown dtype 'float8'; expected one of float32"),
        ("full(4, \"x\")", "full: fill value must be a number, got string"),
        ("randn(4, \"int64\")", "randn: randn is only defined for floating dtypes"),
        ("randn([2, 3]).reshape([7])", "reshape: invalid shape: cannot reshape a tensor of 6 elements"),
        ("randn([2, 3]).slice(0, -1, 1)", "slice: start must be non-negative, got -1"),
        ("randn([2, 3]).slice(0, 1, 5)", "slice: out of range: slice 1..5 of dimension 0 with size 2"),
        ("set_per_process_memory_fraction(\"half\")", "set_per_process_memory_fraction: fraction must be a float"),
        ("set_per_process_memory_fraction(1.5)", "set_per_process_memory_fraction:"),
        ("manual_seed(-1)", "manual_seed: seed must be non-negative, got -1"),
        ("empty(200 * 1073741824, \"uint8\")", "CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of 139.80 GiB"),
        ("memory_allocated(1)", "memory_allocated: device 1 does not exist: this session has 1 device (index 0)"),
        ("memory_allocated(1, 2)", "Function not found: memory_allocated (i64, i64)"),
        ("set_device(\"cuda:7\")", "set_device: no device named 'cuda:7': this session's devices are sim"),
        ("with_device(0, 1)", "with_device: the second argument must be a function, as in || { ... }, got i64"),
        ("import \"os\" as os;", "import: no module named 'os'; gpumem's modules are: mem, check"),
        ("mem::format_size(-1)", "mem::format_size: bytes must be non-negative, got -1"),
    ];
    for (source, expected) in cases {
        let (_, stderr, code) = run_script(&[], &format!("import \"mem\" as mem;\n{source};\n"));
        assert_eq!(code, 1, "{source}");
        assert!(
            stderr.contains(expected),
            "{source}: expected '{expected}' in:\n{stderr}"
        );
    }
}

#[test]
fn uncaught_oom_exits_1_and_caught_oom_keeps_tensors() {
    let (stdout, stderr, code) = run_script(
        &[],
        "let a = empty(1073741824, \"uint8\");\ntry { let b = empty(500 * 1073741824, \"uint8\"); } catch (e) { print(\"caught\"); }\nprint(memory_allocated());\nlet c = empty(500 * 1073741824, \"uint8\");\n",
    );
    assert_eq!(stdout, "caught\n1073741824\n");
    assert_eq!(code, 1);
    assert!(
        stderr.contains(":4:9: error: CUDA out of memory. Tried to allocate 500.00 GiB."),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let output = gpumem(&["run", "--device", "sim", "/nonexistent/x.rhai"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("cannot read /nonexistent/x.rhai"));
    // A file that is not text (a snapshot given as a script) is named, and said to be so.
    let pickle = tests_path("replay/fixtures/convnet.default.pickle");
    let output = gpumem(
        &["run", "--device", "sim", pickle.to_str().expect("utf-8")],
        "",
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("convnet.default.pickle: it is not a text file"),
        "{}",
        text(&output.stderr)
    );
    let output = gpumem(&["--no-such-flag"], "");
    assert_eq!(output.status.code(), Some(2));
    let output = gpumem(&["--device", "sim", "--alloc-conf", "bogus_key:1"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("invalid allocator config 'bogus_key:1'"));
    let output = gpumem(&["--max-operations", "lots"], "");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn deeply_nested_values_do_not_crash_run_or_the_repl() {
    let deep = "let b = []; for i in 0..3000 { b = [b]; }\nprint(`${b}`.len());\n";
    let (stdout, stderr, code) = run_script(&[], deep);
    assert_eq!((stdout.as_str(), code), ("6002\n", 0), "{stderr}");
    let (stdout, stderr, code) = repl(&format!("{deep}b\n:vars\nprint(\"alive\");\n"));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("6002\n[[[["), "{stdout}");
    assert!(stdout.ends_with("no live tensors\nalive\n"), "{stdout}");
}

#[test]
fn repl_errors_in_earlier_functions_point_at_their_definition() {
    let (_, stderr, code) = repl("fn f(x) {\n  x.foo()\n}\nlet y = 1;\n   f(1)\n");
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(
            "input1:2:5: error: Function not found: foo (i64)\n2 |   x.foo()\n  |     ^\n  in f(), called at input3:1:4"
        ),
        "{stderr}"
    );
}

#[test]
fn limits_are_adjustable_from_the_command_line() {
    let (_, stderr, code) = run_script(&["--max-operations", "1000"], "loop {}\n");
    assert_eq!(code, 1);
    assert!(stderr.contains("Too many operations"), "{stderr}");
    let (_, stderr, code) = run_script(
        &["--max-call-depth", "5"],
        "fn down(n) { if n == 0 { 0 } else { down(n - 1) } }\ndown(10);\n",
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("Stack overflow"), "{stderr}");
    assert!(stderr.contains("--max-call-depth"), "{stderr}");
    let (_, stderr, code) = run_script(&["--max-array-size", "3"], "let a = [1, 2, 3, 4];\n");
    assert_eq!(code, 1);
    assert!(stderr.contains("Size of array"), "{stderr}");
    let (stdout, _, code) = run_script(
        &["--max-call-depth", "20"],
        "fn down(n) { if n == 0 { 0 } else { down(n - 1) } }\nprint(down(10));\n",
    );
    assert_eq!((stdout.as_str(), code), ("0\n", 0));
}

#[test]
fn stdlib_is_embedded_not_read_from_disk() {
    assert!(Path::new("stdlib/mem.rhai").exists());
    let (_, stderr, code) = run_script(&[], "import \"stdlib/mem\" as m;\n");
    assert_eq!(code, 1);
    assert!(stderr.contains("no module named 'stdlib/mem'"), "{stderr}");
}

#[test]
fn errors_inside_functions_show_where_and_the_calls() {
    let (_, stderr, code) = run_script(&[], "fn g(n) { randn(n) }\nfn f(n) {\n  g(n)\n}\nf(-2);\n");
    assert_eq!(code, 1);
    assert!(stderr.contains(":1:11: error: randn: invalid shape: dimension 0 is -2; sizes must be non-negative\n1 | fn g(n) { randn(n) }\n  |           ^\n  in g(), called at "), "{stderr}");
    assert!(stderr.contains(":3:3\n  in f(), called at "), "{stderr}");
    let (_, stderr, code) =
        run_script(&[], "import \"check\" as check;\ncheck::eq(1, 2, \"x\");\n");
    assert_eq!(code, 1);
    assert!(stderr.contains(":2:8: error: check::eq failed for x: expected 2 (i64), got 1 (i64)\n2 | check::eq(1, 2, \"x\");\n  |        ^\n  raised in eq() at stdlib/check.rhai:"), "{stderr}");
}

#[test]
fn a_config_from_the_environment_is_named_when_refused() {
    for variable in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
        let output = common::gpumem_with(
            None,
            &[(variable, "max_split_size_mb:1")],
            &["--device", "sim"],
            "print(1);\n",
        );
        let (stdout, stderr, code) = outcome(&output);
        assert_eq!((stdout.as_str(), code), ("", 2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid allocator config 'max_split_size_mb:1' (from the environment variable {variable})"
            )),
            "{stderr}"
        );
    }
    // The flag wins over the environment, and says it was the flag.
    let output = common::gpumem_with(
        None,
        &[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")],
        &["--device", "sim", "--alloc-conf", "bogus:1"],
        "",
    );
    let (_, stderr, code) = outcome(&output);
    assert_eq!(code, 2);
    assert!(stderr.contains("'bogus:1' (from --alloc-conf)"), "{stderr}");
    // A valid config from the environment is used.
    let output = common::gpumem_with(
        None,
        &[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")],
        &["--device", "sim"],
        "print(memory_stats()[\"max_split_size\"]);\n",
    );
    assert_eq!(text(&output.stdout), format!("{}\n", 64 << 20));
}

#[test]
fn deep_recursion_is_a_clean_error_at_any_call_depth() {
    let source = "fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } }\nprint(f(60000));\n";
    for depth in ["100000", "0"] {
        let (stdout, stderr, code) = run_script(&["--max-call-depth", depth], source);
        assert_eq!((stdout.as_str(), code), ("", 1), "{stderr}");
        assert!(stderr.contains("Stack overflow"), "{stderr}");
    }
    let (stdout, stderr, code) = repl(&format!(
        "let keep = 1;\n{}print(keep);\n",
        source.replace("print(f(60000));", "f(60000)")
    ));
    assert_eq!((stdout.as_str(), code), ("1\n", 1), "{stderr}");
}

#[test]
fn piped_syntax_errors_are_reported_at_once() {
    let (stdout, stderr, code) = repl("let y = 1 2;\nprint(\"next\");\nrandn([2,3]))\ndel x;\n");
    assert_eq!((stdout.as_str(), code), ("next\n", 1));
    for at in ["input1:1:11", "input3:1:13", "input4:1:5"] {
        assert!(stderr.contains(at), "{at} in {stderr}");
    }
}

#[test]
fn piped_input_ending_inside_a_block_is_an_error() {
    let (stdout, stderr, code) = repl("print(\"a\");\nfn g() {\n");
    assert_eq!((stdout.as_str(), code), ("a\n", 1));
    assert!(
        stderr.contains("the input ended inside an unfinished block (it starts on line 2"),
        "{stderr}"
    );
    assert!(stderr.contains("a `}` is missing"), "{stderr}");
}

#[test]
fn exit_sets_the_exit_status_in_run_and_in_the_repl() {
    let (stdout, _, code) = run_script(
        &[],
        "print(\"a\");\ntry { exit(3); } catch { print(\"caught\"); }\nprint(\"b\");\n",
    );
    assert_eq!((stdout.as_str(), code), ("a\n", 3));
    let (_, _, code) = run_script(&[], "exit();\n");
    assert_eq!(code, 0);
    let (stdout, _, code) = repl("print(1);\nexit(4);\nprint(2);\n");
    assert_eq!((stdout.as_str(), code), ("1\n", 4));
    let (_, stderr, code) = run_script(&[], "exit(300);\n");
    assert_eq!(code, 1);
    assert!(
        stderr.contains("exit: code must be an integer from 0 to 255, got i64 (300)"),
        "{stderr}"
    );
}

#[test]
fn a_byte_order_mark_is_ignored() {
    let (stdout, stderr, code) = run_script(&[], "\u{feff}//! device: sim\nprint(\"ok\");\n");
    assert_eq!((stdout.as_str(), code), ("ok\n", 0), "{stderr}");
}

#[test]
fn an_error_on_a_huge_line_shows_only_the_part_around_the_caret() {
    let line = format!("let a = [{}1] + ;\n", "1, ".repeat(170_000));
    let (_, stderr, code) = run_script(&[], &line);
    assert_eq!(code, 1);
    assert!(stderr.len() < 1000, "{} bytes", stderr.len());
    assert!(stderr.contains('…'), "{stderr}");
}

#[test]
fn zero_means_unlimited_for_every_limit_flag() {
    let source = "fn down(n) { if n == 0 { 0 } else { down(n - 1) } }\nlet a = 1; let b = 2;\nprint(down(100) + a + b);\n";
    let mut args = Vec::new();
    for flag in [
        "--max-operations",
        "--max-call-depth",
        "--max-expr-depth",
        "--max-string-size",
        "--max-array-size",
        "--max-map-size",
        "--max-variables",
        "--max-functions",
        "--max-modules",
    ] {
        args.extend([flag, "0"]);
    }
    let (stdout, stderr, code) = run_script(&args, &format!("import \"mem\" as mem;\n{source}"));
    assert_eq!((stdout.as_str(), code), ("3\n", 0), "{stderr}");
    let help = text(&gpumem(&["--help"], "").stdout);
    assert_eq!(help.matches("(0 = unlimited)").count(), 9, "{help}");
}

#[test]
fn long_flat_sums_parse_and_too_deep_ones_name_the_flag() {
    let sum = |terms: usize| format!("print({}1);\n", "1+".repeat(terms - 1));
    let (stdout, stderr, code) = run_script(&[], &sum(64));
    assert_eq!((stdout.as_str(), code), ("64\n", 0), "{stderr}");
    let (_, stderr, code) = run_script(&[], &sum(300));
    assert_eq!(code, 1);
    assert!(stderr.contains("--max-expr-depth"), "{stderr}");
    let (stdout, _, code) = run_script(&["--max-expr-depth", "400"], &sum(300));
    assert_eq!((stdout.as_str(), code), ("300\n", 0));
}

#[test]
fn run_honours_directives_over_the_flags_and_says_so() {
    let dir = scratch("directives");
    let script = common::write(
        &dir,
        "pinned.rhai",
        "// A comment first.\n//! Pinned: prose, not a directive.\n//! device: sim:1GiB\n//! alloc-conf: max_split_size_mb:64\nprint(mem_get_info()[1]);\nprint(memory_stats()[\"max_split_size\"]);\n",
    );
    let path = script.display().to_string();
    let output = gpumem(
        &[
            "run",
            "--device",
            "sim",
            "--alloc-conf",
            "max_split_size_mb:128",
            &path,
        ],
        "",
    );
    let (stdout, stderr, code) = outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, format!("{}\n{}\n", 1u64 << 30, 64u64 << 20));
    assert!(stderr.contains("ignoring --device sim"), "{stderr}");
    assert!(
        stderr.contains("ignoring 'max_split_size_mb:128' from --alloc-conf"),
        "{stderr}"
    );
    // Sizes read as they were written, in the directive and in the flag.
    let output = gpumem(&["run", "--device", "sim:2GiB", &path], "");
    let (_, stderr, _) = outcome(&output);
    assert!(
        stderr.contains("pins `//! device: sim:1GiB`; ignoring --device sim:2GiB"),
        "{stderr}"
    );
    // Without a GPU, a script pinned to one says that its directive asked for it.
    let (_, stderr, code) = run_script(&[], "//! device: cuda\nprint(1);\n");
    if code == 2 {
        assert!(stderr.contains("pins with `//! device:`"), "{stderr}");
    }
    for (source, expected) in [
        ("//! devise: sim\nprint(1);\n", "unknown key 'devise'"),
        ("print(1);\n//! device: sim\n", "comes after code"),
    ] {
        let (stdout, stderr, code) = run_script(&[], source);
        assert_eq!((stdout.as_str(), code), ("", 1), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[test]
fn every_way_of_running_a_script_reads_its_directives_alike() {
    // The experiment scripts open with `//!` prose: never a bad directive for `gpumem test`.
    let output = gpumem(&["--device", "sim", "test", "scripts"], "");
    let stdout = text(&output.stdout);
    assert!(!stdout.contains("directive"), "{stdout}");
    // `:load` refuses a script pinned to another device or config, and names the reason.
    let dir = scratch("load-directives");
    let pinned = common::write(&dir, "p.rhai", "//! device: sim:1GiB\nprint(\"ran\");\n");
    let same = common::write(
        &dir,
        "s.rhai",
        "//! device: sim\n//! alloc-conf: max_split_size_mb:64\nprint(\"same\");\n",
    );
    let output = gpumem(
        &["--device", "sim", "--alloc-conf", "max_split_size_mb:64"],
        &format!(":load {}\n:load {}\n", pinned.display(), same.display()),
    );
    let (stdout, stderr, code) = outcome(&output);
    assert_eq!((stdout.as_str(), code), ("same\n", 1), "{stderr}");
    assert!(
        stderr.contains("pins `//! device: sim:1GiB` but this session runs on sim"),
        "{stderr}"
    );
}

#[test]
fn experiment_scripts_refuse_a_session_with_live_tensors_and_run_after_reset() {
    for script in [
        "scripts/walkthrough.rhai",
        "scripts/training_loop.rhai",
        "scripts/fragmentation.rhai",
        "scripts/oom.rhai",
        "scripts/prefetch_streams.rhai",
    ] {
        let input = format!(
            // Refused with a live tensor; runs after :reset; runs with only cached memory.
            "let keep = empty(1000000, \"uint8\");\n:load {script}\nprint(`kept ${{keep.nbytes}}`);\n:reset\n:load {script}\n:reset\nlet t = empty(5000000, \"uint8\");\nt = ();\n:load {script}\n"
        );
        let (stdout, stderr, code) = repl(&input);
        assert_eq!(code, 1, "{script}: {stderr}");
        assert_eq!(
            stderr
                .matches("needs a session without live tensors")
                .count(),
            1,
            "{script}: only the first load is refused:\n{stderr}"
        );
        assert!(stderr.contains("977.00 KiB are allocated"), "{stderr}");
        assert!(stdout.contains("kept 1000000"), "{stdout}");
        assert!(
            !stderr.contains("check::"),
            "{script}: a check failed:\n{stderr}"
        );
    }
}

#[test]
fn a_short_soak_passes_on_sim() {
    for conf in ["", "max_split_size_mb:64,roundup_power2_divisions:4"] {
        let output = gpumem(
            &[
                "--device",
                "sim",
                "--alloc-conf",
                conf,
                "bench",
                "soak",
                "--seconds",
                "1",
                "--seed",
                "5",
            ],
            "",
        );
        let (stdout, stderr, code) = outcome(&output);
        assert_eq!(code, 0, "{stdout}{stderr}");
        assert!(stdout.contains("invariant checks"), "{stdout}");
        assert!(stdout.contains("(leftover 0 bytes)"), "{stdout}");
        assert!(stdout.trim_end().ends_with("PASS"), "{stdout}");
    }
}

#[test]
fn timeline_and_report_are_written_even_when_the_script_fails() {
    let dir = scratch("timeline");
    let script = common::write(
        &dir,
        "oom.rhai",
        "let a = empty(300 << 20, \"uint8\");\nempty_cache();\nlet b = empty(2 << 30, \"uint8\");\n",
    );
    let svg = dir.join("t.svg");
    let html = dir.join("r.html");
    let args = [
        "run",
        "--device",
        "sim:1GiB",
        script.to_str().expect("utf-8"),
        "--timeline",
        svg.to_str().expect("utf-8"),
        "--report",
        html.to_str().expect("utf-8"),
    ];
    let (_, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 1, "the uncaught OOM fails the run: {stderr}");
    assert!(
        stderr.contains("gpumem: it cannot fit on this device"),
        "{stderr}"
    );
    let chart = std::fs::read_to_string(&svg).expect("timeline written");
    assert!(chart.starts_with("<svg"), "an SVG");
    // Both marked events carry their script line.
    assert!(chart.contains("OOM oom.rhai:3"), "{chart}");
    assert!(chart.contains("empty_cache() oom.rhai:2"), "{chart}");
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.contains("oom.rhai:3") && page.contains("1 out-of-memory errors"));

    let bad = dir.join("t.jpg");
    let args = [
        "run",
        script.to_str().expect("utf-8"),
        "--timeline",
        bad.to_str().expect("utf-8"),
    ];
    let (_, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("must end in .svg or .png"), "{stderr}");
    assert!(!bad.exists());
}

#[test]
fn piped_map_command_draws_plain_cells() {
    let (stdout, stderr, code) = repl("let x = randn([2, 3]);\n:map\n");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("memory map: 1 segment, 2 MiB reserved, 512 B allocated"),
        "{stdout}"
    );
    assert!(
        stdout.contains(" small ") && stdout.contains("|1"),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\u{1b}'),
        "no colour when piped: {stdout:?}"
    );
}

#[test]
fn replay_draws_a_report_and_a_timeline() {
    let dir = scratch("replay-report");
    let html = dir.join("replay.html");
    let svg = dir.join("replay.svg");
    let args = [
        "replay",
        "tests/replay/fixtures/inference.default.pickle",
        "--report",
        html.to_str().expect("utf-8"),
        "--timeline",
        svg.to_str().expect("utf-8"),
    ];
    let (stdout, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("segment events"),
        "the replay's own report still prints"
    );
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.contains("inference.default.pickle") && page.contains("segment_alloc"));
    assert!(std::fs::read_to_string(&svg)
        .expect("timeline")
        .starts_with("<svg"));
}

/// One model of the CUDA context, printed alike everywhere: the walkthrough, `:mem` and the
/// README name the same 527 MiB (cudaMemGetInfo's figure) and the walkthrough splits it into
/// NVML's 520 MiB under this process and 7 MiB under none; a small simulated device says that
/// its context is scaled down.
#[test]
fn the_context_figures_agree_everywhere() {
    let walkthrough = gpumem(&["run", "--device", "sim", "scripts/walkthrough.rhai"], "");
    let (stdout, stderr, code) = outcome(&walkthrough);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("the CUDA context: NVML counts 520.00 MiB under this process and 7.00 MiB under none (527.00 MiB); cudaMemGetInfo counts 527.00 MiB"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("unattributed 7.00 MiB)"),
        "an unexplained figure: {stdout}"
    );
    let (stdout, stderr, _) = repl("let x = randn([2, 3]);\n:mem\n");
    assert!(
        stdout.contains("527.00 MiB outside the allocator (the CUDA context"),
        "{stdout}{stderr}"
    );
    let readme = std::fs::read_to_string("README.md").expect("README");
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        readme.contains("a 527 MiB context"),
        "README names another figure"
    );
    assert!(
        readme.contains("docs/memory-figures.md"),
        "README links the model"
    );
    let small = gpumem(&["--device", "sim:1GiB"], "print(1);\n");
    let (_, stderr, _) = outcome(&small);
    assert!(
        stderr.contains("its CUDA context is modelled as 128.00 MiB, an eighth of the device"),
        "{stderr}"
    );
}

#[test]
fn a_piped_block_given_up_by_a_blank_line_is_discarded_and_says_why() {
    let (stdout, stderr, code) = repl("for i in 0..3 {\n  let x = 1\n\nprint(5);\n");
    assert_eq!((stdout.as_str(), code), ("5\n", 1), "{stderr}");
    assert!(stderr.contains("discarded"), "{stderr}");
    assert!(stderr.contains("a `}` is missing"), "{stderr}");
    assert!(!stderr.contains("Expecting"), "{stderr}");
    let (_, stderr, code) = repl("fn g() {\n");
    assert_eq!(code, 1);
    assert!(
        stderr.contains("the input ended inside an unfinished block"),
        "{stderr}"
    );
    assert!(stderr.contains("a `}` is missing"), "{stderr}");
}

/// The REPL shows the byte figures of `measure()` and `fragmentation()` readably beside the
/// numbers, and counts as they are.
#[test]
fn repl_results_show_sizes_readably() {
    let (stdout, stderr, code) = repl("measure(|| randn(8))\nfragmentation()\n");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("peak_reserved: 2097152 (2.00 MiB)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("allocations: 1,"),
        "a count stays a count: {stdout}"
    );
    assert!(
        stdout.contains("releasable: 2097152 (2.00 MiB)"),
        "{stdout}"
    );
    assert!(stdout.contains("free_blocks: 1,"), "{stdout}");
}

/// An I/O error names its path once ("adir: Is a directory"), never twice.
#[test]
fn io_errors_name_the_path_once() {
    let dir = scratch("io");
    let folder = dir.join("adir");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let folder = folder.display().to_string();
    let (_, stderr, code) = outcome(&gpumem(&["--device", "sim", "replay", &folder], ""));
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.matches(folder.as_str()).count(), 1, "{stderr}");
    let (_, stderr, _) = run_script(&[], &format!("replay(\"{folder}\");\n"));
    assert_eq!(
        stderr.matches(folder.as_str()).count(),
        2,
        "the message and the source line: {stderr}"
    );
    let (_, stderr, _) = run_script(&[], &format!("dump_snapshot(\"{folder}\");\n"));
    assert_eq!(
        stderr.matches(folder.as_str()).count(),
        2,
        "the message and the source line: {stderr}"
    );
}

/// The README answers what a new user asks: the set-up stays at two commands, and it says how
/// to put `gpumem` on the PATH, what `with_allocator_conf` does, what "oversize" means, and
/// where `mem::`/`check::` functions are described.
#[test]
fn the_readme_covers_what_a_new_user_asks() {
    let readme = std::fs::read_to_string("README.md").expect("README");
    let setup = readme
        .split("## Getting started")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("a set-up block");
    assert_eq!(setup.lines().count(), 2, "two set-up commands:\n{setup}");
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for needle in [
        "`cargo install --path .`",
        "#### Two configs in one script: `with_allocator_conf`",
        "a cached block of that size or more is *oversize*",
        "`:help mem::status`",
    ] {
        assert!(flat.contains(needle), "README lacks {needle}");
    }
}
