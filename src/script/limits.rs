//! Every limit of the Rhai engine, set in one place.
//!
//! Rhai's built-in defaults differ between debug and release builds (a call depth of 8 in
//! debug, 64 in release), which would make a script behave differently under `cargo test` and
//! in the shipped binary. gpumem therefore sets every limit explicitly from [`Limits`], whose
//! defaults are documented here and adjustable from the command line (`--max-operations`, ...).
//!
//! One rule for every flag: **0 means unlimited**. Two bounds hold whatever the flags say,
//! because passing them would overflow the native stack and abort the process: recursion stops
//! with a "Stack overflow" error when the script stack is nearly full ([`super::stack`]), and
//! expressions nest at most [`MAX_EXPR_DEPTH`] deep.

use clap::Args;
use rhai::Engine;

/// The deepest expression nesting any setting allows. Rhai parses (and evaluates) nested
/// expressions recursively at about 20 KiB of native stack per level in a debug build
/// (2–3 KiB in release, measured with nested parentheses, arrays and flat sums); 1000 levels
/// fit in the script stack's reserve, so even an `eval` at the deepest recursion is safe.
pub const MAX_EXPR_DEPTH: usize = 1000;

/// The sandbox limits a script runs under. 0 means "no limit" for every one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct Limits {
    /// Maximum operations a script may run (0 = unlimited). Default: unlimited for `run` and
    /// the REPL (scripts are your own experiments; in the REPL Ctrl-C stops a runaway loop),
    /// 100 million for `gpumem test`, so a runaway golden script fails instead of hanging the run.
    #[arg(long, value_name = "N")]
    pub max_operations: Option<u64>,
    /// Maximum depth of nested function calls (0 = unlimited). Whatever the value, recursion
    /// stops with a "Stack overflow" error before the 256 MiB script stack runs out: about
    /// 28,000 levels of a simple recursive function in a release build, 4,000 in a debug build.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_call_depth)]
    pub max_call_depth: usize,
    /// Maximum nesting depth of an expression, also inside functions (0 = unlimited). A flat
    /// sum of N terms nests N deep. Capped at 1000 whatever the value: deeper expressions
    /// could overflow the parser's stack.
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_expr_depth)]
    pub max_expr_depth: usize,
    /// Maximum length of a string, in bytes (0 = unlimited).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::DEFAULT.max_string_size)]
    pub max_string_size: usize,
    /// Maximum number of elements of an array (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_array_size)]
    pub max_array_size: usize,
    /// Maximum number of entries of an object map (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_map_size)]
    pub max_map_size: usize,
    /// Maximum number of variables alive at once (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_variables)]
    pub max_variables: usize,
    /// Maximum number of functions a script may define (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_functions)]
    pub max_functions: usize,
    /// Maximum number of modules a script may import (0 = unlimited).
    #[arg(long, value_name = "N", default_value_t = Limits::DEFAULT.max_modules)]
    pub max_modules: usize,
}

impl Limits {
    /// The defaults, identical in debug and release builds.
    pub const DEFAULT: Limits = Limits {
        max_operations: None,
        max_call_depth: 64,
        max_expr_depth: 256,
        max_string_size: 16 << 20,
        max_array_size: 1 << 24,
        max_map_size: 1 << 20,
        max_variables: 100_000,
        max_functions: 10_000,
        max_modules: 64,
    };

    /// The expression depth in force: the setting, with 0 and anything deeper than
    /// `MAX_EXPR_DEPTH` meaning `MAX_EXPR_DEPTH`.
    pub fn effective_expr_depth(&self) -> usize {
        match self.max_expr_depth {
            0 => MAX_EXPR_DEPTH,
            depth => depth.min(MAX_EXPR_DEPTH),
        }
    }

    /// Sets every limit on `engine`, reading 0 as unlimited.
    pub fn apply(&self, engine: &mut Engine) {
        // Rhai reads 0 as "unlimited" for some limits and as "none allowed" for others.
        let unlimited = |n: usize| if n == 0 { usize::MAX } else { n };
        let depth = self.effective_expr_depth();
        engine
            .set_max_operations(self.max_operations.unwrap_or(0))
            .set_max_call_levels(unlimited(self.max_call_depth))
            .set_max_expr_depths(depth, depth)
            .set_max_string_size(self.max_string_size)
            .set_max_array_size(self.max_array_size)
            .set_max_map_size(self.max_map_size)
            .set_max_variables(unlimited(self.max_variables))
            .set_max_functions(unlimited(self.max_functions))
            .set_max_modules(unlimited(self.max_modules));
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_limits_are_what_the_engine_reports() {
        let mut engine = Engine::new_raw();
        let limits = Limits {
            max_operations: Some(1000),
            max_call_depth: 5,
            max_expr_depth: 7,
            max_string_size: 11,
            max_array_size: 13,
            max_map_size: 17,
            max_variables: 19,
            max_functions: 23,
            max_modules: 3,
        };
        limits.apply(&mut engine);
        assert_eq!(engine.max_operations(), 1000);
        assert_eq!(engine.max_call_levels(), 5);
        assert_eq!(engine.max_expr_depth(), 7);
        assert_eq!(engine.max_function_expr_depth(), 7);
        assert_eq!(engine.max_string_size(), 11);
        assert_eq!(engine.max_array_size(), 13);
        assert_eq!(engine.max_map_size(), 17);
        assert_eq!(engine.max_variables(), 19);
        assert_eq!(engine.max_functions(), 23);
        assert_eq!(engine.max_modules(), 3);
    }

    #[test]
    fn zero_means_unlimited_for_every_limit() {
        let mut engine = Engine::new_raw();
        Limits {
            max_operations: Some(0),
            max_call_depth: 0,
            max_expr_depth: 0,
            max_string_size: 0,
            max_array_size: 0,
            max_map_size: 0,
            max_variables: 0,
            max_functions: 0,
            max_modules: 0,
        }
        .apply(&mut engine);
        assert_eq!(engine.max_operations(), 0, "Rhai's unlimited");
        assert_eq!(engine.max_call_levels(), usize::MAX);
        assert_eq!(engine.max_expr_depth(), MAX_EXPR_DEPTH, "the stack's bound");
        assert_eq!(engine.max_string_size(), 0, "Rhai's unlimited");
        assert_eq!(engine.max_variables(), usize::MAX);
        assert_eq!(engine.max_functions(), usize::MAX);
        assert_eq!(engine.max_modules(), usize::MAX);
        let error = engine
            .run("let a = 1; fn f() { 2 } import \"x\" as x;")
            .expect_err("no module resolver here");
        assert!(!error.to_string().contains("Too many"), "{error}");
    }

    #[test]
    fn operation_limit_stops_a_loop() {
        let mut engine = Engine::new();
        Limits {
            max_operations: Some(500),
            ..Limits::DEFAULT
        }
        .apply(&mut engine);
        let error = engine.run("loop {}").expect_err("limited");
        assert!(error.to_string().contains("operations"), "{error}");
    }
}
