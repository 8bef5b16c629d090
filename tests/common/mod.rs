//! Helpers shared by the integration tests: a simulated session in-process, the `gpumem`
//! binary with a clean environment, scratch folders and fixture paths. Each test file uses a
//! different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpumem::alloc::{AllocConf, CachingAllocator};
use gpumem::device::sim::SimDevice;
use gpumem::script::{Host, PrintSink};
use gpumem::tensor::Runtime;

/// A simulated device of `total` bytes, or the H200 when `None`.
pub fn sim_device(total: Option<u64>) -> SimDevice {
    total.map_or_else(SimDevice::h200, SimDevice::new)
}

/// An allocator on a simulated device with the config `conf` (PyTorch's syntax).
pub fn sim_allocator(total: Option<u64>, conf: &str) -> CachingAllocator {
    let conf = AllocConf::parse(conf).expect("valid allocator config");
    CachingAllocator::new(Box::new(sim_device(total)), conf).expect("allocator")
}

/// A runtime (allocator + values) on a simulated device.
pub fn sim_runtime(total: Option<u64>, conf: &str) -> Rc<Runtime> {
    let conf = AllocConf::parse(conf).expect("valid allocator config");
    Runtime::sim(sim_device(total), conf).expect("runtime")
}

/// A script host on a simulated device whose prints go to the returned buffer.
pub fn sim_host(total: Option<u64>, conf: &str) -> (Host, Rc<RefCell<String>>) {
    let output = Rc::new(RefCell::new(String::new()));
    let host = Host::new(
        sim_runtime(total, conf),
        PrintSink::Buffer(Rc::clone(&output)),
    );
    (host, output)
}

/// `gpumem` with `args`, `stdin` piped in, colours off and no allocator config from the
/// environment.
pub fn gpumem(args: &[&str], stdin: &str) -> Output {
    gpumem_in(None, args, stdin)
}

/// [`gpumem`] run in the folder `dir` when given.
pub fn gpumem_in(dir: Option<&Path>, args: &[&str], stdin: &str) -> Output {
    gpumem_with(dir, &[], args, stdin)
}

/// [`gpumem_in`] with extra environment variables `env` set (after the clean-up, so they may
/// set the allocator config variables).
pub fn gpumem_with(dir: Option<&Path>, env: &[(&str, &str)], args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    command
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied());
    let mut child = command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpumem starts");
    // A process that exits before reading its input closes the pipe; that is its business.
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    child.wait_with_output().expect("gpumem finishes")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// (stdout, stderr, exit code) of a finished `gpumem`.
pub fn outcome(output: &Output) -> (String, String, i32) {
    (
        text(&output.stdout),
        text(&output.stderr),
        output.status.code().unwrap_or(-1),
    )
}

/// A fresh, empty folder under cargo's scratch space, unique per call.
pub fn scratch(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch folder");
    dir
}

/// Writes `text` to `dir/name`, creating folders on the way.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create folder");
    }
    std::fs::write(&path, text).expect("write file");
    path
}

/// A path under the repository's tests/ folder.
pub fn tests_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(relative)
}

/// [`tests_path`] as text, for a command line (the repository's paths are UTF-8).
pub fn tests_arg(relative: &str) -> String {
    tests_path(relative)
        .to_str()
        .expect("the repository's paths are UTF-8")
        .to_string()
}

/// Runs `python3 -m unittest MODULE` in `folder` (relative to the repository) with `env` added,
/// and fails the test unless unittest reports OK; skipped, with a note, where python3 cannot
/// be run. For the harnesses whose logic is Python (tests/gpu/whatif, tests/gpu/placement).
pub fn python_unittest(folder: &str, module: &str, env: &[(&str, &str)]) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
    let mut command = Command::new("python3");
    command
        .args(["-m", "unittest", module])
        .current_dir(&folder)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = match command.output() {
        Ok(output) => output,
        Err(error) => {
            eprintln!("skipped: python3 cannot be run here ({error})");
            return;
        }
    };
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{module}.py failed:\n{report}");
    assert!(report.contains("OK"), "{report}");
}
