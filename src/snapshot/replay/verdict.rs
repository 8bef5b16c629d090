//! The answer to "will my job fit?" in one line: whether any allocation failed in the
//! replay, whether the OOMs PyTorch recorded recurred, and, with `--compare`, which configs
//! would have made it fit.
//!
//! It never says "fits" wrongly: a replay whose allocations failed, or whose recorded OOMs
//! recurred, does not fit; and a recording that ran out of memory where gpumem's replay under
//! the recorded config did not, on a device the caller did not choose, does not fit either
//! (the replay did not reproduce the run, so it cannot vouch for it). A replay without OOMs
//! on a device the caller named, or under another config, fits whatever the recording did,
//! and says why the recorded OOMs did not recur; unless the answer is borderline, when
//! another placement of the segments (`placement_check.rs`), or deferred frees completed at
//! other moments (`timing_check.rs`), run out of memory.

use serde::Serialize;

use super::limit::{Applied, Limit};
use super::report::{CapacitySource, ReplayReport};
use crate::alloc::format::format_size;

/// Another reading of the same replay ([`ReplayReport::verdict`]): its answer, and the words
/// that set it beside the replay's own.
struct SecondReading {
    /// Whether the job fits there, and the event of its first OOM.
    answer: (bool, Option<u64>),
    /// How the replay's own reading was made.
    first: &'static str,
    /// How this one was.
    other: &'static str,
    /// Why the two may disagree.
    why: &'static str,
}

/// The verdict of one replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Whether the job fits.
    pub fits: bool,
    /// The line saying so.
    pub text: String,
    /// OOMs of the replay: allocations gpumem could not serve, recorded OOMs that recurred,
    /// and live blocks of the start state that did not fit.
    pub ooms: u64,
    /// The event of the first of them.
    pub first_oom_event: Option<u64>,
    /// Recorded OOMs gpumem did not reproduce.
    pub unreproduced: u64,
    /// Why they were not reproduced, when there are any.
    pub unreproduced_why: Option<String>,
    /// Whether the answer depends on where the driver places segments, or on when the GPU
    /// finishes side streams' work: with every segment placed by the simulator's model
    /// (`placement_check.rs`), or every deferred free completed at its request
    /// (`timing_check.rs`), the job fits where this replay's did not, or the reverse. A
    /// borderline job never `fits`.
    pub borderline: bool,
    /// Whether the answer covers the trace's window only: the trace starts mid-run
    /// (PyTorch's history ring wrapped, or recording began late), so what the job needed before its first event is
    /// not in the file, and a "fits" says so in its text.
    pub window_only: bool,
}

impl ReplayReport {
    /// Where the replay ran: "139.80 GiB", "139.80 GiB under the inferred cap of 3.00 GiB",
    /// or, under a config's memory fraction, "139.80 GiB under per_process_memory_fraction:0.5
    /// (69.90 GiB allowed)".
    fn device_words(&self) -> String {
        let mut device = format_size(self.capacity);
        if let Some(fraction) = self
            .conf
            .per_process_memory_fraction
            .filter(|&fraction| fraction < 1.0)
        {
            // The allocator's cap: fraction × the device's total memory, truncated (PyTorch's
            // `allowed_memory_maximum`, `CachingAllocator::set_memory_fraction`).
            let allowed = (fraction * self.capacity as f64) as u64;
            device.push_str(&format!(
                " under per_process_memory_fraction:{fraction} ({} allowed)",
                format_size(allowed)
            ));
        }
        match self.limit_applied {
            Applied::Cap(cap) => format!("{device} under the inferred cap of {}", format_size(cap)),
            Applied::HeldElsewhere(held) => {
                let context = crate::device::sim::SimDevice::new(self.capacity).context_bytes();
                let usable = self.capacity.saturating_sub(context).saturating_sub(held);
                format!(
                    "{device}, of which the job could hold {} as when recorded (the rest held elsewhere, inferred)",
                    format_size(usable)
                )
            }
            Applied::No => device,
        }
    }

