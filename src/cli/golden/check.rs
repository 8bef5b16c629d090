//! Checking one golden script: run it on a fresh session, capture what it prints, compare that
//! with its `.out` file (or write the file when blessing).
//!
//! What a script "prints" is everything passed to `print`/`debug`, then — when the script stops
//! with an uncaught runtime error — the rendered error as its last lines. A script that is meant
//! to end in an error (an uncaught OOM, a rejected `//! alloc-conf:`) therefore pins that error
//! in its `.out` like any other output and passes when the error is exactly the expected one.
//! Blessing such an output takes `--bless-errors`: a plain `--bless` refuses it and names the
//! error, so a typo (`prnt(x)`) never becomes a passing test.
//! A script that does not compile, cannot be read or has a bad directive is never a valid test:
//! it always fails and is never blessed.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Mutex;

use gpumem::device::DeviceSpec;
use gpumem::script::{on_script_stack, Host, Limits, PrintSink, ScriptError};
use gpumem::session::{self, ConfigSource, SessionError, SessionOptions};

use super::discover::expected_path;
use gpumem::script::directives;

/// Scripts on a real GPU run one at a time: they share the device's memory, and a parallel
/// neighbour could push a script into an OOM it would not otherwise hit.
static GPU_LOCK: Mutex<()> = Mutex::new(());

/// How every script of a run is checked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The device for scripts without a `//! device:` directive. `None` lets the session pick
    /// (a GPU when found, else the simulator); [`Options::resolve`] fixes it once per run.
    pub device: Option<DeviceSpec>,
    /// The allocator config for scripts without a `//! alloc-conf:` directive: `--alloc-conf`
    /// or the defaults. The `PYTORCH_CUDA_ALLOC_CONF` variable is deliberately not read, so
    /// golden results do not depend on the caller's environment.
    pub config: ConfigSource,
    /// Write `.out` files instead of failing on a difference, except for output that ends in
    /// an error (see [`Options::bless_errors`]).
    pub bless: bool,
    /// Write `.out` files also for scripts that stop with an error (an expected OOM, a
    /// rejected config): `--bless-errors`. Implies [`Options::bless`].
    pub bless_errors: bool,
    /// The engine's sandbox limits (`--max-operations`, ...). Without `--max-operations` a
    /// script gets [`GOLDEN_MAX_OPERATIONS`]: a golden test must finish, so a runaway loop fails
    /// the script instead of hanging the suite (`--max-operations 0` lifts the limit).
    pub limits: Limits,
    /// `--allow-path` directories: where scripts may read and write besides their own
    /// directory and the current one.
    pub allow_paths: Vec<std::path::PathBuf>,
}

/// The operation budget of a golden script when none is given: 100 million operations, a
/// few seconds of work and far beyond what any test in tests/golden needs.
pub const GOLDEN_MAX_OPERATIONS: u64 = 100_000_000;

impl Options {
    /// Opens one session with these options to check them up front and pin the device the
    /// session picks, so every script of a run uses the same one. Returns the resolved options
    /// and the session's notice (the "no GPU, using the simulator" line), if any.
    pub fn resolve(&self) -> Result<(Options, Option<String>), SessionError> {
        let session = session::open(&self.session_options(None))?;
        let resolved = Options {
            device: Some(session.device),
            ..self.clone()
        };
        Ok((resolved, session.notice))
    }

    /// The limits scripts run under: [`Options::limits`] with an operation count that was not
    /// given replaced by [`GOLDEN_MAX_OPERATIONS`].
    pub fn engine_limits(&self) -> Limits {
        let mut limits = self.limits;
        limits.max_operations.get_or_insert(GOLDEN_MAX_OPERATIONS);
        limits
    }

