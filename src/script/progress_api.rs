//! `progress(items[, label])`: iterate a range or an array with a tqdm-style progress bar on
//! standard error — only when standard error is a terminal, so pipes, files and golden tests
//! see nothing. `for b in progress(0..n) { ... }`.
//!
//! A line printed while a bar is on screen goes above it: [`above_bars`] clears the bars,
//! prints, and draws them again, so no copy of a bar is left behind between printed lines
//! (every bar of a thread belongs to one [`indicatif::MultiProgress`]). A loop left early
//! (`break`, an error) clears its bar too.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::ops::{Range, RangeInclusive};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use rhai::{Array, Dynamic, Engine, ImmutableString, INT};

use super::args::{wrong_type, BindingResult};

/// What `progress()` returns: the items, and the label its bar shows.
#[derive(Debug, Clone)]
pub struct Progress {
    items: Items,
    label: String,
}

#[derive(Debug, Clone)]
enum Items {
    Range(Range<INT>),
    Array(Array),
}

impl Items {
    fn len(&self) -> u64 {
        match self {
            Items::Range(range) => range.end.saturating_sub(range.start).max(0) as u64,
            Items::Array(array) => array.len() as u64,
        }
    }
}

/// The bars a thread shows, drawn together so that printing can clear and redraw them all.
#[derive(Debug, Clone)]
pub struct Bars {
    multi: MultiProgress,
}

impl Bars {
    /// Bars drawn to `target`.
    pub fn new(target: ProgressDrawTarget) -> Bars {
        Bars {
            multi: MultiProgress::with_draw_target(target),
        }
    }

    /// A new bar of `len` steps labelled `label`, on screen from now on.
    pub fn add(&self, len: u64, label: &str) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new(len));
        // The template is a constant known to parse; fall back to the default style.
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix}{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed}<{eta}, {rate}]",
        ) {
            bar.set_style(
                style
                    .with_key(
                        "rate",
                        |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                            let _ = out.write_str(&rate_text(state.pos(), state.per_sec()));
                        },
                    )
                    .progress_chars("█▉▊▋▌▍▎▏ "),
            );
        }
        if !label.is_empty() {
            bar.set_prefix(format!("{label}: "));
        }
        bar
    }

    /// Clears `bar` from the screen for good.
    pub fn finish(&self, bar: &ProgressBar) {
        bar.finish_and_clear();
        self.multi.remove(bar);
    }

    /// Runs `print` with the bars cleared, then draws them again below what it printed.
    pub fn suspend<T>(&self, print: impl FnOnce() -> T) -> T {
        self.multi.suspend(print)
    }
}

thread_local! {
    /// This thread's bars, on standard error.
    static BARS: Bars = Bars::new(ProgressDrawTarget::stderr());
    /// How many of them are on screen now.
    static SHOWN: RefCell<usize> = const { RefCell::new(0) };
}

/// Runs `print` (which writes to the terminal) so that it lands above any progress bar on
/// screen instead of between copies of it.
pub fn above_bars<T>(print: impl FnOnce() -> T) -> T {
    if SHOWN.with(|shown| *shown.borrow()) == 0 {
        return print();
    }
    BARS.with(|bars| bars.suspend(print))
}

/// A rate as tqdm prints it: `12.3it/s` with three significant digits at most, `2.50s/it`
/// below one item a second, `?it/s` before the first item.
pub fn rate_text(done: u64, per_second: f64) -> String {
    if done == 0 || !per_second.is_finite() || per_second <= 0.0 {
        return "?it/s".to_string();
    }
    let (value, unit) = if per_second < 1.0 {
        (1.0 / per_second, "s/it")
    } else {
        (per_second, "it/s")
    };
    let decimals = match value {
        v if v >= 100.0 => 0,
        v if v >= 10.0 => 1,
        _ => 2,
    };
    format!("{value:.decimals$}{unit}")
}

/// Iterates a [`Progress`], advancing its bar after each item and clearing it at the end, or
/// when the loop is left early.
pub struct ProgressIter {
    items: Box<dyn Iterator<Item = Dynamic>>,
    bar: Option<ProgressBar>,
    started: bool,
}

