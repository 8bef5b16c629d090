//! `gpumem replay` on crafted files, measured from outside (issue 21, acceptance 1): each file
//! is replayed or refused cleanly (exit 0, or exit 2 naming the byte offset and the limit), the
//! process's peak resident memory (its `ru_maxrss`, from `wait4`) stays within 64 MiB + 2 × the
//! file's size, and the CPU time grows linearly with the file: the same kind of file four
//! times larger takes at most a generous multiple of four times as long (quadratic work would
//! take sixteen).
//!
//! The files are built here, opcode by opcode, as small as a pickle can say each thing:
//! memoized keys, 20-odd bytes per trace entry.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

/// Bytes in a mebibyte.
const MIB: u64 = 1 << 20;

/// A protocol-4 pickle whose strings are memoized on first use and fetched after.
struct Pickle {
    bytes: Vec<u8>,
    memo: Vec<String>,
}

impl Pickle {
    fn new() -> Pickle {
        Pickle {
            bytes: vec![0x80, 4],
            memo: Vec::new(),
        }
    }

    fn op(&mut self, bytes: &[u8]) -> &mut Pickle {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// A string: `SHORT_BINUNICODE` + `MEMOIZE` the first time, `BINGET`/`LONG_BINGET` after.
    fn text(&mut self, text: &str) -> &mut Pickle {
        if let Some(id) = self.memo.iter().position(|known| known == text) {
            match u8::try_from(id) {
                Ok(id) => self.op(&[b'h', id]),
                Err(_) => self.op(b"j").op(&(id as u32).to_le_bytes()),
            };
            return self;
        }
        let length = u8::try_from(text.len()).expect("a short string");
        self.op(&[0x8c, length]).op(text.as_bytes()).op(&[0x94]);
        self.memo.push(text.to_string());
        self
    }

    /// `bytes` (one value) and `MEMOIZE`, as a value never fetched again: its memo id is
    /// taken, under a name no string has.
    fn memoized(&mut self, bytes: &[u8]) -> &mut Pickle {
        self.op(bytes).op(&[0x94]);
        self.memo.push(String::from("\0not a string"));
        self
    }

    /// `BININT`.
    fn int(&mut self, value: i32) -> &mut Pickle {
        self.op(b"J").op(&value.to_le_bytes())
    }

    /// `{'segments': [], 'device_traces': [[` — entries follow, each appended.
    fn snapshot_start() -> Pickle {
        let mut pickle = Pickle::new();
        pickle.op(b"}(").text("segments").op(b"]");
        pickle.text("device_traces").op(b"]]");
        pickle
    }

    /// One trace entry `{'action', 'addr', 'size', 'stream', 'frames'}`, appended to the trace.
    fn entry(&mut self, action: &str, addr: i32, size: i32) -> &mut Pickle {
        self.op(b"}(").text("action").text(action);
        self.text("addr").int(addr).text("size").int(size);
        self.text("stream").op(b"K\x00").text("frames").op(b"]ua")
    }

    /// Closes the trace, the device list and the dict that [`Pickle::snapshot_start`] opened.
    fn end_snapshot(&mut self) -> Vec<u8> {
        self.op(b"au.");
        std::mem::take(&mut self.bytes)
    }
}

/// `count` allocations of 512 bytes, each freed when `freed`.
fn allocations(count: i32, freed: bool) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    for i in 0..count {
        let addr = (1 << 21) + 512 * i;
        pickle.entry("alloc", addr, 512);
        if freed {
            pickle.entry("free_requested", addr, 512);
            pickle.entry("free_completed", addr, 512);
        }
    }
    pickle.end_snapshot()
}

