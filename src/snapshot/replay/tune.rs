//! `gpumem replay FILE --tune`: the job replayed under a grid of allocator configs, every core
//! replaying a different config, and the configs ranked: those that fit first, then by peak
//! reserved memory, `cudaMalloc`/map calls and retries.
//!
//! The grid ([`Grid`]) is the default one ([`Grid::default_grid`]) or read from a file
//! ([`Grid::parse`], the format below). Each config is checked by PyTorch's own rules
//! ([`AllocConf::parse`]) before anything runs: one PyTorch would refuse is listed with
//! PyTorch's reason and not replayed, and so is one whose `garbage_collection_threshold`
//! cannot act (PyTorch 2.11 collects only under a memory fraction below 1).
//!
//! Replays of different configs share nothing but the file: each worker thread streams it
//! through its own allocator, so memory is (threads × live blocks), whatever the trace's
//! length, and the work scales with the cores.
//!
//! # Grid files
//!
//! One axis per line, `KEY = VALUE, VALUE, ...`: the grid is every combination of the axes'
//! values, the first axis varying slowest. `none` leaves the key out (PyTorch's default). A
//! value may be a bracketed list (`roundup_power2_divisions = none, [256:1,>:4]`). A line
//! `conf = TEXT` adds one whole config as it is. `#` starts a comment.
//!
//! ```text
//! expandable_segments = none, True
//! max_split_size_mb = none, 128, 512
//! garbage_collection_threshold = none, 0.8
//! per_process_memory_fraction = none, 0.9
//! conf = max_split_size_mb:300,roundup_power2_divisions:[256:1,>:4]
//! ```

use std::cmp::Ordering;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as Atomic};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;

use super::recording::same_behaviour;
use super::{replay, CapacitySource, ReplayError, ReplayOptions, ReplayReport};
use crate::alloc::config::{COMMON_KEYS, CUDA_KEYS};
use crate::alloc::AllocConf;

/// The memory fraction the default grid gives its `garbage_collection_threshold` configs when
/// the base config sets none: PyTorch 2.11 collects only under a fraction below 1.
pub const GC_FRACTION: f64 = 0.95;

/// The default grid's axes: 2 × 6 × 4 × 3 = 144 configs.
const DEFAULT_AXES: [(&str, &[&str]); 4] = [
    ("expandable_segments", &["none", "True"]),
    (
        "max_split_size_mb",
        &["none", "64", "128", "256", "512", "1024"],
    ),
    ("roundup_power2_divisions", &["none", "2", "4", "8"]),
    ("garbage_collection_threshold", &["none", "0.6", "0.8"]),
];

/// A grid file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GridError {
    /// A line is not `KEY = VALUE, ...` or `conf = TEXT`, or names a key PyTorch does not know.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file gives no config.
    #[error("the grid gives no config (no axis and no 'conf =' line)")]
    Empty,
}

/// The configs to replay, in PyTorch's syntax, in grid order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    configs: Vec<String>,
    /// What the grid did on its own (the fraction its gc configs got).
    notes: Vec<String>,
}

impl Grid {
    /// The default grid: `expandable_segments` off/on × `max_split_size_mb` none, 64, 128,
    /// 256, 512, 1024 × `roundup_power2_divisions` none, 2, 4, 8 × `garbage_collection_threshold`
    /// none, 0.6, 0.8. Each config starts from `base` (PyTorch's syntax, may be empty). A
    /// garbage-collection config also gets `per_process_memory_fraction:`[`GC_FRACTION`] when
    /// `base` sets no fraction below 1: without one PyTorch never collects.
    pub fn default_grid(base: &str) -> Grid {
        let base_fraction = AllocConf::parse(base)
            .ok()
            .and_then(|conf| conf.per_process_memory_fraction)
            .is_some_and(|fraction| fraction < 1.0);
        let axes: Vec<(String, Vec<Option<String>>)> = DEFAULT_AXES
            .iter()
            .map(|(key, values)| (key.to_string(), values.iter().map(|v| value(v)).collect()))
            .collect();
        let mut configs = Vec::new();
        for combination in product(&axes) {
            let gc = combination
                .iter()
                .any(|(key, _)| key == "garbage_collection_threshold");
            let mut parts: Vec<String> = combination
                .into_iter()
                .map(|(key, value)| format!("{key}:{value}"))
                .collect();
            if gc && !base_fraction {
                parts.push(format!("per_process_memory_fraction:{GC_FRACTION}"));
            }
            configs.push(join(base, &parts.join(",")));
        }
        let notes = if base_fraction {
            Vec::new()
        } else {
            vec![format!(
                "garbage_collection_threshold acts only under a memory fraction below 1 (PyTorch 2.11), so its configs cap memory with per_process_memory_fraction:{GC_FRACTION} (part of the config to paste); give a fraction in --alloc-conf to use another"
            )]
        };
        Grid { configs, notes }
    }