impl ProgressIter {
    /// Takes the bar off the screen.
    fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            BARS.with(|bars| bars.finish(&bar));
            SHOWN.with(|shown| {
                let mut shown = shown.borrow_mut();
                *shown = shown.saturating_sub(1);
            });
        }
    }
}

impl Drop for ProgressIter {
    fn drop(&mut self) {
        self.clear();
    }
}

impl Iterator for ProgressIter {
    type Item = Dynamic;

    fn next(&mut self) -> Option<Dynamic> {
        if let Some(bar) = &self.bar {
            // The previous item is done once the loop asks for the next one.
            if self.started {
                bar.inc(1);
            }
        }
        self.started = true;
        let item = self.items.next();
        if item.is_none() {
            self.clear();
        }
        item
    }
}

impl IntoIterator for Progress {
    type Item = Dynamic;
    type IntoIter = ProgressIter;

    fn into_iter(self) -> ProgressIter {
        let bar = std::io::stderr().is_terminal().then(|| {
            SHOWN.with(|shown| *shown.borrow_mut() += 1);
            BARS.with(|bars| bars.add(self.items.len(), &self.label))
        });
        let items: Box<dyn Iterator<Item = Dynamic>> = match self.items {
            Items::Range(range) => Box::new(range.map(Dynamic::from)),
            Items::Array(array) => Box::new(array.into_iter()),
        };
        ProgressIter {
            items,
            bar,
            started: false,
        }
    }
}

fn progress(items: Dynamic, label: &str) -> BindingResult<Progress> {
    let items = if let Some(range) = items.read_lock::<Range<INT>>() {
        Items::Range(range.clone())
    } else if let Some(range) = items.read_lock::<RangeInclusive<INT>>() {
        Items::Range(*range.start()..range.end().saturating_add(1))
    } else if let Some(array) = items.read_lock::<Array>() {
        Items::Array(array.clone())
    } else {
        return wrong_type("progress", "items", "a range or an array", &items);
    };
    Ok(Progress {
        items,
        label: label.to_string(),
    })
}

/// Registers `progress(items)` and `progress(items, label)`.
pub fn register(engine: &mut Engine) {
    engine
        .register_type_with_name::<Progress>("Progress")
        .register_iterator::<Progress>()
        .register_fn("progress", |items: Dynamic| progress(items, ""))
        .register_fn("progress", |items: Dynamic, label: ImmutableString| {
            progress(items, &label)
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::{InMemoryTerm, TermLike};

    #[test]
    fn rates_read_as_tqdm_prints_them() {
        assert_eq!(rate_text(0, 0.0), "?it/s");
        assert_eq!(rate_text(1, 4.409_812), "4.41it/s");
        assert_eq!(rate_text(9, 45.091_1), "45.1it/s");
        assert_eq!(rate_text(99, 1_234.567_8), "1235it/s");
        assert_eq!(rate_text(2, 0.4), "2.50s/it");
        assert_eq!(rate_text(2, f64::NAN), "?it/s");
    }

    #[test]
    fn printed_lines_go_above_the_bar_and_leave_no_copy_of_it() {
        let term = InMemoryTerm::new(12, 60);
        let bars = Bars::new(ProgressDrawTarget::term_like(Box::new(term.clone())));
        let bar = bars.add(5, "steps");
        for step in 0..5 {
            bar.inc(1);
            bar.tick();
            bars.suspend(|| {
                let _ = term.write_line(&format!("step {step}"));
            });
        }
        let screen = term.contents();
        let bar_lines = screen
            .lines()
            .filter(|line| line.contains("steps:"))
            .count();
        assert_eq!(bar_lines, 1, "one bar, below the printed lines:\n{screen}");
        let lines: Vec<&str> = screen.lines().filter(|line| !line.is_empty()).collect();
        assert_eq!(
            &lines[..5],
            ["step 0", "step 1", "step 2", "step 3", "step 4"],
            "{screen}"
        );
        assert!(lines[5].starts_with("steps: 100%"), "{screen}");
        bars.finish(&bar);
        assert!(
            !term.contents().contains("steps:"),
            "a finished bar is cleared:\n{}",
            term.contents()
        );
    }
}
