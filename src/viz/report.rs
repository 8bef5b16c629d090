//! The HTML report: one self-contained page (styles, script, data and the charts inlined; no
//! request leaves it). For each timeline it was given — the session's allocator, each side
//! allocator a script made, each device, or each config a replay was compared under — it shows
//! the chart (hover names the event and its script line; click zooms there), a zoomed view
//! that reaches single events around every OOM and both peaks, the segment map after an event
//! there, the counters and a summary. A comparison adds its table and the runs overlaid.
//!
//! Nothing in the page runs from the data: every string from a script or a snapshot is
//! escaped where it enters HTML or SVG, and the data is embedded as JSON in a
//! `<script type="application/json">` element with `<`, `>`, `&`, U+2028 and U+2029 written
//! as `\uXXXX`, so no string can end the element; the page's own script reads it with
//! `JSON.parse` and writes strings only as text.
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

use serde_json::{json, Value};

use super::chart::{self, ChartError, ChartGeometry, ChartSize};
use super::layout::{MemoryLayout, Region};
use super::timeline::{MarkKind, Numbering, Timeline};
use super::units;
use crate::alloc::format::format_size;
use crate::alloc::summary::memory_summary;
use crate::alloc::{CachingAllocator, EventKind, Pool};

const PAGE: &str = include_str!("report/page.html");
const CSS: &str = include_str!("report/page.css");
const JS: &str = include_str!("report/page.js");

/// One timeline of a report and the end state of the allocator it followed.
#[derive(Debug, Clone)]
pub struct Panel<'a> {
    /// What it is (`session allocator`, `with_allocator_conf("expandable_segments:True")`,
    /// `device 1`, a config of a comparison).
    pub label: String,
    /// The recorded run.
    pub timeline: &'a Timeline,
    /// The allocator config in force, in PyTorch's syntax (empty for the defaults).
    pub config: String,
    /// `memory_stats()` at the end, as (key, value).
    pub counters: Vec<(String, i64)>,
    /// A text account of the end (`memory_summary()`, or the replay's report).
    pub summary: String,
}

/// A comparison table (`gpumem replay --compare`): its header and rows, shown above the
/// compared runs overlaid on one chart.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// Column names.
    pub header: Vec<String>,
    /// One row per run, as many cells as the header.
    pub rows: Vec<Vec<String>>,
}

/// The answer a report leads with (`gpumem replay`'s verdict), shown under the title in the
/// colour of its tone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headline {
    /// The answer, as the text report gives it.
    pub text: String,
    /// How it reads.
    pub tone: Tone,
}

/// How a [`Headline`] reads: the job fits, does not, or the answer depends on what the file
/// cannot show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// It fits.
    Good,
    /// It does not fit.
    Bad,
    /// Borderline (it fits one way and not another), or it fits as far as the file shows
    /// (a trace that starts mid-run).
    Caution,
}

impl Tone {
    fn class(self) -> &'static str {
        match self {
            Tone::Good => "good",
            Tone::Bad => "bad",
            Tone::Caution => "caution",
        }
    }
}

/// What a report shows.
#[derive(Debug, Clone)]
pub struct ReportInput<'a> {
    /// The answer it leads with, if any.
    pub headline: Option<Headline>,
    /// What was run (a script's path, a snapshot file).
    pub title: String,
    /// The device, as the subtitle names it (`sim`, `cuda:0`).
    pub device: String,
    /// The timelines, in order; the first is the main one.
    pub panels: Vec<Panel<'a>>,
    /// A comparison of the panels' runs, drawn overlaid.
    pub comparison: Option<Comparison>,
}