    /// Why recorded OOMs did not recur, in words.
    fn unreproduced_why(&self) -> String {
        if !self.recorded_conf {
            return "this config serves the requests the recorded one could not".into();
        }
        match (self.limit, self.limit_applied, self.capacity_source) {
            (Limit::Cap(_) | Limit::Device { .. }, Applied::No, CapacitySource::Given) => format!(
                "the job ran under a limit the file does not record, {}; this replay on the device given has no such limit",
                self.limit.describe()
            ),
            (Limit::Inconsistent(_), _, _) => format!(
                "the job ran under a limit that changed over time: {}",
                self.limit.describe()
            ),
            (_, Applied::Cap(_) | Applied::HeldElsewhere(_), _) => {
                "gpumem found room under the inferred limit where PyTorch did not: its allocator state differed there (see the segment events and the end state)".into()
            }
            _ => "the job ran under a limit the file does not record (a memory fraction, or memory held by another process), and the trace does not show it".into(),
        }
    }

    /// The verdict, and whether it depends on the placement or on the GPU's timing (see
    /// [`Verdict::borderline`]).
    ///
    /// A job fits only if it fits under every reading: when the recording's addresses give
    /// no OOM but the simulator's model does, the answer hangs on where the driver puts
    /// segments, which moves with memory no snapshot shows; when the recording's completions
    /// of deferred frees give no OOM but completing each at its request does, it hangs on when
    /// the GPU finishes the side streams' work, which moves from run to run. Either way the
    /// verdict does not say "fits" (the brief's rule: never say "fits" wrongly). When the
    /// replay ran out of memory and another reading fits, the verdict stays "does not fit"
    /// and says the other.
    pub fn verdict(&self) -> Verdict {
        let mut verdict = self.verdict_as_placed();
        let first_fits = verdict.fits;
        let placement = self.placement_check.map(|check| SecondReading {
            answer: (check.fits, check.first_oom_event),
            first: "with segments placed as the recording's driver placed them",
            other: "with every segment placed by the simulator's model",
            why: "where the driver puts segments decides, and that moves with memory no snapshot shows",
        });
        let timing = self.timing_check.map(|check| SecondReading {
            answer: (check.fits, check.first_oom_event),
            first: "with each deferred free completed where the recording's was",
            other: "with every deferred free completed at its request (the GPU idle)",
            why: "when the GPU finishes the side streams' work decides, and that moves from run to run",
        });
        for reading in [placement, timing].into_iter().flatten() {
            self.read_again(&mut verdict, first_fits, reading);
        }
        verdict
    }

    /// Makes `verdict` borderline where `reading` disagrees with the replay's own answer
    /// (`first_fits`), and says so.
    fn read_again(&self, verdict: &mut Verdict, first_fits: bool, reading: SecondReading) {
        let SecondReading {
            answer: (fits, first_oom_event),
            first,
            other,
            why,
        } = reading;
        if fits == first_fits {
            return;
        }
        if first_fits {
            let at = match first_oom_event {
                Some(event) => format!(" at event {event}"),
                None => String::new(),
            };
            if verdict.borderline {
                verdict
                    .text
                    .push_str(&format!("; {other} it runs out of memory too{at} ({why})"));
            } else {
                verdict.text = format!(
                    "may not fit on {}: borderline, no allocation failed {first}, but {other} it runs out of memory{at} ({why})",
                    self.device_words()
                );
            }
            verdict.fits = false;
        } else {
            verdict
                .text
                .push_str(&format!("; borderline: {other} it fits ({why})"));
        }
        verdict.borderline = true;
    }

    /// Whether the job fits with this replay's own placement, whatever the placement check
    /// found (`gpumem replay --min-capacity` reports where the two answers part).
    pub fn fits_as_placed(&self) -> bool {
        self.verdict_as_placed().fits
    }

