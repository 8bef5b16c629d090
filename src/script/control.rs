//! How a script stops early on purpose: `exit(code)`. It ends the script with Rhai's
//! uncatchable "terminated" error carrying a [`Stop`] (as Ctrl-C and the stack guard do).

use rhai::{Dynamic, Engine, INT};

use super::args::{wrong_type, BindingResult};
use super::stop::Stop;

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
