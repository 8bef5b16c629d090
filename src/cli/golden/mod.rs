//! Golden-output tests: the runner behind `gpumem test [PATH...]` and `cargo test`'s
//! `golden` suite.
//!
//! Every `X.rhai` under the given paths runs on a fresh allocator and device; what it prints
//! (plus the error it stops with, if any) must equal `X.out` beside it. Scripts run in
//! parallel, each worker thread building its own session and engine (Rhai values are not
//! `Send`), and results are reported in sorted path order as soon as they are known.
//!
//! Modules ([`gpumem::script::directives`] reads the `//! device:` / `//! alloc-conf:` headers):
//! [`discover`] (finding
//! scripts), [`check`] (running and comparing one script), [`diff`] (the unified diff),
//! [`report`] (status lines and the closing line).

pub mod check;
pub mod diff;
pub mod discover;
pub mod report;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

pub use check::{check_script, Options, ScriptResult};
pub use discover::discover;
pub use report::Summary;

use super::Exit;
use gpumem::session::{ConfigSource, ALLOC_CONF_VARIABLES};

/// Runs `scripts` on up to `jobs` threads and hands each result to `on_result` in the order of
/// `scripts`, each as soon as it and all before it are done. Returns the counts.
pub fn run_scripts(
    scripts: &[PathBuf],
    options: &Options,
    jobs: usize,
    mut on_result: impl FnMut(&ScriptResult),
) -> Summary {
    let next = AtomicUsize::new(0);
    let (sender, receiver) = mpsc::channel::<(usize, ScriptResult)>();
    let mut summary = Summary::default();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, scripts.len().max(1)) {
            let sender = sender.clone();
            let next = &next;
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(script) = scripts.get(index) else {
                    break;
                };
                if sender.send((index, check_script(script, options))).is_err() {
                    break;
                }
            });
        }
        // Only the workers hold senders now, so the loop ends when they all finish.
        drop(sender);
        let mut waiting = BTreeMap::new();
        let mut reported = 0;
        for (index, result) in receiver {
            waiting.insert(index, result);
            while let Some(result) = waiting.remove(&reported) {
                summary.add(&result);
                on_result(&result);
                reported += 1;
            }
        }
    });
    summary
}

/// `gpumem test [PATH...] [--bless]`: runs the scripts under `paths`, prints a status line per
/// script (with a diff or the reason under each failure) and the closing line, and returns the
/// process exit status: success when every script passed or was skipped, failure when one
/// failed, a usage error when the run could not start (bad path, unusable device or config).
pub fn command(paths: &[PathBuf], options: &Options) -> Exit {
    let color = crate::cli::paint::stdout_wants_color();
    if options.config == ConfigSource::Default {
        for name in ALLOC_CONF_VARIABLES {
            if std::env::var_os(name).is_some() {
                eprintln!(
                    "gpumem test: ignoring {name}; golden scripts take their config from \
                     --alloc-conf or a `//! alloc-conf:` directive"
                );
            }
        }
    }
    let (options, notice) = match options.resolve() {
        Ok(resolved) => resolved,
        Err(error) => {
            eprintln!("gpumem: {error}");
            return Exit::Usage;
        }
    };
    if let Some(notice) = notice {
        eprintln!("{notice}");
    }
    let scripts = match discover(paths) {
        Ok(scripts) => scripts,
        Err(error) => {
            eprintln!("gpumem: {error}");
            return Exit::Usage;
        }
    };
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut stdout = std::io::stdout().lock();
    let summary = run_scripts(&scripts, &options, jobs, |result| {
        // A closed pipe (e.g. `| head`) must not abort the run; the exit status still counts.
        let _ = stdout.write_all(report::render(result, color).as_bytes());
        let _ = stdout.flush();
    });
    let _ = writeln!(stdout, "{}", summary.closing_line());
    if summary.success() {
        Exit::Success
    } else {
        Exit::Failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::device::DeviceSpec;

    #[test]
    fn parallel_results_arrive_in_script_order() {
        let dir = std::env::temp_dir().join(format!("gpumem-golden-order-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut scripts = Vec::new();
        for i in 0..12 {
            // Uneven work so that workers finish out of order.
            let path = dir.join(format!("s{i:02}.rhai"));
            let work = if i % 3 == 0 { 2000 } else { 1 };
            std::fs::write(
                &path,
                format!("let n = 0; for k in 0..{work} {{ n += k; }}\nprint({i});\n"),
            )
            .expect("write");
            std::fs::write(dir.join(format!("s{i:02}.out")), format!("{i}\n")).expect("write");
            scripts.push(path);
        }
        std::fs::write(dir.join("s05.out"), "wrong\n").expect("write");
        let options = Options {
            device: Some(DeviceSpec::sim()),
            ..Options::default()
        };
        let mut seen = Vec::new();
        let summary = run_scripts(&scripts, &options, 4, |result| {
            seen.push(result.script.clone())
        });
        assert_eq!(seen, scripts);
        assert_eq!(summary.closing_line(), "11 passed, 1 failed");
        let _ = std::fs::remove_dir_all(dir);
    }
}
