//! Why a script ended early on purpose or by force: `exit(code)`, Ctrl-C, or the stack guard.
//! The reason rides in Rhai's uncatchable "terminated" error, which
//! [`crate::script::ScriptError`] turns into its message or exit status. Kept apart from the
//! bindings that raise it ([`super::control`]) so that argument helpers can raise it too
//! without an import loop.

use rhai::{Dynamic, EvalAltResult, Position};

/// The result of a binding that may end the script.
type StopResult<T> = Result<T, Box<EvalAltResult>>;

/// Why a script was terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `exit(code)` was called: the process (or the REPL) ends with this status.
    Exit(u8),
    /// Ctrl-C.
    Interrupted,
    /// The script stack is nearly full ([`super::stack::nearly_full`]).
    StackFull,
}

impl Stop {
    /// The terminating error carrying this reason.
    pub fn error<T>(self) -> StopResult<T> {
        Err(Box::new(EvalAltResult::ErrorTerminated(
            Dynamic::from(self),
            Position::NONE,
        )))
    }

    /// The reason a terminated script's value carries, if it is one of these.
    pub fn of(value: &Dynamic) -> Option<Stop> {
        value.clone().try_cast::<Stop>()
    }
}
