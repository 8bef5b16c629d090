//! `gpumem diff A B`: two jobs compared (the work is `gpumem::snapshot::diff`), as text or
//! JSON; with `--max-peak-increase PCT` the exit status is the CI gate's verdict.

use std::path::PathBuf;

use gpumem::alloc::format::format_size;
use gpumem::snapshot::diff::{diff, DiffOptions, DiffReport, JobFigures, SiteChange};
use gpumem::snapshot::replay::ReplayOptions;

use super::out::say;
use super::{CliError, Exit};

/// Sites listed per group; the rest are counted.
const SHOWN: usize = 10;

/// What `gpumem diff` was asked.
pub struct DiffArgs {
    /// The baseline snapshot.
    pub a: PathBuf,
    /// The snapshot compared with it.
    pub b: PathBuf,
    /// The device and placement of both replays.
    pub replay: ReplayOptions,
    /// `--max-peak-increase PCT`.
    pub max_peak_increase: Option<f64>,
    /// `--json`.
    pub json: bool,
}

/// `gpumem diff`: exit 1 when the gate fails.
pub fn command(args: &DiffArgs) -> Result<(), CliError> {
    if let Some(pct) = args.max_peak_increase {
        if !(pct.is_finite() && pct >= 0.0) {
            return Err(CliError::Usage(format!(
                "--max-peak-increase must be a percentage of at least 0, got {pct}"
            )));
        }
    }
    let options = DiffOptions {
        replay: args.replay.clone(),
        max_increase_pct: args.max_peak_increase,
    };
    let report = diff(&args.a, &args.b, &options).map_err(|e| CliError::Usage(e.to_string()))?;
    if args.json {
        let text = serde_json::to_string(&report)
            .map_err(|error| CliError::Failed(format!("cannot write JSON: {error}")))?;
        say!("{text}");
    } else {
        print(&report);
    }
    match &report.gate {
        Some(gate) if !gate.passed => Err(CliError::Reported(Exit::Failure)),
        _ => Ok(()),
    }
}

fn signed_size(change: i64) -> String {
    let sign = if change < 0 { "-" } else { "+" };
    format!("{sign}{}", format_size(change.unsigned_abs()))
}

fn pct(change: Option<f64>, a: u64, b: u64) -> String {
    match change {
        Some(pct) => format!("{pct:+.1}%"),
        None if b == a => "=".into(),
        None => "new".into(),
    }
}

fn print(report: &DiffReport) {
    let (a, b) = (&report.a, &report.b);
    say!("diff of A {} and B {}", a.file, b.file);
    let conf = |job: &JobFigures| {
        if job.alloc_conf.is_empty() {
            "(defaults)".to_string()
        } else {
            job.alloc_conf.clone()
        }
    };
    say!(
        "  configs        A {}, B {} (each file's own)",
        conf(a),
        conf(b)
    );
    let windows: Vec<&str> = [("A", a), ("B", b)]
        .into_iter()
        .filter(|(_, job)| job.window_only)
        .map(|(name, _)| name)
        .collect();
    if !windows.is_empty() {
        say!(
            "  window only    {} starts mid-run (PyTorch's history ring kept only its last max_entries events, or recording began late): its peaks and counts are its trace's window's, and the job's may lie before it",
            windows.join(" and ")
        );
    }
    say!("{:<18} {:>14} {:>14} {:>14}", "", "A", "B", "change");
    let sizes = |what: &str, x: u64, y: u64, change: Option<f64>| {
        say!(
            "{what:<18} {:>14} {:>14} {:>14}",
            format_size(x),
            format_size(y),
            pct(change, x, y)
        );
    };
    sizes(
        "peak reserved",
        a.peak_reserved,
        b.peak_reserved,
        report.peak_reserved_increase_pct,
    );
    sizes(
        "peak allocated",
        a.peak_allocated,
        b.peak_allocated,
        report.peak_allocated_increase_pct,
    );
    let counts = |what: &str, x: u64, y: u64| {
        say!(
            "{what:<18} {x:>14} {y:>14} {:>14}",
            format!("{:+}", i128::from(y) - i128::from(x))
        );
    };
    counts("segments at peak", a.peak_segments, b.peak_segments);
    counts("cudaMalloc calls", a.device_allocs, b.device_allocs);
    counts("retries", a.retries, b.retries);
    counts("OOMs (replayed)", a.ooms, b.ooms);
    counts("OOMs (recorded)", a.recorded_ooms, b.recorded_ooms);
    counts("events", a.events, b.events);
    say!();
    let event = |job: &JobFigures| {
        job.sites
            .allocated
            .event
            .map_or_else(|| "none".to_string(), |e| e.to_string())
    };
    say!(
        "allocation sites by bytes live at each job's peak of allocated memory (A after event {}, B after event {})",
        event(a),
        event(b)
    );
    for job in [a, b] {
        if let Some(note) = &job.sites.frames_note {
            say!("  {}: {note}", job.file);
        }
    }
    let sites = &report.sites;
    group("grown", &sites.grown);
    group("added", &sites.added);
    group("removed", &sites.removed);
    group("shrunk", &sites.shrunk);
    say!("  unchanged: {} sites", sites.unchanged);
    if let Some(gate) = &report.gate {
        say!();
        if gate.passed {
            say!(
                "gate: passed (neither peak grew by more than {}%)",
                gate.max_increase_pct
            );
        } else {
            for failure in &gate.failures {
                say!("gate: FAILED: B's {failure}");
            }
        }
    }
}

fn group(what: &str, list: &[SiteChange]) {
    if list.is_empty() {
        return;
    }
    say!("  {what} ({}):", list.len());
    for site in list.iter().take(SHOWN) {
        say!(
            "    {:>13}  {}  ({} in {} blocks -> {} in {} blocks)",
            signed_size(site.change),
            site.label,
            format_size(site.a_bytes),
            site.a_blocks,
            format_size(site.b_bytes),
            site.b_blocks
        );
    }
    if list.len() > SHOWN {
        say!("    ... {} more (--json lists all)", list.len() - SHOWN);
    }
}
