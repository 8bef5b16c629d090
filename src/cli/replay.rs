//! `gpumem replay FILE`: a PyTorch memory snapshot replayed through gpumem's allocator on a
//! simulated device (the work is `gpumem::snapshot::replay`); and `gpumem bench replay`.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use gpumem::alloc::format::format_size;
use gpumem::alloc::AllocConf;
use gpumem::device::DeviceSpec;
use gpumem::snapshot::replay::verdict::with_comparison;
use gpumem::snapshot::replay::{
    check_verdict, min_capacity_of, replay, replay_reading, replay_recording, CapacitySearch,
    Placement, Recording, ReplayError, ReplayOptions, ReplayReport,
};
use gpumem::viz::report::{Headline, Tone};
use gpumem::viz::{Recorder, Timeline};

use super::CliError;

/// `println!` that ignores a closed stdout (`gpumem replay x --json | head`) instead of
/// panicking.
macro_rules! say {
    () => { say!("") };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` without the newline, ignoring a closed stdout.
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Files smaller than this replay too fast for a progress bar to help.
const PROGRESS_MIN_BYTES: u64 = 16 << 20;

/// What `gpumem replay` was asked.
pub struct ReplayArgs {
    /// The snapshot.
    pub file: PathBuf,
    /// `--device`.
    pub device: Option<DeviceSpec>,
    /// `--alloc-conf` (the flag only: the file's recorded config is the default; the
    /// environment's variables are ignored, with a warning).
    pub alloc_conf: Option<String>,
    /// `--compare CONF...`.
    pub compare: Vec<String>,
    /// `--min-capacity`.
    pub min_capacity: bool,
    /// `--json`.
    pub json: bool,
    /// `--fail-on-oom`: exit 3 when the job does not fit.
    pub fail_on_oom: bool,
    /// `--placement`.
    pub placement: Placement,
    /// `--addresses-from RUN`.
    pub addresses_from: Option<PathBuf>,
    /// `--device-index N`.
    pub device_index: Option<u32>,
    /// `--timeline` and `--report`.
    pub outputs: super::Outputs,
}

fn parse_conf(text: &str, what: &str) -> Result<AllocConf, CliError> {
    AllocConf::parse(text).map_err(|error| {
        CliError::Usage(format!(
            "invalid allocator config '{text}' ({what}): {error}"
        ))
    })
}

fn replay_error(file: &Path, error: ReplayError) -> CliError {
    CliError::Usage(error.naming(file))
}

/// A progress bar on stderr for a large file when stderr is a terminal.
fn progress_bar(file: &Path) -> Option<ProgressBar> {
    let bytes = std::fs::metadata(file).ok()?.len();
    if bytes < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(bytes);
    let style =
        ProgressStyle::with_template("{prefix} {bar:40} {bytes}/{total_bytes} {msg} ({eta} left)")
            .ok()?;
    bar.set_style(style);
    Some(bar)
}

/// Runs `work` with a progress bar (for large files on a terminal) named `what`.
fn with_progress<T>(
    file: &Path,
    what: &'static str,
    work: impl FnOnce(&mut dyn FnMut(u64, u64)) -> Result<T, ReplayError>,
) -> Result<T, CliError> {
    let bar = progress_bar(file);
    if let Some(bar) = &bar {
        bar.set_prefix(what);
    }
    let mut progress = |bytes: u64, events: u64| {
        if let Some(bar) = &bar {
            bar.set_position(bytes);
            bar.set_message(format!("{events} events"));
        }
    };
    let result = work(&mut progress);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    result.map_err(|error| replay_error(file, error))
}

fn run_one(
    args: &ReplayArgs,
    recording: &Recording,
    options: &ReplayOptions,
) -> Result<ReplayReport, CliError> {
    with_progress(&args.file, "replaying", |progress| {
        let mut report =
            replay_recording(&args.file, recording, options, &mut *progress, Vec::new())?;
        check_verdict(&args.file, recording, options, &mut report, progress)?;
        Ok(report)
    })
}

/// One `--compare` config's replay and its capacity search.
struct Row {
    conf: String,
    report: ReplayReport,
    search: Option<CapacitySearch>,
}

/// Warns when the allocator config variables are set: replay reads its config from the file
/// (or `--alloc-conf`), never from the environment, whose variables describe this shell, not
/// the recorded job.
fn warn_about_environment(args: &ReplayArgs) {
    if args.alloc_conf.is_some() {
        return;
    }
    for name in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
        if let Ok(value) = std::env::var(name) {
            eprintln!(
                "gpumem: replay ignores {name}={value}: the file records the job's config; give --alloc-conf to replay under another"
            );
        }
    }
}

/// `gpumem replay`.
pub fn command(args: &ReplayArgs) -> Result<(), CliError> {
    let capacity = match &args.device {
        None => None,
        Some(DeviceSpec::Sim(sizes)) => match sizes.as_slice() {
            [size] => *size,
            _ => {
                return Err(CliError::Usage(
                    "replay runs on one simulated device: use --device sim[:SIZE]".into(),
                ))
            }
        },
        Some(DeviceSpec::Cuda(_)) => {
            return Err(CliError::Usage(
                "replay runs on a simulated device: use --device sim[:SIZE]".into(),
            ))
        }
    };
    warn_about_environment(args);
    let conf = match &args.alloc_conf {
        Some(text) => Some(parse_conf(text, "--alloc-conf")?),
        None => None,
    };
    if args.addresses_from.is_some() && args.placement != Placement::Recorded {
        return Err(CliError::Usage(
            "--addresses-from places segments at another recording's addresses: it needs --placement recorded".into(),
        ));
    }
    let options = ReplayOptions {
        capacity,
        conf: conf.clone(),
        placement: args.placement,
        device_index: args.device_index,
        addresses_from: args.addresses_from.clone(),
        ..ReplayOptions::default()
    };
    let (report, recording) = with_progress(&args.file, "replaying", |progress| {
        replay_reading(&args.file, &options, progress)
    })?;
    let sites = gpumem::snapshot::replay::peaks::sites_at_peaks(&args.file, &report)
        .map_err(|error| replay_error(&args.file, error))?;
    let search = |conf: Option<AllocConf>| -> Result<Option<CapacitySearch>, CliError> {
        if !args.min_capacity {
            return Ok(None);
        }
        with_progress(&args.file, "searching", |_| {
            min_capacity_of(&args.file, &recording, capacity, conf)
        })
        .map(Some)
    };
    let own_search = search(Some(report.conf.clone()))?;
    let mut rows = Vec::new();
    for text in &args.compare {
        let conf = parse_conf(text, "--compare")?;
        let options = ReplayOptions {
            capacity,
            conf: Some(conf.clone()),
            placement: args.placement,
            device_index: args.device_index,
            ..ReplayOptions::default()
        };
        let row = run_one(args, &recording, &options)?;
        let row_search = search(Some(conf))?;
        rows.push(Row {
            conf: text.clone(),
            report: row,
            search: row_search,
        });
    }
    let compared: Vec<(String, &ReplayReport)> = rows
        .iter()
        .map(|row| (row.conf.clone(), &row.report))
        .collect();
    let verdict = with_comparison(&report, &compared);
    if args.outputs.wanted() {
        let mut state = end_state(args, &report, &rows, &verdict)?;
        // The report's text of the main run names what holds memory at its peaks too.
        if let Some(main) = state.timelines.first_mut() {
            main.summary = format!("{}\n{}", main.summary, super::sites::render(&sites));
        }
        args.outputs.write(&state)?;
    }
    if args.json {
        let mut object = json_answer(&report, &verdict, own_search.as_ref(), &rows);
        object["sites_at_peaks"] = serde_json::to_value(&sites).unwrap_or_default();
        say!("{object}");
    } else {
        say_part!("{report}");
        if let Some(found) = &own_search {
            say!("  {}", describe_search(found, report.start.is_some()));
        }
        say!("{}", super::sites::render(&sites).trim_end());
        if !rows.is_empty() {
            print_comparison(&report, own_search.as_ref(), &rows);
            say!();
            say!("verdict: {verdict}");
        }
    }
    if args.fail_on_oom && !report.fits() {
        return Err(CliError::Reported(super::Exit::DoesNotFit));
    }
    Ok(())
}

/// The report's JSON with the searches, the compared configs and the verdict over them.
fn json_answer(
    report: &ReplayReport,
    verdict: &str,
    own_search: Option<&CapacitySearch>,
    rows: &[Row],
) -> serde_json::Value {
    let mut object = report.to_json();
    if let Some(found) = own_search {
        object["min_capacity"] = search_json(found, report.start.is_some());
    }
    if !rows.is_empty() {
        object["verdict"]["with_compare"] = json!(verdict);
        object["verdict"]["fits_under"] = rows
            .iter()
            .filter(|row| row.report.fits())
            .map(|row| json!(row.conf))
            .collect();
        object["compare"] = rows
            .iter()
            .map(|row| {
                let report = &row.report;
                let verdict = report.verdict();
                let mut entry = json!({
                    "alloc_conf": row.conf,
                    "fits": verdict.fits,
                    "verdict": verdict.text,
                    "borderline": verdict.borderline,
                    "placement_check": report.placement_check,
                    "timing_check": report.timing_check,
                    "ooms": report.counts.ooms,
                    "recorded_ooms_reproduced": report.counts.recorded_ooms_reproduced,
                    "first_oom_event": verdict.first_oom_event,
                    "peaks_lowered_by_failed_allocations": report.peaks_lowered(),
                    "allocated_bytes.all.peak": report.stat("allocated_bytes.all.peak"),
                    "reserved_bytes.all.peak": report.stat("reserved_bytes.all.peak"),
                    "num_device_alloc": report.stat("num_device_alloc"),
                    "num_alloc_retries": report.stat("num_alloc_retries"),
                });
                if let Some(found) = &row.search {
                    entry["min_capacity"] = search_json(found, report.start.is_some());
                }
                entry
            })
            .collect();
    }
    object
}

/// Replays `report`'s run once more with a timeline recording it (numbered by the file's
/// event indices, as the text numbers them).
pub(crate) fn record(file: &Path, report: &ReplayReport) -> Result<Timeline, CliError> {
    let recorder = Rc::new(RefCell::new(Recorder::empty(
        file.display().to_string(),
        report.capacity,
    )));
    gpumem::snapshot::replay::replay_observed(file, report, vec![Box::new(Rc::clone(&recorder))])
        .map_err(|error| replay_error(file, error))?;
    // The replay is over and its allocator gone: the recorder is ours alone.
    let mut recorder = Rc::try_unwrap(recorder)
        .map(RefCell::into_inner)
        .map_err(|_| CliError::Failed("the replay kept its timeline recorder".into()))?;
    // Numbers count every device's events from 1 (`replay::event_number`): the axis ends one
    // past the file's last.
    recorder.extend_to(report.counts.events + report.counts.other_device_events + 1);
    Ok(recorder.finish(Vec::new()))
}

/// What `--timeline` and `--report` show: the replay's timeline, and with `--compare` each
/// config's, with the comparison table.
fn end_state(
    args: &ReplayArgs,
    report: &ReplayReport,
    rows: &[Row],
    verdict_text: &str,
) -> Result<super::EndState, CliError> {
    let drawn = |label: String, run: &ReplayReport| -> Result<super::Drawn, CliError> {
        Ok(super::Drawn {
            label,
            timeline: record(&args.file, run)?,
            config: run.alloc_conf.clone(),
            counters: run.final_stats.clone(),
            summary: run.to_string(),
        })
    };
    let main = if rows.is_empty() {
        match report.alloc_conf.as_str() {
            "" => "replay under PyTorch's default config".to_string(),
            conf => format!("replay under {conf}"),
        }
    } else {
        recorded_name(report)
    };
    let mut timelines = vec![drawn(main, report)?];
    for row in rows {
        timelines.push(drawn(row.conf.clone(), &row.report)?);
    }
    let comparison = (!rows.is_empty()).then(|| {
        let line = |name: &str, run: &ReplayReport| {
            vec![
                name.to_string(),
                match (run.fits(), run.verdict().borderline) {
                    (true, _) => "fits".into(),
                    (false, false) => "does not fit".into(),
                    (false, true) => "does not fit (borderline)".into(),
                },
                format_size(run.stat("allocated_bytes.all.peak").max(0) as u64),
                format_size(run.stat("reserved_bytes.all.peak").max(0) as u64),
                run.stat("num_device_alloc").to_string(),
                run.stat("num_alloc_retries").to_string(),
                run.counts.ooms.to_string(),
                run.first_oom
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |oom| oom.index.to_string()),
            ]
        };
        let mut table = vec![line(&recorded_name(report), report)];
        table.extend(rows.iter().map(|row| line(&row.conf, &row.report)));
        gpumem::viz::report::Comparison {
            header: [
                "config",
                "verdict",
                "peak allocated",
                "peak reserved",
                "cudaMalloc",
                "retries",
                "OOMs",
                "first OOM at event",
            ]
            .map(String::from)
            .to_vec(),
            rows: table,
        }
    });
    Ok(super::EndState {
        title: args.file.display().to_string(),
        device: "sim".into(),
        timelines,
        comparison,
        headline: Some(headline(&format!("verdict: {verdict_text}"), report)),
    })
}

/// A report's lead line: `text`, in the tone of `report`'s verdict (borderline before fits;
/// a fit of a trace's window only is not shown as a plain fit either).
pub(crate) fn headline(text: &str, report: &ReplayReport) -> Headline {
    let verdict = report.verdict();
    let tone = match (verdict.fits, verdict.borderline) {
        (_, true) => Tone::Caution,
        (true, false) if verdict.window_only => Tone::Caution,
        (true, false) => Tone::Good,
        (false, false) => Tone::Bad,
    };
    Headline {
        text: text.to_string(),
        tone,
    }
}

/// The name the recorded (or given) config goes by in a comparison.
fn recorded_name(report: &ReplayReport) -> String {
    if report.alloc_conf.is_empty() {
        "(recorded: defaults)".to_string()
    } else {
        format!("(recorded) {}", report.alloc_conf)
    }
}

/// Runs `gpumem replay SNAPSHOT --report PATH` (on `--device sim:SIZE` with the model's
/// placement when a capacity is given: the synthetic trace's recorded placement is the H200's)
/// and prints what it cost.
fn bench_report(snapshot: &Path, wanted: &BenchReport) -> Result<(), CliError> {
    let args = ReplayArgs {
        file: snapshot.to_path_buf(),
        device: wanted
            .capacity
            .map(|bytes| DeviceSpec::Sim(vec![Some(bytes)])),
        alloc_conf: None,
        compare: Vec::new(),
        min_capacity: false,
        json: false,
        fail_on_oom: false,
        placement: if wanted.capacity.is_some() {
            Placement::Model
        } else {
            Placement::Recorded
        },
        addresses_from: None,
        device_index: None,
        outputs: super::Outputs {
            timeline: Vec::new(),
            report: Some(wanted.path.clone()),
        },
    };
    let start = Instant::now();
    command(&args)?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&wanted.path)
        .map_err(|error| CliError::Io(format!("cannot read {}: {error}", wanted.path.display())))?
        .len();
    say!(
        "report: {:.1} MiB ({bytes} bytes) written in {seconds:.2} s (two replays: the report, then the timeline) to {}",
        bytes as f64 / f64::from(1 << 20),
        wanted.path.display()
    );
    if let Some(kib) = crate::cli::bench::replay::peak_rss_kib() {
        say!(
            "peak RSS (VmHWM) after the report: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// `--min-capacity`'s answer in JSON; `window_only` when the trace starts mid-run, so the
/// capacity covers its window only (`verdict::WINDOW_ONLY`).
fn search_json(found: &CapacitySearch, window_only: bool) -> serde_json::Value {
    json!({
        "window_only": window_only,
        "capacity": found.capacity,
        "lower_bound": found.lower,
        "upper_bound": found.upper,
        "peak_allocated": found.peak,
        "simulated_context": found.context,
        "real_gpu_total": found.real_gpu,
        "real_gpu_context": found.real_context,
        "step": gpumem::snapshot::replay::search::STEP,
        "probes": found.probes,
        "borderline_from": found.borderline_from,
    })
}

/// `--min-capacity`'s answer in words; `window_only` as in [`search_json`].
fn describe_search(found: &CapacitySearch, window_only: bool) -> String {
    let bounds = format!(
        "searched in 2 MiB steps between {} (below it the peak of {} allocated does not fit beside the CUDA context) and {}; {} replays",
        format_size(found.lower),
        format_size(found.peak),
        format_size(found.upper),
        found.probes
    );
    let borderline = match found.borderline_from {
        Some(from) => format!(
            "; borderline from {} ({from} bytes): from there the job fits with its segments where the recording's driver put them, but not with every segment placed by the simulator's model, and where the driver puts them moves with memory no snapshot shows",
            format_size(from)
        ),
        None => String::new(),
    };
    let window = if window_only {
        format!("; {}", gpumem::snapshot::replay::verdict::WINDOW_ONLY)
    } else {
        String::new()
    };
    match (found.capacity, found.real_gpu) {
        (Some(bytes), Some(real)) => format!(
            "min capacity    {} ({bytes} bytes, --device sim:{bytes}) of simulated device, whose CUDA context is modelled as {} (the H200's 527 MiB, at most an eighth of the device); a real GPU needs about {} of total memory (cudaMemGetInfo's total), assuming the {} context measured on the H200{borderline}{window}; {bounds}",
            format_size(bytes),
            format_size(found.context),
            format_size(real),
            format_size(found.real_context)
        ),
        // Allocations failed on the largest device searched, so the peak there is lowered by
        // them and bounds nothing: no range was searched.
        _ => format!(
            "min capacity    does not fit even on {}, the largest device searched (give a larger one with --device sim:SIZE); {} replay{}",
            format_size(found.upper),
            found.probes,
            if found.probes == 1 { "" } else { "s" }
        ),
    }
}

fn print_comparison(report: &ReplayReport, own_search: Option<&CapacitySearch>, rows: &[Row]) {
    say!();
    let with_search = own_search.is_some();
    say_part!(
        "{:<44} {:>13} {:>13} {:>10} {:>8} {:>6} {:>13}",
        "config",
        "peak alloc",
        "peak reserv",
        "cudaMalloc",
        "retries",
        "OOMs",
        "verdict"
    );
    if with_search {
        say_part!(" {:>14}", "min capacity");
    }
    say!();
    let conf_name = recorded_name(report);
    let line = |name: &str, row: &ReplayReport, found: Option<&CapacitySearch>| {
        // A peak lowered by skipped allocations is marked: the job needs more than it shows.
        let mark = if row.peaks_lowered() { "*" } else { "" };
        let verdict = row.verdict();
        say_part!(
            "{:<44} {:>13} {:>13} {:>10} {:>8} {:>6} {:>13}",
            name,
            format!(
                "{}{mark}",
                format_size(row.stat("allocated_bytes.all.peak").max(0) as u64)
            ),
            format!(
                "{}{mark}",
                format_size(row.stat("reserved_bytes.all.peak").max(0) as u64)
            ),
            row.stat("num_device_alloc"),
            row.stat("num_alloc_retries"),
            verdict.ooms,
            match (verdict.fits, verdict.borderline) {
                (true, _) => "fits",
                (false, false) => "does not fit",
                (false, true) => "does not fit~",
            }
        );
        if let Some(found) = found {
            let text = match (found.capacity, found.borderline_from) {
                (None, _) => "does not fit".to_string(),
                (Some(capacity), None) => format_size(capacity),
                // Smaller devices fit at the recording's addresses only.
                (Some(capacity), Some(_)) => format!("{}~", format_size(capacity)),
            };
            say_part!(" {text:>14}");
        }
        say!();
    };
    line(&conf_name, report, own_search);
    for row in rows {
        line(&row.conf, &row.report, row.search.as_ref());
    }
    let lowered = std::iter::once(report)
        .chain(rows.iter().map(|row| &row.report))
        .any(ReplayReport::peaks_lowered);
    if lowered {
        say!("* lowered by failed allocations, which were skipped: the job needs more than this");
    }
    let borderline = std::iter::once(report)
        .chain(rows.iter().map(|row| &row.report))
        .any(|row| row.verdict().borderline);
    if borderline {
        say!("~ borderline: one placement of the segments fits and the other does not (the recording's addresses, the simulator's model); it fits only if both do");
    }
    let searches = std::iter::once(own_search)
        .chain(rows.iter().map(|row| row.search.as_ref()))
        .flatten();
    footnote_borderline_capacities(searches);
}

/// The footnote for `--compare`'s min capacity column, when a search found a range where the
/// answer depends on the placement.
fn footnote_borderline_capacities<'a>(mut searches: impl Iterator<Item = &'a CapacitySearch>) {
    if searches.any(|found| found.borderline_from.is_some()) {
        say!("~ min capacity: on somewhat smaller devices the job fits only with its segments where the recording's driver put them (how far down: borderline_from in --json)");
    }
}

/// `gpumem bench replay --report`: where the report goes and the device it is replayed on.
pub struct BenchReport {
    /// The HTML report to write.
    pub path: PathBuf,
    /// `--device sim:SIZE` (None: the simulated H200, where the synthetic job fits).
    pub capacity: Option<u64>,
}

/// `gpumem bench replay`: writes a synthetic snapshot of `events` events (unless `file`
/// exists), replays it and prints the rate and the peak resident memory; with `report`, then
/// runs `gpumem replay FILE --report PATH` on it and prints the page's size, the time and the
/// peak resident memory after it.
pub fn bench(
    events: u64,
    file: Option<&Path>,
    keep: bool,
    report_to: Option<&BenchReport>,
) -> Result<(), CliError> {
    let generated = file.is_none_or(|path| !path.exists());
    let path = match file {
        Some(path) => path.to_path_buf(),
        None => {
            std::env::temp_dir().join(format!("gpumem-bench-replay-{}.pickle", std::process::id()))
        }
    };
    if generated {
        let start = Instant::now();
        let (bytes, written) = crate::cli::bench::replay::write_synthetic(&path, events, 1)
            .map_err(CliError::Failed)?;
        say!(
            "generated {written} events ({:.1} MB) in {:.2} s: {}",
            bytes as f64 / 1e6,
            start.elapsed().as_secs_f64(),
            path.display()
        );
    }
    let rss_before = crate::cli::bench::replay::peak_rss_kib();
    let cpu_before = crate::cli::bench::replay::thread_cpu_ns();
    let start = Instant::now();
    let report = replay(&path, &ReplayOptions::default(), &mut |_, _| {})
        .map_err(|error| replay_error(&path, error));
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = match (cpu_before, crate::cli::bench::replay::thread_cpu_ns()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / 1e9),
        _ => None,
    };
    let measured = report.and_then(|report| {
        if let Some(wanted) = report_to {
            bench_report(&path, wanted)?;
        }
        Ok(report)
    });
    if generated && !keep {
        let _ = std::fs::remove_file(&path);
    }
    let report = measured?;
    let replayed = report.counts.events;
    say!(
        "replayed {replayed} events in {seconds:.2} s: {:.2} million events/s (wall clock)",
        replayed as f64 / seconds / 1e6
    );
    if let Some(cpu) = cpu_seconds {
        say!(
            "  on the CPU {cpu:.2} s: {:.2} million events/s of CPU time (the wall clock also counts other processes sharing the cores)",
            replayed as f64 / cpu / 1e6
        );
    }
    say!(
        "live at the end: {} blocks, peak allocated {}; segment events {} recorded, {} replayed, {} differ",
        report.stat("allocation.all.current"),
        format_size(report.stat("allocated_bytes.all.peak").max(0) as u64),
        report.segment_events.recorded,
        report.segment_events.replayed,
        report.segment_events.differing
    );
    match (rss_before, crate::cli::bench::replay::peak_rss_kib()) {
        (Some(before), Some(after)) => say!(
            "peak RSS (VmHWM): {:.1} MiB (before the replay: {:.1} MiB)",
            after as f64 / 1024.0,
            before as f64 / 1024.0
        ),
        _ => say!("peak RSS: not reported by this system"),
    }
    Ok(())
}
