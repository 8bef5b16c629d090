//! The `gpumem` command line: `gpumem` (REPL), `gpumem run FILE`, `gpumem test [PATH...]`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use gpumem::device::DeviceSpec;
use gpumem::script::{Host, Limits, PrintSink, ScriptError};
use gpumem::session::{self, SessionOptions};

/// Exit code for a script that failed (syntax or runtime error, uncaught OOM).
const EXIT_SCRIPT_ERROR: u8 = 1;
/// Exit code for a usage error (bad flags, unusable device, bad config).
const EXIT_USAGE: u8 = 2;

/// See and script how GPU memory behaves: PyTorch's caching allocator, re-implemented.
#[derive(Parser)]
#[command(name = "gpumem", version, about)]
struct Cli {
    /// Device: `cuda[:N]` or `sim[:SIZE]` (e.g. `sim:80GiB`). Default: cuda:0 when a GPU is
    /// found, else the simulated H200.
    #[arg(long, global = true, value_name = "DEVICE")]
    device: Option<DeviceSpec>,
    /// Allocator config in PyTorch's syntax (e.g. `max_split_size_mb:64`); default: the
    /// PYTORCH_CUDA_ALLOC_CONF environment variable.
    #[arg(long, global = true, value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Sandbox limits of the script engine.
    #[command(flatten)]
    limits: Limits,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a script.
    Run {
        /// The `.rhai` script.
        file: PathBuf,
    },
    /// Run golden tests: every X.rhai under the paths must print exactly X.out.
    Test {
        /// Scripts or folders (searched recursively).
        #[arg(default_value = "tests/golden")]
        paths: Vec<PathBuf>,
        /// Write (create or update) the .out files instead of comparing.
        #[arg(long)]
        bless: bool,
    },
    /// Measure gpumem itself (for comparisons with PyTorch; see benches/compare/).
    #[command(subcommand)]
    Bench(BenchTarget),
}

#[derive(Subcommand)]
enum BenchTarget {
    /// Median ns per malloc+free pair: a cached 1 MiB pair and 1000 live mixed-size blocks.
    Alloc {
        /// Samples per pattern (at least 1).
        #[arg(long, default_value_t = 101, value_parser = clap::value_parser!(u32).range(1..))]
        rounds: u32,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The randn kernel's throughput on a CUDA device, next to PyTorch's `normal_`.
    Randn {
        /// Timed repetitions after the warm-up (at least 1).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// The PyTorch comparison script.
        #[arg(long, default_value = "benches/compare/randn_torch.py")]
        torch_script: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let options = SessionOptions {
        device: cli.device,
        alloc_conf: cli.alloc_conf.clone(),
    };
    match cli.command {
        Some(Command::Run { file }) => on_script_stack(|| run(&options, cli.limits, &file)),
        Some(Command::Test { paths, bless }) => ExitCode::from(gpumem::golden::command(
            &paths,
            &gpumem::golden::Options {
                device: cli.device,
                alloc_conf: cli.alloc_conf,
                bless,
                limits: cli.limits,
            },
        )),
        Some(Command::Bench(BenchTarget::Alloc { rounds, json })) => {
            bench_alloc(&options, rounds, json)
        }
        Some(Command::Bench(BenchTarget::Randn { reps, torch_script })) => {
            bench_randn(&options, reps, &torch_script)
        }
        None => on_script_stack(|| repl(&options, cli.limits)),
    }
}

/// Runs a script or the REPL on a thread with a stack big enough for deeply nested values
/// ([`gpumem::script::on_script_stack`]).
fn on_script_stack(work: impl FnOnce() -> ExitCode + Send) -> ExitCode {
    gpumem::script::on_script_stack(work).unwrap_or_else(|error| {
        eprintln!("gpumem: {error}");
        ExitCode::from(EXIT_SCRIPT_ERROR)
    })
}

/// Opens the session the options ask for, printing the fallback notice if there is one; on
/// failure prints why and returns the usage-error exit code.
fn open_session(options: &SessionOptions) -> Result<session::Session, ExitCode> {
    match session::open(options) {
        Ok(session) => {
            if let Some(notice) = &session.notice {
                eprintln!("{notice}");
            }
            Ok(session)
        }
        Err(error) => {
            eprintln!("gpumem: {error}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// `gpumem` without a subcommand: the REPL (exit 1 when a piped transcript had errors).
fn repl(options: &SessionOptions, limits: Limits) -> ExitCode {
    let session = match open_session(options) {
        Ok(session) => session,
        Err(code) => return code,
    };
    match gpumem::repl::run(session.runtime, limits) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_SCRIPT_ERROR),
        Err(error) => {
            eprintln!("gpumem: {error}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(options: &SessionOptions, limits: Limits, file: &std::path::Path) -> ExitCode {
    let session = match open_session(options) {
        Ok(session) => session,
        Err(code) => return code,
    };
    let host = Host::with_limits(session.runtime, PrintSink::Stdout, limits);
    match host.run_file(file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ ScriptError::Io { .. }) => {
            eprintln!("gpumem: {error}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_SCRIPT_ERROR)
        }
    }
}

fn bench_alloc(options: &SessionOptions, rounds: u32, json: bool) -> ExitCode {
    let session = match open_session(options) {
        Ok(session) => session,
        Err(code) => return code,
    };
    let timings = session
        .runtime
        .with_allocator(|allocator| gpumem::bench::time_patterns(allocator, rounds as usize));
    match timings {
        Ok(t) if json => {
            println!(
                "{}",
                serde_json::json!({
                    "device": session.device.to_string(),
                    "cached_pair_ns": t.cached_pair_ns,
                    "mixed_pair_ns": t.mixed_pair_ns,
                })
            );
            ExitCode::SUCCESS
        }
        Ok(t) => {
            println!("device {}", session.device);
            println!("cached 1 MiB malloc+free       {:8.1} ns", t.cached_pair_ns);
            println!("1000 live mixed, per pair      {:8.1} ns", t.mixed_pair_ns);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("gpumem: {error}");
            ExitCode::from(EXIT_SCRIPT_ERROR)
        }
    }
}

fn bench_randn(options: &SessionOptions, reps: u32, torch_script: &std::path::Path) -> ExitCode {
    let index = match options.device {
        None => 0,
        Some(DeviceSpec::Cuda(index)) => index,
        Some(DeviceSpec::Sim(_)) => {
            eprintln!("gpumem: bench randn measures a CUDA device; use --device cuda[:N]");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match gpumem::bench::randn::randn(index, reps, torch_script) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("gpumem: cannot use cuda:{index}: {error}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
