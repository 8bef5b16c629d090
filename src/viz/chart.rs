//! The `--timeline` chart: allocated and reserved bytes over a run's events, drawn per pixel
//! column as the lowest and highest value the column's events reached (so every peak shows
//! exactly however many events share a pixel), with OOMs, `empty_cache()` calls and the
//! script's `mark(text)` phases marked, and the limits that explain an OOM (the fraction cap,
//! the device total and what the CUDA context and other processes left of it). Drawn with
//! plotters, as SVG or PNG; text uses the DejaVu Sans font built into the binary, so nothing
//! depends on the fonts of the machine that draws or views it.
//!
//! The legend sits above the plot, never over data; a marker's label is drawn only where it
//! fits between its line and its neighbours' (markers too close to label one by one are
//! labelled as a group), so no label crosses another marker's line.

use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::envelope::Bucket;
use super::timeline::{MarkKind, Numbering, Timeline};
use super::units;

/// Pixel size of the chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChartSize {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl Default for ChartSize {
    fn default() -> ChartSize {
        ChartSize {
            width: 1100,
            height: 500,
        }
    }
}

/// Where the plot sits in the picture, so a page can map the mouse to an event number: pixel
/// `left + f × (right − left)` is event number `from + f × (to − from)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChartGeometry {
    /// Left edge of the plotting area, in pixels.
    pub left: i32,
    /// Right edge of the plotting area.
    pub right: i32,
    /// Top edge of the plotting area.
    pub top: i32,
    /// Bottom edge of the plotting area.
    pub bottom: i32,
    /// The event number at the left edge.
    pub from: u64,
    /// The event number at the right edge (the last event's number + 1: the state after an
    /// event is drawn from its number to the next).
    pub to: u64,
    /// Bytes at the top edge of the plot (0 at the bottom).
    pub y_max: f64,
}

impl ChartGeometry {
    /// The geometry of a drawn plot: its plotting area's pixel ranges (plotters'
    /// `get_pixel_range`), the events it spans and the bytes at its top edge.
    fn of_plot(
        (x_range, y_range): (std::ops::Range<i32>, std::ops::Range<i32>),
        (from, to): (u64, u64),
        y_max_bytes: f64,
    ) -> ChartGeometry {
        ChartGeometry {
            left: x_range.start,
            right: x_range.end,
            top: y_range.start,
            bottom: y_range.end,
            from,
            to,
            y_max: y_max_bytes,
        }
    }
}

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// plotters failed.
    #[error("drawing the chart failed: {0}")]
    Draw(String),
    /// Encoding the PNG failed.
    #[error("encoding the PNG failed: {0}")]
    Png(String),
}

fn draw_error(error: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(error.to_string())
}

/// Registers the built-in font once per process.
fn register_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        // The font is built in and valid; registering it cannot fail in practice, and if it
        // did plotters would report the missing font when drawing.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

/// How a phase marker's label begins.
const PHASE_KIND: &str = "▸";

/// Up to this many OOMs, each is drawn with the request it could not meet.
const FEW_OOMS: u64 = 20;

const RESERVED: RGBColor = RGBColor(52, 110, 170);
const ALLOCATED: RGBColor = RGBColor(196, 58, 40);
const OOM: RGBColor = RGBColor(200, 0, 90);
const CACHE: RGBColor = RGBColor(30, 140, 60);
const PHASE: RGBColor = RGBColor(90, 70, 150);
const CAP: RGBColor = RGBColor(230, 120, 0);
const DEVICE: RGBColor = RGBColor(60, 60, 60);

/// Colours of overlaid runs, in order.
const OVERLAY: [RGBColor; 6] = [
    RGBColor(52, 110, 170),
    RGBColor(196, 58, 40),
    RGBColor(30, 140, 60),
    RGBColor(150, 80, 170),
    RGBColor(220, 130, 0),
    RGBColor(20, 150, 160),
];

/// One value per pixel column: the events in column `c` of `n` over event numbers
/// `from..to`, merged (the state carried in included). Exact: every value the run took is in
/// the column of its event number.
pub fn columns(timeline: &Timeline, from: u64, to: u64, n: usize) -> Vec<Option<Bucket>> {
    let span = to.saturating_sub(from);
    (0..n as u64)
        .map(|c| {
            let start = from + c * span / n as u64;
            let stop = (from + (c + 1) * span / n as u64).max(start + 1);
            timeline.envelope.over(start, stop)
        })
        .collect()
}

/// The unit the y axis counts in, for a largest value of `bytes`.
fn unit(bytes: u64) -> (&'static str, u64) {
    match units::unit_for(bytes) {
        (_, size) if size >= 1 << 30 => ("GiB", 1 << 30),
        (_, size) if size >= 1 << 20 || bytes == 0 => ("MiB", 1 << 20),
        other => other,
    }
}

/// An event number for an axis: `1234`, `250k`, `1.5M`.
fn event_number(x: f64) -> String {
    if x.fract() != 0.0 || x < 0.0 {
        return String::new();
    }
    match x {
        x if x >= 1e6 => format!("{}M", units::trimmed(x / 1e6)),
        x if x >= 1e5 => format!("{}k", units::trimmed(x / 1e3)),
        x => format!("{x:.0}"),
    }
}

