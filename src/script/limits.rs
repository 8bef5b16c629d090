//! Every limit of the Rhai engine, set in one place.
//!
//! Rhai's built-in defaults differ between debug and release builds (a call depth of 8 in
//! debug, 64 in release), which would make a script behave differently under `cargo test` and
//! in the shipped binary. gpumem therefore sets every limit explicitly from [`Limits`], whose
//! defaults are documented here and adjustable from the command line (`--max-operations`, ...).

use clap::Args;
use rhai::Engine;

/// The sandbox limits a script runs under. `0` means "no limit" for operations, expression
/// depth and string/array/map sizes; for variables, functions and modules it means "none".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct Limits {
    /// Maximum operations a script may run (0 = unlimited). Unlimited by default: scripts are
    /// the user's own experiments, and in the REPL Ctrl-C stops a runaway loop. `gpumem test`
    /// reads 0 as 100 million, so a runaway golden script fails instead of hanging the run.
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_operations)]
    pub max_operations: u64,
    /// Maximum depth of nested function calls (recursion).
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_call_depth)]
    pub max_call_depth: usize,
    /// Maximum nesting depth of an expression (and of expressions inside functions).
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_expr_depth)]
    pub max_expr_depth: usize,
    /// Maximum length of a string, in bytes (0 = unlimited).
    #[arg(long, global = true, value_name = "BYTES", default_value_t = Limits::DEFAULT.max_string_size)]
    pub max_string_size: usize,
    /// Maximum number of elements of an array (0 = unlimited).
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_array_size)]
    pub max_array_size: usize,
    /// Maximum number of entries of an object map (0 = unlimited).
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_map_size)]
    pub max_map_size: usize,
    /// Maximum number of variables alive at once.
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_variables)]
    pub max_variables: usize,
    /// Maximum number of functions a script may define.
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_functions)]
    pub max_functions: usize,
    /// Maximum number of modules a script may import.
    #[arg(long, global = true, value_name = "N", default_value_t = Limits::DEFAULT.max_modules)]
    pub max_modules: usize,
}

impl Limits {
    /// The defaults, identical in debug and release builds.
    pub const DEFAULT: Limits = Limits {
        max_operations: 0,
        max_call_depth: 64,
        max_expr_depth: 64,
        max_string_size: 16 << 20,
        max_array_size: 1 << 24,
        max_map_size: 1 << 20,
        max_variables: 100_000,
        max_functions: 10_000,
        max_modules: 64,
    };

    /// Sets every limit on `engine`.
    pub fn apply(&self, engine: &mut Engine) {
        engine
            .set_max_operations(self.max_operations)
            .set_max_call_levels(self.max_call_depth)
            .set_max_expr_depths(self.max_expr_depth, self.max_expr_depth)
            .set_max_string_size(self.max_string_size)
            .set_max_array_size(self.max_array_size)
            .set_max_map_size(self.max_map_size)
            .set_max_variables(self.max_variables)
            .set_max_functions(self.max_functions)
            .set_max_modules(self.max_modules);
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
            max_operations: 1000,
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
    fn operation_limit_stops_a_loop() {
        let mut engine = Engine::new();
        Limits {
            max_operations: 500,
            ..Limits::DEFAULT
        }
        .apply(&mut engine);
        let error = engine.run("loop {}").expect_err("limited");
        assert!(error.to_string().contains("operations"), "{error}");
    }
}