    /// The session a script runs in: its directives win over the run's options. `name` (the
    /// script's file name) is how a rejected directive config is attributed.
    fn session_options(&self, pinned: Option<(&directives::Directives, &str)>) -> SessionOptions {
        let device = pinned
            .and_then(|(d, _)| d.device.clone())
            .or_else(|| self.device.clone());
        let devices = pinned.and_then(|(d, _)| d.devices);
        let config = match pinned {
            Some((
                directives::Directives {
                    alloc_conf: Some(text),
                    ..
                },
                name,
            )) => ConfigSource::Directive {
                script: PathBuf::from(name),
                text: text.clone(),
            },
            _ => self.config.clone(),
        };
        SessionOptions {
            device,
            config,
            devices,
        }
    }
}

/// How one script fared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its output equals its `.out` file.
    Passed,
    /// `--bless` wrote its `.out` file (`created`: the file did not exist before).
    Blessed {
        /// The file written.
        expected: PathBuf,
        /// Whether the file is new (else it was updated).
        created: bool,
    },
    /// Not run: its pinned device is unavailable.
    Skipped {
        /// Why, in the session's words.
        reason: String,
    },
    /// It did not produce the expected output, or could not run at all.
    Failed(Failure),
}

/// Why a script failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The output differs from the `.out` file.
    Mismatch {
        /// The `.out` file.
        expected_path: PathBuf,
        /// Its contents.
        expected: String,
        /// What the script printed (with its error, if it stopped with one).
        actual: String,
        /// The rendered error the script stopped with, if any.
        error: Option<String>,
    },
    /// There is no `.out` file yet.
    MissingExpected {
        /// The file that should exist.
        expected_path: PathBuf,
        /// What the script printed (with its error, if it stopped with one).
        actual: String,
    },
    /// `--bless` was asked to write output that ends in an error; it takes `--bless-errors`.
    ErrorNotBlessed {
        /// The `.out` file left as it was.
        expected_path: PathBuf,
        /// The rendered error the script stopped with.
        error: String,
    },
    /// The script could not be run to a comparable result: unreadable, a syntax error, a bad
    /// directive, an unwritable `.out` when blessing, or a crash inside gpumem.
    Unrunnable {
        /// What went wrong, ready to show.
        reason: String,
    },
}

/// One script and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptResult {
    /// The script's path as discovered.
    pub script: PathBuf,
    /// How it fared.
    pub verdict: Verdict,
}

/// What running a script produced, before comparison: its printed text and, when it did not
/// run to its end, how it stopped (an error, or `exit(code)` with a non-zero code).
enum Execution {
    Output { text: String, stop: Option<Stop> },
    Skipped(String),
    Unrunnable(String),
}

/// How a script stopped before its end, as its output shows it.
enum Stop {
    /// An uncaught error (or a config the allocator rejected): the rendered error.
    Error(String),
    /// `exit(code)` with a non-zero code: `name: exit(code)`.
    Exit(String),
}

impl Stop {
    fn text(&self) -> &str {
        match self {
            Stop::Error(text) | Stop::Exit(text) => text,
        }
    }
}

/// Runs `script` on a fresh session and compares (or blesses) its output.
pub fn check_script(script: &Path, options: &Options) -> ScriptResult {
    // On its own thread with a big stack, so deeply nested values cannot overflow it. A panic
    // is a gpumem bug; report it against the script instead of losing the run.
    let execution = on_script_stack(|| execute(script, options)).unwrap_or_else(|message| {
        Execution::Unrunnable(format!("gpumem crashed running this script: {message}"))
    });
    let verdict = match execution {
        Execution::Skipped(reason) => Verdict::Skipped { reason },
        Execution::Unrunnable(reason) => Verdict::Failed(Failure::Unrunnable { reason }),
        Execution::Output { text, stop } => {
            let mut actual = text;
            if let Some(stop) = &stop {
                actual.push_str(stop.text());
                actual.push('\n');
            }
            compare(script, actual, stop, options)
        }
    };
    ScriptResult {
        script: script.to_path_buf(),
        verdict,
    }
}

