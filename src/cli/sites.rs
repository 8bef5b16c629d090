//! Memory at the peaks by allocation site, as `gpumem replay` prints it and its `--report`
//! shows it.

use std::fmt::Write as _;

use gpumem::alloc::format::format_size;
use gpumem::snapshot::replay::peaks::{PeakSites, SitesAtPeaks};

/// Sites listed per peak; the rest are summed on one line.
pub const SHOWN: usize = 10;

/// Both peaks' sites (or why there are none) as text, one line per site.
pub fn render(sites: &SitesAtPeaks) -> String {
    let mut out = String::from("memory at the peaks by allocation site (the innermost frame of your code; --json lists every site with its stack)\n");
    if let Some(note) = &sites.frames_note {
        line(&mut out, format_args!("  {note}"));
        if !sites.frames_known {
            return out;
        }
    }
    render_peak(&mut out, "peak reserved ", &sites.reserved, true);
    render_peak(&mut out, "peak allocated", &sites.allocated, false);
    out
}

/// Appends one line (writing to a String cannot fail).
fn line(out: &mut String, text: std::fmt::Arguments<'_>) {
    let _ = out.write_fmt(text);
    out.push('\n');
}

fn render_peak(out: &mut String, what: &str, peak: &PeakSites, cached: bool) {
    let Some(event) = peak.event else {
        line(out, format_args!("  {what}  nothing was held"));
        return;
    };
    line(
        out,
        format_args!(
            "  {what}  {} after event {event}: {} in live blocks",
            format_size(peak.bytes),
            format_size(peak.allocated)
        ),
    );
    for site in peak.sites.iter().take(SHOWN) {
        let blocks = if site.blocks == 1 { "block " } else { "blocks" };
        line(
            out,
            format_args!(
                "    {:>12} {:>7} {blocks}  {}",
                format_size(site.bytes),
                site.blocks,
                site.label
            ),
        );
    }
    let rest = &peak.sites[peak.sites.len().min(SHOWN)..];
    if !rest.is_empty() {
        let bytes: u64 = rest.iter().map(|site| site.bytes).sum();
        line(
            out,
            format_args!(
                "    {:>12} in {} more sites",
                format_size(bytes),
                rest.len()
            ),
        );
    }
    if cached && peak.bytes > peak.allocated {
        line(
            out,
            format_args!(
                "    {:>12} cached: reserved, in no live block",
                format_size(peak.bytes - peak.allocated)
            ),
        );
    }
}