impl<'a> ReportInput<'a> {
    /// A report of `timeline` with `allocator`'s counters and summary as they are now.
    pub fn at_end(
        timeline: &'a Timeline,
        allocator: &CachingAllocator,
        device: impl Into<String>,
    ) -> ReportInput<'a> {
        ReportInput {
            headline: None,
            title: timeline.title.clone(),
            device: device.into(),
            panels: vec![Panel {
                label: "allocator".into(),
                timeline,
                config: allocator.config().source.clone(),
                counters: allocator.stats().entries(),
                summary: memory_summary(allocator.stats(), allocator.device().index(), false),
            }],
            comparison: None,
        }
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` escaped for HTML text and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// JSON text safe inside a `<script type="application/json">` element: `<`, `>`, `&`,
/// U+2028 and U+2029 (which can only occur inside JSON strings) written as `\uXXXX`, so no
/// string can end the element or open a comment, and the text stays valid JSON.
pub fn script_json(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len() + text.len() / 64);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            _ => out.push(c),
        }
    }
    out
}

fn pool_code(pool: Pool) -> u8 {
    u8::from(pool == Pool::Large)
}

/// The region codes the page's script reads: the index in [`Region::ALL`].
fn region_code(region: Region) -> usize {
    Region::ALL.iter().position(|r| *r == region).unwrap_or(0)
}

fn layout_json(layout: &MemoryLayout) -> Value {
    layout
        .segments
        .iter()
        .map(|segment| {
            let spans: Vec<Value> = segment
                .spans
                .iter()
                .map(|span| json!([span.address, span.size, region_code(span.region)]))
                .collect();
            json!([
                segment.address,
                segment.size,
                pool_code(segment.pool),
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
    let mut html = String::from("<table class=\"counters\">");
    for (key, name, is_bytes) in HEADLINE {
        if let Some(v) = value(key) {
            let shown = if is_bytes {
                format!("{} ({v} bytes)", units::bytes(v.max(0) as u64))
            } else {
                v.to_string()
            };
            let _ = write!(
                html,
                "<tr><td>{}</td><td class=\"num\" data-key=\"{}\">{}</td><td class=\"key\">{}</td></tr>",
                escape(name),
                escape(key),
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

/// The page's data for one timeline: events as `[kind, address, size, pool, number − previous
/// number, context (0 in a replay)]` (the page follows allocated and reserved bytes from them, from each
/// window's `before`), the envelope as four flat arrays, marks as `[number, kind, context,
/// text or OOM figures]`.
fn timeline_json(timeline: &Timeline, geometry: &ChartGeometry, size: ChartSize) -> Value {
    let envelope = &timeline.envelope;
    let column = |pick: fn(&super::envelope::Bucket) -> u64| -> Vec<u64> {
        envelope.buckets.iter().map(pick).collect()
    };
    // A replay's context is its event number again: no need to write it twice.
    let sites = timeline.numbering == Numbering::Sequence;
    let windows: Vec<Value> = timeline
        .windows
        .iter()
        .map(|window| {
            let mut previous = window.events.first().map_or(0, |e| e.position);
            let events: Vec<Value> = window
                .events
                .iter()
                .map(|e| {
                    let step = e.position - previous;
                    previous = e.position;
                    let context = if sites { e.context } else { 0 };
                    json!([
                        e.kind.code(),
                        e.address,
                        e.size,
                        pool_code(e.pool),
                        step,
                        context
                    ])
                })
                .collect();
            let after = window
                .events
                .last()
                .map_or(window.before, |e| (e.allocated, e.reserved));
            json!({
                "first": window.first,
                "start": window.events.first().map_or(0, |e| e.position),
                "before": [window.before.0, window.before.1],
                "after": [after.0, after.1],
                "layout": window.layout.as_ref().map(layout_json),
                "events": events,
            })
        })
        .collect();
    let marks: Vec<Value> = timeline
        .marks
        .iter()
        .map(|mark| (mark, if sites { mark.context } else { 0 }))
        .map(|(mark, context)| match &mark.kind {
            MarkKind::Oom(limits) => json!([
                mark.position,
                0,
                context,
                [
                    limits.reserved,
                    limits.segment,
                    limits.device_free,
                    limits.cap
                ]
            ]),
            MarkKind::EmptyCache => json!([mark.position, 1, context, null]),
            MarkKind::Phase(text) => json!([mark.position, 2, context, text]),
        })
        .collect();
    let labels: Vec<Value> = timeline
        .labels
        .iter()
        .map(|site| json!([site.label, site.helper]))
        .collect();
    json!({
        "numbering": match timeline.numbering {
            Numbering::Sequence => "sequence",
            Numbering::TraceIndex => "trace",
        },
        "from": envelope.origin,
        "to": timeline.end.max(envelope.origin + 1),
        "initial": [timeline.initial.0, timeline.initial.1],
        "envelope": {
            "origin": envelope.origin,
            "width": envelope.width,
            "allocated_min": column(|b| b.allocated.min),
            "allocated_max": column(|b| b.allocated.max),
            "reserved_min": column(|b| b.reserved.min),
            "reserved_max": column(|b| b.reserved.max),
        },
        "windows": windows,
        "complete": timeline.is_complete(),
        "marks": marks,
        "labels": labels,
        "expandable": timeline
            .expandable
            .iter()
            .map(|range| json!([range.base, range.size, range.page, pool_code(range.pool)]))
            .collect::<Vec<_>>(),
        "peaks": {
            "allocated": [timeline.peak_allocated.bytes, timeline.peak_allocated.position],
            "reserved": [timeline.peak_reserved.bytes, timeline.peak_reserved.position],
        },
        "caps": timeline.caps.iter().map(|(at, cap)| json!([at, cap])).collect::<Vec<_>>(),
        "device_total": timeline.device_total,
        "counts": {
            "events": timeline.counts.events,
            "ooms": timeline.counts.ooms,
            "empty_cache": timeline.counts.empty_cache,
            "marks_dropped": timeline.counts.marks_dropped,
        },
        "geometry": {
            "left": geometry.left, "right": geometry.right,
            "top": geometry.top, "bottom": geometry.bottom,
            "from": geometry.from, "to": geometry.to, "y_max": geometry.y_max,
            "width": size.width, "height": size.height,
        },
    })
}

/// One line about a panel's run: events, peaks, OOMs (as its counters count them) and the
/// script's own `empty_cache()` calls.
fn panel_subtitle(panel: &Panel<'_>) -> String {
    let timeline = panel.timeline;
    let (peak_allocated, peak_reserved) = timeline.peaks();
    let mut text = format!(
        "{} allocator events · peak allocated {} · peak reserved {} · {} out-of-memory errors",
        timeline.counts.events,
        format_size(peak_allocated),
        format_size(peak_reserved),
        timeline.counts.ooms,
    );
    if timeline.counts.marks_dropped > 0 {
        // Past the recorder's limit on markers the chart shows only the first ones: say so,
        // so that a stretch without OOM lines is not read as a stretch without OOMs.
        let _ = write!(
            text,
            " (markers up to event {} only: the recorder keeps {} markers)",
            timeline.marks.last().map_or(0, |mark| mark.position),
            timeline.marks.len()
        );
    }
    let own = timeline.own_empty_cache_calls();
    let helpers = timeline.counts.empty_cache - own;
    let _ = write!(text, " · {own} empty_cache() calls");
    if helpers > 0 {
        let _ = write!(text, " (and {helpers} inside stdlib helpers)");
    }
    let phases = timeline
        .marks
        .iter()
        .filter(|mark| matches!(mark.kind, MarkKind::Phase(_)))
        .count();
    if phases > 0 {
        let _ = write!(text, " · {phases} phases marked");
    }
    if !panel.config.is_empty() {
        let _ = write!(text, " · alloc-conf {}", panel.config);
    }
    text
}

/// The HTML of one panel: its heading, chart, zoom, map and counters.
fn panel_html(index: usize, panel: &Panel<'_>, svg: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<section class=\"panel\" data-panel=\"{index}\">\n<h2>Timeline: <span class=\"mono\">{}</span></h2>\n<p class=\"sub panel-sub\">{}</p>\n",
        escape(&panel.label),
        escape(&panel_subtitle(panel)),
    );
    let _ = write!(
        html,
        "<p class=\"hint\">Hover the chart for the events under the mouse and their script line; click to zoom there.</p>\n<div class=\"chart-wrap\">\n{svg}\n<div class=\"cursor\"></div>\n<div class=\"tip\" role=\"tooltip\"></div>\n</div>\n"
    );
    html.push_str(
        "<h3>Zoom <span class=\"zoom-range hint\"></span></h3>\n<div class=\"controls zoom-controls\">\n<button type=\"button\" data-act=\"prev-oom\">◀ OOM</button>\n<button type=\"button\" data-act=\"next-oom\">OOM ▶</button>\n<button type=\"button\" data-act=\"peak-allocated\">peak allocated</button>\n<button type=\"button\" data-act=\"peak-reserved\">peak reserved</button>\n<button type=\"button\" data-act=\"prev-mark\">◀ marker</button>\n<button type=\"button\" data-act=\"next-mark\">marker ▶</button>\n<button type=\"button\" data-act=\"zoom-in\">zoom in</button>\n<button type=\"button\" data-act=\"zoom-out\">zoom out</button>\n<button type=\"button\" data-act=\"all\">whole run</button>\n</div>\n<div class=\"zoom-wrap\"><svg class=\"zoom\" xmlns=\"http://www.w3.org/2000/svg\"></svg><div class=\"cursor\"></div><div class=\"tip\" role=\"tooltip\"></div></div>\n",
    );
    html.push_str(
        "<h3>Segments after <span class=\"event-index\"></span></h3>\n<div class=\"controls\">\n<button type=\"button\" data-act=\"prev\" aria-label=\"previous event\">&#9664;</button>\n<input class=\"slider\" type=\"range\" min=\"0\" step=\"1\" aria-label=\"event\">\n<button type=\"button\" data-act=\"next\" aria-label=\"next event\">&#9654;</button>\n</div>\n<div class=\"event-info mono\"></div>\n<div class=\"map-wrap\"><svg class=\"map\" xmlns=\"http://www.w3.org/2000/svg\"></svg></div>\n<p class=\"legend\">\n<span class=\"swatch allocated\"></span>allocated\n<span class=\"swatch split_free\"></span>free in a segment still in use (cached; empty_cache() cannot return it)\n<span class=\"swatch cached_free\"></span>free segment (cached; empty_cache() returns it)\n<span class=\"swatch unmapped\"></span>unmapped (expandable segments)\n</p>\n",
    );
    let _ = write!(
        html,
        "<details class=\"end\"{}><summary>Counters and summary at the end</summary>\n{}\n<pre class=\"summary\">{}</pre>\n</details>\n</section>\n",
        if index == 0 { " open" } else { "" },
        counters_html(&panel.counters),
        escape(&panel.summary),
    );
    html
}

/// The comparison section: the table and the runs overlaid.
fn comparison_html(comparison: &Comparison, overlay: &str) -> String {
    let mut html = String::from(
        "<section class=\"comparison\">\n<h2>Comparison</h2>\n<table class=\"compare\"><tr>",
    );
    for cell in &comparison.header {
        let _ = write!(html, "<th>{}</th>", escape(cell));
    }
    html.push_str("</tr>");
    for row in &comparison.rows {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(cell));
        }
        html.push_str("</tr>");
    }
    let _ = write!(
        html,
        "</table>\n<div class=\"overlay\">\n{overlay}\n</div>\n</section>\n"
    );
    html
}

