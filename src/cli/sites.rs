//! Memory at the peaks by allocation site, as `gpumem replay` prints it.

use gpumem::alloc::format::format_size;
use gpumem::snapshot::replay::peaks::{PeakSites, SitesAtPeaks};

use super::out::say;

/// Sites listed per peak; the rest are summed on one line.
pub const SHOWN: usize = 10;

/// Prints both peaks' sites (or why there are none).
pub fn print(sites: &SitesAtPeaks) {
    say!("memory at the peaks by allocation site (the innermost frame of your code; --json lists every site with its stack)");
    if let Some(note) = &sites.frames_note {
        say!("  {note}");
        if !sites.frames_known {
            return;
        }
    }
    print_peak("peak reserved ", &sites.reserved, true);
    print_peak("peak allocated", &sites.allocated, false);
}

fn print_peak(what: &str, peak: &PeakSites, cached: bool) {
    let Some(event) = peak.event else {
        say!("  {what}  nothing was held");
        return;
    };
    say!(
        "  {what}  {} after event {event}: {} in live blocks",
        format_size(peak.bytes),
        format_size(peak.allocated)
    );
    for site in peak.sites.iter().take(SHOWN) {
        let blocks = if site.blocks == 1 { "block " } else { "blocks" };
        say!(
            "    {:>12} {:>7} {blocks}  {}",
            format_size(site.bytes),
            site.blocks,
            site.label
        );
    }
    let rest = &peak.sites[peak.sites.len().min(SHOWN)..];
    if !rest.is_empty() {
        let bytes: u64 = rest.iter().map(|site| site.bytes).sum();
        say!(
            "    {:>12} in {} more sites",
            format_size(bytes),
            rest.len()
        );
    }
    if cached && peak.bytes > peak.allocated {
        say!(
            "    {:>12} cached: reserved, in no live block",
            format_size(peak.bytes - peak.allocated)
        );
    }
}
