//! The binary's own code, private to it: argument parsing, the subcommands, the REPL
//! ([`repl`]), the golden runner ([`golden`]) and terminal colour ([`paint`]).
//!
//! [`main`] parses the arguments and runs [`try_main`]; every failure comes back as one
//! [`CliError`] whose [`CliError::exit`] names the exit status, and is printed in one place.

pub mod bench;
pub mod diff;
pub mod golden;
pub mod out;
pub mod paint;
pub mod record;
pub mod repl;
pub mod replay;
pub mod sites;
pub mod soak;
pub mod splitmix;
pub mod tune;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use thiserror::Error;

use gpumem::device::DeviceSpec;
use gpumem::script::directives::{self, Directives};
use gpumem::script::sandbox::PathPolicy;
use gpumem::script::{on_script_stack, Host, Limits, PrintSink, ScriptError};
use gpumem::session::{self, ConfigSource, Session, SessionError, SessionOptions};
use gpumem::viz::chart::{self, ChartSize};
use gpumem::viz::report::{self, ReportInput};
use gpumem::viz::Timeline;

/// The process exit statuses `gpumem` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything worked.
    Success = 0,
    /// A script failed (syntax or runtime error, uncaught OOM), a piped REPL transcript had
    /// errors, a golden test failed, or `gpumem diff`'s gate did.
    Failure = 1,
    /// A usage error: bad flags, an unusable device or config, an unreadable file.
    Usage = 2,
    /// `gpumem replay --fail-on-oom`: the replayed job does not fit.
    DoesNotFit = 3,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// Why a command failed, carrying the exit status it maps to.
#[derive(Debug, Error)]
pub enum CliError {
    /// The session could not open (device or config).
    #[error("gpumem: {0}")]
    Session(#[from] SessionError),
    /// A script failed; its error is already rendered with location and caret.
    #[error("{0}")]
    Script(ScriptError),
    /// A file could not be read.
    #[error("gpumem: {0}")]
    Io(String),
    /// Any other usage error (a wrong device for a subcommand, ...).
    #[error("gpumem: {0}")]
    Usage(String),
    /// A command failed at run time in a way that is not the user's input.
    #[error("gpumem: {0}")]
    Failed(String),
    /// The command already reported what went wrong (golden failures, REPL transcript
    /// errors); only the status remains.
    #[error("")]
    Reported(Exit),
    /// A script called `exit(code)`: the process ends with that status, printing nothing.
    #[error("")]
    ScriptExit(u8),
}

impl CliError {
    /// The exit status this error ends the process with.
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Session(_) | CliError::Io(_) | CliError::Usage(_) => Exit::Usage,
            CliError::Script(_) | CliError::Failed(_) => Exit::Failure,
            CliError::Reported(exit) => *exit,
            CliError::ScriptExit(0) => Exit::Success,
            CliError::ScriptExit(_) => Exit::Failure,
        }
    }

    /// The process exit status: [`CliError::exit`], or the script's own `exit(code)`.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::ScriptExit(code) => ExitCode::from(*code),
            other => other.exit().into(),
        }
    }
}

impl From<ScriptError> for CliError {
    fn from(error: ScriptError) -> CliError {
        match error {
            io @ ScriptError::Io { .. } => CliError::Io(io.to_string()),
            ScriptError::Exit(code) => CliError::ScriptExit(code),
            other => CliError::Script(other),
        }
    }
}

/// See and script how GPU memory behaves: PyTorch's caching allocator, re-implemented.
///
/// Without a subcommand: the REPL. The options below are the REPL's; given before a
/// subcommand they apply to it when it takes them (its own --help lists which), and are an
/// error when it does not.
#[derive(Parser)]
#[command(
    name = "gpumem",
    version,
    about,
    after_help = "Exit status: 0 ok; 1 a script error, a failed golden test; 2 a usage, config or file error; 3 `replay --fail-on-oom` when the replayed job does not fit."
)]
struct Cli {
    /// The device and allocator config of the REPL.
    #[command(flatten)]
    session: SessionArgs,
    /// Sandbox limits of the script engine.
    #[command(flatten)]
    limits: Limits,
    /// Also let scripts read and write files beneath DIR (repeatable). Without it a script's
    /// `dump_snapshot` and `replay` reach only its own directory and the current directory.
    #[arg(long, global = true, value_name = "DIR")]
    allow_path: Vec<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Where a script, the REPL or a benchmark runs: the device and the allocator config.
#[derive(Args, Clone, Default)]
struct SessionArgs {
    /// Devices: `cuda` (every visible GPU; `cuda:N` starts on GPU N), `sim[:SIZE]` (e.g.
    /// `sim:80GiB`) or `sim:SIZE,SIZE,...` (one simulated device per size). Default: the GPUs
    /// when one is found, else the simulated H200.
    #[arg(long, value_name = "DEVICE")]
    device: Option<DeviceSpec>,
    /// Allocator config in PyTorch's syntax (e.g. `max_split_size_mb:64`); default: the
    /// PYTORCH_CUDA_ALLOC_CONF (then PYTORCH_ALLOC_CONF) environment variable.
    #[arg(long, value_name = "CONF")]
    alloc_conf: Option<String>,
}

impl SessionArgs {
    /// These, each filled in from `outer` (given before the subcommand) where not given.
    fn or(self, outer: &SessionArgs) -> SessionArgs {
        SessionArgs {
            device: self.device.or_else(|| outer.device.clone()),
            alloc_conf: self.alloc_conf.or_else(|| outer.alloc_conf.clone()),
        }
    }

