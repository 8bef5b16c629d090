//! `gpumem replay FILE --tune`: the ranking of allocator configs for one job (the work is
//! `gpumem::snapshot::replay::tune`), as a table with the best config ready to paste, or as
//! JSON.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use gpumem::alloc::format::format_size;
use gpumem::alloc::AllocConf;
use gpumem::device::DeviceSpec;
use gpumem::snapshot::replay::tune::{tune, Grid, TuneOptions, TuneRanking, TuneRow};
use gpumem::snapshot::replay::{replay, CapacitySource, ReplayOptions};

use super::out::say;
use super::{CliError, Drawn, EndState, Outputs};

/// What `--tune` was asked.
pub struct TuneArgs {
    /// The snapshot.
    pub file: PathBuf,
    /// The device and placement of every replay.
    pub replay: ReplayOptions,
    /// `--alloc-conf`: the config every grid config starts from.
    pub base: String,
    /// `--grid FILE`.
    pub grid: Option<PathBuf>,
    /// `--threads N`.
    pub threads: Option<usize>,
    /// `--json`.
    pub json: bool,
    /// `--report FILE`: the report of the best config's replay, with the ranking.
    pub report: Option<PathBuf>,
}

/// The simulated device's size from `--capacity` and `--device sim:SIZE`, which must agree
/// when both are given (`None`: the simulated H200).
pub fn capacity(
    device: Option<&DeviceSpec>,
    capacity: Option<u64>,
) -> Result<Option<u64>, CliError> {
    let from_device = match device {
        None => None,
        Some(DeviceSpec::Sim(sizes)) => match sizes.as_slice() {
            [size] => *size,
            _ => return Err(CliError::Usage(
                "replays run on one simulated device: use --capacity SIZE or --device sim[:SIZE]"
                    .into(),
            )),
        },
        Some(DeviceSpec::Cuda(_)) => {
            return Err(CliError::Usage(
                "replays run on a simulated device: use --capacity SIZE or --device sim[:SIZE]"
                    .into(),
            ))
        }
    };
    match (from_device, capacity) {
        (Some(device), Some(given)) if device != given => Err(CliError::Usage(format!(
            "--capacity {given} and --device sim:{device} disagree: give one"
        ))),
        (device, given) => Ok(given.or(device)),
    }
}

/// Reads the grid: the file's, else the default one.
fn grid(args: &TuneArgs) -> Result<Grid, CliError> {
    let Some(path) = &args.grid else {
        return Ok(Grid::default_grid(&args.base));
    };
    let text = super::read_text(path, "a grid").map_err(CliError::Io)?;
    Grid::parse(&text, &args.base)
        .map_err(|error| CliError::Usage(format!("--grid {}: {error}", path.display())))
}

/// A progress bar on stderr when it is a terminal: the file's bytes times the replays.
fn progress_bar(file: &Path, replays: u64, threads: usize) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bytes = std::fs::metadata(file).ok()?.len();
    let bar = ProgressBar::new(bytes.saturating_mul(replays));
    let style =
        ProgressStyle::with_template("tuning {bar:40} {percent}% {msg} ({eta} left)").ok()?;
    bar.set_style(style);
    bar.set_message(format!("{replays} replays on {threads} threads"));
    Some(bar)
}

