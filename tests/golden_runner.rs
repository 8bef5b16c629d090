//! `cargo test --test golden`: every script under tests/golden/ checked by `gpumem test`, one
//! libtest trial per script (named by its path under tests/golden/), so a failure names the
//! script and shows its diff. Scripts pinned to a missing device are reported as ignored with
//! the reason. `GPUMEM_BLESS=1 cargo test --test golden` writes the `.out` files (`gpumem test
//! --bless`), `GPUMEM_BLESS=errors` also those of scripts that stop with an error
//! (`--bless-errors`).
//!
//! The runner is the binary's (it is not part of the library's API), so each trial runs the
//! `gpumem` executable on its one script, exactly as a user would.

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

mod common;

fn main() {
    let args = Arguments::from_args();
    let root = common::tests_path("golden");
    let mut scripts = Vec::new();
    collect(&root, &mut scripts);
    scripts.sort();
    assert!(!scripts.is_empty(), "tests/golden holds scripts");
    let bless = match std::env::var("GPUMEM_BLESS").as_deref() {
        Ok("1") => Some("--bless"),
        Ok("errors") => Some("--bless-errors"),
        _ => None,
    };
    let trials = scripts
        .into_iter()
        .map(|script| trial(&root, script, bless))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// Every `.rhai` file under `dir`.
fn collect(dir: &Path, scripts: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("tests/golden is readable");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect(&path, scripts);
        } else if path.extension().is_some_and(|ext| ext == "rhai") {
            scripts.push(path);
        }
    }
}

fn trial(root: &Path, script: PathBuf, bless: Option<&'static str>) -> Trial {
    let name = script
        .strip_prefix(root)
        .unwrap_or(&script)
        .with_extension("")
        .display()
        .to_string();
    Trial::ignorable_test(name, move || {
        let path = script.display().to_string();
        let mut args = vec!["test", path.as_str()];
        args.extend(bless);
        let (stdout, stderr, code) = common::outcome(&common::gpumem(&args, ""));
        let status = stdout.lines().next().unwrap_or("");
        match (code, status.split_whitespace().next()) {
            (0, Some("SKIP")) => Ok(Completion::ignored_with(
                status.split_once(": ").map_or(status, |(_, why)| why),
            )),
            (0, Some("PASS" | "BLESS")) => Ok(Completion::Completed),
            _ => Err(Failed::from(format!(
                "gpumem test exited {code}\n{stdout}{stderr}"
            ))),
        }
    })
}