/// `count` allocations of 512 bytes, each freed, as Python's pickler writes PyTorch's
/// snapshots: every entry dict memoized, each entry's own `compile_context` string object
/// (PyTorch's writer makes a new one per entry: a new memoized `"N/A"` each time) and its own
/// memoized empty `frames` list, the entries appended in batches of 1,000. Every entry adds
/// three memo ids, none of them ever fetched again.
fn python_pickled_allocations(count: u32) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    pickle.op(b"(");
    let mut entries = 0u32;
    for i in 0..count as i32 {
        let addr = (1 << 21) + 512 * i;
        for action in ["alloc", "free_requested", "free_completed"] {
            pickle.memoized(b"}").op(b"(").text("action").text(action);
            pickle.text("addr").int(addr).text("size").int(512);
            pickle.text("stream").op(b"K\x00");
            pickle.text("compile_context").memoized(b"\x8c\x03N/A");
            pickle.text("frames").memoized(b"]").op(b"u");
            entries += 1;
            if entries.is_multiple_of(1000) {
                pickle.op(b"e(");
            }
        }
    }
    pickle.op(b"e");
    pickle.end_snapshot()
}

/// `count` recorded `segment_alloc` events (the replay keeps each for the comparison).
fn segment_events(count: i32) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    for i in 0..count {
        pickle.entry("segment_alloc", (2 << 20) * (i % 1000 + 1), 2 << 20);
    }
    pickle.end_snapshot()
}

/// `count` allocations of 512 bytes, each freed, whose entries also carry a key no snapshot
/// has, holding a list (read by the reader's generic path, not its fast one).
fn unusual_allocations(count: u32) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    for i in 0..count as i32 {
        let addr = (1 << 21) + 512 * i;
        for action in ["alloc", "free_requested", "free_completed"] {
            pickle.op(b"}(").text("extra").op(b"(K\x01K\x02K\x03l");
            pickle.text("action").text(action).text("addr").int(addr);
            pickle.text("size").int(512).text("stream").op(b"K\x00");
            pickle.text("frames").op(b"]ua");
        }
    }
    pickle.end_snapshot()
}

/// `count` distinct strings, each memoized and popped: a memo that only grows.
fn memoized_strings(count: u32) -> Vec<u8> {
    let mut pickle = Pickle::new();
    for i in 0..count {
        let text = format!("{i:08}");
        pickle.op(&[0x8c, 8]).op(text.as_bytes()).op(&[0x94, b'0']);
    }
    pickle.op(b"N.");
    pickle.bytes
}

/// One string of `length` bytes as a frame's file name, in an allocation that replays.
fn one_long_string(length: usize) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    pickle.op(b"}(").text("action").text("alloc");
    pickle.text("addr").int(1 << 21).text("size").int(512);
    pickle.text("stream").op(b"K\x00").text("frames").op(b"]}(");
    pickle
        .text("filename")
        .op(&[0x8d])
        .op(&(length as u64).to_le_bytes());
    pickle.op(&vec![b'x'; length]);
    pickle
        .text("line")
        .op(b"K\x07")
        .text("name")
        .text("f")
        .op(b"ua");
    pickle.op(b"ua");
    pickle.end_snapshot()
}

/// `live` allocations never freed, then `strings` distinct strings memoized in a list under an
/// unknown top-level key: the replay's share and the reader's at once.
fn live_then_memo(live: i32, strings: u32) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    for i in 0..live {
        pickle.entry("alloc", (1 << 21) + 512 * i, 512);
    }
    pickle.op(b"a");
    pickle.text("junk").op(b"](");
    for i in 0..strings {
        pickle
            .op(&[0x8c, 8])
            .op(format!("{i:08}").as_bytes())
            .op(&[0x94]);
        if i % 1000 == 999 {
            pickle.op(b"e(");
        }
    }
    pickle.op(b"eu.");
    pickle.bytes
}

/// `count` distinct short strings in one list under an unknown top-level key: held until the
/// list ends.
fn one_long_list(count: u32) -> Vec<u8> {
    let mut pickle = Pickle::snapshot_start();
    pickle.op(b"a");
    pickle.text("junk").op(b"](");
    for i in 0..count {
        pickle.op(&[0x8c, 8]).op(format!("{i:08}").as_bytes());
        if i % 1000 == 999 {
            pickle.op(b"e(");
        }
    }
    pickle.op(b"eu.");
    pickle.bytes
}

/// 2,000,000 empty lists, each appended to the one before (issue 21's stack overflow).
fn deep_lists() -> Vec<u8> {
    let mut bytes = vec![0x80, 4];
    bytes.extend(std::iter::repeat_n(b']', 2_000_000));
    bytes.extend(std::iter::repeat_n(b'a', 1_999_999));
    bytes.push(b'.');
    bytes
}