/// `gpumem replay FILE --tune`.
pub fn command(args: &TuneArgs) -> Result<(), CliError> {
    let grid = grid(args)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let options = TuneOptions {
        replay: args.replay.clone(),
        grid,
        threads: Some(threads),
    };
    let bar = progress_bar(&args.file, options.grid.len() as u64 + 1, threads);
    let start = Instant::now();
    let ranking = tune(&args.file, &options, &|bytes| {
        if let Some(bar) = &bar {
            bar.inc(bytes);
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let ranking =
        ranking.map_err(|error| CliError::Usage(format!("{}: {error}", args.file.display())))?;
    let text = render(&ranking, start.elapsed().as_secs_f64());
    if let (Some(path), Some(best)) = (&args.report, ranking.best()) {
        write_report(args, path, best, &text)?;
    }
    if args.json {
        let json = serde_json::to_string(&ranking)
            .map_err(|error| CliError::Failed(format!("cannot write JSON: {error}")))?;
        say!("{json}");
    } else {
        say!("{}", text.trim_end());
    }
    Ok(())
}

/// `--tune --report FILE`: the best config's replay drawn, with the ranking as its summary.
fn write_report(
    args: &TuneArgs,
    path: &Path,
    best: &TuneRow,
    ranking: &str,
) -> Result<(), CliError> {
    let failed = |error: gpumem::snapshot::replay::ReplayError| {
        CliError::Usage(format!("{}: {error}", args.file.display()))
    };
    let conf = AllocConf::parse(&best.alloc_conf)
        .map_err(|error| CliError::Failed(format!("the best config does not parse: {error}")))?;
    let options = ReplayOptions {
        conf: Some(conf),
        ..args.replay.clone()
    };
    let report = replay(&args.file, &options, &mut |_, _| {}).map_err(failed)?;
    let timeline = super::replay::record(&args.file, &report)?;
    let outputs = Outputs {
        timeline: Vec::new(),
        report: Some(path.to_path_buf()),
    };
    outputs.write(&EndState {
        title: format!("{} (--tune: the best config)", args.file.display()),
        device: "sim".into(),
        timelines: vec![Drawn {
            label: format!("best config: {}", best.alloc_conf),
            timeline,
            config: report.alloc_conf.clone(),
            counters: report.final_stats.clone(),
            summary: format!("{report}\n{ranking}"),
        }],
        comparison: None,
        headline: Some(super::replay::headline(
            &format!(
                "best config ({}): {}",
                if best.alloc_conf.is_empty() {
                    "PyTorch's defaults"
                } else {
                    &best.alloc_conf
                },
                report.verdict().text
            ),
            &report,
        )),
    })
}

/// The ranking as text: a table of every config, the configs left out, and the best config
/// with its line to paste last.
pub fn render(ranking: &TuneRanking, seconds: f64) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    macro_rules! say {
        () => { let _ = writeln!(out); };
        ($($arg:tt)*) => { let _ = writeln!(out, $($arg)*); };
    }
    macro_rules! say_part {
        ($($arg:tt)*) => { let _ = write!(out, $($arg)*); };
    }
    let capacity_note = match ranking.capacity_source {
        CapacitySource::DefaultH200 => "the simulated H200; --capacity SIZE sets another",
        CapacitySource::Given => "given",
    };
    say!(
        "tune of {}: {} configs replayed on {} ({capacity_note}), {} events each, in {seconds:.1} s on {} threads",
        ranking.file,
        ranking.configs.len(),
        format_size(ranking.capacity),
        ranking.events,
        ranking.threads
    );
    for note in &ranking.notes {
        say!("  note: {note}");
    }
    say!(
        "{:>4}  {:<4} {:>13} {:>14} {:>14} {:>7} {:>6}  config",
        "rank",
        "fits",
        "peak reserved",
        "peak allocated",
        "cudaMalloc/map",
        "retries",
        "OOMs"
    );
    for row in &ranking.configs {
        let conf = if row.alloc_conf.is_empty() {
            "(defaults)"
        } else {
            &row.alloc_conf
        };
        say_part!(
            "{:>4}  {:<4} {:>13} {:>14} {:>14} {:>7} {:>6}  {conf}",
            row.rank,
            match (row.fits, row.borderline) {
                (true, _) => "yes",
                (false, false) => "no",
                (false, true) => "no~",
            },
            format_size(row.peak_reserved),
            format_size(row.peak_allocated),
            row.device_allocs,
            row.retries,
            row.ooms
        );
        if row.recorded {
            say_part!("  <- the job's own config");
        }
        say!();
    }
    if ranking.configs.iter().any(|row| row.borderline) {
        say!("~ borderline: it fits with the segments where the recording's driver put them, or with every segment placed by the simulator's model, not both (where the driver puts segments decides)");
    }
    if !ranking.skipped.is_empty() {
        say!("not ranked ({}):", ranking.skipped.len());
        for skipped in &ranking.skipped {
            say!("  {}: {}", skipped.alloc_conf, skipped.reason);
        }
    }
    let Some(best) = ranking.best() else {
        say!("no config was replayed");
        return out;
    };
    let verdict = if best.fits && ranking.window_only {
        format!(
            "fits on {} ({})",
            format_size(ranking.capacity),
            gpumem::snapshot::replay::verdict::WINDOW_ONLY
        )
    } else if best.fits {
        format!("fits on {}", format_size(ranking.capacity))
    } else {
        format!(
            "no config fits on {}; this one fails the fewest allocations ({})",
            format_size(ranking.capacity),
            best.ooms
        )
    };
    let against = match ranking.recorded() {
        Some(own) if own.rank != best.rank => format!(
            "; the job's own config (rank {}) peaks at {} reserved with {} cudaMalloc/map calls",
            own.rank,
            format_size(own.peak_reserved),
            own.device_allocs
        ),
        Some(_) => "; it is the job's own config".to_string(),
        None => String::new(),
    };
    say!(
        "best config: {verdict}, peak reserved {}, {} cudaMalloc/map calls, {} retries{against}",
        format_size(best.peak_reserved),
        best.device_allocs,
        best.retries
    );
    say!("{}", best.env_line());
    out
}