    /// The verdict of this replay's own placement.
    fn verdict_as_placed(&self) -> Verdict {
        let counts = &self.counts;
        let start_failed = self.start.map_or(0, |start| start.failed);
        let ooms = counts.ooms + counts.recorded_ooms_reproduced + start_failed;
        let unreproduced = counts
            .recorded_ooms
            .saturating_sub(counts.recorded_ooms_reproduced);
        let unreproduced_why = (unreproduced > 0).then(|| self.unreproduced_why());
        let first_oom_event = self.first_oom.as_ref().map(|oom| oom.index);
        let device = self.device_words();
        let window_only = self.start.is_some();
        if ooms > 0 {
            let first = match first_oom_event {
                Some(index) => format!(", first at event {index}"),
                None => ", the first in the state the trace starts from".into(),
            };
            let mut text = format!(
                "does not fit on {device}: {ooms} OOM{}{first}",
                plural(ooms)
            );
            if counts.recorded_ooms_reproduced > 0 {
                text.push_str(&format!(
                    " ({} of {} recorded OOMs reproduced)",
                    counts.recorded_ooms_reproduced, counts.recorded_ooms
                ));
            }
            return Verdict {
                fits: false,
                text,
                ooms,
                first_oom_event,
                unreproduced,
                unreproduced_why,
                borderline: false,
                window_only,
            };
        }
        if unreproduced > 0 && self.capacity_source != CapacitySource::Given && self.recorded_conf {
            return Verdict {
                fits: false,
                text: format!(
                    "does not fit: the recorded run ran out of memory {unreproduced} time{}, which gpumem's replay on {device} did not reproduce",
                    plural(unreproduced)
                ),
                ooms,
                first_oom_event,
                unreproduced,
                unreproduced_why,
                borderline: false,
                window_only,
            };
        }
        let mut text = if unreproduced > 0 && !self.recorded_conf {
            format!(
                "fits on {device} under this config (the recorded run, under its own, ran out of memory {unreproduced} time{})",
                plural(unreproduced)
            )
        } else if unreproduced > 0 {
            format!(
                "fits on {device} (the recorded run ran out of memory {unreproduced} time{} on its own device)",
                plural(unreproduced)
            )
        } else {
            format!("fits on {device}: no allocation failed")
        };
        if window_only {
            text.push_str(&format!("; {}", WINDOW_ONLY));
        }
        Verdict {
            fits: true,
            text,
            ooms,
            first_oom_event,
            unreproduced,
            unreproduced_why,
            borderline: false,
            window_only,
        }
    }
}

/// What a "fits" of a trace that starts mid-run does not cover. The OOMs of a window are
/// real whatever came before, but its fit is not the job's: the events before it (a first
/// iteration, a warm-up, an evaluation) may have needed more, and no snapshot keeps their
/// peak (PyTorch 2.11's `_snapshot()` records no `memory_stats()`).
pub const WINDOW_ONLY: &str = "for the trace's window only: it starts mid-run (PyTorch's history ring kept only its last max_entries events, or recording began after the job's first allocations), and what the job needed before its first event is not in the file";

fn plural(count: u64) -> &'static str {
    if count == 1 {
        ""
    } else {
        "s"
    }
}

/// The verdict line with the configs `--compare` tried: which of them fit when the recorded
/// config does not ("fits under expandable_segments:True only"), or that none does.
pub fn with_comparison(report: &ReplayReport, rows: &[(String, &ReplayReport)]) -> String {
    let verdict = report.verdict();
    if rows.is_empty() {
        return verdict.text;
    }
    let fitting: Vec<&str> = rows
        .iter()
        .filter(|(_, row)| row.fits())
        .map(|(conf, _)| conf.as_str())
        .collect();
    match (verdict.fits, fitting.is_empty()) {
        (false, false) => format!("{}; fits under {} only", verdict.text, fitting.join(" or ")),
        (false, true) => format!("{}; none of the compared configs fits either", verdict.text),
        (true, _) if fitting.len() == rows.len() => {
            format!("{}; so does every compared config", verdict.text)
        }
        (true, _) => {
            let failing: Vec<&str> = rows
                .iter()
                .filter(|(_, row)| !row.fits())
                .map(|(conf, _)| conf.as_str())
                .collect();
            format!("{}; not under {}", verdict.text, failing.join(" or "))
        }
    }
}
