//! The `--timeline` chart: allocated and reserved bytes over a run's allocator events, with
//! OOMs and `empty_cache()` calls marked and labelled with their script line. Drawn with
//! plotters, as SVG or PNG; text uses the DejaVu Sans font built into the binary, so nothing
//! depends on the fonts of the machine that draws or views it.

use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::timeline::Timeline;
use super::units;
use crate::alloc::EventKind;

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
            height: 460,
        }
    }
}

/// Where the plot sits in the picture, so a page can map the mouse to an event: point `k`
/// (the state after event `k − 1`; point 0 is the start) is at
/// `left + k / points × (right − left)` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChartGeometry {
    /// Left edge of the plotting area, in pixels.
    pub left: i32,
    /// Right edge of the plotting area.
    pub right: i32,
    /// Top edge of the plotting area.
    pub top: i32,
    /// Bottom edge of the plotting area.
    pub bottom: i32,
    /// The x axis runs from point 0 (before the first event) to point `points` (the number of
    /// events plus one: the state after event i is drawn from i to i + 1).
    pub points: usize,
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

/// At most this many points are drawn; longer runs are bucketed, each bucket drawn at its
/// highest values, so peaks survive.
const MAX_POINTS: usize = 2400;

/// The (x, allocated, reserved) points to draw, x in events.
fn points(timeline: &Timeline) -> Vec<(f64, u64, u64)> {
    let all: Vec<(f64, u64, u64)> =
        std::iter::once((0.0, timeline.initial_allocated, timeline.initial_reserved))
            .chain(
                timeline
                    .events
                    .iter()
                    .enumerate()
                    .map(|(index, event)| ((index + 1) as f64, event.allocated, event.reserved)),
            )
            .collect();
    if all.len() <= MAX_POINTS {
        return all;
    }
    let bucket = all.len().div_ceil(MAX_POINTS / 2);
    all.chunks(bucket)
        .map(|chunk| {
            let allocated = chunk.iter().map(|p| p.1).max().unwrap_or(0);
            let reserved = chunk.iter().map(|p| p.2).max().unwrap_or(0);
            (chunk[0].0, allocated, reserved)
        })
        .collect()
}

/// A step line through `values` (each value holds until the next x).
fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (index, &(x, y)) in points.iter().enumerate() {
        if index > 0 {
            out.push((x, points[index - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// `file:line` shortened to the file's name.
fn short_label(label: &str) -> &str {
    label.rsplit('/').next().unwrap_or(label)
}

/// Draws the chart on `root`.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    timeline: &Timeline,
) -> Result<ChartGeometry, ChartError> {
    register_font();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut points = points(timeline);
    // Point i is the state after event i and holds until i + 1, so the axis runs one past the
    // last event: otherwise the last event's change would fall on the plot's right edge, unseen.
    let count = timeline.events.len() + 1;
    if let Some(&(_, allocated, reserved)) = points.last() {
        points.push((count as f64, allocated, reserved));
    }
    let (_, peak_reserved) = timeline.peaks();
    let (unit_name, unit) = match units::unit_for(peak_reserved) {
        (_, size) if size >= 1 << 30 => ("GiB", 1_u64 << 30),
        (_, size) if size >= 1 << 20 || peak_reserved == 0 => ("MiB", 1 << 20),
        other => other,
    };
    let scale = |bytes: u64| bytes as f64 / unit as f64;
    // Headroom above the peak for the legend and the marker labels.
    let y_max = (scale(peak_reserved) * 1.3).max(1e-9);
    let title = if timeline.title.is_empty() {
        "memory over allocator events".to_string()
    } else {
        format!("{}: memory over allocator events", timeline.title)
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..count as f64, 0f64..y_max)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("allocator event (#)")
        .y_desc(unit_name)
        // Events are whole numbers: ticks plotters puts between them stay unlabelled.
        .x_label_formatter(&|x| {
            if x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| units::trimmed(*y))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(236, 236, 236))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(draw_error)?;

    // Reserved first, so allocated (never above it) is drawn on top: (values, colour, fill
    // opacity, legend).
    let series = [
        (
            points.iter().map(|p| (p.0, scale(p.2))).collect::<Vec<_>>(),
            RGBColor(52, 110, 170),
            0.14,
            "reserved (memory_reserved)",
        ),
        (
            points.iter().map(|p| (p.0, scale(p.1))).collect::<Vec<_>>(),
            RGBColor(196, 58, 40),
            0.22,
            "allocated (memory_allocated)",
        ),
    ];
    for (values, color, fill, legend) in series {
        let line = steps(&values);
        chart
            .draw_series(AreaSeries::new(line.iter().copied(), 0.0, color.mix(fill)))
            .map_err(draw_error)?;
        chart
            .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(legend)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
            });
    }

    // Marked events: a vertical line each, labelled where the label fits in one of a few
    // rows under the top.
    let oom_color = RGBColor(200, 0, 90);
    let cache_color = RGBColor(30, 140, 60);
    let (x_range, y_range) = chart.plotting_area().get_pixel_range();
    let width_px = (x_range.end - x_range.start).max(1) as f64;
    let to_px = |x: f64| f64::from(x_range.start) + x / count as f64 * width_px;
    const ROWS: usize = 6;
    const ROW_STEP: f64 = 0.04;
    let mut row_end = [f64::MIN; ROWS];
    // The legend sits in the upper left: labels in the rows it covers start right of it.
    let marked_kinds = [EventKind::Oom, EventKind::EmptyCache]
        .iter()
        .filter(|kind| timeline.events.iter().any(|e| e.kind == **kind))
        .count();
    let legend_bottom_px = f64::from(y_range.start) + 14.0 + 18.0 * (2 + marked_kinds) as f64;
    let legend_right_px = f64::from(x_range.start) + 250.0;
    let height_px = f64::from(y_range.end - y_range.start).max(1.0);
    for (row, end) in row_end.iter_mut().enumerate() {
        let row_px = f64::from(y_range.start) + (0.025 + ROW_STEP * row as f64) * height_px;
        if row_px < legend_bottom_px {
            *end = legend_right_px;
        }
    }
    let mut seen = (false, false);
    for (index, event) in timeline.events.iter().enumerate() {
        if !event.kind.is_marked() {
            continue;
        }
        let x = (index + 1) as f64;
        let (color, name) = if event.kind == EventKind::Oom {
            seen.0 = true;
            (oom_color, "OOM")
        } else {
            seen.1 = true;
            (cache_color, "empty_cache()")
        };
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                color.stroke_width(if event.kind == EventKind::Oom { 2 } else { 1 }),
            )))
            .map_err(draw_error)?;
        let label = match timeline.label(event.context) {
            "" => name.to_string(),
            where_ => format!("{name} {}", short_label(where_)),
        };
        let font = ("sans-serif", 12).into_font().color(&color);
        let text_width = root
            .estimate_text_size(&label, &font)
            .map_or(label.len() as f64 * 7.0, |(width, _)| f64::from(width));
        // Right of the line, or left of it where it would run past the plot.
        let line_px = to_px(x);
        let start_px = if line_px + 4.0 + text_width > f64::from(x_range.end) {
            line_px - 4.0 - text_width
        } else {
            line_px + 4.0
        };
        if let Some(row) = (0..ROWS).find(|&row| row_end[row] < start_px) {
            row_end[row] = start_px + text_width + 8.0;
            let y = y_max * (0.975 - ROW_STEP * row as f64);
            let text_x = (start_px - f64::from(x_range.start)) / width_px * count as f64;
            chart
                .draw_series(std::iter::once(Text::new(label, (text_x, y), font)))
                .map_err(draw_error)?;
        }
    }
    // Legend entries for the markers that occur.
    for (present, color, name) in [
        (seen.0, oom_color, "out of memory"),
        (seen.1, cache_color, "empty_cache()"),
    ] {
        if present {
            chart
                .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                .map_err(draw_error)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(
                        vec![(x + 11, y - 7), (x + 11, y + 7)],
                        color.stroke_width(2),
                    )
                });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(ChartGeometry {
        left: x_range.start,
        right: x_range.end,
        top: y_range.start,
        bottom: y_range.end,
        points: count,
    })
}