    /// The session options: the flag, else the environment's config.
    fn options(&self) -> SessionOptions {
        SessionOptions {
            device: self.device.clone(),
            config: ConfigSource::flag_or_environment(self.alloc_conf.clone()),
            devices: None,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a script.
    Run {
        /// The `.rhai` script.
        file: PathBuf,
        /// Also draw allocated and reserved memory over the script's allocator events, OOMs,
        /// empty_cache() and mark(text) phases marked with their script lines, to FILE (.svg
        /// or .png; give it twice for both).
        #[arg(long, value_name = "FILE")]
        timeline: Vec<PathBuf>,
        /// Also write a self-contained HTML report to FILE: each allocator's timeline (hover
        /// for events, zoom to single events), the segment map after an event, the counters
        /// and memory_summary().
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// The device and allocator config (a script's `//!` directives win over both).
        #[command(flatten)]
        session: SessionArgs,
        /// Sandbox limits of the script engine.
        #[command(flatten)]
        limits: Limits,
    },
    /// Run golden tests: every X.rhai under the paths must print exactly X.out.
    Test {
        /// Scripts or folders (searched recursively).
        #[arg(default_value = "tests/golden")]
        paths: Vec<PathBuf>,
        /// Write (create or update) the .out files instead of comparing; a script that stops
        /// with an error is refused (a typo must not become a passing test).
        #[arg(long)]
        bless: bool,
        /// Like --bless, and also write the .out files of scripts that stop with an error
        /// (an expected OOM, a rejected config), pinning the error.
        #[arg(long)]
        bless_errors: bool,
        /// Device: `cuda[:N]` or `sim[:SIZE]`, for scripts that pin none. Default: cuda:0
        /// when a GPU is found, else the simulated H200.
        #[arg(long, value_name = "DEVICE")]
        device: Option<DeviceSpec>,
        /// Allocator config in PyTorch's syntax, for scripts that pin none. Default:
        /// PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF is not read: golden results must not
        /// depend on the environment).
        #[arg(long, value_name = "CONF")]
        alloc_conf: Option<String>,
        /// Sandbox limits of the script engine (without --max-operations: 100 million per
        /// script).
        #[command(flatten)]
        limits: Limits,
    },
    /// Replay a PyTorch memory snapshot through gpumem's allocator: does the job fit?
    ///
    /// The snapshot (torch.cuda.memory._dump_snapshot) is replayed on a simulated device.
    /// The answer: the verdict, each OOM's cause and figures with the frames recorded for it
    /// (your own files first), peaks, cudaMalloc calls, fragmentation, and the replay checked
    /// against the file (its segment events and its end-state segments). A trace that starts
    /// mid-run (PyTorch's history ring wrapped) replays from the state rebuilt at its start; a
    /// limit the recorded OOMs show (a memory fraction, memory held by another process) is
    /// inferred and, on the default device, applied. Event N is the N-th entry of the file's
    /// trace (counted from 1).
    #[command(
        after_help = "Exit status: 0 when the replay ran (whether or not the job fits, unless --fail-on-oom); 2 a usage, config or file error (an empty history among them); 3 with --fail-on-oom when the job does not fit."
    )]
    Replay {
        /// The snapshot (a .pickle written by PyTorch or by gpumem's dump_snapshot).
        file: PathBuf,
        /// The simulated device: `sim` or `sim:SIZE` (e.g. `sim:24GiB`; replay never runs on
        /// a GPU). Default: the simulated H200 (139.80 GiB), since the file does not record
        /// the device's size.
        #[arg(long, value_name = "DEVICE")]
        device: Option<DeviceSpec>,
        /// Replay under this allocator config (PyTorch's syntax) instead of the one the file
        /// records. Default: the recorded config (PyTorch's defaults for a file that records
        /// none); PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF are ignored.
        #[arg(long, value_name = "CONF")]
        alloc_conf: Option<String>,
        /// Exit with status 3 when the job does not fit (for CI gates).
        #[arg(long)]
        fail_on_oom: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also replay under each of these configs and compare them side by side.
        #[arg(long, value_name = "CONF", num_args = 1..)]
        compare: Vec<String>,
        /// Find the smallest simulated device on which the job fits (binary search in 2 MiB
        /// steps from its peak), for each config, and the total memory a real GPU needs.
        #[arg(long)]
        min_capacity: bool,
        /// Where segments are placed: where PyTorch's driver put the recording's while the
        /// replay's cudaMalloc/cudaFree calls are the recording's; under another config, then
        /// where the driver's model puts them in the recording's address space, knowing the
        /// memory the recording shows others held; else at the segment the trace made at the
        /// same allocation, above the last large one, or by the simulator's model (recorded),
        /// or always the simulator's model (model).
        #[arg(long, value_enum, default_value_t = PlacementArg::Recorded)]
        placement: PlacementArg,
        /// Place segments where another recording of the same job put them (while the
        /// replay's cudaMalloc/cudaFree calls are that recording's; the simulator's model
        /// after), not where FILE's did: give PyTorch's own run under --alloc-conf to tell
        /// whether a what-if replay differs from that run by the driver's placement (which no
        /// file carries from one process to the next) or by the allocator's decisions.
        #[arg(long, value_name = "RUN", conflicts_with_all = ["tune", "compare", "min_capacity"])]
        addresses_from: Option<PathBuf>,
        /// Replay device N's trace (its position in the file's `device_traces`); by default
        /// the first device with entries. The report lists every device the file holds.
        #[arg(long, value_name = "N")]
        device_index: Option<u32>,
        /// Also draw the replay's allocated and reserved memory over the file's events to FILE
        /// (.svg or .png; give it twice for both); with --compare, the configs overlaid.
        #[arg(long, value_name = "FILE")]
        timeline: Vec<PathBuf>,
        /// Also write the replay as a self-contained HTML report to FILE: the timeline (exact
        /// per-pixel envelopes, every event kept around each OOM and both peaks, so a file of
        /// any length gives a page of bounded size), with --compare the table and the configs
        /// overlaid.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Replay under a grid of allocator configs instead (one config per core at a time)
        /// and rank them: those that fit first, then by peak reserved, cudaMalloc/map calls
        /// and retries; prints the best as PYTORCH_CUDA_ALLOC_CONF. --alloc-conf is the base
        /// every grid config starts from.
        #[arg(long, conflicts_with_all = ["compare", "min_capacity", "timeline"])]
        tune: bool,
        /// --tune's grid from FILE: lines `KEY = VALUE, VALUE, ...` (every combination; `none`
        /// leaves the key out) and `conf = TEXT` (default: 144 configs of expandable_segments,
        /// max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold).
        #[arg(long, value_name = "FILE", requires = "tune")]
        grid: Option<PathBuf>,
        /// --tune's worker threads (default: one per core).
        #[arg(long, value_name = "N", requires = "tune", value_parser = clap::value_parser!(u32).range(1..))]
        threads: Option<u32>,
        /// The simulated device's size, e.g. 24GiB (the same as --device sim:SIZE).
        #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
        capacity: Option<u64>,
    },
    /// Compare two jobs' snapshots, each replayed under its own config: peaks, segments,
    /// OOMs, and the allocation sites by bytes live at each job's peak (added, removed, grown,
    /// shrunk). With --max-peak-increase, exit 1 when B's peak reserved or allocated memory
    /// grew by more than PCT percent of A's: a memory regression gate for CI.
    Diff {
        /// The baseline snapshot.
        a: PathBuf,
        /// The snapshot compared with it.
        b: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Exit 1 when B's peak reserved or allocated memory grew by more than PCT percent.
        #[arg(long, value_name = "PCT")]
        max_peak_increase: Option<f64>,
        /// The simulated device's size, e.g. 24GiB (default: the simulated H200).
        #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
        capacity: Option<u64>,
        /// Where segments are placed (as for replay).
        #[arg(long, value_enum, default_value_t = PlacementArg::Recorded)]
        placement: PlacementArg,
    },
    /// Measure gpumem itself (for comparisons with PyTorch; see benches/compare/).
    #[command(subcommand)]
    Bench(BenchTarget),
}

/// `--placement`.
#[derive(Clone, Copy, ValueEnum)]
enum PlacementArg {
    /// Where PyTorch's driver placed the recording's segment while the replay's device calls
    /// are the recording's; under another config, the driver's model in the recording's
    /// address space; else the same allocation's, above the last large segment, or the model.
    Recorded,
    /// The simulator's placement model.
    Model,
}

impl From<PlacementArg> for gpumem::snapshot::replay::Placement {
    fn from(arg: PlacementArg) -> Self {
        match arg {
            PlacementArg::Recorded => gpumem::snapshot::replay::Placement::Recorded,
            PlacementArg::Model => gpumem::snapshot::replay::Placement::Model,
        }
    }
}

/// `--capacity SIZE`: a byte count as `--device sim:SIZE` takes it.
/// The text of `path` (a script, an expected output, a grid), or why it cannot be had: "cannot
/// read PATH: ERROR", or, for a file whose bytes are not UTF-8 (an image, a pickle given as a
/// script), that it is not a text file, where std's own words ("stream did not contain valid
/// UTF-8") name neither the file nor the fix.
pub(crate) fn read_text(path: &Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::InvalidData => format!(
            "cannot read {}: it is not a text file (its bytes are not UTF-8), and {what} is text",
            path.display()
        ),
        _ => format!("cannot read {}: {error}", path.display()),
    })
}