/// The report page.
pub fn html(input: &ReportInput<'_>) -> Result<String, ChartError> {
    let size = ChartSize::default();
    let mut panels_html = String::new();
    let mut panels_data = Vec::with_capacity(input.panels.len());
    for (index, panel) in input.panels.iter().enumerate() {
        let (svg, geometry) = chart::svg(panel.timeline, size)?;
        panels_html.push_str(&panel_html(index, panel, &svg));
        let mut data = timeline_json(panel.timeline, &geometry, size);
        data["label"] = json!(panel.label);
        panels_data.push(data);
    }
    let comparison = match &input.comparison {
        Some(comparison) => {
            let runs: Vec<(String, &Timeline)> = input
                .panels
                .iter()
                .map(|panel| (panel.label.clone(), panel.timeline))
                .collect();
            let (overlay, _) = chart::overlay_svg("the runs overlaid", &runs, size)?;
            comparison_html(comparison, &overlay)
        }
        None => String::new(),
    };
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
    let data = script_json(&json!({ "kinds": kinds, "panels": panels_data }));
    let subtitle = page_subtitle(input);
    let body_size = PAGE.len() + CSS.len() + JS.len() + data.len() + panels_html.len();
    // Substitute the placeholders in one pass, so nothing inserted is scanned again.
    let mut page = String::with_capacity(body_size + comparison.len());
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
            "TITLE" => page.push_str(&escape(&input.title)),
            "SUBTITLE" => page.push_str(&escape(&subtitle)),
            "HEADLINE" => {
                if let Some(headline) = &input.headline {
                    let _ = write!(
                        page,
                        "<p class=\"headline {}\">{}</p>",
                        headline.tone.class(),
                        escape(&headline.text)
                    );
                }
            }
            "CSS" => page.push_str(CSS),
            "COMPARISON" => page.push_str(&comparison),
            "PANELS" => page.push_str(&panels_html),
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

/// The page's subtitle: the device and, over every panel, events, OOMs and the script's own
/// `empty_cache()` calls (the OOMs agree with the panels' counters).
fn page_subtitle(input: &ReportInput<'_>) -> String {
    let total = |pick: fn(&Timeline) -> u64| -> u64 {
        input.panels.iter().map(|panel| pick(panel.timeline)).sum()
    };
    let device_total = input
        .panels
        .first()
        .map_or(0, |panel| panel.timeline.device_total);
    let mut text = format!(
        "device {} ({} total) · {} allocator events · {} out-of-memory errors · {} empty_cache() calls",
        input.device,
        format_size(device_total),
        total(|t| t.counts.events),
        total(|t| t.counts.ooms),
        total(Timeline::own_empty_cache_calls),
    );
    if input.panels.len() > 1 {
        let _ = write!(text, " · {} timelines", input.panels.len());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planted_input<'a>(timeline: &'a Timeline, evil: &str) -> ReportInput<'a> {
        ReportInput {
            headline: Some(Headline {
                text: evil.into(),
                tone: Tone::Caution,
            }),
            title: evil.into(),
            device: evil.into(),
            panels: vec![Panel {
                label: evil.into(),
                timeline,
                config: evil.into(),
                counters: vec![("num_ooms".into(), 0), (evil.into(), 1)],
                summary: evil.into(),
            }],
            comparison: Some(Comparison {
                header: vec![evil.into()],
                rows: vec![vec![evil.into()]],
            }),
        }
    }

    #[test]
    fn escapes_every_string_and_fills_every_placeholder() {
        let evil = "</script><script>alert(1)</script>\"'onerror=<!--\u{2028}&amp;";
        let mut timeline = Timeline {
            title: evil.into(),
            ..Timeline::default()
        };
        timeline.marks.push(crate::viz::Mark {
            position: 0,
            kind: MarkKind::Phase(evil.into()),
            context: 1,
        });
        timeline.labels.push(crate::viz::Site {
            label: evil.into(),
            helper: Some(evil.into()),
        });
        let page = html(&planted_input(&timeline, evil)).expect("draws");
        assert!(!page.contains("{{"));
        assert_eq!(
            page.matches("<script").count(),
            2,
            "only the page's own two"
        );
        assert_eq!(page.matches("</script").count(), 2);
        assert!(!page.contains("<!--"));
        assert!(!page.contains("alert(1)</"), "no planted markup survives");
        assert!(page.contains("&lt;/script&gt;&lt;script&gt;alert(1)"));
        assert!(page.contains("<p class=\"headline caution\">&lt;/script&gt;"));
        assert!(!page.contains("src=\"http"), "nothing is fetched");
        // The data element still holds the planted text, intact once parsed.
        let start = page.find("type=\"application/json\">").expect("data") + 24;
        let end = start + page[start..].find("</script>").expect("end of data");
        assert!(!page[start..end].contains(['<', '>', '&', '\u{2028}']));
        let data: Value = serde_json::from_str(&page[start..end]).expect("valid JSON");
        assert_eq!(data["panels"][0]["label"], json!(evil));
        assert_eq!(data["panels"][0]["marks"][0][3], json!(evil));
    }

    #[test]
    fn script_json_escapes_only_inside_strings_and_stays_json() {
        let value = json!({"a": "<b>&\u{2029}", "n": [1, 2]});
        let text = script_json(&value);
        assert_eq!(text, r#"{"a":"\u003cb\u003e\u0026\u2029","n":[1,2]}"#);
        assert_eq!(serde_json::from_str::<Value>(&text).expect("json"), value);
    }
}