/// The limits drawn: the fraction caps set during the run, and the device figures an OOM
/// that the device (not the cap) refused makes relevant.
struct Limits {
    /// The highest cap set (None: never capped).
    cap: Option<u64>,
    /// Whether to draw the device total.
    device: bool,
    /// What the allocator could reach at a device-limited OOM (total less the context and
    /// other processes), the lowest of them.
    reachable: Option<u64>,
}

impl Limits {
    fn of(timeline: &Timeline) -> Limits {
        let cap = timeline.caps.iter().filter_map(|(_, cap)| *cap).max();
        let reachable = timeline
            .marks
            .iter()
            .filter_map(|mark| match &mark.kind {
                MarkKind::Oom(limits) if !limits.over_cap() => Some(limits.device_reachable()),
                _ => None,
            })
            .min();
        let (_, peak_reserved) = timeline.peaks();
        Limits {
            cap,
            device: reachable.is_some()
                || (timeline.device_total > 0 && peak_reserved >= timeline.device_total / 2),
            reachable,
        }
    }

    /// The highest limit to keep in view.
    fn top(&self, device_total: u64) -> u64 {
        let device = if self.device { device_total } else { 0 };
        self.cap.unwrap_or(0).max(device)
    }
}

/// A legend entry: what its swatch looks like and what it says.
enum Swatch {
    Line(RGBColor, u32),
    Dashed(RGBColor),
    Marker(RGBColor),
    None,
}

/// The font of legend entries.
fn legend_font() -> TextStyle<'static> {
    ("sans-serif", 13).into_font().color(&RGBColor(40, 40, 40))
}

/// Where each legend entry goes in `area`, left to right from `left` and wrapped into rows of
/// 20 pixels so no entry runs past the right edge: its swatch's `(x, y)`.
fn legend_positions<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(Swatch, String)],
    left: i32,
) -> Vec<(i32, i32)> {
    let font = legend_font();
    let (width, _) = area.dim_in_pixel();
    let (mut x, mut y) = (left, 10);
    let mut positions = Vec::with_capacity(entries.len());
    for (_, text) in entries {
        let text_width = area
            .estimate_text_size(text, &font)
            .map_or(text.len() as i32 * 7, |(w, _)| w as i32);
        if x + 30 + text_width > width as i32 - 10 && x > left {
            x = left;
            y += 20;
        }
        positions.push((x, y));
        x += 28 + text_width + 22;
    }
    positions
}

/// A legend row above the plot (never over data).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(Swatch, String)],
    left: i32,
) -> Result<(), ChartError> {
    let font = legend_font();
    let positions = legend_positions(area, entries, left);
    for ((swatch, text), (x, y)) in entries.iter().zip(positions) {
        match swatch {
            Swatch::Line(color, stroke) => area
                .draw(&PathElement::new(
                    vec![(x, y + 7), (x + 22, y + 7)],
                    color.stroke_width(*stroke),
                ))
                .map_err(draw_error)?,
            Swatch::Dashed(color) => {
                for dash in 0..3 {
                    area.draw(&PathElement::new(
                        vec![(x + dash * 8, y + 7), (x + dash * 8 + 5, y + 7)],
                        color.stroke_width(2),
                    ))
                    .map_err(draw_error)?;
                }
            }
            Swatch::Marker(color) => area
                .draw(&PathElement::new(
                    vec![(x + 11, y), (x + 11, y + 14)],
                    color.stroke_width(2),
                ))
                .map_err(draw_error)?,
            Swatch::None => {}
        }
        area.draw(&Text::new(text.clone(), (x + 28, y), font.clone()))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// The x axis of a chart over the events of a snapshot file, numbered as the text numbers them.
const FILE_EVENT_AXIS: &str = "event of the snapshot file (its index, as the text numbers it)";

/// The chart of a timeline or an overlay below its heading: events `from..to` across, 0 to
/// `y_max` (in the chart's unit) up, with the mesh, the axis names `(x_desc, y_desc)` and
/// whole-number event ticks drawn.
fn event_chart<'a, DB: DrawingBackend>(
    body: &'a DrawingArea<DB, Shift>,
    (from, to): (u64, u64),
    y_max: f64,
    (x_desc, y_desc): (&str, &str),
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, ChartError> {
    let mut chart = ChartBuilder::on(body)
        .margin(14)
        .margin_top(4)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(from as f64..to as f64, 0f64..y_max)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        // Events are whole numbers: ticks plotters puts between them stay unlabelled.
        .x_label_formatter(&|x| event_number(*x))
        .y_label_formatter(&|y| units::trimmed(*y))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(236, 236, 236))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(draw_error)?;
    Ok(chart)
}

/// Draws a picture's heading — its title, then the legend in as many rows as it needs, so the
/// legend never covers the plot — and returns the area left below it for the plot.
fn draw_heading<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    legend: &[(Swatch, String)],
) -> Result<DrawingArea<DB, Shift>, ChartError> {
    let caption_height = 34;
    let legend_height = 20 * legend_rows(root, legend, 84) + 6;
    let (head, body) = root.split_vertically(caption_height + legend_height);
    let (caption, legend_area) = head.split_vertically(caption_height);
    caption
        .draw(&Text::new(
            title.to_string(),
            (14, 8),
            ("sans-serif", 20).into_font().color(&BLACK),
        ))
        .map_err(draw_error)?;
    draw_legend(&legend_area, legend, 84)?;
    Ok(body)
}

