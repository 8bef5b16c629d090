//! The `gpumem` command line: `gpumem` (REPL), `gpumem run FILE`, `gpumem test [PATH...]`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use gpumem::device::DeviceSpec;
use gpumem::script::{Host, PrintSink, ScriptError};
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
    /// Measure the randn kernel on a CUDA device (`gpumem bench randn`), next to PyTorch.
    #[command(hide = true)]
    Bench {
        /// What to measure; only `randn` exists.
        what: String,
        /// Timed repetitions after the warm-up.
        #[arg(long, default_value_t = 20)]
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
        Some(Command::Run { file }) => run(&options, &file),
        Some(Command::Bench {
            what,
            reps,
            torch_script,
        }) => bench(&options, &what, reps, &torch_script),
        None => {
            eprintln!("gpumem: the REPL is not available yet; use `gpumem run FILE.rhai`");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(options: &SessionOptions, file: &std::path::Path) -> ExitCode {
    let session = match session::open(options) {
        Ok(session) => session,
        Err(error) => {
            eprintln!("gpumem: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(notice) = &session.notice {
        eprintln!("{notice}");
    }
    let host = Host::new(session.runtime, PrintSink::Stdout);
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

fn bench(
    options: &SessionOptions,
    what: &str,
    reps: u32,
    torch_script: &std::path::Path,
) -> ExitCode {
    if what != "randn" {
        eprintln!("gpumem: unknown benchmark '{what}'; the only one is 'randn'");
        return ExitCode::from(EXIT_USAGE);
    }
    let index = match options.device {
        None => 0,
        Some(DeviceSpec::Cuda(index)) => index,
        Some(DeviceSpec::Sim(_)) => {
            eprintln!("gpumem: bench randn measures a CUDA device; use --device cuda[:N]");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match gpumem::bench::randn(index, reps, torch_script) {
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