fn execute(script: &Path, options: &Options) -> Execution {
    let source = match crate::cli::read_text(script, "a script") {
        Ok(source) => source,
        Err(error) => return Execution::Unrunnable(error),
    };
    let pinned = match directives::parse(&source) {
        Ok(pinned) => pinned,
        Err(error) => return Execution::Unrunnable(error.to_string()),
    };
    // Errors name the script by file name only, so `.out` files do not depend on the folder
    // the suite is run from.
    let name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| script.display().to_string());
    let session_options = options.session_options(Some((&pinned, &name)));
    let _gpu = match &session_options.device {
        Some(DeviceSpec::Sim(_)) => None,
        _ => Some(
            GPU_LOCK
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        ),
    };
    let session = match session::open(&session_options) {
        Ok(session) => session,
        Err(error @ (SessionError::Cuda { .. } | SessionError::TooFewDevices { .. })) => {
            return Execution::Skipped(error.to_string())
        }
        // A config the allocator rejects is PyTorch behaviour worth pinning: it is output.
        Err(error) => {
            return Execution::Output {
                text: String::new(),
                stop: Some(Stop::Error(format!("{name}: error: {error}"))),
            }
        }
    };
    let buffer = Rc::new(RefCell::new(String::new()));
    let host = Host::with_limits(
        session.devices,
        PrintSink::Buffer(Rc::clone(&buffer)),
        options.engine_limits(),
    );
    match gpumem::script::sandbox::PathPolicy::for_script(Some(script), &options.allow_paths) {
        Ok(policy) => host.set_path_policy(policy),
        Err(error) => return Execution::Unrunnable(error.to_string()),
    }
    let result = host.run_source(&name, &source);
    drop(host);
    let text = buffer.take();
    match result {
        Ok(()) | Err(ScriptError::Exit(0)) => Execution::Output { text, stop: None },
        Err(ScriptError::Exit(code)) => Execution::Output {
            text,
            stop: Some(Stop::Exit(format!("{name}: exit({code})"))),
        },
        Err(ScriptError::Script {
            rendered,
            is_parse: false,
            ..
        }) => Execution::Output {
            text,
            stop: Some(Stop::Error(rendered)),
        },
        Err(error) => Execution::Unrunnable(error.to_string()),
    }
}

