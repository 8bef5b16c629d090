//! In-process tests of the script layer: every documented binding runs, values of the memory
//! functions, and the embedded `mem` and `check` modules.

use gpumem::alloc::format::format_size;
use gpumem::script::docs::BINDINGS;

mod common;

/// Runs `source` on a fresh simulated H200; returns what it printed or the error text.
fn run(source: &str) -> Result<String, String> {
    let (host, buffer) = common::sim_host(None, "");
    host.run_source("test", source)
        .map_err(|error| error.to_string())?;
    let printed = buffer.borrow().clone();
    Ok(printed)
}

#[test]
fn every_documented_binding_runs_its_example() {
    // An example that writes a file (dump_snapshot) writes it here, not where the tests run.
    let scratch = common::scratch("examples");
    let written = scratch.join("run.pickle");
    for doc in BINDINGS {
        let example = doc.example.replace(
            "\"run.pickle\"",
            &format!("{:?}", written.display().to_string()),
        );
        let source =
            format!("let t = randn([2, 3]);\nlet value = {example};\nprint(type_of(value));");
        let printed = run(&source).unwrap_or_else(|error| panic!("{}: {error}", doc.name));
        assert!(!printed.is_empty(), "{}", doc.name);
    }
    assert!(written.exists(), "dump_snapshot's example wrote its file");
    std::fs::remove_dir_all(&scratch).expect("the scratch folder is removed");
}

#[test]
fn tensor_properties_and_views() {
    let printed = run(
        "let t = randn([2, 3], \"float16\");\nprint(t.shape); print(t.dtype); print(t.numel); print(t.nbytes); print(t.device);\nlet v = t.reshape([3, 2]); print(v.data_ptr == t.data_ptr);\nlet s = t.slice(0, 1, 2); print(s.data_ptr - t.data_ptr); print(s);",
    )
    .expect("runs");
    assert_eq!(
        printed,
        "[2, 3]\nfloat16\n6\n12\nsim\ntrue\n6\ntensor(shape=[1, 3], dtype=float16, device=sim, 6 bytes, [0.8608, -1.1553, -0.3933])\n"
    );
}

#[test]
fn memory_functions_report_the_allocator() {
    let printed = run(
        "let a = empty(1000, \"uint8\");\nprint(memory_allocated()); print(memory_reserved());\na = ();\nprint(max_memory_allocated()); reset_peak_memory_stats(); print(max_memory_allocated());\nprint(memory_stats()[\"num_device_alloc\"]); reset_accumulated_memory_stats(); print(memory_stats()[\"num_device_alloc\"]);\nprint(memory_snapshot()[0].total_size); empty_cache(); print(memory_snapshot().len()); print(memory_reserved());\nset_per_process_memory_fraction(0.25); print(get_per_process_memory_fraction());\nlet info = mem_get_info(); print(info[1]); print(info[0] < info[1]);\nsynchronize(); manual_seed(1); print(memory_summary().contains(\"memory summary\"));",
    )
    .expect("runs");
    assert_eq!(
        printed,
        "1024\n2097152\n1024\n0\n1\n0\n2097152\n0\n0\n0.25\n150109880320\ntrue\ntrue\n"
    );
}

#[test]
fn mem_format_size_matches_pytorchs() {
    let mut values: Vec<u64> = vec![
        0,
        1,
        1023,
        1024,
        1025,
        1152,
        1536,
        1 << 20,
        (1 << 20) + 1,
        300 << 20,
        1 << 30,
        (1 << 30) + 1,
        150_109_880_320,
        3_006_477_107,
    ];
    let mut x: u64 = 12345;
    for _ in 0..300 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        values.push((x >> 20) % (1 << 42));
    }
    let source: String = std::iter::once("import \"mem\" as mem;\n".to_string())
        .chain(
            values
                .iter()
                .map(|v| format!("print(mem::format_size({v}));\n")),
        )
        .collect();
    let printed = run(&source).expect("runs");
    let expected: String = values
        .iter()
        .map(|&v| format!("{}\n", format_size(v)))
        .collect();
    assert_eq!(printed, expected);
}

