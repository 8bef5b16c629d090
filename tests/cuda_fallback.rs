//! Without a usable GPU (CI, this machine): `gpumem run` falls back to the simulated H200 with
//! one explanatory line on stderr, and `--device cuda` fails with a clear message and exit
//! code 2 — never a panic. On a machine where CUDA works these checks do not apply and return
//! early (tests/gpu/run.sh covers that machine).

use std::path::PathBuf;
use std::process::Output;

mod common;

fn gpumem(args: &[&str]) -> Output {
    common::gpumem(args, "")
}

fn script(name: &str, source: &str) -> PathBuf {
    common::write(
        &common::scratch("fallback"),
        &format!("{name}.rhai"),
        source,
    )
}

fn cuda_works() -> bool {
    let probe = script("probe", "let x = 1;");
    let ok = gpumem(&[
        "--device",
        "cuda",
        "run",
        probe.to_str().expect("utf-8 path"),
    ])
    .status
    .success();
    let _ = std::fs::remove_file(probe);
    ok
}

#[test]
fn run_falls_back_to_sim_with_one_line() {
    if cuda_works() {
        return;
    }
    let path = script("fallback", "print(randn([2, 3]).device);");
    let output = gpumem(&["run", path.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "sim\n");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(
        stderr.contains("no usable CUDA device") && stderr.contains("simulated H200"),
        "stderr: {stderr}"
    );
}

#[test]
fn explicit_cuda_without_gpu_is_a_usage_error() {
    if cuda_works() {
        return;
    }
    let path = script("explicit", "print(1);");
    for device in ["cuda", "cuda:3"] {
        let output = gpumem(&[
            "--device",
            device,
            "run",
            path.to_str().expect("utf-8 path"),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
        assert!(
            stderr.starts_with("gpumem: cannot use cuda:"),
            "stderr: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "stderr: {stderr}");
        assert!(output.stdout.is_empty());
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn sim_values_and_device_memory_from_scripts() {
    let path = script(
        "values",
        r#"
manual_seed(3);
let t = randn([4]);
let a = t.to_array();
print(a.len());
print(t.clone().to_array() == a);
print(full([3], 2.0).sum());
print(ones([5]).mean());
print(zeros([5]).std());
let dm = device_memory();
print(dm.method);
print(dm.keys().len());
print(dm.process_bytes - dm.allocator_reserved_bytes == dm.context_bytes);
// As on the H200, a few MiB of the context count as used on the device but as nobody's.
print((dm.used_bytes - dm.driver_reserved_bytes - dm.process_bytes - dm.other_processes_bytes) / 1048576);
try { (t * 2).sum(); } catch (e) { print(e); }
"#,
    );
    let output = gpumem(&["--device", "sim", "run", path.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        "4\ntrue\n6.0\n1.0\n0.0\nsim-model\n11\ntrue\n7\n\
         sum: values of computed tensors are only available on a CUDA device\n"
    );
}