/// The chart as an SVG document, and where its plot sits.
pub fn svg(timeline: &Timeline, size: ChartSize) -> Result<(String, ChartGeometry), ChartError> {
    let mut text = String::new();
    let geometry = {
        let root =
            SVGBackend::with_string(&mut text, (size.width, size.height)).into_drawing_area();
        draw(&root, timeline)?
    };
    Ok((text, geometry))
}

/// The chart as a PNG file's bytes.
pub fn png(timeline: &Timeline, size: ChartSize) -> Result<Vec<u8>, ChartError> {
    let mut pixels = vec![0_u8; size.width as usize * size.height as usize * 3];
    {
        let root =
            BitMapBackend::with_buffer(&mut pixels, (size.width, size.height)).into_drawing_area();
        draw(&root, timeline)?;
    }
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, size.width, size.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .map_err(|error| ChartError::Png(error.to_string()))?;
        writer
            .write_image_data(&pixels)
            .map_err(|error| ChartError::Png(error.to_string()))?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_keep_their_peaks_when_bucketed() {
        let mut timeline = Timeline::default();
        for index in 0..10_000_u64 {
            timeline.events.push(crate::viz::Event {
                kind: EventKind::Alloc,
                address: 0,
                size: 0,
                pool: crate::alloc::Pool::Large,
                allocated: if index == 5_001 { 999 } else { index % 7 },
                reserved: 1000,
                context: 0,
            });
        }
        let points = points(&timeline);
        assert!(points.len() <= MAX_POINTS);
        assert!(points.iter().any(|p| p.1 == 999));
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        assert_eq!(
            steps(&[(0.0, 1.0), (2.0, 3.0)]),
            [(0.0, 1.0), (2.0, 1.0), (2.0, 3.0)]
        );
    }

    #[test]
    fn the_axis_runs_one_past_the_last_event_so_its_change_shows() {
        let event = |allocated| crate::viz::Event {
            kind: EventKind::Alloc,
            address: 0,
            size: 0,
            pool: crate::alloc::Pool::Large,
            allocated,
            reserved: 20 << 20,
            context: 0,
        };
        let timeline = Timeline {
            events: vec![event(4 << 20), event(0)],
            ..Timeline::default()
        };
        let (svg, geometry) = svg(&timeline, ChartSize::default()).expect("drawn");
        assert_eq!(geometry.points, 3);
        // Whole-numbered ticks only: no label printed twice (0.5 would print as "0" or "1").
        // The x axis's labels are the numeric texts on the lowest line of the image.
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
