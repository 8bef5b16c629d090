//! Every class of bad input gpumem refuses, with its message and exit status: one table drives
//! both this test (each row run against the binary on the simulated device) and README's
//! "What gpumem refuses" section, which must equal [`readme_table`]'s rendering of it
//! (`GPUMEM_BLESS_README=1 cargo test --test refusals` rewrites that section).

mod common;
use common::{gpumem_with, outcome, scratch, write};

/// How a row's input reaches gpumem.
#[derive(Clone, Copy)]
enum Via {
    /// Command-line arguments after `--device sim` (none when the first is `--device`).
    Args(&'static [&'static str]),
    /// An allocator config given with `--alloc-conf`.
    Conf(&'static str),
    /// An allocator config in `PYTORCH_CUDA_ALLOC_CONF`.
    Env(&'static str),
    /// A script file run with `gpumem run` (with extra flags before it).
    Run(&'static [&'static str], &'static str),
    /// Text piped into the REPL.
    Repl(&'static str),
}

/// One refusal: what is given, a part of the message it must get, the exit status.
struct Row {
    via: Via,
    message: &'static str,
    exit: i32,
}

const fn row(via: Via, message: &'static str, exit: i32) -> Row {
    Row { via, message, exit }
}

use Via::{Args, Conf, Env, Repl, Run};

/// The refusals, grouped: command line, allocator config, script errors, limits, directives,
/// the REPL.
const ROWS: &[Row] = &[
    row(Args(&["--device", "gpu"]), "unknown device 'gpu': expected 'sim', 'sim:SIZE', 'cuda' or 'cuda:N'", 2),
    row(Args(&["--device", "sim:100TiB"]), "simulated device size '100TiB' is too large: at most 64 TiB", 2),
    row(Args(&["--device", "cuda:x"]), "invalid CUDA device index 'x': expected a non-negative integer", 2),
    row(Args(&["--max-operations", "lots"]), "invalid value 'lots' for '--max-operations <N>'", 2),
    row(Args(&["--no-such-flag"]), "unexpected argument '--no-such-flag'", 2),
    row(Args(&["run", "/nonexistent/x.rhai"]), "cannot read /nonexistent/x.rhai", 2),
    row(Args(&["test", "/nonexistent"]), "cannot read /nonexistent", 2),
    row(Args(&["bench", "randn"]), "bench randn measures a CUDA device; use --device cuda[:N]", 2),
    row(Args(&["bench", "soak", "--seconds", "nan"]), "--seconds must be a non-negative number, got NaN", 2),
    row(Conf("bogus:1"), "Unrecognized key 'bogus' in CUDA allocator config.", 2),
    row(Conf(",max_split_size_mb:64"), "Unrecognized key ',' in CUDA allocator config.", 2),
    row(Conf("throw_on_cudamalloc_oom:True"), "Unrecognized key 'throw_on_cudamalloc_oom'", 2),
    row(Conf("max_split_size_mb:10"), "CachingAllocator option max_split_size_mb too small, must be >= 20", 2),
    row(Conf("max_non_split_rounding_mb:x"), "expected a non-negative integer, found 'x' (PyTorch: stoull)", 2),
    row(Conf("max_split_size_mb"), "max_split_size_mb needs ':' and a value but the config ends", 2),
    row(Conf("roundup_power2_divisions:[256:1"), "roundup_power2_divisions needs ',' or ']' but the config ends", 2),
    row(Conf("garbage_collection_threshold:1.5"), "garbage_collect_threshold is invalid, set it in (0.0, 1.0)", 2),
    row(Conf("roundup_power2_divisions:3"), "For roundups, the divisions has to be power of 2", 2),
    row(Conf("roundup_power2_divisions:[300:2]"), "For roundups, the intervals have to be power of 2", 2),
    row(Conf("roundup_power2_divisions:[256:3]"), "the divisions has to be power of 2 or 0 to disable roundup", 2),
    row(Conf("release_lock_on_cudamalloc:yes"), "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'", 2),
    row(Conf("backend:cudaMallocAsync"), "backend:cudaMallocAsync is not yet supported by gpumem", 2),
    row(Conf("backend:fast"), "Unknown allocator backend, options are native and cudaMallocAsync", 2),
    row(Conf("per_process_memory_fraction:2"), "per_process_memory_fraction is invalid, set it in [0.0, 1.0]", 2),
    row(Conf("pinned_num_register_threads:3"), "Number of register threads has to be power of 2, got 3", 2),
    row(Conf("pinned_num_register_threads:256"), "Number of register threads should be less than or equal to 128, got 256", 2),
    row(Conf("pinned_reserve_segment_size_mb:0"), "Pinned reserve segment size has to be greater than 0", 2),
    row(Env("bogus:1"), "invalid allocator config 'bogus:1' (from the environment variable PYTORCH_CUDA_ALLOC_CONF)", 2),
    row(Run(&[], "let x = ;"), "syntax error: Unexpected ';'", 1),
    row(Run(&[], "randn([2, -3])"), "randn: invalid shape: dimension 1 is -3; sizes must be non-negative", 1),
    row(Run(&[], "zeros([2, 1.5])"), "zeros: shape element 1 must be an integer, got f64", 1),
    row(Run(&[], "empty([1 << 62, 1 << 62])"), "empty: invalid shape: the number of elements of", 1),
    row(Run(&[], "empty(4, \"float8\")"), "empty: unknown dtype 'float8'", 1),
    row(Run(&[], "full(4, \"x\")"), "full: fill value must be a number, got string", 1),
    row(Run(&[], "randn(4, \"int64\")"), "randn: randn is only defined for floating dtypes", 1),
    row(Run(&[], "randn([2, 3]).reshape([7])"), "reshape: invalid shape: cannot reshape a tensor of 6 elements", 1),
    row(Run(&[], "randn([2, 3]).slice(0, 1, 5)"), "slice: out of range: slice 1..5 of dimension 0 with size 2", 1),
    row(Run(&[], "empty(4).sum()"), "sum: the tensor was created with empty() and holds no defined values", 1),
    row(Run(&[], "(randn(4) + 1).sum()"), "values of computed tensors are only available on a CUDA device", 1),
    row(Run(&[], "set_per_process_memory_fraction(1)"), "set_per_process_memory_fraction: fraction must be a float, got i64 (1)", 1),
    row(Run(&[], "set_per_process_memory_fraction(1.5)"), "set_per_process_memory_fraction: fraction must be between 0 and 1, got 1.5", 1),
    row(Run(&[], "manual_seed(-1)"), "manual_seed: seed must be non-negative, got -1", 1),
    row(Run(&[], "empty(200 * 1073741824, \"uint8\")"), "CUDA out of memory. Tried to allocate 200.00 GiB", 1),
    row(Run(&[], "import \"os\" as os;"), "import: no module named 'os'; gpumem's modules are: mem, check", 1),
    row(Run(&[], "exit(300)"), "exit: code must be an integer from 0 to 255, got i64 (300)", 1),
    row(Run(&["--max-call-depth", "0"], "fn f(n) { f(n + 1) } f(0)"), "Stack overflow: function calls (or expressions inside them) are nested so deeply", 1),
    row(Run(&["--max-call-depth", "5"], "fn f(n) { f(n + 1) } f(0)"), "Stack overflow: function calls nested too deeply (raise the limit with --max-call-depth)", 1),
    row(Run(&["--max-operations", "1000"], "loop {}"), "Too many operations: the script ran past its operation budget (raise it with --max-operations)", 1),
    row(Run(&["--max-expr-depth", "8"], "1+1+1+1+1+1+1+1+1+1"), "nests deeper than --max-expr-depth allows", 1),
    row(Run(&["--max-array-size", "3"], "let a = [1, 2, 3, 4];"), "Size of array", 1),
    row(Run(&["--max-string-size", "4"], "let s = \"hello\";"), "Length of string", 1),
    row(Run(&[], "//! devise: sim"), "directive on line 1: unknown key 'devise'; expected one of device, alloc-conf", 1),
    row(Run(&[], "print(1);\n//! device: sim"), "directive on line 2: '//! device:' comes after code", 1),
    row(Run(&[], "//! device: sim\n//! device: sim"), "directive on line 2: 'device' is given twice", 1),
    row(Run(&[], "//! device: gpu"), "directive on line 1: unknown device 'gpu'", 1),
    row(Run(&[], "//! alloc-conf: bogus:1"), "(from the `//! alloc-conf:` directive of", 2),
    row(Repl(":bogus"), "unknown command ':bogus'; :help lists the commands", 1),
    row(Repl(":load"), ":load: which file? usage: :load FILE", 1),
    row(Repl(":load /nonexistent.rhai"), ":load: cannot read /nonexistent.rhai", 1),
    row(Repl(":help nosuch"), ":help: no binding, command or module function named 'nosuch'", 1),
    row(Repl("let y = 1 2;"), "input1:1:11: error: syntax error: Expecting ';' to terminate this statement", 1),
    row(Repl("fn g() {"), "the input ended inside an unfinished block", 1),
    row(Repl("let t = empty(16, \"uint8\");\n:load scripts/walkthrough.rhai"), "needs a session without live tensors", 1),
    // Devices (issue 19).
    row(Args(&["--device", "sim:80GiB,12 parsecs"]), "device 1 of 'sim:80GiB,12 parsecs' (entry 2): invalid size '12 parsecs'", 2),
    row(Args(&["--device", "sim:80GiB,"]), "device 1 of 'sim:80GiB,' (entry 2): invalid size ''", 2),
    row(Args(&["--device", "cuda:0,1"]), "invalid CUDA device index '0,1': expected a non-negative integer, as in 'cuda:0' ('cuda' alone makes every visible GPU available", 2),
    row(Run(&[], "set_device(5)"), "set_device: device 5 does not exist: this session has 1 device (index 0)", 1),
    row(Run(&[], "randn(4).to(\"cuda:1\")"), "to: no device named 'cuda:1': this session's devices are sim", 1),
    row(Run(&[], "memory_map(60)"), "memory_map: device 60 does not exist: this session has 1 device (index 0); the width is the second argument: memory_map(current_device(), 60)", 1),
    row(Run(&[], "//! devices: 0"), "directive on line 1: 'devices' must be a number of devices from 1 to 64, got '0'", 1),
    row(Repl(":load tests/golden/devices/counters.rhai"), "pins `//! devices: 2` but this session has 1 device", 1),
    row(Run(&[], "dump_snapshot(\"/etc/gpumem.pickle\");"), "dump_snapshot: '/etc/gpumem.pickle' is outside the directories a script may use", 1),
    row(Run(&[], "replay(\"../../../etc/passwd\");"), "replay: '../../../etc/passwd' is outside the directories a script may use", 1),
];

/// The input as README shows it.
fn shown(via: Via) -> String {
    let code = |text: &str| {
        let text = text.replace('\n', "⏎");
        if text.contains('`') {
            format!("`` {text} ``")
        } else {
            format!("`{text}`")
        }
    };
    match via {
        Args(args) if args.first() == Some(&"--device") => {
            code(&format!("gpumem {}", args.join(" ")))
        }
        Args(args) => code(&format!("gpumem --device sim {}", args.join(" "))),
        Conf(conf) => code(&format!("--alloc-conf {conf}")),
        Env(conf) => code(&format!("PYTORCH_CUDA_ALLOC_CONF={conf}")),
        Run(&[], source) => code(source),
        Run(flags, source) => format!("{} with {}", code(source), code(&flags.join(" "))),
        Repl(text) => code(text),
    }
}

/// Where the row is run.
fn how(via: Via) -> &'static str {
    match via {
        Args(_) => "command line",
        Conf(_) | Env(_) => "config",
        Run(..) => "`gpumem run`",
        Repl(_) => "REPL (piped)",
    }
}

/// README's table, rendered from [`ROWS`].
fn readme_table() -> String {
    let mut table = String::from(
        "| # | input | message (excerpt) | exit | given as |\n|---|---|---|---|---|\n",
    );
    for (index, row) in ROWS.iter().enumerate() {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            index + 1,
            shown(row.via).replace('|', "\\|"),
            row.message.replace('|', "\\|").replace('`', "'"),
            row.exit,
            how(row.via)
        ));
    }
    table
}