fn parse_capacity(text: &str) -> Result<u64, String> {
    gpumem::device::spec::parse_size(text).map_err(|error| error.to_string())
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
        /// The device and allocator config.
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Replay speed: writes a synthetic snapshot of N events, replays it, prints events per
    /// second and the peak resident memory.
    Replay {
        /// Trace events in the synthetic snapshot.
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Replay this file (written first if it does not exist) instead of a temporary one.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Keep the generated file.
        #[arg(long)]
        keep: bool,
        /// Then also run `gpumem replay FILE --report REPORT` on it (on a simulated device of
        /// `--capacity` when given, with the model's placement) and print the page's size, the
        /// time and the peak resident memory.
        #[arg(long, value_name = "REPORT")]
        report: Option<PathBuf>,
        /// The simulated device `--report` replays on, e.g. 24GiB (default: the simulated
        /// H200).
        #[arg(long, value_name = "SIZE", value_parser = parse_capacity, requires = "report")]
        capacity: Option<u64>,
    },
    /// `replay --tune`'s throughput on 1, 2, 4, ... threads: the same replays of a synthetic
    /// snapshot per run, with the scaling and efficiency against one thread.
    Tune {
        /// Trace events in the synthetic snapshot.
        #[arg(long, default_value_t = 2_000_000)]
        events: u64,
        /// Replay this file (written first if it does not exist; kept) instead of a temporary
        /// one.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Thread counts, comma-separated (default: 1, the powers of two below the cores, the
        /// cores).
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
        threads: Vec<u32>,
        /// Replays per run (default: twice the most threads).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        replays: Option<u32>,
    },
    /// The randn kernel's throughput on a CUDA device, next to PyTorch's `normal_`.
    Randn {
        /// Timed repetitions after the warm-up (at least 1).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// The PyTorch comparison script.
        #[arg(long, default_value = "benches/compare/randn_torch.py")]
        torch_script: PathBuf,
        /// The device (a CUDA device) and allocator config.
        #[command(flatten)]
        session: SessionArgs,
    },
    /// A random workload (1 B to 4 GiB requests, frees, empty_cache, caught OOMs) with the
    /// allocator's invariants checked as it goes; everything freed at the end must leave the
    /// driver's view at the context alone. Exit 1 on any fault.
    Soak {
        /// How long to run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// The random seed (a seed reproduces a run).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The device and allocator config.
        #[command(flatten)]
        session: SessionArgs,
    },
}

