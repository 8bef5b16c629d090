//! `gpumem diff A B`: two jobs' snapshots replayed (at once, one thread each) and compared:
//! their peaks, segments and OOMs, and their allocation sites by the bytes each holds at its
//! job's peak of allocated memory (sites added, removed, grown and shrunk). With a limit
//! ([`Gate`]), B fails when its peak reserved or allocated memory grew by more than a
//! percentage: a memory regression gate for CI.
//!
//! Memory is the two replays' (live blocks and distinct stacks), never the traces' length.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use super::model::Frame;
use super::replay::peaks::{sites_at_peaks, SitesAtPeaks};
use super::replay::{replay, ReplayError, ReplayOptions, ReplayReport};
use super::sites::{Site, SiteBytes};

/// One job's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobFigures {
    /// The snapshot.
    pub file: String,
    /// The config replayed under (the file's own; PyTorch's syntax, empty = defaults).
    pub alloc_conf: String,
    /// Trace events replayed.
    pub events: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `segment.all.peak`: the most segments held at once.
    pub peak_segments: u64,
    /// `num_device_alloc`: `cudaMalloc` calls (page maps under expandable segments).
    pub device_allocs: u64,
    /// `num_alloc_retries`.
    pub retries: u64,
    /// Allocations that failed in the replay.
    pub ooms: u64,
    /// `oom` events the file records.
    pub recorded_ooms: u64,
    /// Whether the trace starts mid-run: its peaks and counts are its window's, and the
    /// job's may lie before it (`verdict::WINDOW_ONLY`).
    pub window_only: bool,
    /// Memory at its peaks by allocation site.
    pub sites: SitesAtPeaks,
}

impl JobFigures {
    fn of(report: &ReplayReport, sites: SitesAtPeaks) -> JobFigures {
        let stat = |key: &str| report.stat(key).max(0) as u64;
        JobFigures {
            file: report.file.clone(),
            alloc_conf: report.alloc_conf.clone(),
            events: report.counts.events,
            peak_reserved: stat("reserved_bytes.all.peak"),
            peak_allocated: stat("allocated_bytes.all.peak"),
            peak_segments: stat("segment.all.peak"),
            device_allocs: stat("num_device_alloc"),
            retries: stat("num_alloc_retries"),
            ooms: report.counts.ooms,
            recorded_ooms: report.counts.recorded_ooms,
            window_only: report.start.is_some(),
            sites,
        }
    }
}

/// One site's bytes at each job's peak of allocated memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SiteChange {
    /// `file:line in name`, or "(no frames recorded)".
    pub label: String,
    /// The site (`None`: no frames recorded).
    pub site: Option<Site>,
    /// Bytes it holds at A's peak.
    pub a_bytes: u64,
    /// Bytes it holds at B's peak.
    pub b_bytes: u64,
    /// Blocks at A's peak.
    pub a_blocks: u64,
    /// Blocks at B's peak.
    pub b_blocks: u64,
    /// `b_bytes - a_bytes`.
    pub change: i64,
    /// The stack of its largest contributor (B's when B has the site, else A's).
    pub stack: Vec<Frame>,
}

/// The sites of two jobs, compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SiteChanges {
    /// In B only, largest first.
    pub added: Vec<SiteChange>,
    /// In A only, largest first.
    pub removed: Vec<SiteChange>,
    /// Holding more in B, by the most grown first.
    pub grown: Vec<SiteChange>,
    /// Holding less in B, by the most shrunk first.
    pub shrunk: Vec<SiteChange>,
    /// Sites holding the same bytes in both.
    pub unchanged: usize,
}