#[test]
fn mem_status_fill_and_fragmentation() {
    let printed = run(
        "import \"mem\" as mem;\nlet a = empty(4096, \"uint8\");\nprint(mem::status());\nset_per_process_memory_fraction(0.001);\nlet f = mem::fill_until_oom(10485760);\nprint(f.count); print(f.error.contains(\"CUDA out of memory\"));\nf = (); a = (); empty_cache();\nlet b = [];\nfor i in 0..5 { b.push(empty(4194304, \"uint8\")); }\nb[1] = (); b[3] = ();\nlet g = fragmentation().all; print(g.cached_free); print(g.largest_free); print(g.free_blocks); print(g.external); print(g.releasable);",
    )
    .expect("runs");
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines[0].starts_with("allocated 4.00 KiB, reserved 2.00 MiB, cudaMemGetInfo used "),
        "{printed}"
    );
    assert_eq!(
        lines[1], "14",
        "150109880320 * 0.001 = 150 MB holds 14 chunks of 10 MiB"
    );
    assert_eq!(&lines[2..], ["true", "8388608", "4194304", "2", "0.5", "0"]);
}

/// One fragmentation API: the built-in `fragmentation()`. The `mem` module has none of its
/// own, with other field names, to disagree with it.
#[test]
fn fragmentation_is_one_builtin_not_a_second_stdlib_helper() {
    let error =
        run("import \"mem\" as mem;\nmem::fragmentation();").expect_err("no mem::fragmentation");
    assert!(error.contains("mem::fragmentation"), "{error}");
    for (name, _, source) in gpumem::script::stdlib::MODULES {
        assert!(
            !source.contains("fn fragmentation"),
            "stdlib/{name}.rhai defines its own fragmentation()"
        );
    }
}

#[test]
fn check_failures_show_both_sides() {
    let cases = [
        ("check::eq(1, 2, \"count\")", "check::eq failed for count: expected 2 (i64), got 1 (i64)"),
        ("check::eq(\"a\", 1)", "check::eq failed for value: expected 1 (i64), got a (string)"),
        ("check::in_range(5, 1, 3, \"x\")", "check::in_range failed for x: expected 1 ..= 3, got 5"),
        ("check::in_range(0.0 / 0.0, 0.9, 1.1)", "check::in_range failed for value: expected 0.9 ..= 1.1, got NaN"),
        ("check::in_range(\"a\", 1, 2)", "check::in_range failed for value: expected numbers, got a (string) in 1 (i64) ..= 2 (i64)"),
        ("check::in_range(1.5, 1, \"2\")", "expected numbers"),
        ("check::is_true(1 > 2, \"order\")", "check::is_true failed: order (got false)"),
        ("check::fails(|| 1, \"boom\")", "check::fails failed: expected an error containing \"boom\", but the call succeeded"),
        ("check::fails(|| randn(-1), \"dtype\")", "check::fails failed: expected an error containing \"dtype\", got \"randn: invalid shape"),
    ];
    for (call, expected) in cases {
        let error = run(&format!("import \"check\" as check;\n{call};")).expect_err(call);
        assert!(error.contains(expected), "{call}: {error}");
    }
    let printed = run("import \"check\" as check;\ncheck::eq(2, 2); check::in_range(2, 1, 3); check::in_range(1.5, 1, 2); check::in_range(2, 1.5, 2.5); check::is_true(true, \"t\");\nprint(check::fails(|| empty(4, \"x\"), \"unknown dtype\"));")
        .expect("passing checks");
    assert!(printed.starts_with("empty: unknown dtype 'x'"), "{printed}");
}