/// Parses the command line, runs the command and turns its outcome into the exit status,
/// printing the error (if any) on stderr.
pub fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let outer = Outer::of(&matches);
    match try_main(cli, &outer) {
        Ok(()) => Exit::Success.into(),
        Err(error) => {
            let text = error.to_string();
            if !text.is_empty() {
                eprintln!("{text}");
            }
            error.exit_code()
        }
    }
}

/// Which options were given on the command line before the subcommand (`gpumem --device sim
/// run x.rhai`), and whether the subcommand's own limits were.
struct Outer {
    /// `--device`/`--alloc-conf` given before the subcommand, as written.
    session_flags: Vec<String>,
    /// Script-engine limits given before the subcommand, as written.
    limit_flags: Vec<String>,
    /// Whether limits were given after the subcommand (`run`, `test`).
    own_limits: bool,
}

impl Outer {
    fn of(matches: &ArgMatches) -> Outer {
        let given = |matches: &ArgMatches, ids: &[String]| -> Vec<String> {
            ids.iter()
                .filter(|id| {
                    matches.try_get_raw(id).is_ok_and(|value| value.is_some())
                        && matches.value_source(id) == Some(ValueSource::CommandLine)
                })
                .map(|id| format!("--{}", id.replace('_', "-")))
                .collect()
        };
        let ids = |command: clap::Command| -> Vec<String> {
            command
                .get_arguments()
                .map(|arg| arg.get_id().to_string())
                .collect()
        };
        let session_ids = ids(SessionArgs::augment_args(clap::Command::new("session")));
        let limit_ids = ids(Limits::augment_args(clap::Command::new("limits")));
        Outer {
            session_flags: given(matches, &session_ids),
            limit_flags: given(matches, &limit_ids),
            own_limits: matches
                .subcommand()
                .is_some_and(|(_, sub)| !given(sub, &limit_ids).is_empty()),
        }
    }