    /// Reads a grid file's text (the format is in the module documentation); every config
    /// starts from `base`.
    pub fn parse(text: &str, base: &str) -> Result<Grid, GridError> {
        let mut axes: Vec<(String, Vec<Option<String>>)> = Vec::new();
        let mut singles = Vec::new();
        for (number, raw) in text.lines().enumerate() {
            let line = number + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let bad = |message: String| GridError::Line { line, message };
            let Some((key, values)) = content.split_once('=') else {
                return Err(bad(format!(
                    "expected 'KEY = VALUE, VALUE, ...' or 'conf = TEXT', found '{content}'"
                )));
            };
            let (key, values) = (key.trim(), values.trim());
            if key == "conf" {
                singles.push(join(base, values));
                continue;
            }
            if !COMMON_KEYS.contains(&key) && !CUDA_KEYS.contains(&key) {
                return Err(bad(format!(
                    "'{key}' is not a key of PyTorch's allocator config"
                )));
            }
            if axes.iter().any(|(known, _)| known == key) {
                return Err(bad(format!("'{key}' is already an axis")));
            }
            let values: Vec<Option<String>> = split_top_level(values)
                .into_iter()
                .map(|v| value(v.trim()))
                .collect();
            if values.iter().any(|v| v.as_deref() == Some("")) || values.is_empty() {
                return Err(bad(format!("'{key}' has an empty value")));
            }
            axes.push((key.to_string(), values));
        }
        let mut configs: Vec<String> = if axes.is_empty() {
            Vec::new()
        } else {
            product(&axes)
                .into_iter()
                .map(|combination| {
                    let parts: Vec<String> = combination
                        .into_iter()
                        .map(|(key, value)| format!("{key}:{value}"))
                        .collect();
                    join(base, &parts.join(","))
                })
                .collect()
        };
        configs.extend(singles);
        if configs.is_empty() {
            return Err(GridError::Empty);
        }
        Ok(Grid {
            configs,
            notes: Vec::new(),
        })
    }

    /// The configs, in grid order.
    pub fn configs(&self) -> &[String] {
        &self.configs
    }

    /// How many configs the grid has.
    pub fn len(&self) -> usize {
        self.configs.len()
    }

    /// Whether the grid has no config.
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }
}

/// An axis value: `none` is the key left out.
fn value(text: &str) -> Option<String> {
    (!text.eq_ignore_ascii_case("none")).then(|| text.to_string())
}

/// `base` and `more` as one config text.
fn join(base: &str, more: &str) -> String {
    match (base.trim().is_empty(), more.trim().is_empty()) {
        (true, _) => more.trim().to_string(),
        (false, true) => base.trim().to_string(),
        (false, false) => format!("{},{}", base.trim(), more.trim()),
    }
}