/// Every function a script can call has `:help` text: the names Rhai has registered (beyond
/// its own packages) are all documented in `script::docs::BINDINGS`, and the other way round.
#[test]
fn every_registered_function_has_help_text() {
    let (host, _) = common::sim_host(None, "");
    let documented: std::collections::BTreeSet<&str> =
        BINDINGS.iter().map(|binding| binding.name).collect();
    let mut registered = std::collections::BTreeSet::new();
    for signature in host.engine().gen_fn_signatures(false) {
        // "name(arg: Type, ...) -> Ret"; property getters appear as "get$name(...)".
        let name = signature.split('(').next().unwrap_or("").trim();
        let name = name.strip_prefix("get$").unwrap_or(name);
        // to_string/to_debug are what `print` and string interpolation call on a tensor.
        if ["to_string", "to_debug"].contains(&name) {
            continue;
        }
        registered.insert(name.to_string());
    }
    let undocumented: Vec<&String> = registered
        .iter()
        .filter(|name| !documented.contains(name.as_str()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "no :help text for {undocumented:?}"
    );
    let unregistered: Vec<&&str> = documented
        .iter()
        .filter(|name| !registered.contains(**name))
        .collect();
    assert!(
        unregistered.is_empty(),
        ":help documents unknown {unregistered:?}"
    );
}

/// A misspelt function gets the nearest name, built-in or from the stdlib; a shape given as
/// several integers is told that a shape is one array.
#[test]
fn unknown_functions_suggest_the_nearest_name() {
    let cases = [
        ("randm([2]);", "did you mean `randn`?"),
        ("fragmentatoin();", "did you mean `fragmentation`?"),
        (
            "let t = randn([2, 3]);\nt.reshpe([3, 2]);",
            "did you mean `reshape`?",
        ),
        (
            "import \"mem\" as mem;\nmem::format_sise(1);",
            "did you mean `mem::format_size`?",
        ),
        (
            "import \"mem\" as mem;\nmem::fragmentation();",
            "did you mean `fragmentation`?",
        ),
        ("prnt(1);", "did you mean `print`?"),
    ];
    for (source, expected) in cases {
        let error = run(source).expect_err(source);
        assert!(error.contains(expected), "{source}: {error}");
    }
    let error = run("xyzzy_plugh();").expect_err("unknown");
    assert!(!error.contains("did you mean"), "nothing is near: {error}");
    for (source, expected) in [
        (
            "randn(10, 10);",
            "a shape is one argument, an array: randn([10, 10])",
        ),
        (
            "zeros(2, 3, 4);",
            "a shape is one argument, an array: zeros([2, 3, 4])",
        ),
    ] {
        let error = run(source).expect_err(source);
        assert!(error.contains(expected), "{source}: {error}");
    }
}

/// A small tensor prints every value; a large one its first and last three around `...`.
#[test]
fn tensors_print_all_values_when_small_and_both_ends_when_large() {
    let printed = run("let t = randn([2, 3]);\nprint(t);\nprint(t.to_array());").expect("runs");
    let lines: Vec<&str> = printed.lines().collect();
    let shown = lines[0]
        .split(", [")
        .nth(1)
        .expect("values")
        .trim_end_matches("])");
    assert_eq!(shown.split(", ").count(), 6, "{printed}");
    assert!(!shown.contains("..."), "{printed}");
    let printed = run("let t = randn([100]);\nprint(t);\nlet a = t.to_array();\nprint(a[97]); print(a[98]); print(a[99]);")
        .expect("runs");
    let lines: Vec<&str> = printed.lines().collect();
    let shown: Vec<&str> = lines[0]
        .split(", [")
        .nth(1)
        .expect("values")
        .trim_end_matches("])")
        .split(", ")
        .collect();
    assert_eq!(shown.len(), 7, "{printed}");
    assert_eq!(shown[3], "...", "{printed}");
    for (index, line) in lines[1..].iter().enumerate() {
        let value: f64 = line.parse().expect("a number");
        assert_eq!(shown[4 + index], format!("{value:.4}"), "{printed}");
    }
}