/// Rows the legend `entries` take in `area` (at least one).
fn legend_rows<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(Swatch, String)],
    left: i32,
) -> i32 {
    legend_positions(area, entries, left)
        .last()
        .map_or(1, |&(_, y)| (y - 10) / 20 + 1)
}

/// One marker as drawn: its pixel column, colour, name and label.
struct Marker {
    px: f64,
    color: RGBColor,
    kind: &'static str,
    label: String,
}

/// Places marker labels: each group of markers closer than a few pixels gets one label, right
/// of its last line or left of its first, only where the label fits before the next group's
/// line (or after the previous one's), in the first of `rows` rows where it overlaps no other
/// label. Returns (row, left pixel, text) per label.
fn place_labels(
    markers: &[Marker],
    width_of: &dyn Fn(&str) -> f64,
    plot: (f64, f64),
    rows: usize,
) -> Vec<(usize, f64, String, RGBColor)> {
    const PAD: f64 = 4.0;
    const GROUP: f64 = 6.0;
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for (index, marker) in markers.iter().enumerate() {
        match groups.last_mut() {
            Some((_, last)) if marker.px - markers[*last].px < GROUP => *last = index,
            _ => groups.push((index, index)),
        }
    }
    let mut row_spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); rows];
    let mut placed = Vec::new();
    for (group_index, &(first, last)) in groups.iter().enumerate() {
        let left_limit = group_index
            .checked_sub(1)
            .map_or(plot.0, |previous| markers[groups[previous].1].px);
        let right_limit = groups
            .get(group_index + 1)
            .map_or(plot.1, |next| markers[next.0].px);
        let count = last - first + 1;
        let texts: Vec<String> = if count == 1 {
            let marker = &markers[first];
            let mut texts = Vec::new();
            if !marker.label.is_empty() {
                texts.push(format!("{} {}", marker.kind, marker.label));
                // A phase's name is worth keeping in part where the whole does not fit.
                if marker.kind == PHASE_KIND {
                    let chars: Vec<char> = marker.label.chars().collect();
                    for keep in [24, 16, 10, 6, 3] {
                        if chars.len() > keep {
                            let short: String = chars[..keep].iter().collect();
                            texts.push(format!("{} {}…", marker.kind, short.trim_end()));
                        }
                    }
                }
            }
            texts.push(marker.kind.to_string());
            texts
        } else {
            let same = markers[first..=last]
                .iter()
                .all(|m| m.kind == markers[first].kind);
            if same {
                vec![format!("{count} × {}", markers[first].kind)]
            } else {
                vec![format!("{count} markers")]
            }
        };
        let color = markers[last].color;
        'texts: for text in texts {
            let width = width_of(&text);
            let right = markers[last].px + PAD;
            let left = markers[first].px - PAD - width;
            let mut candidates = Vec::new();
            if right + width + PAD <= right_limit {
                candidates.push(right);
            }
            if left - PAD >= left_limit {
                candidates.push(left);
            }
            for start in candidates {
                for (row, spans) in row_spans.iter_mut().enumerate() {
                    let free = spans
                        .iter()
                        .all(|&(a, b)| start + width + PAD <= a || start >= b + PAD);
                    if free {
                        spans.push((start, start + width));
                        placed.push((row, start, text.clone(), color));
                        break 'texts;
                    }
                }
            }
        }
    }
    placed
}

