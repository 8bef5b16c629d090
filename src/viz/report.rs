//! The HTML report: one self-contained page (styles, script, data and the chart inlined; no
//! request leaves it) with the timeline chart — hover shows each event and its script line —
//! the segment map after any event, chosen with a slider, the counters and
//! `memory_summary()`.
//!
//! It takes a [`Timeline`] (the layout at the start plus every event) and the end state's
//! counters and summary, so anything that produces a timeline can make a report: `gpumem run
//! --report` records a script with a [`Recorder`](super::timeline::Recorder), and a replay of
//! recorded allocator events can feed a recorder the same way.
//!
//! ```
//! use std::{cell::RefCell, rc::Rc};
//! use gpumem::alloc::{AllocConf, CachingAllocator};
//! use gpumem::device::sim::SimDevice;
//! use gpumem::viz::report::{self, ReportInput};
//! use gpumem::viz::Recorder;
//!
//! let device = Box::new(SimDevice::new(8 << 30));
//! let mut allocator = CachingAllocator::new(device, AllocConf::default())?;
//! let recorder = Rc::new(RefCell::new(Recorder::new(&allocator, "example")));
//! allocator.subscribe(Box::new(Rc::clone(&recorder)));
//! let x = allocator.malloc(4 << 20)?;
//! allocator.free(x)?;
//! let timeline = recorder.borrow().timeline(Vec::new());
//! let page = report::html(&ReportInput::at_end(&timeline, &allocator, "sim"))?;
//! assert!(page.contains("<svg") && !page.contains("http://cdn"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::Write as _;

use serde_json::json;

use super::chart::{self, ChartError, ChartSize};
use super::layout::{MemoryLayout, Region};
use super::timeline::Timeline;
use super::units;
use crate::alloc::format::format_size;
use crate::alloc::summary::memory_summary;
use crate::alloc::CachingAllocator;
use crate::alloc::EventKind;

const PAGE: &str = include_str!("report/page.html");
const CSS: &str = include_str!("report/page.css");
const JS: &str = include_str!("report/page.js");

/// What a report shows.
#[derive(Debug, Clone)]
pub struct ReportInput<'a> {
    /// The recorded run.
    pub timeline: &'a Timeline,
    /// The device, as the subtitle names it (`sim`, `cuda:0`).
    pub device: String,
    /// The allocator config in force, in PyTorch's syntax (empty for the defaults).
    pub config: String,
    /// `memory_stats()` at the end, as (key, value).
    pub counters: Vec<(String, i64)>,
    /// `memory_summary()` at the end.
    pub summary: String,
}

impl<'a> ReportInput<'a> {
    /// A report of `timeline` with `allocator`'s counters and summary as they are now.
    pub fn at_end(
        timeline: &'a Timeline,
        allocator: &CachingAllocator,
        device: impl Into<String>,
    ) -> ReportInput<'a> {
        ReportInput {
            timeline,
            device: device.into(),
            config: String::new(),
            counters: allocator.stats().entries(),
            summary: memory_summary(allocator.stats(), allocator.device().index(), false),
        }
    }
}

/// `text` with `&`, `<`, `>` and `"` escaped for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// The region codes the page's script reads: the index in [`Region::ALL`].
fn region_code(region: Region) -> usize {
    Region::ALL.iter().position(|r| *r == region).unwrap_or(0)
}

fn layout_json(layout: &MemoryLayout) -> serde_json::Value {
    layout
        .segments
        .iter()
        .map(|segment| {
            let spans: Vec<serde_json::Value> = segment
                .spans
                .iter()
                .map(|span| json!([span.address, span.size, region_code(span.region)]))
                .collect();
            json!([
                segment.address,
                segment.size,
                u8::from(segment.pool == crate::alloc::Pool::Large),
                spans
            ])
        })
        .collect()
}

