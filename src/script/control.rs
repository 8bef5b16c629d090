//! How a script stops early on purpose or by force: `exit(code)`, Ctrl-C, and the stack
//! guard. Each ends the script with Rhai's uncatchable "terminated" error carrying a [`Stop`],
//! which [`crate::script::ScriptError`] turns into its message or exit status.

use rhai::{Dynamic, Engine, EvalAltResult, Position, INT};

use super::args::{wrong_type, BindingResult};

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
    pub fn error<T>(self) -> BindingResult<T> {
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

/// Registers `exit()` and `exit(code)`, replacing Rhai's own `exit`, which ends a script as if it
/// had finished normally and so cannot set the process's exit status.
pub fn register(engine: &mut Engine) {
    engine.register_fn("exit", || -> BindingResult<()> { Stop::Exit(0).error() });
    engine.register_fn("exit", |code: Dynamic| -> BindingResult<()> {
        match code
            .as_int()
            .ok()
            .and_then(|code: INT| u8::try_from(code).ok())
        {
            Some(code) => Stop::Exit(code).error(),
            None => wrong_type("exit", "code", "an integer from 0 to 255", &code),
        }
    });
}