/// Draws `timeline` on `root` under `title`.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    timeline: &Timeline,
    title: &str,
) -> Result<ChartGeometry, ChartError> {
    register_font();
    root.fill(&WHITE).map_err(draw_error)?;
    let from = timeline.envelope.origin;
    let to = timeline.end.max(from + 1);
    let limits = Limits::of(timeline);
    let (peak_allocated, peak_reserved) = timeline.peaks();
    let top = peak_reserved.max(limits.top(timeline.device_total));
    let (unit_name, unit) = unit(top);
    let scale = |bytes: u64| bytes as f64 / unit as f64;
    // Headroom above everything drawn, for the marker labels' rows.
    let y_max = (scale(top) * 1.28).max(1e-9);

    let mut legend = vec![
        (
            Swatch::Line(RESERVED, 3),
            format!(
                "reserved (memory_reserved), peak {}",
                units::bytes(peak_reserved)
            ),
        ),
        (
            Swatch::Line(ALLOCATED, 3),
            format!(
                "allocated (memory_allocated), peak {}",
                units::bytes(peak_allocated)
            ),
        ),
    ];
    let has = |wanted: fn(&MarkKind) -> bool| timeline.marks.iter().any(|m| wanted(&m.kind));
    if has(|k| matches!(k, MarkKind::Oom(_))) {
        let text = if timeline.counts.ooms <= FEW_OOMS {
            "out of memory (the bar: the segment it could not have, from the reserved bytes up)"
                .to_string()
        } else if timeline.counts.marks_dropped > 0 {
            // The recorder keeps the first markers only: a stretch without lines after the
            // last one is not a stretch without OOMs.
            format!(
                "out of memory ({} of them: markers up to event {} only)",
                timeline.counts.ooms,
                timeline.marks.last().map_or(0, |mark| mark.position)
            )
        } else {
            "out of memory".to_string()
        };
        legend.push((Swatch::Marker(OOM), text));
    }
    if has(|k| matches!(k, MarkKind::EmptyCache)) {
        legend.push((Swatch::Marker(CACHE), "empty_cache()".to_string()));
    }
    if has(|k| matches!(k, MarkKind::Phase(_))) {
        legend.push((
            Swatch::Dashed(PHASE),
            "mark(text): a phase begins".to_string(),
        ));
    }
    if let Some(cap) = limits.cap {
        legend.push((
            Swatch::Dashed(CAP),
            format!(
                "fraction cap (set_per_process_memory_fraction), up to {}",
                units::bytes(cap)
            ),
        ));
    }
    if limits.device {
        legend.push((
            Swatch::Line(DEVICE, 1),
            format!("device total {}", units::bytes(timeline.device_total)),
        ));
    }
    if let Some(reachable) = limits.reachable {
        legend.push((
            Swatch::Dashed(DEVICE),
            format!(
                "what the allocator could reach at the OOM: {} (the rest: CUDA context, other processes)",
                units::bytes(reachable)
            ),
        ));
    } else if !limits.device && timeline.device_total > 0 {
        legend.push((
            Swatch::None,
            format!(
                "device total {} (off the scale)",
                units::bytes(timeline.device_total)
            ),
        ));
    }

    let body = draw_heading(root, title, &legend)?;
    let x_desc = match timeline.numbering {
        Numbering::Sequence => "allocator event (#)",
        Numbering::TraceIndex => FILE_EVENT_AXIS,
    };
    let mut chart = event_chart(&body, (from, to), y_max, (x_desc, unit_name))?;
    let (x_range, y_range) = chart.plotting_area().get_pixel_range();
    let width_px = (x_range.end - x_range.start).max(1) as usize;
    let column_x = |c: usize| from as f64 + c as f64 * (to - from) as f64 / width_px as f64;
    let columns = columns(timeline, from, to, width_px);

    // Reserved first, so allocated (never above it) is drawn on top.
    type Pick = fn(&Bucket) -> (u64, u64);
    let series: [(Pick, RGBColor, f64); 2] = [
        (|b| (b.reserved.min, b.reserved.max), RESERVED, 0.12),
        (|b| (b.allocated.min, b.allocated.max), ALLOCATED, 0.2),
    ];
    for (pick, color, fill) in series {
        let mut tops = Vec::with_capacity(2 * width_px);
        let mut bottoms = Vec::with_capacity(2 * width_px);
        for (c, column) in columns.iter().enumerate() {
            let Some(bucket) = column else { continue };
            let (low, high) = pick(bucket);
            tops.push((column_x(c), scale(high)));
            tops.push((column_x(c + 1), scale(high)));
            bottoms.push((column_x(c), scale(low)));
            bottoms.push((column_x(c + 1), scale(low)));
        }
        chart
            .draw_series(AreaSeries::new(
                bottoms.iter().copied(),
                0.0,
                color.mix(fill),
            ))
            .map_err(draw_error)?;
        // The band between the lowest and highest value of each column.
        let band: Vec<(f64, f64)> = tops
            .iter()
            .copied()
            .chain(bottoms.iter().rev().copied())
            .collect();
        chart
            .draw_series(std::iter::once(Polygon::new(band, color.mix(fill + 0.25))))
            .map_err(draw_error)?;
        chart
            .draw_series(LineSeries::new(tops.iter().copied(), color.stroke_width(2)))
            .map_err(draw_error)?;
    }

    // The limits.
    if let Some(_cap) = limits.cap {
        let mut steps: Vec<(f64, Option<u64>)> = timeline
            .caps
            .iter()
            .map(|&(at, cap)| (at as f64, cap))
            .collect();
        steps.push((to as f64, None));
        for pair in steps.windows(2) {
            let (start, cap) = pair[0];
            let end = pair[1].0;
            if let Some(cap) = cap {
                dashed_line(&mut chart, (start, scale(cap)), (end, scale(cap)), CAP)?;
            }
        }
    }
    if limits.device {
        let y = scale(timeline.device_total);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(from as f64, y), (to as f64, y)],
                DEVICE.stroke_width(1),
            )))
            .map_err(draw_error)?;
    }
    if let Some(reachable) = limits.reachable {
        let y = scale(reachable);
        dashed_line(&mut chart, (from as f64, y), (to as f64, y), DEVICE)?;
    }

    // Markers: a vertical line each; at an OOM, the request it could not meet drawn from the
    // reserved bytes up.
    let to_px = |x: f64| {
        f64::from(x_range.start) + (x - from as f64) / (to - from) as f64 * width_px as f64
    };
    let mut markers = Vec::new();
    // Many OOMs (a search that catches them) are drawn lighter, without their requests.
    let few_ooms = timeline.counts.ooms <= FEW_OOMS;
    // The pixel column of the last line drawn for each kind of marker: marks come in order, and
    // a second line of the same kind in the same column would add nothing but bytes (a replay
    // with 40,000 OOMs would otherwise write 20,000 lines into a 1,000-pixel-wide plot).
    let mut last_column: [Option<i64>; 3] = [None; 3];
    for mark in &timeline.marks {
        // An event's marker stands in the middle of its step; a phase begins where the step of
        // its first event does.
        let x = match mark.kind {
            MarkKind::Phase(_) => mark.position as f64,
            _ => mark.position as f64 + 0.5,
        };
        let (color, kind, label, dashed) = match &mark.kind {
            MarkKind::Oom(limits) => {
                if few_ooms {
                    let low = scale(limits.reserved);
                    let high = scale(limits.reserved + limits.segment).min(y_max);
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x, low), (x, high)],
                            OOM.stroke_width(5),
                        )))
                        .map_err(draw_error)?;
                }
                (OOM, "OOM", timeline.label(mark.context), false)
            }
            MarkKind::EmptyCache => (CACHE, "empty_cache()", timeline.label(mark.context), false),
            MarkKind::Phase(text) => (PHASE, PHASE_KIND, text.clone(), true),
        };
        let column = to_px(x).round() as i64;
        let slot = match kind {
            "OOM" => 0,
            "empty_cache()" => 1,
            _ => 2,
        };
        let repeated = last_column[slot] == Some(column);
        last_column[slot] = Some(column);
        if repeated {
            // Its line is already there; it still counts for the labels.
        } else if dashed {
            dashed_line(&mut chart, (x, 0.0), (x, y_max), color)?;
        } else {
            let style = match kind {
                "OOM" if few_ooms => color.stroke_width(2),
                "OOM" => color.mix(0.45).stroke_width(1),
                _ => color.stroke_width(1),
            };
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, 0.0), (x, y_max)],
                    style,
                )))
                .map_err(draw_error)?;
        }
        markers.push(Marker {
            px: to_px(x),
            color,
            kind,
            label: short_label(&label),
        });
    }
    let font_of = |color: RGBColor| ("sans-serif", 12).into_font().color(&color);
    let width_of = |text: &str| {
        root.estimate_text_size(text, &font_of(BLACK))
            .map_or(text.len() as f64 * 7.0, |(w, _)| f64::from(w))
    };
    const ROWS: usize = 4;
    let placed = place_labels(
        &markers,
        &width_of,
        (f64::from(x_range.start), f64::from(x_range.end)),
        ROWS,
    );
    let height_px = f64::from(y_range.end - y_range.start).max(1.0);
    for (row, left_px, text, color) in placed {
        let y_px = f64::from(y_range.start) + 6.0 + 16.0 * row as f64;
        let x = from as f64
            + (left_px - f64::from(x_range.start)) / width_px as f64 * (to - from) as f64;
        let y = y_max * (1.0 - (y_px - f64::from(y_range.start)) / height_px);
        chart
            .draw_series(std::iter::once(Text::new(text, (x, y), font_of(color))))
            .map_err(draw_error)?;
    }
    root.present().map_err(draw_error)?;
    Ok(ChartGeometry::of_plot(
        (x_range, y_range),
        (from, to),
        y_max * unit as f64,
    ))
}

