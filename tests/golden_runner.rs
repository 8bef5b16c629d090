//! `cargo test --test golden`: every script under tests/golden/ checked by the same runner as
//! `gpumem test`, one libtest trial per script (named by its path under tests/golden/), so a
//! failure names the script and shows its diff. Scripts pinned to a missing device are reported
//! as ignored with the reason. `GPUMEM_BLESS=1 cargo test --test golden` writes the `.out` files.

use std::path::{Path, PathBuf};

use gpumem::golden::{self, report, Options, Verdict};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let scripts =
        golden::discover(std::slice::from_ref(&root)).expect("tests/golden holds scripts");
    let options = Options {
        bless: std::env::var_os("GPUMEM_BLESS").is_some_and(|v| v == "1"),
        ..Options::default()
    };
    let (options, _notice) = options.resolve().expect("the default session opens");
    let trials = scripts
        .into_iter()
        .map(|script| trial(&root, script, options.clone()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

fn trial(root: &Path, script: PathBuf, options: Options) -> Trial {
    let name = script
        .strip_prefix(root)
        .unwrap_or(&script)
        .with_extension("")
        .display()
        .to_string();
    Trial::ignorable_test(name, move || {
        let result = golden::check_script(&script, &options);
        match &result.verdict {
            Verdict::Passed | Verdict::Blessed { .. } => Ok(Completion::Completed),
            Verdict::Skipped { reason } => Ok(Completion::ignored_with(reason)),
            Verdict::Failed(failure) => Err(Failed::from(report::failure_details(
                &result, failure, false,
            ))),
        }
    })
}