/// Splits at commas outside brackets.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0_i32, 0);
    for (at, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Every combination of the axes' values (the first axis varying slowest), each as the
/// (key, value) pairs of the values that are not `none`.
fn product(axes: &[(String, Vec<Option<String>>)]) -> Vec<Vec<(String, String)>> {
    let mut combinations: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (key, values) in axes {
        let mut next = Vec::with_capacity(combinations.len() * values.len());
        for combination in &combinations {
            for value in values {
                let mut extended = combination.clone();
                if let Some(value) = value {
                    extended.push((key.clone(), value.clone()));
                }
                next.push(extended);
            }
        }
        combinations = next;
    }
    combinations
}

/// One replayed config, ranked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TuneRow {
    /// 1-based rank.
    pub rank: usize,
    /// The config in PyTorch's syntax (`PYTORCH_CUDA_ALLOC_CONF`'s value; empty = defaults).
    pub alloc_conf: String,
    /// Whether every allocation succeeded on the capacity, under both placements when the
    /// replay was checked (`placement_check.rs`: a borderline config does not fit).
    pub fits: bool,
    /// Whether the answer depends on where the driver puts segments: the replay at the
    /// recording's addresses and the one with every segment placed by the simulator's model
    /// disagree on whether the job fits.
    pub borderline: bool,
    /// Allocations that failed (each skipped with its free: a peak then understates the job).
    pub ooms: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `num_device_alloc`: `cudaMalloc` calls, and page maps under expandable segments.
    pub device_allocs: u64,
    /// `num_device_free`.
    pub device_frees: u64,
    /// `num_alloc_retries`: mallocs that had to free cached memory and try again.
    pub retries: u64,
    /// Whether the allocator decides as under the config the file records (the job's own).
    pub recorded: bool,
}

impl TuneRow {
    fn of(alloc_conf: String, report: &ReplayReport, recorded: bool) -> TuneRow {
        let stat = |key: &str| report.stat(key).max(0) as u64;
        let verdict = report.verdict();
        TuneRow {
            rank: 0,
            alloc_conf,
            fits: verdict.fits,
            borderline: verdict.borderline,
            ooms: report.counts.ooms,
            peak_reserved: stat("reserved_bytes.all.peak"),
            peak_allocated: stat("allocated_bytes.all.peak"),
            device_allocs: stat("num_device_alloc"),
            device_frees: stat("num_device_free"),
            retries: stat("num_alloc_retries"),
            recorded,
        }
    }

    /// The config as a shell line, ready to paste: `PYTORCH_CUDA_ALLOC_CONF='...'`, or the
    /// advice to leave it unset for the defaults.
    pub fn env_line(&self) -> String {
        if self.alloc_conf.is_empty() {
            "unset PYTORCH_CUDA_ALLOC_CONF  # PyTorch's defaults".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF='{}'", self.alloc_conf)
        }
    }
}

/// A config of the grid that is not ranked, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The config as the grid gave it.
    pub alloc_conf: String,
    /// Why it is not ranked (PyTorch's reason for refusing it, an inert setting, a duplicate,
    /// or the error its replay stopped at).
    pub reason: String,
}

/// The ranking `--tune` prints, writes as JSON and hands to the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuneRanking {
    /// The snapshot.
    pub file: String,
    /// Total bytes of the simulated device.
    pub capacity: u64,
    /// Where that came from.
    pub capacity_source: CapacitySource,
    /// Trace events each replay went through.
    pub events: u64,
    /// Whether the trace starts mid-run, so a config that fits fits the window only
    /// (`verdict::WINDOW_ONLY`).
    pub window_only: bool,
    /// Worker threads used.
    pub threads: usize,
    /// Replays run: the job's own, and the grid's configs not left out beforehand (a config
    /// whose replay fails is run, then listed in `skipped`).
    pub replays: usize,
    /// The configs, best first.
    pub configs: Vec<TuneRow>,
    /// Configs of the grid not ranked: left out beforehand, or whose replay failed, with why.
    pub skipped: Vec<Skipped>,
    /// What the grid did on its own.
    pub notes: Vec<String>,
}

impl TuneRanking {
    /// The best config.
    pub fn best(&self) -> Option<&TuneRow> {
        self.configs.first()
    }

    /// The job's own config's row.
    pub fn recorded(&self) -> Option<&TuneRow> {
        self.configs.iter().find(|row| row.recorded)
    }
}

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// The device and placement every replay uses (its `conf` is ignored).
    pub replay: ReplayOptions,
    /// The configs.
    pub grid: Grid,
    /// Worker threads; `None` = one per core.
    pub threads: Option<usize>,
}

/// Told, from any worker thread, of bytes of the file replayed (summed over all configs:
/// the whole job is the file's size times the configs plus one).
pub type TuneProgress<'a> = &'a (dyn Fn(u64) + Sync);

/// One replay to run: a grid config, or the file's own.
struct Task {
    /// Position in the grid (`None`: the file's recorded config).
    position: Option<usize>,
    conf: Option<AllocConf>,
    text: String,
}