/// A dashed line from `a` to `b` in data coordinates.
fn dashed_line<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    a: (f64, f64),
    b: (f64, f64),
    color: RGBColor,
) -> Result<(), ChartError> {
    let (from_px, to_px) = (chart.backend_coord(&a), chart.backend_coord(&b));
    let length = f64::from((to_px.0 - from_px.0).pow(2) + (to_px.1 - from_px.1).pow(2)).sqrt();
    let dashes = (length / 9.0).ceil().max(1.0) as usize;
    let pieces = (0..dashes).map(|i| {
        let start = i as f64 / dashes as f64;
        let end = (i as f64 + 0.6) / dashes as f64;
        let at = |t: f64| (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
        PathElement::new(vec![at(start), at(end)], color.stroke_width(2))
    });
    chart.draw_series(pieces).map_err(draw_error)?;
    Ok(())
}

/// `file:line` shortened to the file's name (the helper kept after it).
fn short_label(label: &str) -> String {
    match label.split_once(' ') {
        Some((site, rest)) => format!("{} {rest}", site.rsplit('/').next().unwrap_or(site)),
        None => label.rsplit('/').next().unwrap_or(label).to_string(),
    }
}

/// The title a chart of `timeline` gets on its own.
fn title_of(timeline: &Timeline) -> String {
    if timeline.title.is_empty() {
        "memory over events".to_string()
    } else {
        format!("{}: memory over events", timeline.title)
    }
}

/// The chart as an SVG document, and where its plot sits.
pub fn svg(timeline: &Timeline, size: ChartSize) -> Result<(String, ChartGeometry), ChartError> {
    let mut text = String::new();
    let geometry = {
        let root =
            SVGBackend::with_string(&mut text, (size.width, size.height)).into_drawing_area();
        draw(&root, timeline, &title_of(timeline))?
    };
    Ok((text, geometry))
}

/// The chart as a PNG file's bytes.
pub fn png(timeline: &Timeline, size: ChartSize) -> Result<Vec<u8>, ChartError> {
    picture(&[(String::new(), timeline)], false, size, Format::Png)
}

/// A picture file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An SVG document.
    Svg,
    /// A PNG image.
    Png,
}