    /// Refuses options given before `command` that it does not take.
    fn refuse(flags: &[String], command: &str, why: &str) -> Result<(), CliError> {
        match flags {
            [] => Ok(()),
            flags => Err(CliError::Usage(format!(
                "{} does not apply to `gpumem {command}`: {why}",
                flags.join(", ")
            ))),
        }
    }

    /// The limits in force: the subcommand's own when given there, else those given before
    /// it.
    fn limits(&self, own: Limits, outer: Limits) -> Limits {
        if self.own_limits || self.limit_flags.is_empty() {
            own
        } else {
            outer
        }
    }
}

/// Runs the command the arguments name.
fn try_main(cli: Cli, outer: &Outer) -> Result<(), CliError> {
    const NO_SCRIPT: &str = "it runs no script, so the script engine's limits do not apply";
    match cli.command {
        Some(Command::Run {
            file,
            timeline,
            report,
            session,
            limits,
        }) => {
            let outputs = Outputs { timeline, report };
            outputs.check()?;
            let options = session.or(&cli.session).options();
            let limits = outer.limits(limits, cli.limits);
            on_stack(|| run(&options, limits, &cli.allow_path, &file, &outputs))
        }
        Some(Command::Test {
            paths,
            bless,
            bless_errors,
            device,
            alloc_conf,
            limits,
        }) => {
            let golden_options = golden::Options {
                device: device.or(cli.session.device),
                // Golden results must not depend on the caller's environment: only the flag.
                config: alloc_conf
                    .or(cli.session.alloc_conf)
                    .map_or(ConfigSource::Default, ConfigSource::Flag),
                bless,
                bless_errors,
                limits: outer.limits(limits, cli.limits),
                allow_paths: cli.allow_path.clone(),
            };
            match golden::command(&paths, &golden_options) {
                Exit::Success => Ok(()),
                exit => Err(CliError::Reported(exit)),
            }
        }
        Some(Command::Bench(BenchTarget::Alloc {
            rounds,
            json,
            session,
        })) => {
            Outer::refuse(&outer.limit_flags, "bench alloc", NO_SCRIPT)?;
            bench_alloc(&session.or(&cli.session).options(), rounds, json)
        }
        Some(Command::Replay {
            file,
            device,
            alloc_conf,
            json,
            tune: true,
            grid,
            threads,
            capacity,
            placement,
            device_index,
            report,
            ..
        }) => {
            Outer::refuse(&outer.limit_flags, "replay --tune", NO_SCRIPT)?;
            let device = device.or(cli.session.device);
            tune::command(&tune::TuneArgs {
                replay: gpumem::snapshot::replay::ReplayOptions {
                    capacity: tune::capacity(device.as_ref(), capacity)?,
                    conf: None,
                    placement: placement.into(),
                    device_index,
                    ..gpumem::snapshot::replay::ReplayOptions::default()
                },
                base: alloc_conf.or(cli.session.alloc_conf).unwrap_or_default(),
                file,
                grid,
                threads: threads.map(|n| n as usize),
                json,
                report,
            })
        }
        Some(Command::Diff {
            a,
            b,
            json,
            max_peak_increase,
            capacity,
            placement,
        }) => {
            Outer::refuse(&outer.limit_flags, "diff", NO_SCRIPT)?;
            diff::command(&diff::DiffArgs {
                replay: gpumem::snapshot::replay::ReplayOptions {
                    capacity: tune::capacity(cli.session.device.as_ref(), capacity)?,
                    conf: match &cli.session.alloc_conf {
                        Some(text) => {
                            Some(gpumem::alloc::AllocConf::parse(text).map_err(|error| {
                                CliError::Usage(format!(
                                    "invalid allocator config '{text}' (--alloc-conf): {error}"
                                ))
                            })?)
                        }
                        None => None,
                    },
                    placement: placement.into(),
                    device_index: None,
                    ..gpumem::snapshot::replay::ReplayOptions::default()
                },
                a,
                b,
                max_peak_increase,
                json,
            })
        }
        Some(Command::Replay {
            file,
            device,
            alloc_conf,
            fail_on_oom,
            json,
            compare,
            min_capacity,
            placement,
            addresses_from,
            device_index,
            timeline,
            report,
            capacity,
            ..
        }) => {
            Outer::refuse(&outer.limit_flags, "replay", NO_SCRIPT)?;
            let device = device.or(cli.session.device);
            replay::command(&replay::ReplayArgs {
                outputs: {
                    let outputs = Outputs { timeline, report };
                    outputs.check()?;
                    outputs
                },
                file,
                device: match capacity {
                    Some(bytes) => {
                        tune::capacity(device.as_ref(), Some(bytes))?;
                        Some(DeviceSpec::sim_of(bytes))
                    }
                    None => device,
                },
                alloc_conf: alloc_conf.or(cli.session.alloc_conf),
                compare,
                min_capacity,
                json,
                fail_on_oom,
                placement: placement.into(),
                addresses_from,
                device_index,
            })
        }
        Some(Command::Bench(BenchTarget::Replay {
            events,
            file,
            keep,
            report,
            capacity,
        })) => {
            Outer::refuse(&outer.limit_flags, "bench replay", NO_SCRIPT)?;
            Outer::refuse(
                &outer.session_flags,
                "bench replay",
                "it replays on the simulated H200 under the file's recorded config (--capacity sets the device of --report)",
            )?;
            let report = report.map(|path| replay::BenchReport { path, capacity });
            replay::bench(events, file.as_deref(), keep, report.as_ref())
        }
        Some(Command::Bench(BenchTarget::Tune {
            events,
            file,
            threads,
            replays,
        })) => {
            Outer::refuse(&outer.limit_flags, "bench tune", NO_SCRIPT)?;
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads: Vec<usize> = if threads.is_empty() {
                bench::tune::default_threads(cores)
            } else {
                threads.into_iter().map(|n| n as usize).collect()
            };
            let path = file.unwrap_or_else(|| {
                std::env::temp_dir()
                    .join(format!("gpumem-bench-tune-{}.pickle", std::process::id()))
            });
            bench::tune::bench(&path, events, &threads, replays.map(|n| n as usize))
        }
        Some(Command::Bench(BenchTarget::Randn {
            reps,
            torch_script,
            session,
        })) => {
            Outer::refuse(&outer.limit_flags, "bench randn", NO_SCRIPT)?;
            bench_randn(&session.or(&cli.session).options(), reps, &torch_script)
        }
        Some(Command::Bench(BenchTarget::Soak {
            seconds,
            seed,
            session,
        })) => {
            Outer::refuse(&outer.limit_flags, "bench soak", NO_SCRIPT)?;
            bench_soak(&session.or(&cli.session).options(), seconds, seed)
        }
        None => {
            let options = cli.session.options();
            on_stack(|| repl(&options, cli.limits, &cli.allow_path))
        }
    }
}