/// How long one replay of a tune took (wall clock, on its worker thread): `gpumem bench tune`
/// tells from these whether threads waited for work (uneven replays) or each replay ran slower
/// (threads contending for the machine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayTime {
    /// The worker thread that ran it (0-based).
    pub worker: usize,
    /// Its seconds.
    pub seconds: f64,
}

/// What one replay of a tune came to, and how long it took.
type Outcome = (Result<ReplayReport, ReplayError>, ReplayTime);

/// Replays `path` under each config of the grid and under its own, and ranks them.
pub fn tune(
    path: &Path,
    options: &TuneOptions,
    progress: TuneProgress<'_>,
) -> Result<TuneRanking, ReplayError> {
    tune_timed(path, options, progress).map(|(ranking, _)| ranking)
}

/// [`tune`], with how long each replay that ran took.
pub fn tune_timed(
    path: &Path,
    options: &TuneOptions,
    progress: TuneProgress<'_>,
) -> Result<(TuneRanking, Vec<ReplayTime>), ReplayError> {
    let (tasks, mut skipped) = plan(&options.grid);
    let file_bytes = std::fs::metadata(path).map_or(0, |meta| meta.len());
    let threads = options
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, tasks.len().max(1));
    let results: Vec<Mutex<Option<Outcome>>> = tasks.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (tasks_ref, results_ref, next_ref, failed_ref) = (&tasks, &results, &next, &failed);
    std::thread::scope(|scope| {
        for worker in 0..threads {
            let (tasks, results, next, failed) = (tasks_ref, results_ref, next_ref, failed_ref);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Atomic::Relaxed);
                if index >= tasks.len() || failed.load(Atomic::Relaxed) {
                    break;
                }
                let task = &tasks[index];
                let replay_options = ReplayOptions {
                    conf: task.conf.clone(),
                    ..options.replay.clone()
                };
                let mut told = 0_u64;
                let started = Instant::now();
                let result = replay(path, &replay_options, &mut |bytes, _| {
                    let bytes = bytes.min(file_bytes);
                    if bytes > told {
                        progress(bytes - told);
                        told = bytes;
                    }
                });
                let time = ReplayTime {
                    worker,
                    seconds: started.elapsed().as_secs_f64(),
                };
                progress(file_bytes.saturating_sub(told));
                // The job's own replay failing means the file does: stop the others.
                if result.is_err() && task.position.is_none() {
                    failed.store(true, Atomic::Relaxed);
                }
                if let Ok(mut slot) = results[index].lock() {
                    *slot = Some((result, time));
                }
            });
        }
    });
    let mut reports = Vec::with_capacity(tasks.len());
    let mut times = Vec::with_capacity(tasks.len());
    for (task, slot) in tasks.iter().zip(results) {
        let outcome = slot.into_inner().ok().flatten().map(|(result, time)| {
            times.push(time);
            result
        });
        match (outcome, task.position) {
            (Some(Ok(report)), _) => reports.push((task, report)),
            // The file itself cannot be replayed (the job's own config runs first).
            (Some(Err(error)), None) => return Err(error),
            // The file replays under its own config, so this config is what fails.
            (Some(Err(error)), Some(position)) => skipped.push((
                position,
                Skipped {
                    alloc_conf: task.text.clone(),
                    reason: format!("its replay failed: {error}"),
                },
            )),
            // Left when the job's own replay failed, whose error comes first in task order.
            (None, _) => {}
        }
    }
    let Some(own) = reports
        .iter()
        .find(|(task, _)| task.position.is_none())
        .map(|(_, report)| report.clone())
    else {
        return Err(ReplayError::Allocator(
            "the replay under the file's own config did not run".into(),
        ));
    };
    let mut rows: Vec<(Option<usize>, TuneRow)> = Vec::new();
    let mut own_in_grid = false;
    for (task, report) in &reports {
        let Some(position) = task.position else {
            continue;
        };
        let recorded = same_behaviour(&report.conf, &own.conf);
        own_in_grid |= recorded;
        rows.push((
            Some(position),
            TuneRow::of(task.text.clone(), report, recorded),
        ));
    }
    if !own_in_grid {
        rows.push((None, TuneRow::of(own.alloc_conf.clone(), &own, true)));
    }
    rows.sort_by(|(a_position, a), (b_position, b)| {
        order(a, b).then_with(|| match (a_position, b_position) {
            (Some(a), Some(b)) => a.cmp(b),
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (None, None) => Ordering::Equal,
        })
    });
    let configs = rows
        .into_iter()
        .enumerate()
        .map(|(index, (_, mut row))| {
            row.rank = index + 1;
            row
        })
        .collect();
    skipped.sort_by_key(|entry| entry.0);
    let ranking = TuneRanking {
        file: path.display().to_string(),
        capacity: own.capacity,
        capacity_source: own.capacity_source,
        events: own.counts.events,
        window_only: own.start.is_some(),
        threads,
        replays: tasks.len(),
        configs,
        skipped: skipped.into_iter().map(|(_, entry)| entry).collect(),
        notes: options.grid.notes.clone(),
    };
    Ok((ranking, times))
}