/// One picture of several timelines: each labelled run's chart stacked under the previous
/// (the session's allocator, then each side allocator or device), or, with `overlay`, the
/// runs of one job drawn over one axis (`--compare`). Each chart is `size`.
pub fn picture(
    runs: &[(String, &Timeline)],
    overlay: bool,
    size: ChartSize,
    format: Format,
) -> Result<Vec<u8>, ChartError> {
    let count = if overlay { 1 } else { runs.len().max(1) as u32 };
    let total = (size.width, size.height * count);
    match format {
        Format::Svg => {
            let mut text = String::new();
            paint(
                &SVGBackend::with_string(&mut text, total).into_drawing_area(),
                runs,
                overlay,
            )?;
            Ok(text.into_bytes())
        }
        Format::Png => {
            let mut pixels = vec![0_u8; total.0 as usize * total.1 as usize * 3];
            paint(
                &BitMapBackend::with_buffer(&mut pixels, total).into_drawing_area(),
                runs,
                overlay,
            )?;
            encode_png(
                &pixels,
                ChartSize {
                    width: total.0,
                    height: total.1,
                },
            )
        }
    }
}

/// Draws [`picture`]'s charts on `root`.
fn paint<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(String, &Timeline)],
    overlay: bool,
) -> Result<(), ChartError> {
    if overlay {
        let title = runs.first().map_or_else(String::new, |(_, timeline)| {
            format!("{}: the configs compared", timeline.title)
        });
        draw_overlay(root, &title, runs)?;
        return Ok(());
    }
    let areas = root.split_evenly((runs.len().max(1), 1));
    for (area, (label, timeline)) in areas.iter().zip(runs) {
        let title = if label.is_empty() {
            title_of(timeline)
        } else {
            // Several charts: each names its run, after the script's file name.
            let file = timeline.title.rsplit('/').next().unwrap_or(&timeline.title);
            format!("{file}: {label}")
        };
        draw(area, timeline, &title)?;
    }
    Ok(())
}

fn encode_png(pixels: &[u8], size: ChartSize) -> Result<Vec<u8>, ChartError> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, size.width, size.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .map_err(|error| ChartError::Png(error.to_string()))?;
        writer
            .write_image_data(pixels)
            .map_err(|error| ChartError::Png(error.to_string()))?;
    }
    Ok(bytes)
}

/// Draws several runs of the same job over one x axis (a replay under several configs):
/// each run's reserved bytes as a line, its allocated bytes dashed, in its own colour.
fn draw_overlay<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    runs: &[(String, &Timeline)],
) -> Result<ChartGeometry, ChartError> {
    register_font();
    root.fill(&WHITE).map_err(draw_error)?;
    let from = runs
        .iter()
        .map(|(_, t)| t.envelope.origin)
        .min()
        .unwrap_or(0);
    let to = runs
        .iter()
        .map(|(_, t)| t.end)
        .max()
        .unwrap_or(1)
        .max(from + 1);
    let top = runs.iter().map(|(_, t)| t.peaks().1).max().unwrap_or(0);
    let (unit_name, unit) = unit(top);
    let scale = |bytes: u64| bytes as f64 / unit as f64;
    let y_max = (scale(top) * 1.15).max(1e-9);
    let mut legend = Vec::new();
    for (index, (label, timeline)) in runs.iter().enumerate() {
        let color = OVERLAY[index % OVERLAY.len()];
        let (allocated, reserved) = timeline.peaks();
        legend.push((
            Swatch::Line(color, 3),
            format!(
                "{label}: reserved (peak {}), allocated thin (peak {}), {} OOMs",
                units::bytes(reserved),
                units::bytes(allocated),
                timeline.counts.ooms
            ),
        ));
    }
    let body = draw_heading(root, title, &legend)?;
    let mut chart = event_chart(&body, (from, to), y_max, (FILE_EVENT_AXIS, unit_name))?;
    let (x_range, y_range) = chart.plotting_area().get_pixel_range();
    let width_px = (x_range.end - x_range.start).max(1) as usize;
    let column_x = |c: usize| from as f64 + c as f64 * (to - from) as f64 / width_px as f64;
    for (index, (_, timeline)) in runs.iter().enumerate() {
        let color = OVERLAY[index % OVERLAY.len()];
        let columns = columns(timeline, from, to, width_px);
        let mut reserved = Vec::new();
        let mut allocated = Vec::new();
        for (c, column) in columns.iter().enumerate() {
            let Some(bucket) = column else { continue };
            for x in [column_x(c), column_x(c + 1)] {
                reserved.push((x, scale(bucket.reserved.max)));
                allocated.push((x, scale(bucket.allocated.max)));
            }
        }
        chart
            .draw_series(LineSeries::new(reserved, color.stroke_width(2)))
            .map_err(draw_error)?;
        chart
            .draw_series(LineSeries::new(allocated, color.mix(0.55).stroke_width(1)))
            .map_err(draw_error)?;
        for mark in &timeline.marks {
            if let MarkKind::Oom(_) = mark.kind {
                let x = mark.position as f64 + 0.5;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x, 0.0), (x, y_max * 0.04)],
                        color.stroke_width(2),
                    )))
                    .map_err(draw_error)?;
            }
        }
    }
    root.present().map_err(draw_error)?;
    Ok(ChartGeometry::of_plot(
        (x_range, y_range),
        (from, to),
        y_max * unit as f64,
    ))
}