const START: &str = "<!-- refusals table: generated by tests/refusals.rs -->\n";
const END: &str = "<!-- end of refusals table -->";

/// Runs one row: (stdout, stderr, exit status).
fn run_row(via: Via, dir: &std::path::Path, index: usize) -> (String, String, i32) {
    let repo = env!("CARGO_MANIFEST_DIR");
    let with = |env: &[(&str, &str)], args: Vec<String>, stdin: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        outcome(&gpumem_with(
            Some(std::path::Path::new(repo)),
            env,
            &args,
            stdin,
        ))
    };
    let sim = || vec!["--device".to_string(), "sim".to_string()];
    match via {
        Args(args) => {
            let mut all = if args.first() == Some(&"--device") {
                Vec::new()
            } else {
                sim()
            };
            all.extend(args.iter().map(|a| a.to_string()));
            with(&[], all, "")
        }
        Conf(conf) => {
            let mut all = sim();
            all.extend(["--alloc-conf".into(), conf.into()]);
            with(&[], all, "")
        }
        Env(conf) => with(&[("PYTORCH_CUDA_ALLOC_CONF", conf)], sim(), ""),
        Run(flags, source) => {
            let script = write(dir, &format!("row{index}.rhai"), &format!("{source}\n"));
            let mut all = vec!["run".to_string()];
            all.extend(sim());
            all.extend(flags.iter().map(|f| f.to_string()));
            all.push(script.display().to_string());
            with(&[], all, "")
        }
        Repl(text) => with(&[], sim(), &format!("{text}\n")),
    }
}

#[test]
fn every_refusal_gets_its_message_and_exit_status() {
    assert!(ROWS.len() >= 40);
    let dir = scratch("refusals");
    let mut failures = Vec::new();
    for (index, row) in ROWS.iter().enumerate() {
        let (stdout, stderr, code) = run_row(row.via, &dir, index + 1);
        let clean = !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE");
        if code != row.exit || !stderr.contains(row.message) || !clean {
            failures.push(format!(
                "row {} ({}): expected exit {} and '{}', got exit {code}\nstdout: {stdout}\nstderr: {stderr}",
                index + 1,
                shown(row.via),
                row.exit,
                row.message
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn readme_lists_exactly_these_refusals() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let table = readme_table();
    let (Some(start), Some(end)) = (readme.find(START), readme.find(END)) else {
        panic!("README.md lacks the markers {START:?} and {END:?}; the table is:\n{table}");
    };
    let current = &readme[start + START.len()..end];
    if current != table {
        if std::env::var_os("GPUMEM_BLESS_README").is_some() {
            let updated = format!("{}{START}{table}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).expect("write README.md");
        } else {
            panic!("README's refusals table differs from tests/refusals.rs; rerun with GPUMEM_BLESS_README=1 to update it. Expected:\n{table}");
        }
    }
}