impl SiteChanges {
    /// Compares `a`'s sites with `b`'s.
    pub fn of(a: &[SiteBytes], b: &[SiteBytes]) -> SiteChanges {
        let in_a: HashMap<&Option<Site>, &SiteBytes> = a.iter().map(|s| (&s.site, s)).collect();
        let in_b: HashMap<&Option<Site>, &SiteBytes> = b.iter().map(|s| (&s.site, s)).collect();
        let mut changes = SiteChanges::default();
        for site in b {
            let before = in_a.get(&site.site).copied();
            let change = change(before, Some(site));
            match before {
                None => changes.added.push(change),
                Some(_) if change.change > 0 => changes.grown.push(change),
                Some(_) if change.change < 0 => changes.shrunk.push(change),
                Some(_) => changes.unchanged += 1,
            }
        }
        for site in a {
            if !in_b.contains_key(&site.site) {
                changes.removed.push(change(Some(site), None));
            }
        }
        changes.added.sort_by(|x, y| {
            y.b_bytes
                .cmp(&x.b_bytes)
                .then_with(|| x.label.cmp(&y.label))
        });
        changes.removed.sort_by(|x, y| {
            y.a_bytes
                .cmp(&x.a_bytes)
                .then_with(|| x.label.cmp(&y.label))
        });
        changes
            .grown
            .sort_by(|x, y| y.change.cmp(&x.change).then_with(|| x.label.cmp(&y.label)));
        changes
            .shrunk
            .sort_by(|x, y| x.change.cmp(&y.change).then_with(|| x.label.cmp(&y.label)));
        changes
    }
}

fn change(a: Option<&SiteBytes>, b: Option<&SiteBytes>) -> SiteChange {
    let (a_bytes, a_blocks) = a.map_or((0, 0), |s| (s.bytes, s.blocks));
    let (b_bytes, b_blocks) = b.map_or((0, 0), |s| (s.bytes, s.blocks));
    let named = b.or(a);
    SiteChange {
        label: named.map(|s| s.label.clone()).unwrap_or_default(),
        site: named.and_then(|s| s.site.clone()),
        a_bytes,
        b_bytes,
        a_blocks,
        b_blocks,
        change: i128::from(b_bytes)
            .saturating_sub(i128::from(a_bytes))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
        stack: named.map(|s| s.stack.clone()).unwrap_or_default(),
    }
}

/// The CI gate: B fails when a peak grew by more than `max_increase_pct` percent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gate {
    /// The largest growth allowed, in percent of A's peak.
    pub max_increase_pct: f64,
    /// Whether B stayed within it.
    pub passed: bool,
    /// Each peak that grew too much, in words.
    pub failures: Vec<String>,
}

/// Growth from `a` to `b` in percent of `a` (`None` when `a` is 0: any growth from nothing is
/// unbounded).
pub fn increase_pct(a: u64, b: u64) -> Option<f64> {
    (a > 0).then(|| (b as f64 - a as f64) / a as f64 * 100.0)
}

impl Gate {
    /// Checks `b`'s peaks against `a`'s.
    pub fn check(a: &JobFigures, b: &JobFigures, max_increase_pct: f64) -> Gate {
        let mut failures = Vec::new();
        for (what, before, after) in [
            ("peak reserved", a.peak_reserved, b.peak_reserved),
            ("peak allocated", a.peak_allocated, b.peak_allocated),
        ] {
            let too_much = match increase_pct(before, after) {
                Some(pct) => pct > max_increase_pct,
                None => after > 0,
            };
            if too_much {
                let growth = increase_pct(before, after)
                    .map_or_else(|| "from nothing".to_string(), |pct| format!("by {pct:.1}%"));
                failures.push(format!(
                    "{what} grew {growth} ({before} to {after} bytes), more than {max_increase_pct}%"
                ));
            }
        }
        Gate {
            max_increase_pct,
            passed: failures.is_empty(),
            failures,
        }
    }
}

/// Two jobs compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// The first job (the baseline).
    pub a: JobFigures,
    /// The second job (the change).
    pub b: JobFigures,
    /// Growth of peak reserved memory, percent of A's (`None` when A's is 0).
    pub peak_reserved_increase_pct: Option<f64>,
    /// Growth of peak allocated memory, percent of A's (`None` when A's is 0).
    pub peak_allocated_increase_pct: Option<f64>,
    /// The sites by bytes held at each job's peak of allocated memory.
    pub sites: SiteChanges,
    /// The gate, when a limit was given.
    pub gate: Option<Gate>,
}