/// Several runs of one job overlaid (drawn as `draw_overlay` draws them) as an SVG document.
pub fn overlay_svg(
    title: &str,
    runs: &[(String, &Timeline)],
    size: ChartSize,
) -> Result<(String, ChartGeometry), ChartError> {
    let mut text = String::new();
    let geometry = {
        let root =
            SVGBackend::with_string(&mut text, (size.width, size.height)).into_drawing_area();
        draw_overlay(&root, title, runs)?
    };
    Ok((text, geometry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viz::envelope::Envelope;

    fn timeline(states: &[(u64, u64)]) -> Timeline {
        let mut envelope = Envelope::new(0, 0, 0, Envelope::MAX_BUCKETS);
        for (index, &(allocated, reserved)) in states.iter().enumerate() {
            envelope.record(index as u64 + 1, allocated, reserved);
        }
        let end = states.len() as u64 + 1;
        envelope.close(end);
        let peak = |pick: fn(&(u64, u64)) -> u64| crate::viz::timeline::Peak {
            bytes: states.iter().map(pick).max().unwrap_or(0),
            position: 0,
        };
        Timeline {
            end,
            envelope,
            peak_allocated: peak(|s| s.0),
            peak_reserved: peak(|s| s.1),
            ..Timeline::default()
        }
    }

    #[test]
    fn every_column_holds_the_extremes_of_its_events() {
        // A spike of one event among a million: the column it falls in reaches it.
        let mut states = vec![(10_u64, 100_u64); 1_000_000];
        states[654_321] = (99, 100);
        let timeline = timeline(&states);
        let columns = columns(&timeline, 0, timeline.end, 1000);
        let highest = columns
            .iter()
            .filter_map(|c| c.map(|b| b.allocated.max))
            .max();
        assert_eq!(highest, Some(99));
        let spike = columns
            .iter()
            .position(|c| c.is_some_and(|b| b.allocated.max == 99))
            .expect("a column with the spike");
        assert!((653..=655).contains(&spike), "column {spike}");
        assert!(columns
            .iter()
            .all(|c| c.is_some_and(|b| b.allocated.min == 10 || b.allocated.min == 0)));
    }

    #[test]
    fn labels_fit_between_marker_lines_or_are_grouped() {
        let marker = |px: f64, label: &str| Marker {
            px,
            color: OOM,
            kind: "OOM",
            label: label.to_string(),
        };
        let markers = [
            marker(100.0, "a.rhai:1"),
            marker(160.0, "a.rhai:2"),
            marker(163.0, "a.rhai:3"),
            marker(400.0, "a.rhai:4"),
        ];
        let width_of = |text: &str| text.len() as f64 * 7.0;
        let placed = place_labels(&markers, &width_of, (50.0, 1000.0), 3);
        let lines: Vec<f64> = markers.iter().map(|m| m.px).collect();
        for (_, left, text, _) in &placed {
            let right = left + width_of(text);
            assert!(
                lines.iter().all(|&x| x <= *left || x >= right),
                "{text:?} at {left}..{right} crosses a marker line"
            );
        }
        let texts: Vec<&str> = placed.iter().map(|p| p.2.as_str()).collect();
        assert!(texts.contains(&"2 × OOM"), "{texts:?}");
        assert!(texts.contains(&"OOM a.rhai:4"), "{texts:?}");
    }

    /// The texts of an SVG with their y coordinates.
    fn texts(svg: &str) -> Vec<(i32, String)> {
        svg.split("</text>")
            .filter_map(|part| {
                let (tag, text) = part.rsplit_once('>')?;
                let tag = tag.rsplit_once("<text")?.1;
                let y = tag.split(" y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                Some((y, text.trim().to_string()))
            })
            .collect()
    }

    #[test]
    fn the_legend_sits_above_the_plot_never_over_data() {
        let mut states = vec![(900_u64 << 20, 1000_u64 << 20); 50];
        states[0] = (1000 << 20, 1000 << 20);
        let timeline = timeline(&states);
        let (picture, geometry) = svg(&timeline, ChartSize::default()).expect("drawn");
        let legend: Vec<i32> = texts(&picture)
            .into_iter()
            .filter(|(_, text)| text.starts_with("reserved (") || text.starts_with("allocated ("))
            .map(|(y, _)| y)
            .collect();
        assert_eq!(legend.len(), 2, "{picture}");
        for y in legend {
            assert!(
                y + 14 <= geometry.top,
                "legend text at {y}, plot from {}",
                geometry.top
            );
        }
    }

    #[test]
    fn the_limits_that_explain_an_oom_are_drawn() {
        use crate::viz::timeline::{Mark, OomLimits};
        let mut timeline = timeline(&[(200 << 20, 200 << 20), (200 << 20, 200 << 20)]);
        timeline.device_total = 1 << 30;
        timeline.caps = vec![(0, None), (1, Some(256 << 20))];
        timeline.marks.push(Mark {
            position: 2,
            kind: MarkKind::Oom(OomLimits {
                reserved: 200 << 20,
                segment: 100 << 20,
                device_free: 800 << 20,
                cap: Some(256 << 20),
            }),
            context: 0,
        });
        timeline.counts.ooms = 1;
        let (picture, _) = svg(&timeline, ChartSize::default()).expect("drawn");
        let all: Vec<String> = texts(&picture).into_iter().map(|(_, text)| text).collect();
        assert!(
            all.iter()
                .any(|t| t.starts_with("fraction cap") && t.contains("256 MiB")),
            "{all:?}"
        );
        assert!(
            all.iter()
                .any(|t| t == "device total 1 GiB (off the scale)"),
            "{all:?}"
        );
        // The cap is drawn as dashes in its colour.
        assert!(picture.contains("stroke=\"#E67800\""), "the cap's line");

        // Refused by the device, not the cap: the device total and what the allocator could
        // reach (what it held plus what was free) are drawn.
        timeline.caps = vec![(0, None)];
        timeline.marks[0].kind = MarkKind::Oom(OomLimits {
            reserved: 900 << 20,
            segment: 200 << 20,
            device_free: 100 << 20,
            cap: None,
        });
        let (picture, _) = svg(&timeline, ChartSize::default()).expect("drawn");
        let all: Vec<String> = texts(&picture).into_iter().map(|(_, text)| text).collect();
        assert!(all.iter().any(|t| t == "device total 1 GiB"), "{all:?}");
        assert!(
            all.iter()
                .any(|t| t.starts_with("what the allocator could reach at the OOM: 1000 MiB")),
            "{all:?}"
        );
    }

    #[test]
    fn many_markers_in_one_pixel_column_draw_one_line() {
        use crate::viz::timeline::{Mark, OomLimits};
        // 100,000 events and 5,000 OOMs, one every 20 events: 5 or more to each of the
        // plot's ~1,000 columns.
        let mut timeline = timeline(&vec![(1 << 20, 2 << 20); 100_000]);
        let limits = OomLimits {
            reserved: 2 << 20,
            segment: 2 << 20,
            device_free: 0,
            cap: None,
        };
        timeline.marks = (0..5_000)
            .map(|i| Mark {
                position: 20 * i + 1,
                kind: MarkKind::Oom(limits),
                context: 0,
            })
            .collect();
        timeline.counts.ooms = 5_000;
        let (picture, _) = svg(&timeline, ChartSize::default()).expect("drawn");
        assert!(
            texts(&picture)
                .iter()
                .any(|(_, text)| text == "out of memory"),
            "all OOMs marked: the legend says nothing more"
        );
        // Past the recorder's limit the legend says where the markers stop.
        timeline.counts.ooms = 7_000;
        timeline.counts.marks_dropped = 2_000;
        let (picture, geometry) = svg(&timeline, ChartSize::default()).expect("drawn");
        assert!(
            texts(&picture)
                .iter()
                .any(|(_, text)| text
                    == "out of memory (7000 of them: markers up to event 99981 only)"),
            "{picture}"
        );
        let oom_lines = picture.matches("stroke=\"#C8005A\"").count();
        let columns = (geometry.right - geometry.left) as usize;
        assert!(
            // (the legend has its own OOM swatch)
            (columns / 2..=columns + 4).contains(&oom_lines),
            "{oom_lines} OOM lines in {columns} columns"
        );
    }

    #[test]
    fn event_numbers_are_whole_and_short() {
        assert_eq!(event_number(0.5), "");
        assert_eq!(event_number(1234.0), "1234");
        assert_eq!(event_number(250_000.0), "250k");
        assert_eq!(event_number(1_500_000.0), "1.5M");
    }

    #[test]
    fn the_axis_runs_one_past_the_last_event_so_its_change_shows() {
        let timeline = timeline(&[(4 << 20, 20 << 20), (0, 20 << 20)]);
        let (svg, geometry) = svg(&timeline, ChartSize::default()).expect("drawn");
        assert_eq!((geometry.from, geometry.to), (0, 3));
        // Whole-numbered ticks only: no label printed twice (0.5 would print as "0" or "1").
        let labels: Vec<(u32, String)> = svg
            .split("</text>")
            .filter_map(|part| {
                let (tag, text) = part.rsplit_once('>')?;
                let y = tag.split(" y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                let text = text.trim();
                (!text.is_empty() && text.chars().all(|c| c.is_ascii_digit()))
                    .then(|| (y, text.to_string()))
            })
            .collect();
        let lowest = labels.iter().map(|(y, _)| *y).max().expect("tick labels");
        let ticks: Vec<&str> = labels
            .iter()
            .filter(|(y, _)| *y == lowest)
            .map(|(_, text)| text.as_str())
            .collect();
        assert!(ticks.len() >= 2, "{ticks:?}");
        let mut unique = ticks.clone();
        unique.dedup();
        assert_eq!(ticks, unique, "{ticks:?}");
    }
}