/// Runs a script or the REPL on a thread with a stack big enough for deeply nested values
/// ([`on_script_stack`]).
fn on_stack(work: impl FnOnce() -> Result<(), CliError> + Send) -> Result<(), CliError> {
    on_script_stack(work).unwrap_or_else(|error| Err(CliError::Failed(error)))
}

/// Opens the session the options ask for, printing the fallback notice if there is one.
fn open_session(options: &SessionOptions) -> Result<Session, CliError> {
    let session = session::open(options)?;
    if let Some(notice) = &session.notice {
        eprintln!("{notice}");
    }
    Ok(session)
}

/// Where a script (at `script`, or typed into the REPL) may read and write files: its own
/// directory, the current one and every `--allow-path`.
pub(crate) fn sandbox_policy(
    script: Option<&Path>,
    allow_paths: &[PathBuf],
) -> Result<PathPolicy, CliError> {
    PathPolicy::for_script(script, allow_paths).map_err(|error| CliError::Usage(error.to_string()))
}

/// `gpumem` without a subcommand: the REPL (a piped transcript with errors fails).
fn repl(options: &SessionOptions, limits: Limits, allow_paths: &[PathBuf]) -> Result<(), CliError> {
    let session = open_session(options)?;
    let paths = sandbox_policy(None, allow_paths)?;
    match repl::run(session.devices, session.device, limits, paths) {
        Ok(0) => Ok(()),
        Ok(code) => Err(CliError::ScriptExit(code)),
        Err(error) => Err(CliError::Usage(error.to_string())),
    }
}

/// What `gpumem run` and `gpumem replay` draw besides their own output.
pub(crate) struct Outputs {
    /// `--timeline FILE` (.svg or .png), as often as given (one of each, say).
    pub timeline: Vec<PathBuf>,
    /// `--report FILE` (.html).
    pub report: Option<PathBuf>,
}

