//! `:reset` makes the REPL a fresh process in every visible respect (issue 20 item 3), and
//! `mem::require_fresh` makes the counters read as in one: a probe script prints what a
//! session shows (the driver's view, every counter, random values, the current device, the
//! cap, the history), and its output after work and `:reset` must equal a new process's.

mod common;
use common::{gpumem, outcome, scratch, write};

/// What a session shows, in an order that creates no context before reading the driver's view.
const PROBE: &str = r#"
for device in 0..device_count() {
    let d = device_memory(device);
    print(`device ${device}: process ${d.process_bytes}, used ${d.used_bytes}`);
    let stats = memory_stats(device);
    let keys = stats.keys();
    keys.sort();
    for key in keys { print(`  ${key} = ${stats[key]}`); }
    print(`  fraction ${get_per_process_memory_fraction(device)}`);
}
print(`current device ${current_device()}, segments ${memory_snapshot().len()}`);
print(`history ${memory_history().len()}`);
print(`randn ${randn(4).to_array()}`);
print(`with_device(1): ${with_device(1, || randn(4)).to_array()}`);
"#;

/// Work that changes everything the probe reads: allocations on both devices, a caught OOM,
/// peaks, a cap, history, the generator, the current device, and both contexts.
const WORK: &str = "record_memory_history(true);\nlet a = randn(1000);\nset_device(1);\nlet b = empty(30000000, \"uint8\");\ntry { empty(1 << 40, \"uint8\"); } catch (e) { }\nset_per_process_memory_fraction(0.5);\nmanual_seed(3);\nlet c = randn(8);\nb = ();\n";

const DEVICES: &str = "sim:8GiB,8GiB";

/// The lines the probe printed (from its first line on).
fn probe_output(stdout: &str) -> String {
    let start = stdout.find("device 0: process").unwrap_or(stdout.len());
    stdout[start..].to_string()
}

fn fresh_probe(probe: &std::path::Path) -> String {
    let path = probe.display().to_string();
    let (stdout, stderr, code) = outcome(&gpumem(&["--device", DEVICES, "run", &path], ""));
    assert_eq!(code, 0, "{stderr}");
    probe_output(&stdout)
}

#[test]
fn reset_makes_a_fresh_process_in_every_visible_respect() {
    let probe = write(&scratch("fresh-reset"), "probe.rhai", PROBE);
    let expected = fresh_probe(&probe);
    assert!(expected.contains("device 0: process 0,"), "{expected}");
    let input = format!("{WORK}:reset\n:load {}\n", probe.display());
    let (stdout, stderr, code) = outcome(&gpumem(&["--device", DEVICES], &input));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("no CUDA context until a call needs one\nsim:0 (current): allocated 0 bytes, reserved 0 bytes, no CUDA context yet\nnot in use (no context, nothing reserved): sim:1\n"),
        "{stdout}"
    );
    assert_eq!(probe_output(&stdout), expected);
}

#[test]
fn require_fresh_makes_every_counter_read_as_in_a_fresh_process() {
    let dir = scratch("fresh-require");
    let probe = write(&dir, "probe.rhai", PROBE);
    let counters = |stdout: &str| -> String {
        // The context (driver's view) is what a script cannot undo, and a history recording the
        // user started stays on (tests/snapshot_walkthrough.rs records the walkthrough across
        // its require_fresh): compare the rest.
        probe_output(stdout)
            .lines()
            .filter(|line| !line.starts_with("device ") && !line.starts_with("history "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let expected = counters(&fresh_probe(&probe));
    let fresh = write(
        &dir,
        "fresh.rhai",
        &format!(
            "import \"mem\" as mem;\nmem::require_fresh(\"fresh.rhai\");\nset_device(0);\n{PROBE}"
        ),
    );
    // The work's cap stays (a setting, not a counter), so undo it as a script would.
    let input = format!(
        "{WORK}a = ();\nc = ();\nset_per_process_memory_fraction(1.0, 1);\n:load {}\n",
        fresh.display()
    );
    let (stdout, stderr, code) = outcome(&gpumem(&["--device", DEVICES], &input));
    assert_eq!(code, 0, "{stderr}");
    let actual = counters(&stdout);
    assert!(actual.contains("num_ooms = 0"), "{actual}");
    assert_eq!(actual, expected);
}

#[test]
fn the_walkthrough_says_when_the_context_already_exists() {
    let input = "let t = empty(5000000, \"uint8\");\nt = ();\n:load scripts/walkthrough.rhai\n:reset\n:load scripts/walkthrough.rhai\n";
    let (stdout, stderr, code) = outcome(&gpumem(&["--device", "sim"], input));
    assert_eq!(code, 0, "{stderr}");
    let (first, second) = stdout
        .split_once("reset: ")
        .expect("the output of :reset separates the two runs");
    assert!(
        first.contains(
            "0. the CUDA context already exists: an earlier call in this process created it"
        ),
        "{first}"
    );
    assert!(!first.contains("no context"), "{first}");
    assert!(
        first.contains(
            "the context existed before, so the device shows only the new segment in addition"
        ),
        "{first}"
    );
    assert!(
        !first.contains("creating the CUDA context is most of it"),
        "{first}"
    );
    assert!(
        second.contains("0. before the first CUDA call: no context"),
        "{second}"
    );
    assert!(
        second.contains(
            "yet the device shows far more in use: creating the CUDA context is most of it"
        ),
        "{second}"
    );
    assert!(
        second.contains("CUDA OOMs: 0"),
        "no OOM carried over: {second}"
    );
}
