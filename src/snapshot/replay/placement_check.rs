//! Whether a replay's answer depends on where the driver places segments.
//!
//! A replay under another config or device makes segments the recording never made, and where
//! they land decides best-fit ties between equal free blocks; near the memory limit one tie
//! can decide whether a request finds a block at all. The driver's rules are measured
//! (`device/address_space.rs`), but memory that libraries, kernels loaded on first use and
//! pinned host memory hold moves its choices, and a snapshot shows that memory only where a
//! recorded segment reveals it: PyTorch's own runs of one job place segments differently from
//! run to run (tests/gpu/placement). So a replay under pressure (an allocation retried or
//! failed) that placed segments the recording does not place is run once more with every
//! segment placed by the simulator's own model (a fresh process's layout, knowing none of the
//! recording's memory), and the verdict says the job is borderline when the two answers
//! disagree.

use super::recording::Recording;
use super::report::{PlacementCheck, ReplayReport};
use super::{replay_recording, Placement, Progress, ReplayError, ReplayOptions};

/// Whether `report` calls for the check: placed at recorded addresses where it could, some
/// segments placed otherwise (the recording made other segments, or none there), and under
/// pressure (a retry, or an allocation that failed).
pub fn wanted(report: &ReplayReport) -> bool {
    let placed = report.placed;
    let placed_otherwise = placed.total() > placed.recorded();
    let pressed = report.stat("num_alloc_retries") > 0 || report.counts.ooms > 0;
    report.placement == Placement::Recorded && placed_otherwise && pressed
}

/// Replays the file `report` was made from once more, as it was but with every segment placed
/// by the simulator's model, and puts what that found into `report`.
pub fn check(
    path: &std::path::Path,
    recording: &Recording,
    options: &ReplayOptions,
    report: &mut ReplayReport,
    progress: Progress<'_>,
) -> Result<(), ReplayError> {
    let options = ReplayOptions {
        placement: Placement::Model,
        ..options.clone()
    };
    let other = replay_recording(path, recording, &options, progress, Vec::new())?;
    let verdict = other.verdict();
    report.placement_check = Some(PlacementCheck {
        fits: verdict.fits,
        ooms: verdict.ooms,
        first_oom_event: verdict.first_oom_event,
        num_alloc_retries: other.stat("num_alloc_retries"),
        num_device_alloc: other.stat("num_device_alloc"),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::alloc::config::AllocConf;
    use crate::snapshot::replay::{no_progress, replay};

    fn convnet() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay/fixtures/convnet.default.pickle")
    }

    /// The fixture under `max_split_size_mb:20` on a device just large enough: 34 retries,
    /// segments the recording never made.
    fn pressed(placement: Placement) -> ReplayOptions {
        ReplayOptions {
            capacity: Some(1_707_081_728),
            conf: Some(AllocConf::parse("max_split_size_mb:20").expect("a config")),
            placement,
            ..ReplayOptions::default()
        }
    }

    #[test]
    fn a_what_if_replay_under_pressure_is_checked_by_a_replay_under_the_models_placement() {
        let report = replay(&convnet(), &pressed(Placement::Recorded), &mut no_progress)
            .expect("the fixture replays");
        assert!(report.stat("num_alloc_retries") > 0);
        let check = report.placement_check.expect("checked");
        let by_model = replay(&convnet(), &pressed(Placement::Model), &mut no_progress)
            .expect("the fixture replays");
        assert!(
            by_model.placement_check.is_none(),
            "placed by the model already"
        );
        let verdict = by_model.verdict();
        assert_eq!(
            check,
            PlacementCheck {
                fits: verdict.fits,
                ooms: verdict.ooms,
                first_oom_event: verdict.first_oom_event,
                num_alloc_retries: by_model.stat("num_alloc_retries"),
                num_device_alloc: by_model.stat("num_device_alloc"),
            }
        );
    }

    #[test]
    fn a_replay_at_the_recorded_addresses_or_without_pressure_is_not_checked() {
        let own = replay(&convnet(), &ReplayOptions::default(), &mut no_progress)
            .expect("the fixture replays");
        assert_eq!(own.placed.total(), own.placed.recorded());
        assert!(!wanted(&own) && own.placement_check.is_none());
        let roomy = ReplayOptions {
            capacity: None,
            ..pressed(Placement::Recorded)
        };
        let roomy = replay(&convnet(), &roomy, &mut no_progress).expect("the fixture replays");
        assert_eq!(roomy.stat("num_alloc_retries"), 0);
        assert!(roomy.placement_check.is_none());
    }

    #[test]
    fn a_check_that_disagrees_makes_the_verdict_borderline_and_says_so() {
        let mut report = replay(&convnet(), &pressed(Placement::Recorded), &mut no_progress)
            .expect("the fixture replays");
        let mut check = report.placement_check.expect("checked");
        assert!(report.verdict().fits && check.fits && !report.verdict().borderline);
        check.fits = false;
        check.ooms = 2;
        check.first_oom_event = Some(700);
        report.placement_check = Some(check);
        let verdict = report.verdict();
        assert!(
            !verdict.fits,
            "a job that fits under one placement only does not fit"
        );
        assert!(verdict.borderline);
        assert_says(
            &verdict.text,
            "may not fit on ",
            "with every segment placed by the simulator's model it runs out of memory at event 700",
        );
        assert!(report
            .to_string()
            .contains("it does not fit (2 OOMs, first at event 700)"));
    }

    #[test]
    fn a_replay_that_ran_out_where_the_models_placement_fits_stays_does_not_fit() {
        let mut report = replay(&convnet(), &pressed(Placement::Recorded), &mut no_progress)
            .expect("the fixture replays");
        report.counts.ooms = 1;
        let verdict = report.verdict();
        assert!(!verdict.fits && verdict.borderline);
        assert_says(
            &verdict.text,
            "does not fit on ",
            "; borderline: with every segment placed by the simulator's model it fits",
        );
    }

    #[test]
    fn a_job_fits_only_when_every_placement_tried_fits() {
        let base = replay(&convnet(), &pressed(Placement::Recorded), &mut no_progress)
            .expect("the fixture replays");
        let checked = base.placement_check.expect("checked");
        for ooms in [0, 1] {
            for check_fits in [None, Some(true), Some(false)] {
                let mut report = base.clone();
                report.counts.ooms = ooms;
                report.placement_check = check_fits.map(|fits| PlacementCheck {
                    fits,
                    ooms: u64::from(!fits),
                    first_oom_event: (!fits).then_some(9),
                    ..checked
                });
                let verdict = report.verdict();
                let as_placed = ooms == 0;
                assert_eq!(report.fits_as_placed(), as_placed);
                assert_eq!(
                    verdict.fits,
                    as_placed && check_fits != Some(false),
                    "{ooms} {check_fits:?}"
                );
                assert_eq!(
                    verdict.borderline,
                    check_fits.is_some_and(|fits| fits != as_placed),
                    "{ooms} {check_fits:?}"
                );
            }
        }
    }

    /// A verdict's text starts with `start` and says `clause`.
    fn assert_says(text: &str, start: &str, clause: &str) {
        assert!(text.starts_with(start) && text.contains(clause), "{text}");
    }
}