/// One timeline a command recorded, and the end state of the allocator it followed.
pub(crate) struct Drawn {
    /// What it followed (`session allocator`, `with_allocator_conf("...")`, a config).
    pub label: String,
    /// The run.
    pub timeline: Timeline,
    /// The allocator config, in PyTorch's syntax.
    pub config: String,
    /// `memory_stats()` at the end.
    pub counters: Vec<(String, i64)>,
    /// A text account of the end (`memory_summary()`, or the replay's report).
    pub summary: String,
}

/// Everything the pictures and the report show: one or more labelled timelines, each with
/// its counters, and for `--compare` the comparison table (its timelines then drawn overlaid).
pub(crate) struct EndState {
    /// What was run.
    pub title: String,
    /// The device, as the report's subtitle names it.
    pub device: String,
    /// The timelines, the main one first.
    pub timelines: Vec<Drawn>,
    /// `--compare`'s table.
    pub comparison: Option<gpumem::viz::report::Comparison>,
    /// The answer the report leads with (a replay's verdict).
    pub headline: Option<gpumem::viz::report::Headline>,
}

impl Outputs {
    pub(crate) fn wanted(&self) -> bool {
        !self.timeline.is_empty() || self.report.is_some()
    }

    fn chart_format(path: &Path) -> Option<chart::Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "svg" => Some(chart::Format::Svg),
            "png" => Some(chart::Format::Png),
            _ => None,
        }
    }

    /// Refuses a `--timeline` file that is neither .svg nor .png before anything runs.
    pub(crate) fn check(&self) -> Result<(), CliError> {
        match self
            .timeline
            .iter()
            .find(|path| Outputs::chart_format(path).is_none())
        {
            Some(path) => Err(CliError::Usage(format!(
                "--timeline {}: the file must end in .svg or .png",
                path.display()
            ))),
            None => Ok(()),
        }
    }

    /// Writes every `--timeline` picture and the report of `end`.
    pub(crate) fn write(&self, end: &EndState) -> Result<(), CliError> {
        let failed = |error: gpumem::viz::chart::ChartError| CliError::Failed(error.to_string());
        let events: u64 = end
            .timelines
            .iter()
            .map(|drawn| drawn.timeline.counts.events)
            .sum();
        let write = |path: &Path, bytes: &[u8], what: &str| -> Result<(), CliError> {
            std::fs::write(path, bytes).map_err(|error| {
                CliError::Io(format!("cannot write {}: {error}", path.display()))
            })?;
            let timelines = match end.timelines.len() {
                1 => String::new(),
                n => format!(" ({n} timelines)"),
            };
            eprintln!(
                "gpumem: wrote the {what} of {events} allocator events{timelines} to {}",
                path.display()
            );
            Ok(())
        };
        let runs: Vec<(String, &Timeline)> = end
            .timelines
            .iter()
            .map(|drawn| {
                let label = if end.timelines.len() == 1 && end.comparison.is_none() {
                    String::new()
                } else {
                    drawn.label.clone()
                };
                (label, &drawn.timeline)
            })
            .collect();
        for path in &self.timeline {
            let format = Outputs::chart_format(path).unwrap_or(chart::Format::Svg);
            let overlay = end.comparison.is_some();
            let bytes =
                chart::picture(&runs, overlay, ChartSize::default(), format).map_err(failed)?;
            write(path, &bytes, "timeline")?;
        }
        if let Some(path) = &self.report {
            let input = ReportInput {
                headline: end.headline.clone(),
                title: end.title.clone(),
                device: end.device.clone(),
                panels: end
                    .timelines
                    .iter()
                    .map(|drawn| report::Panel {
                        label: drawn.label.clone(),
                        timeline: &drawn.timeline,
                        config: drawn.config.clone(),
                        counters: drawn.counters.clone(),
                        summary: drawn.summary.clone(),
                    })
                    .collect(),
                comparison: end.comparison.clone(),
            };
            let page = report::html(&input).map_err(failed)?;
            write(path, page.as_bytes(), "report")?;
        }
        Ok(())
    }
}