/// The counters table: the headline figures, then every key folded away.
fn counters_html(counters: &[(String, i64)]) -> String {
    const HEADLINE: [(&str, &str, bool); 10] = [
        ("allocated_bytes.all.current", "allocated now", true),
        ("allocated_bytes.all.peak", "allocated, peak", true),
        ("reserved_bytes.all.current", "reserved now", true),
        ("reserved_bytes.all.peak", "reserved, peak", true),
        (
            "inactive_split_bytes.all.current",
            "free in split segments now",
            true,
        ),
        ("segment.all.peak", "segments, peak", false),
        ("num_device_alloc", "device allocations (cudaMalloc)", false),
        ("num_device_free", "device frees (cudaFree)", false),
        (
            "num_alloc_retries",
            "retries after freeing the cache",
            false,
        ),
        ("num_ooms", "out-of-memory errors", false),
    ];
    let value = |key: &str| counters.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    let mut html = String::from("<table id=\"counters\">");
    for (key, name, is_bytes) in HEADLINE {
        if let Some(v) = value(key) {
            let shown = if is_bytes {
                format!("{} ({v} bytes)", units::bytes(v.max(0) as u64))
            } else {
                v.to_string()
            };
            let _ = write!(
                html,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"key\">{}</td></tr>",
                escape(name),
                escape(&shown),
                escape(key)
            );
        }
    }
    html.push_str("</table><details><summary>every memory_stats() key</summary><table>");
    for (key, v) in counters {
        let _ = write!(
            html,
            "<tr><td class=\"key\">{}</td><td class=\"num\">{v}</td></tr>",
            escape(key)
        );
    }
    html.push_str("</table></details>");
    html
}

/// The report page.
pub fn html(input: &ReportInput<'_>) -> Result<String, ChartError> {
    let timeline = input.timeline;
    let size = ChartSize::default();
    let (svg, geometry) = chart::svg(timeline, size)?;
    let events: Vec<serde_json::Value> = timeline
        .events
        .iter()
        .map(|e| {
            json!([
                e.kind.code(),
                e.address,
                e.size,
                u8::from(e.pool == crate::alloc::Pool::Large),
                e.allocated,
                e.reserved,
                e.context
            ])
        })
        .collect();
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
    let data = json!({
        "kinds": kinds,
        "labels": timeline.labels,
        "initial": {
            "allocated": timeline.initial_allocated,
            "reserved": timeline.initial_reserved,
            "segments": layout_json(&timeline.initial),
        },
        "events": events,
        "expandable": timeline
            .expandable
            .iter()
            .map(|range| json!([
                range.base,
                range.size,
                range.page,
                u8::from(range.pool == crate::alloc::Pool::Large)
            ]))
            .collect::<Vec<_>>(),
        "geometry": {
            "left": geometry.left, "right": geometry.right,
            "top": geometry.top, "bottom": geometry.bottom,
            "points": geometry.points,
            "width": size.width, "height": size.height,
        },
    });
    // Inside <script>, "</" could end the element early.
    let data = data.to_string().replace("</", "<\\/");
    let (peak_allocated, peak_reserved) = timeline.peaks();
    let marked = |kind: EventKind| timeline.events.iter().filter(|e| e.kind == kind).count();
    let subtitle = format!(
        "device {} ({} total){} · {} allocator events · peak allocated {} · peak reserved {} · {} out-of-memory errors · {} empty_cache() calls",
        input.device,
        format_size(timeline.device_total),
        if input.config.is_empty() {
            String::new()
        } else {
            format!(" · alloc-conf {}", input.config)
        },
        timeline.events.len(),
        format_size(peak_allocated),
        format_size(peak_reserved),
        marked(EventKind::Oom),
        marked(EventKind::EmptyCache),
    );
    // Substitute the placeholders in one pass, so nothing inserted is scanned again.
    let mut page = String::with_capacity(PAGE.len() + svg.len() + data.len() + JS.len());
    let mut rest = PAGE;
    while let Some(start) = rest.find("{{") {
        page.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            page.push_str(&rest[start..]);
            rest = "";
            break;
        };
        match &after[..end] {
            "TITLE" => page.push_str(&escape(&timeline.title)),
            "SUBTITLE" => page.push_str(&escape(&subtitle)),
            "CSS" => page.push_str(CSS),
            "CHART" => page.push_str(&svg),
            "COUNTERS" => page.push_str(&counters_html(&input.counters)),
            "SUMMARY" => page.push_str(&escape(&input.summary)),
            "DATA" => page.push_str(&data),
            "JS" => page.push_str(JS),
            other => {
                let _ = write!(page, "{{{{{other}}}}}");
            }
        }
        rest = &after[end + 2..];
    }
    page.push_str(rest);
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_fills_every_placeholder() {
        let timeline = Timeline {
            title: "a<b>.rhai".into(),
            ..Timeline::default()
        };
        let page = html(&ReportInput {
            timeline: &timeline,
            device: "sim".into(),
            config: String::new(),
            counters: vec![("num_ooms".into(), 0)],
            summary: "</script>".into(),
        })
        .expect("draws");
        assert!(page.contains("a&lt;b&gt;.rhai"));
        assert!(!page.contains("{{"));
        assert!(page.contains("&lt;/script&gt;"));
        assert!(!page.contains("src=\"http"), "nothing is fetched");
    }
}