/// The tasks for a grid: the file's own config first (its failure is the file's), then the
/// grid's configs PyTorch accepts and that act, first seen first; and the configs left out,
/// with their grid positions.
fn plan(grid: &Grid) -> (Vec<Task>, Vec<(usize, Skipped)>) {
    let mut tasks: Vec<Task> = vec![Task {
        position: None,
        conf: None,
        text: String::new(),
    }];
    let mut skipped = Vec::new();
    for (position, text) in grid.configs.iter().enumerate() {
        let skip = |reason: String| {
            (
                position,
                Skipped {
                    alloc_conf: text.clone(),
                    reason,
                },
            )
        };
        let conf = match AllocConf::parse(text) {
            Ok(conf) => conf,
            Err(error) => {
                skipped.push(skip(format!("PyTorch refuses it: {error}")));
                continue;
            }
        };
        let fraction_caps = conf
            .per_process_memory_fraction
            .is_some_and(|fraction| fraction < 1.0);
        if conf.garbage_collection_threshold > 0.0 && !fraction_caps {
            skipped.push(skip(
                "garbage_collection_threshold acts only under a memory fraction below 1 (PyTorch 2.11): the same as without it; add per_process_memory_fraction".into(),
            ));
            continue;
        }
        if let Some(twin) = tasks.iter().find(|task| {
            task.conf
                .as_ref()
                .is_some_and(|known| same_behaviour(known, &conf))
        }) {
            skipped.push(skip(format!("the same config as '{}'", twin.text)));
            continue;
        }
        tasks.push(Task {
            position: Some(position),
            conf: Some(conf),
            text: text.clone(),
        });
    }
    (tasks, skipped)
}

/// How settings in a config text are counted, for the tie-break toward simpler configs.
fn settings(text: &str) -> usize {
    if text.trim().is_empty() {
        0
    } else {
        split_top_level(text).len()
    }
}