/// `gpumem run FILE [--timeline FILE] [--report FILE]`: the script's directives choose its
/// device and config, over the flags. The outputs are written even when the script fails (an
/// uncaught OOM is often what one wants to see).
fn run(
    options: &SessionOptions,
    limits: Limits,
    allow_paths: &[PathBuf],
    file: &Path,
    outputs: &Outputs,
) -> Result<(), CliError> {
    let name = file.display().to_string();
    let source = read_text(file, "a script").map_err(CliError::Io)?;
    let pinned =
        directives::parse(&source).map_err(|error| CliError::Failed(format!("{name}: {error}")))?;
    let options = pinned_options(options, &pinned, file);
    let session = match open_session(&options) {
        Err(CliError::Session(error @ SessionError::Cuda { .. })) if pinned.device.is_some() => {
            return Err(CliError::Usage(format!(
                "{error} (the device {name} pins with `//! device:`)"
            )))
        }
        other => other?,
    };
    let mut host = Host::with_limits(session.devices, PrintSink::Stdout, limits);
    host.set_path_policy(sandbox_policy(Some(file), allow_paths)?);
    host.set_map_options(paint::stdout_map_options());
    if !outputs.wanted() {
        return Ok(host.run_source(&name, &source)?);
    }
    // Pictures name the script's own line for events inside stdlib helpers.
    host.track_call_sites();
    let recording = record::Recording::start(host.devices(), &name);
    let result = host.run_source(&name, &source);
    let end = EndState {
        title: name.clone(),
        device: recording.devices_label(),
        timelines: recording.finish(options.config.text()),
        comparison: None,
        headline: None,
    };
    outputs.write(&end)?;
    Ok(result?)
}

/// The session options for a script with directives `pinned`: each directive replaces the
/// flag (or environment variable), saying so on stderr when it overrides one that was given.
fn pinned_options(options: &SessionOptions, pinned: &Directives, file: &Path) -> SessionOptions {
    let mut resolved = options.clone();
    if let Some(device) = &pinned.device {
        if let Some(flag) = options.device.as_ref().filter(|flag| *flag != device) {
            let written = pinned.device_text.clone().unwrap_or(device.to_string());
            eprintln!(
                "gpumem: {} pins `//! device: {written}`; ignoring --device {flag}",
                file.display()
            );
        }
        resolved.device = Some(device.clone());
    }
    resolved.devices = pinned.devices;
    if let Some(text) = &pinned.alloc_conf {
        if options.config != ConfigSource::Default && options.config.text() != text {
            eprintln!(
                "gpumem: {} pins `//! alloc-conf: {text}`; ignoring '{}' from {}",
                file.display(),
                options.config.text(),
                options.config
            );
        }
        resolved.config = ConfigSource::Directive {
            script: file.to_path_buf(),
            text: text.clone(),
        };
    }
    resolved
}

/// `gpumem bench alloc`.
fn bench_alloc(options: &SessionOptions, rounds: u32, json: bool) -> Result<(), CliError> {
    let session = open_session(options)?;
    let timings = session
        .devices
        .current()
        .with_allocator(|allocator| crate::cli::bench::time_patterns(allocator, rounds as usize))
        .map_err(|error| CliError::Failed(error.to_string()))?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "device": session.device.to_string(),
                "cached_pair_ns": timings.cached_pair_ns,
                "mixed_pair_ns": timings.mixed_pair_ns,
            })
        );
    } else {
        println!("device {}", session.device);
        println!(
            "cached 1 MiB malloc+free       {:8.1} ns",
            timings.cached_pair_ns
        );
        println!(
            "1000 live mixed, per pair      {:8.1} ns",
            timings.mixed_pair_ns
        );
    }
    Ok(())
}

/// `gpumem bench soak`.
fn bench_soak(options: &SessionOptions, seconds: f64, seed: u64) -> Result<(), CliError> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(CliError::Usage(format!(
            "bench soak: --seconds must be a non-negative number, got {seconds}"
        )));
    }
    let session = open_session(options)?;
    let tolerance = match session.device {
        DeviceSpec::Sim(_) => 0,
        DeviceSpec::Cuda(_) => 2 << 20,
    };
    let report = session.devices.current().with_allocator(|allocator| {
        soak::soak(
            allocator,
            std::time::Duration::from_secs_f64(seconds),
            seed,
            tolerance,
        )
    });
    println!(
        "{}",
        report.render(
            &session.device.to_string(),
            seconds,
            seed,
            options.config.text()
        )
    );
    match report.fault {
        None => Ok(()),
        Some(_) => Err(CliError::Reported(Exit::Failure)),
    }
}

/// `gpumem bench randn`: needs a CUDA device.
fn bench_randn(options: &SessionOptions, reps: u32, torch_script: &Path) -> Result<(), CliError> {
    let index = match options.device {
        None => 0,
        Some(DeviceSpec::Cuda(index)) => index,
        Some(DeviceSpec::Sim(_)) => {
            return Err(CliError::Usage(
                "bench randn measures a CUDA device; use --device cuda[:N]".into(),
            ))
        }
    };
    // The session decides the config (flag, environment, defaults) as for every command.
    let session = session::open(&SessionOptions {
        device: Some(DeviceSpec::Cuda(index)),
        config: options.config.clone(),
        devices: None,
    })?;
    let report =
        crate::cli::bench::randn::randn(&session.devices.current(), index, reps, torch_script)
            .map_err(|error| CliError::Usage(format!("cannot use cuda:{index}: {error}")))?;
    println!("{report}");
    Ok(())
}
