//! Reading a gpumem report the way its page does: the data embedded as JSON in
//! `<script id="data" type="application/json">`, and the overview chart's drawn lines.
//! Included by path (`#[path = "browser/report_data.rs"] mod report_data;`) from the report
//! tests.

#![allow(dead_code)]

use serde_json::Value;

/// The page's embedded data, parsed.
pub fn data(page: &str) -> Value {
    let marker = "<script id=\"data\" type=\"application/json\">";
    let start = page.find(marker).expect("the data element") + marker.len();
    let end = start
        + page[start..]
            .find("</script>")
            .expect("the data element's end");
    serde_json::from_str(&page[start..end]).expect("the data is JSON")
}

/// The highest value the overview chart of panel `index` draws for the series of `color`
/// (plotters' `stroke="#RRGGBB"` of its 2-pixel line), read back from its pixels through the
/// chart's geometry, and the bytes one pixel stands for.
pub fn drawn_peak(page: &str, index: usize, color: &str) -> (f64, f64) {
    let panel_start = page
        .find(&format!("data-panel=\"{index}\""))
        .expect("the panel");
    let svg_start = panel_start + page[panel_start..].find("<svg").expect("its chart");
    let svg_end = svg_start + page[svg_start..].find("</svg>").expect("the chart's end");
    let svg = &page[svg_start..svg_end];
    let stroke = format!("stroke=\"{color}\"");
    let mut top = f64::INFINITY;
    for line in svg.split("<polyline").skip(1) {
        let tag = &line[..line.find("/>").unwrap_or(line.len())];
        if !tag.contains(&stroke) || !tag.contains("stroke-width=\"2\"") {
            continue;
        }
        let points = tag.split("points=\"").nth(1).expect("points");
        for point in points[..points.find('"').unwrap_or(points.len())].split_whitespace() {
            let y: f64 = point
                .split(',')
                .nth(1)
                .and_then(|y| y.parse().ok())
                .expect("x,y");
            top = top.min(y);
        }
    }
    assert!(top.is_finite(), "no {color} line drawn");
    let geometry = &data(page)["panels"][index]["geometry"];
    let number = |key: &str| geometry[key].as_f64().expect("a number");
    let (plot_top, bottom, y_max) = (number("top"), number("bottom"), number("y_max"));
    let per_pixel = y_max / (bottom - plot_top);
    ((bottom - top) * per_pixel, per_pixel)
}