fn compare(script: &Path, actual: String, stop: Option<Stop>, options: &Options) -> Verdict {
    let expected_path = expected_path(script);
    let expected = match std::fs::read_to_string(&expected_path) {
        Ok(text) => Some(text.replace("\r\n", "\n")),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            return Verdict::Failed(Failure::Unrunnable {
                reason: format!("cannot read {}: {error}", expected_path.display()),
            })
        }
    };
    if expected.as_deref() == Some(actual.as_str()) {
        return Verdict::Passed;
    }
    if let (Some(Stop::Error(error)), true, false) = (&stop, options.bless, options.bless_errors) {
        return Verdict::Failed(Failure::ErrorNotBlessed {
            expected_path,
            error: error.clone(),
        });
    }
    if options.bless || options.bless_errors {
        return match std::fs::write(&expected_path, &actual) {
            Ok(()) => Verdict::Blessed {
                expected: expected_path,
                created: expected.is_none(),
            },
            Err(error) => Verdict::Failed(Failure::Unrunnable {
                reason: format!("cannot write {}: {error}", expected_path.display()),
            }),
        };
    }
    Verdict::Failed(match expected {
        Some(expected) => Failure::Mismatch {
            expected_path,
            expected,
            actual,
            error: stop.map(|stop| stop.text().to_string()),
        },
        None => Failure::MissingExpected {
            expected_path,
            actual,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch folder for one test, removed when the test is done with it.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("gpumem-check-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        Scratch(dir)
    }

    fn sim() -> Options {
        Options {
            device: Some(DeviceSpec::sim()),
            ..Options::default()
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn a_runaway_script_stops_at_the_operation_limit() {
        let dir = scratch("runaway");
        let script = write(&dir, "spin.rhai", "print(1);\nloop {}\n");
        let options = Options {
            limits: Limits {
                max_operations: Some(10_000),
                ..Limits::DEFAULT
            },
            ..sim()
        };
        match check_script(&script, &options).verdict {
            Verdict::Failed(Failure::MissingExpected { actual, .. }) => {
                assert!(actual.starts_with("1\nspin.rhai:2:"), "{actual}");
                assert!(actual.contains("--max-operations"), "{actual}");
            }
            other => panic!("unexpected {other:?}"),
        }
        // Without a limit from the caller, golden scripts still get a finite budget.
        assert_eq!(
            Options::default().engine_limits().max_operations,
            Some(GOLDEN_MAX_OPERATIONS)
        );
        assert_eq!(options.engine_limits().max_operations, Some(10_000));
    }

    #[test]
    fn deeply_nested_values_do_not_overflow_the_worker_stack() {
        let dir = scratch("deep");
        let script = write(
            &dir,
            "deep.rhai",
            "let b = []; for i in 0..3000 { b = [b]; }\nlet s = `${b}`;\nprint(s.len());\n",
        );
        write(&dir, "deep.out", "6002\n");
        // Run from a thread with a default-sized stack, as libtest and `gpumem test` workers do.
        let verdict = std::thread::spawn(move || check_script(&script, &sim()).verdict)
            .join()
            .expect("no crash");
        assert_eq!(verdict, Verdict::Passed);
    }

    #[test]
    fn matching_output_passes() {
        let dir = scratch("pass");
        let script = write(
            &dir,
            "a.rhai",
            "let t = empty(100);\nprint(memory_allocated());\n",
        );
        write(&dir, "a.out", "512\n");
        assert_eq!(check_script(&script, &sim()).verdict, Verdict::Passed);
    }

    #[test]
    fn differing_output_is_a_mismatch_with_both_texts() {
        let dir = scratch("mismatch");
        let script = write(&dir, "a.rhai", "print(1);\nprint(2);\n");
        write(&dir, "a.out", "1\n3\n");
        match check_script(&script, &sim()).verdict {
            Verdict::Failed(Failure::Mismatch {
                expected,
                actual,
                error,
                ..
            }) => {
                assert_eq!(expected, "1\n3\n");
                assert_eq!(actual, "1\n2\n");
                assert_eq!(error, None);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn missing_out_fails_and_bless_creates_then_updates_it() {
        let dir = scratch("bless");
        let script = write(&dir, "a.rhai", "print(\"hi\");\n");
        assert!(matches!(
            check_script(&script, &sim()).verdict,
            Verdict::Failed(Failure::MissingExpected { .. })
        ));
        let bless = Options {
            bless: true,
            ..sim()
        };
        assert_eq!(
            check_script(&script, &bless).verdict,
            Verdict::Blessed {
                expected: dir.join("a.out"),
                created: true
            }
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("a.out")).expect("read"),
            "hi\n"
        );
        assert_eq!(check_script(&script, &bless).verdict, Verdict::Passed);
        write(&dir, "a.out", "old\n");
        assert_eq!(
            check_script(&script, &bless).verdict,
            Verdict::Blessed {
                expected: dir.join("a.out"),
                created: false
            }
        );
    }

    #[test]
    fn runtime_error_is_part_of_the_output() {
        let dir = scratch("error");
        let script = write(&dir, "boom.rhai", "print(1);\nlet t = empty(-1);\n");
        match check_script(&script, &sim()).verdict {
            Verdict::Failed(Failure::MissingExpected { actual, .. }) => {
                // The exact wording belongs to the tensor module; check the structure.
                assert!(
                    actual.starts_with("1\nboom.rhai:2:9: error: empty: "),
                    "{actual}"
                );
                write(&dir, "boom.out", &actual);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(check_script(&script, &sim()).verdict, Verdict::Passed);
    }

    #[test]
    fn output_ending_in_an_error_is_blessed_only_with_bless_errors() {
        let dir = scratch("bless-errors");
        let script = write(&dir, "typo.rhai", "print(1);\nprnt(2);\n");
        let bless = Options {
            bless: true,
            ..sim()
        };
        match check_script(&script, &bless).verdict {
            Verdict::Failed(Failure::ErrorNotBlessed { error, .. }) => {
                assert!(error.contains("Function not found: prnt"), "{error}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(!dir.join("typo.out").exists());
        let on_purpose = Options {
            bless_errors: true,
            ..sim()
        };
        assert!(matches!(
            check_script(&script, &on_purpose).verdict,
            Verdict::Blessed { created: true, .. }
        ));
        // Once pinned, the error is the expected output and a plain --bless passes it.
        assert_eq!(check_script(&script, &bless).verdict, Verdict::Passed);
    }

    #[test]
    fn syntax_errors_are_never_blessed() {
        let dir = scratch("syntax");
        let script = write(&dir, "bad.rhai", "let x = ;\n");
        let bless = Options {
            bless: true,
            ..sim()
        };
        match check_script(&script, &bless).verdict {
            Verdict::Failed(Failure::Unrunnable { reason }) => {
                assert!(reason.contains("syntax error"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(!dir.join("bad.out").exists());
    }

    #[test]
    fn cuda_directive_is_skipped_without_a_gpu() {
        let dir = scratch("skip");
        let script = write(&dir, "gpu.rhai", "//! device: cuda\nprint(1);\n");
        match check_script(&script, &sim()).verdict {
            Verdict::Skipped { reason } => assert!(reason.contains("cuda:0"), "{reason}"),
            // On a machine with a GPU the script runs; it has no .out here.
            Verdict::Failed(Failure::MissingExpected { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn alloc_conf_directive_replaces_the_flag() {
        let dir = scratch("conf");
        let script = write(
            &dir,
            "conf.rhai",
            "//! alloc-conf: max_split_size_mb:64\nprint(memory_stats()[\"max_split_size\"]);\n",
        );
        write(&dir, "conf.out", &format!("{}\n", 64 << 20));
        let options = Options {
            config: ConfigSource::Flag("max_split_size_mb:128".into()),
            ..sim()
        };
        assert_eq!(check_script(&script, &options).verdict, Verdict::Passed);
    }

    #[test]
    fn rejected_config_is_expectable_output_but_bad_directive_is_not() {
        let dir = scratch("badconf");
        let script = write(&dir, "c.rhai", "//! alloc-conf: nonsense:1\nprint(1);\n");
        match check_script(&script, &sim()).verdict {
            Verdict::Failed(Failure::MissingExpected { actual, .. }) => {
                assert!(actual.starts_with("c.rhai: error: invalid allocator config 'nonsense:1'"));
                assert!(actual.contains("Unrecognized key 'nonsense'"), "{actual}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let script = write(&dir, "d.rhai", "//! colour: red\nprint(1);\n");
        match check_script(&script, &sim()).verdict {
            Verdict::Failed(Failure::Unrunnable { reason }) => {
                assert!(reason.contains("unknown key 'colour'"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn each_script_gets_a_fresh_allocator() {
        let dir = scratch("fresh");
        let script = write(
            &dir,
            "a.rhai",
            "let t = empty(1000);\nprint(memory_stats()[\"num_device_alloc\"]);\n",
        );
        write(&dir, "a.out", "1\n");
        for _ in 0..2 {
            assert_eq!(check_script(&script, &sim()).verdict, Verdict::Passed);
        }
    }

    #[test]
    fn resolve_pins_the_default_device() {
        let (resolved, _notice) = Options::default().resolve().expect("opens");
        assert!(resolved.device.is_some());
        let bad = Options {
            config: ConfigSource::Flag("max_split_size_mb:1".into()),
            ..sim()
        };
        assert!(bad.resolve().is_err());
    }
}
