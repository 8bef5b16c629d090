//! Printing to stdout that ignores a closed pipe (`gpumem diff a b --json | head`) instead of
//! panicking, for the commands that print tables.

/// `println!` that ignores a closed stdout.
macro_rules! say {
    () => { $crate::cli::out::say!("") };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

pub(crate) use say;
