//! The what-if harness's own tests (tests/gpu/whatif/test_whatif.py): the plan, the runner, the
//! request-sequence and timing comparisons, and compare.py's verdicts with this build's
//! `gpumem` (the tests that need PyTorch skip themselves without it). The harness runs on the
//! H200; its comparison logic is checked here, in CI, with Python's unittest.

use std::process::Command;

#[test]
fn the_whatif_harness_passes_its_own_tests() {
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gpu/whatif");
    let output = match Command::new("python3")
        .args(["-m", "unittest", "test_whatif"])
        .current_dir(folder)
        .env("GPUMEM", env!("CARGO_BIN_EXE_gpumem"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            eprintln!("skipped: python3 cannot be run here ({error})");
            return;
        }
    };
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "test_whatif.py failed:\n{report}");
    assert!(report.contains("OK"), "{report}");
}
