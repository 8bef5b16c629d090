//! `gpumem bench tune`: how `--tune`'s throughput scales with threads. The same configs are
//! replayed on 1, 2, 4, ... threads over one synthetic snapshot; each run's replays per second
//! against the one-thread run's gives the scaling and, divided by the threads, the
//! efficiency (the issue asks for at least 0.8).
//!
//! Where efficiency is lost, two more columns tell: `replay s`, the mean seconds of one replay
//! (against the one-thread run's, how much slower each replay ran while the threads shared the
//! machine: caches, memory, the kernel's page cache, a lower clock with every core busy, two
//! threads on one physical core), and `busy`, the share of the threads' time spent replaying
//! (below 1 when threads waited for the slowest one at the end). Efficiency is about
//! `busy` / (`replay s` / its one-thread value).

use std::path::Path;
use std::time::Instant;

use gpumem::snapshot::replay::tune::{tune_timed, Grid, TuneOptions};
use gpumem::snapshot::replay::ReplayOptions;

use crate::cli::out::say;
use crate::cli::CliError;

/// One run's figures.
struct Run {
    threads: usize,
    replays: usize,
    events: u64,
    seconds: f64,
    /// Seconds of all its replays together (each on its own thread).
    replaying: f64,
}

impl Run {
    fn events_per_second(&self) -> f64 {
        (self.replays as u64 * self.events) as f64 / self.seconds
    }

    /// Mean seconds of one replay.
    fn replay_seconds(&self) -> f64 {
        self.replaying / self.replays.max(1) as f64
    }

    /// The share of the threads' time spent replaying.
    fn busy(&self) -> f64 {
        self.replaying / (self.threads as f64 * self.seconds)
    }
}

/// The thread counts measured when none are given: 1, the powers of two below the cores, and
/// the cores.
pub fn default_threads(cores: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1_usize), |n| n.checked_mul(2))
        .take_while(|&n| n < cores)
        .collect();
    counts.push(cores.max(1));
    counts.dedup();
    counts
}

/// Measures `--tune` on `path` (written with `events` events first when it does not exist) with
/// each thread count in `threads`; `replays` replays per run (`None`: twice the most threads,
/// so that every thread has the same share).
pub fn bench(
    path: &Path,
    events: u64,
    threads: &[usize],
    replays: Option<usize>,
) -> Result<(), CliError> {
    let generated = !path.exists();
    if generated {
        let start = Instant::now();
        let (bytes, written) =
            super::replay::write_synthetic(path, events, 1).map_err(CliError::Failed)?;
        say!(
            "generated {written} events ({:.1} MB) in {:.2} s: {}",
            bytes as f64 / 1e6,
            start.elapsed().as_secs_f64(),
            path.display()
        );
    }
    let most = threads.iter().copied().max().unwrap_or(1);
    let replays = replays.unwrap_or(2 * most).max(1);
    // The tune adds the job's own config to the grid's: the grid holds one config less.
    let configs = Grid::default_grid("");
    if replays > configs.len() {
        return Err(CliError::Usage(format!(
            "bench tune: at most {} replays (the default grid's configs and the job's own)",
            configs.len()
        )));
    }
    let text: String = configs.configs()[1..replays]
        .iter()
        .map(|conf| format!("conf = {conf}\n"))
        .collect();
    let grid = Grid::parse(&text, "").map_err(|error| CliError::Failed(error.to_string()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    say!(
        "tune throughput: {replays} replays of {} per run, {cores} cores",
        path.display()
    );
    say!(
        "{:>7} {:>9} {:>11} {:>13} {:>8} {:>10} {:>9} {:>6}",
        "threads",
        "wall s",
        "replays/s",
        "M events/s",
        "scaling",
        "efficiency",
        "replay s",
        "busy"
    );
    let mut single: Option<f64> = None;
    for &count in threads {
        let options = TuneOptions {
            replay: ReplayOptions::default(),
            grid: grid.clone(),
            threads: Some(count),
        };
        let start = Instant::now();
        let (ranking, times) = tune_timed(path, &options, &|_| {})
            .map_err(|error| CliError::Failed(format!("{}: {error}", path.display())))?;
        let run = Run {
            threads: ranking.threads,
            replays: ranking.replays,
            events: ranking.events,
            seconds: start.elapsed().as_secs_f64(),
            replaying: times.iter().map(|time| time.seconds).sum(),
        };
        let rate = run.events_per_second();
        let base = *single.get_or_insert(rate / run.threads as f64);
        let scaling = rate / base;
        say!(
            "{:>7} {:>9.2} {:>11.2} {:>13.2} {:>8.2} {:>10.2} {:>9.2} {:>6.2}",
            run.threads,
            run.seconds,
            run.replays as f64 / run.seconds,
            rate / 1e6,
            scaling,
            scaling / run.threads as f64,
            run.replay_seconds(),
            run.busy()
        );
    }
    if let Some(kib) = super::replay::peak_rss_kib() {
        say!(
            "peak RSS (VmHWM) over all runs: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    if generated {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}
