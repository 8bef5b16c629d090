//! `progress(items[, label])`: iterate a range or an array with a tqdm-style progress bar on
//! standard error — only when standard error is a terminal, so pipes, files and golden tests
//! see nothing. `for b in progress(0..n) { ... }`.

use std::io::IsTerminal;
use std::ops::{Range, RangeInclusive};

use indicatif::{ProgressBar, ProgressStyle};
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

/// Iterates a [`Progress`], advancing its bar after each item and clearing it at the end.
pub struct ProgressIter {
    items: Box<dyn Iterator<Item = Dynamic>>,
    bar: Option<ProgressBar>,
    started: bool,
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
            if let Some(bar) = self.bar.take() {
                bar.finish_and_clear();
            }
        }
        item
    }
}

impl IntoIterator for Progress {
    type Item = Dynamic;
    type IntoIter = ProgressIter;

    fn into_iter(self) -> ProgressIter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(self.items.len());
            // The template is a constant known to parse; fall back to the default style.
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix}{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed}<{eta}, {per_sec}]",
            ) {
                bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
            }
            if !self.label.is_empty() {
                bar.set_prefix(format!("{}: ", self.label));
            }
            bar
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
