//! A trace event as the reader hands it out: the fields of one `device_traces` entry a replay
//! uses.

use crate::snapshot::model::Action;

/// The fields of one trace event a replay uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// What happened.
    pub action: Action,
    /// `addr` (for `oom`: `device_free`).
    pub addr: i64,
    /// `size`.
    pub size: i64,
    /// `stream` (0 when absent).
    pub stream: i64,
    /// `time_us` (0 when absent).
    pub time_us: i64,
    /// Whether its frames name `empty_cache` (a release by `torch.cuda.empty_cache()`).
    pub empty_cache_frame: bool,
}