/// The ranking: configs that fit first (then fewer OOMs), lower peak reserved, fewer
/// `cudaMalloc`/map calls, fewer retries, lower peak allocated, fewer settings.
fn order(a: &TuneRow, b: &TuneRow) -> Ordering {
    b.fits
        .cmp(&a.fits)
        .then(a.ooms.cmp(&b.ooms))
        .then(a.peak_reserved.cmp(&b.peak_reserved))
        .then(a.device_allocs.cmp(&b.device_allocs))
        .then(a.retries.cmp(&b.retries))
        .then(a.peak_allocated.cmp(&b.peak_allocated))
        .then(settings(&a.alloc_conf).cmp(&settings(&b.alloc_conf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grid_covers_the_issue_and_pytorch_accepts_it() {
        let grid = Grid::default_grid("");
        assert_eq!(grid.len(), 144);
        assert_eq!(grid.configs()[0], "");
        let (tasks, skipped) = plan(&grid);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(tasks.len(), 145, "the grid and the file's own config");
        for needle in [
            "expandable_segments:True,max_split_size_mb:512,roundup_power2_divisions:8,garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
            "max_split_size_mb:64",
            "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.95",
        ] {
            assert!(grid.configs().iter().any(|c| c == needle), "{needle}");
        }
        assert!(!grid.notes.is_empty());
        let capped = Grid::default_grid("per_process_memory_fraction:0.5");
        assert!(capped.notes.is_empty());
        assert!(capped
            .configs()
            .iter()
            .all(|c| c.matches("per_process_memory_fraction").count() == 1));
    }

    #[test]
    fn a_grid_file_is_read_with_its_errors_named() {
        let text = "# a grid\nexpandable_segments = none, True\nroundup_power2_divisions = [256:1,>:4], 2  # list and scalar\nconf = max_split_size_mb:300\n";
        let grid = Grid::parse(text, "").expect("a grid");
        assert_eq!(
            grid.configs(),
            [
                "roundup_power2_divisions:[256:1,>:4]",
                "roundup_power2_divisions:2",
                "expandable_segments:True,roundup_power2_divisions:[256:1,>:4]",
                "expandable_segments:True,roundup_power2_divisions:2",
                "max_split_size_mb:300",
            ]
        );
        let error = |text: &str| Grid::parse(text, "").expect_err(text).to_string();
        assert_eq!(
            error("\n\nmax_split = 1"),
            "line 3: 'max_split' is not a key of PyTorch's allocator config"
        );
        assert!(error("expandable_segments True").starts_with("line 1: expected"));
        assert!(error("# nothing").contains("no config"));
        assert!(error("max_split_size_mb = 64,").contains("empty value"));
    }

    #[test]
    fn refused_inert_and_duplicate_configs_are_listed_not_replayed() {
        let text = "conf = max_split_size_mb:10\nconf = garbage_collection_threshold:0.6\nconf = roundup_power2_divisions:1\nconf = expandable_segments:False\nconf = \n";
        let grid = Grid::parse(text, "").expect("a grid");
        let (tasks, skipped) = plan(&grid);
        let reasons: Vec<&str> = skipped.iter().map(|(_, s)| s.reason.as_str()).collect();
        assert!(reasons[0].starts_with("PyTorch refuses it:"), "{reasons:?}");
        assert!(reasons[0].contains("max_split_size_mb"));
        assert!(reasons[1].contains("memory fraction below 1"));
        assert_eq!(reasons[2], "the same config as 'expandable_segments:False'");
        assert_eq!(
            tasks.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
            [
                "",
                "roundup_power2_divisions:1",
                "expandable_segments:False"
            ]
        );
    }

    #[test]
    fn configs_that_fit_rank_first_then_by_peak_and_calls() {
        let row = |conf: &str, fits: bool, reserved: u64, calls: u64| TuneRow {
            rank: 0,
            alloc_conf: conf.into(),
            fits,
            borderline: false,
            ooms: u64::from(!fits),
            peak_reserved: reserved,
            peak_allocated: 1,
            device_allocs: calls,
            device_frees: 0,
            retries: 0,
            recorded: false,
        };
        let mut rows = [
            row("a:1", false, 1, 1),
            row("b:1,c:2", true, 5, 3),
            row("d:1", true, 5, 3),
            row("e:1", true, 5, 2),
            row("", true, 6, 1),
        ];
        rows.sort_by(order);
        let names: Vec<&str> = rows.iter().map(|r| r.alloc_conf.as_str()).collect();
        assert_eq!(names, ["e:1", "d:1", "b:1,c:2", "", "a:1"]);
        assert_eq!(rows[4].env_line(), "PYTORCH_CUDA_ALLOC_CONF='a:1'");
        assert!(rows[3].env_line().starts_with("unset"));
    }

    #[test]
    fn a_file_that_cannot_be_replayed_is_the_error_not_a_skipped_config() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/replay/fixtures/convnet.default.pickle");
        let bytes = std::fs::read(&fixture).expect("the fixture");
        let truncated = std::env::temp_dir().join(format!(
            "gpumem-tune-truncated-{}.pickle",
            std::process::id()
        ));
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("written");
        let options = TuneOptions {
            replay: ReplayOptions::default(),
            grid: Grid::parse("expandable_segments = none, True", "").expect("a grid"),
            threads: Some(2),
        };
        let result = tune(&truncated, &options, &|_| {});
        let _ = std::fs::remove_file(&truncated);
        assert!(result.is_err(), "{result:?}");
        let whole = tune(&fixture, &options, &|_| {}).expect("the fixture replays");
        assert_eq!(whole.configs.len(), 2);
        assert!(whole.skipped.is_empty());
        assert_eq!(whole.replays, 3);
    }
}