/// `[L, L]` where L is the list before, `levels` times: 2^levels lists if copied out.
fn doubling_lists(levels: u8) -> Vec<u8> {
    let mut bytes = vec![0x80, 4, b']', 0x94, b'0'];
    for level in 0..levels {
        bytes.extend_from_slice(&[b'(', b'h', level, b'h', level, b'l', 0x94, b'0']);
    }
    bytes.extend_from_slice(&[b'h', levels, b'.']);
    bytes
}

/// A `BINUNICODE8` that declares 2^40 bytes in a file of 15.
fn huge_declared_length() -> Vec<u8> {
    let mut bytes = vec![0x80, 4, 0x8d];
    bytes.extend_from_slice(&(1_u64 << 40).to_le_bytes());
    bytes.extend_from_slice(b"abc.");
    bytes
}

/// What one `gpumem replay` did.
#[derive(Debug)]
struct Measured {
    code: i32,
    stderr: String,
    /// Peak resident memory, bytes.
    peak_rss: u64,
    /// User + system CPU time, seconds.
    cpu: f64,
}

/// The environment variable that tells [`measure_one_replay`] which file to replay.
const LAUNCH: &str = "GPUMEM_REPLAY_MEMORY_FILE";

/// Runs `gpumem replay path` and measures it. The peak a child's `wait4` reports includes the
/// peak of the process that started it (Linux keeps the larger across `exec`), and this test
/// process holds the crafted files; so a fresh, small copy of this test binary
/// ([`measure_one_replay`]) starts gpumem and reports what `wait4` says of it.
fn replay_measured(path: &Path) -> Measured {
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "measure_one_replay",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(LAUNCH, path)
        .stdin(Stdio::null())
        .output()
        .expect("the test binary starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.split_once("measured ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no measurement: {stdout}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let field = |i: usize| -> f64 { fields[i].parse().expect("a number") };
    Measured {
        code: field(0) as i32,
        peak_rss: field(1) as u64,
        cpu: field(2),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Not a test of its own: the small process that [`replay_measured`] starts. It runs
/// `gpumem replay` on the file named by `GPUMEM_REPLAY_MEMORY_FILE`, passes its stderr on,
/// and prints `measured EXIT PEAK_RSS_BYTES CPU_SECONDS` from `wait4`.
#[test]
#[ignore = "started by the other tests of this file"]
// The child is reaped by `wait4` below, which std's `Child` does not know of.
#[allow(clippy::zombie_processes)]
fn measure_one_replay() {
    let path = std::env::var_os(LAUNCH).expect("GPUMEM_REPLAY_MEMORY_FILE names the file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .arg("replay")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpumem starts");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("stderr");
    eprint!("{stderr}");
    let pid = i32::try_from(child.id()).expect("a pid");
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped (std's `Child` is never waited on), and
    // wait4 writes only into `status` and `usage`, which outlive the call.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4");
    assert!(
        libc::WIFEXITED(status),
        "gpumem replay did not exit (status {status:#x}: a signal, an abort): {stderr}"
    );
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    println!(
        "measured {} {} {}",
        libc::WEXITSTATUS(status),
        usage.ru_maxrss as u64 * 1024,
        seconds(usage.ru_utime) + seconds(usage.ru_stime)
    );
}

/// How `gpumem replay` must end on a file.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Replayed: exit 0.
    Replays,
    /// Refused by a limit: exit 2, the byte offset and this part of the limit named.
    Refused(&'static str),
    /// Read to the end but not a replayable snapshot: exit 2 with this said.
    Rejected(&'static str),
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}.pickle"));
    std::fs::write(&path, bytes).expect("write");
    path
}

/// Replays `bytes` as `name`, checks the outcome and the memory bound, and returns the run.
fn check(dir: &Path, name: &str, bytes: &[u8], expected: Outcome) -> Measured {
    let path = write(dir, name, bytes);
    let measured = replay_measured(&path);
    // Tens of megabytes each: gone as soon as measured.
    std::fs::remove_file(&path).expect("remove");
    let size = bytes.len() as u64;
    let bound = 64 * MIB + 2 * size;
    println!(
        "{name}: {size} bytes, exit {}, peak RSS {:.1} MiB (bound {:.1} MiB), {:.2} s CPU",
        measured.code,
        measured.peak_rss as f64 / MIB as f64,
        bound as f64 / MIB as f64,
        measured.cpu
    );
    assert!(
        !measured.stderr.contains("panicked"),
        "{name}: {measured:?}"
    );
    match expected {
        Outcome::Replays => assert_eq!(measured.code, 0, "{name}: {}", measured.stderr),
        Outcome::Refused(limit) => {
            assert_eq!(measured.code, 2, "{name}: {}", measured.stderr);
            assert!(
                measured.stderr.contains("refused at byte") && measured.stderr.contains(limit),
                "{name}: {}",
                measured.stderr
            );
        }
        Outcome::Rejected(what) => {
            assert_eq!(measured.code, 2, "{name}: {}", measured.stderr);
            assert!(
                measured.stderr.contains(what),
                "{name}: {}",
                measured.stderr
            );
        }
    }
    assert!(
        measured.peak_rss <= bound,
        "{name}: peak RSS {} bytes over the bound {bound} for a {size}-byte file",
        measured.peak_rss
    );
    measured
}

#[test]
fn crafted_files_stay_within_the_memory_bound() {
    let dir = common::scratch("replay-memory");
    let cases: Vec<(&str, Vec<u8>, Outcome)> = vec![
        (
            "deep-lists",
            deep_lists(),
            Outcome::Refused("bytes of memory"),
        ),
        (
            "huge-declared-length",
            huge_declared_length(),
            Outcome::Refused("bytes are left in the file"),
        ),
        (
            "doubling-lists",
            doubling_lists(60),
            Outcome::Rejected("not a PyTorch memory snapshot"),
        ),
        (
            "memo-flood",
            memoized_strings(1_000_000),
            Outcome::Refused("bytes of memory"),
        ),
        (
            "long-list",
            one_long_list(1_000_000),
            Outcome::Refused("bytes of memory"),
        ),
        ("long-string", one_long_string(16 << 20), Outcome::Replays),
        (
            "live-allocations",
            allocations(300_000, false),
            Outcome::Refused("allocations live at once"),
        ),
        (
            "live-then-memo",
            live_then_memo(100_000, 1_000_000),
            Outcome::Refused("bytes of memory"),
        ),
        (
            "freed-allocations",
            allocations(100_000, true),
            Outcome::Replays,
        ),
        ("segment-events", segment_events(300_000), Outcome::Replays),
        (
            "python-pickled",
            python_pickled_allocations(100_000),
            Outcome::Replays,
        ),
    ];
    for (name, bytes, expected) in &cases {
        check(&dir, name, bytes, *expected);
    }
}

/// A kind of file for the linear-time check: its name, how to make it with N units, the N of
/// the smaller file, and how its replay ends.
type LinearCase = (&'static str, fn(u32) -> Vec<u8>, u32, Outcome);

#[test]
fn time_grows_linearly_with_the_file() {
    let dir = common::scratch("replay-linear");
    // A generous factor over 4 (noise on a shared machine) that quadratic work (16) exceeds;
    // the small run takes a good part of a second in a debug build, so the fixed cost of
    // starting the process is small beside it.
    const MOST: f64 = 9.0;
    let kinds: [LinearCase; 3] = [
        (
            "freed-allocations",
            |n| allocations(n as i32, true),
            25_000,
            Outcome::Replays,
        ),
        (
            "segment-events",
            |n| segment_events(n as i32),
            75_000,
            Outcome::Replays,
        ),
        (
            "unusual-entries",
            unusual_allocations,
            10_000,
            Outcome::Replays,
        ),
    ];
    for (name, make, small, expected) in kinds {
        let one = check(&dir, &format!("{name}-1x"), &make(small), expected);
        let four = check(&dir, &format!("{name}-4x"), &make(4 * small), expected);
        let ratio = four.cpu / one.cpu.max(0.05);
        println!("{name}: 4 × the file took {ratio:.1} × the CPU time");
        assert!(
            ratio <= MOST,
            "{name}: {:.2} s then {:.2} s for 4 × the file",
            one.cpu,
            four.cpu
        );
    }
}
