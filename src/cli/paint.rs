//! Terminal colour chosen by the caller's `color` flag.
//!
//! `colored`'s `ColoredString` consults a process-wide override when it is displayed, so two
//! callers (or two tests) that want different answers race each other. Painting here depends
//! only on the arguments: the escape sequence is built from `colored`'s colour table, and
//! `colored` still decides whether standard output wants colour at all.

use colored::Color;

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
    /// The style as `colored` names it: whether it is bold or dimmed, and its colour.
    fn parts(self) -> (Option<&'static str>, Option<Color>) {
        // SGR 1 = bold, 2 = dim (ECMA-48); colours come from `colored`'s table.
        const BOLD: Option<&str> = Some("1");
        match self {
            Style::Red => (None, Some(Color::Red)),
            Style::RedBold => (BOLD, Some(Color::Red)),
            Style::Green => (None, Some(Color::Green)),
            Style::GreenBold => (BOLD, Some(Color::Green)),
            Style::Yellow => (None, Some(Color::Yellow)),
            Style::Cyan => (None, Some(Color::Cyan)),
            Style::BlueBold => (BOLD, Some(Color::Blue)),
            Style::MagentaBold => (BOLD, Some(Color::Magenta)),
            Style::Dimmed => (Some("2"), None),
        }
    }

    /// The SGR parameters of the style, e.g. `1;31`.
    fn code(self) -> String {
        let (weight, color) = self.parts();
        let color = color.map(|color| color.to_fg_str());
        weight
            .into_iter()
            .map(Into::into)
            .chain(color)
            .collect::<Vec<std::borrow::Cow<'static, str>>>()
            .join(";")
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

/// How `memory_map()` and `:map` draw on standard output: the terminal's width (80 when it
/// is not a terminal) and colour when [`stdout_wants_color`] says so.
pub fn stdout_map_options() -> gpumem::viz::MapOptions {
    let width = console::Term::stdout()
        .size_checked()
        .map_or(80, |(_rows, columns)| usize::from(columns));
    gpumem::viz::MapOptions {
        width,
        color: stdout_wants_color(),
    }
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
