//! Terminal colour as plain ANSI escape codes, chosen by the caller's `color` flag.
//!
//! `colored`'s painting consults a process-wide override, so two callers (or two tests) that
//! want different answers race each other. Painting here depends only on the arguments; the
//! `colored` crate is kept for deciding whether standard output wants colour at all.

/// A text style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Red: removed lines, failures.
    Red,
    /// Bold red: the FAIL status word.
    RedBold,
    /// Green: added lines, passes, strings.
    Green,
    /// Bold green: the prompt.
    GreenBold,
    /// Yellow: skips, numbers.
    Yellow,
    /// Cyan: hunk headers, binding names.
    Cyan,
    /// Bold blue: `:` commands.
    BlueBold,
    /// Bold magenta: keywords.
    MagentaBold,
    /// Dimmed: comments and hints.
    Dimmed,
}

impl Style {
    /// The SGR parameters of the style.
    fn code(self) -> &'static str {
        match self {
            Style::Red => "31",
            Style::RedBold => "1;31",
            Style::Green => "32",
            Style::GreenBold => "1;32",
            Style::Yellow => "33",
            Style::Cyan => "36",
            Style::BlueBold => "1;34",
            Style::MagentaBold => "1;35",
            Style::Dimmed => "2",
        }
    }
}

/// `text` in `style` when `color` is set, else `text` unchanged.
pub fn paint(color: bool, text: &str, style: Style) -> String {
    if color && !text.is_empty() {
        format!("\u{1b}[{}m{text}\u{1b}[0m", style.code())
    } else {
        text.to_string()
    }
}

/// Whether standard output should be coloured: a terminal, and neither `NO_COLOR` nor
/// `CLICOLOR=0` set (unless `CLICOLOR_FORCE` asks for colour anyway), as `colored` decides.
pub fn stdout_wants_color() -> bool {
    colored::control::SHOULD_COLORIZE.should_colorize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paints_only_when_asked() {
        assert_eq!(paint(true, "x", Style::Red), "\u{1b}[31mx\u{1b}[0m");
        assert_eq!(paint(false, "x", Style::Red), "x");
        assert_eq!(paint(true, "", Style::Red), "");
    }
}