/// How to compare.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// The device and placement both replays use (each under its file's own config unless
    /// `conf` is given).
    pub replay: ReplayOptions,
    /// The gate's limit in percent, if any.
    pub max_increase_pct: Option<f64>,
}

/// Replays `a` and `b` (in parallel) and compares them.
pub fn diff(a: &Path, b: &Path, options: &DiffOptions) -> Result<DiffReport, DiffError> {
    let (a_job, b_job) = std::thread::scope(|scope| {
        let a_job = scope.spawn(|| job(a, &options.replay));
        let b_job = job(b, &options.replay);
        let a_job = a_job
            .join()
            .unwrap_or_else(|_| Err(ReplayError::Allocator("the replay of A panicked".into())));
        (a_job, b_job)
    });
    let a_job = a_job.map_err(|error| DiffError::A(a.display().to_string(), error))?;
    let b_job = b_job.map_err(|error| DiffError::B(b.display().to_string(), error))?;
    let sites = SiteChanges::of(&a_job.sites.allocated.sites, &b_job.sites.allocated.sites);
    let gate = options
        .max_increase_pct
        .map(|limit| Gate::check(&a_job, &b_job, limit));
    Ok(DiffReport {
        peak_reserved_increase_pct: increase_pct(a_job.peak_reserved, b_job.peak_reserved),
        peak_allocated_increase_pct: increase_pct(a_job.peak_allocated, b_job.peak_allocated),
        a: a_job,
        b: b_job,
        sites,
        gate,
    })
}

/// Why a diff could not be made: which file could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// The first file (named once: an unreadable file's error names it already).
    #[error("{}", .1.naming(std::path::Path::new(.0)))]
    A(String, ReplayError),
    /// The second file (named as the first).
    #[error("{}", .1.naming(std::path::Path::new(.0)))]
    B(String, ReplayError),
}

/// One job replayed with its sites.
fn job(path: &Path, options: &ReplayOptions) -> Result<JobFigures, ReplayError> {
    let report = replay(path, options, &mut |_, _| {})?;
    let sites = sites_at_peaks(path, &report)?;
    Ok(JobFigures::of(&report, sites))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::sites::label;

    fn site(name: &str, bytes: u64) -> SiteBytes {
        let site = Site {
            filename: "m.py".into(),
            line: 1,
            name: name.into(),
            user: true,
        };
        SiteBytes {
            label: label(Some(&site)),
            site: Some(site),
            bytes,
            blocks: 1,
            stack: Vec::new(),
        }
    }

    #[test]
    fn sites_are_added_removed_grown_and_shrunk() {
        let a = [
            site("kept", 5),
            site("grows", 10),
            site("goes", 7),
            site("shrinks", 9),
        ];
        let b = [
            site("grows", 30),
            site("kept", 5),
            site("comes", 4),
            site("shrinks", 1),
        ];
        let changes = SiteChanges::of(&a, &b);
        let names = |list: &[SiteChange]| -> Vec<(String, i64)> {
            list.iter()
                .map(|c| {
                    (
                        c.site.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
                        c.change,
                    )
                })
                .collect()
        };
        assert_eq!(names(&changes.grown), [("grows".to_string(), 20)]);
        assert_eq!(names(&changes.added), [("comes".to_string(), 4)]);
        assert_eq!(names(&changes.removed), [("goes".to_string(), -7)]);
        assert_eq!(names(&changes.shrunk), [("shrinks".to_string(), -8)]);
        assert_eq!(changes.unchanged, 1);
    }

    #[test]
    fn the_gate_fails_only_past_the_limit() {
        assert_eq!(increase_pct(100, 110), Some(10.0));
        assert_eq!(increase_pct(0, 1), None);
    }
}
