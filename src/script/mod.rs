//! The script layer: a Rhai engine with gpumem's bindings registered, run over a session's
//! [`Devices`] (one or more devices and which is current). Thin glue — every binding converts
//! its arguments and calls into [`crate::tensor`] or [`crate::alloc`].

pub(crate) mod args;
pub(crate) mod bindings;
pub(crate) mod control;
pub(crate) mod device_api;
pub mod directives;
pub mod docs;
pub(crate) mod errors;
pub mod history;
pub(crate) mod limits;
pub(crate) mod mem_pool_api;
pub(crate) mod memory_api;
pub(crate) mod oom_error;
pub(crate) mod progress_api;
pub mod sandbox;
pub(crate) mod snapshot_api;
pub(crate) mod stack;
pub mod stdlib;
pub(crate) mod stop;
pub(crate) mod stream_api;
pub(crate) mod suggest;
pub(crate) mod tensor_api;
pub(crate) mod values_api;
pub mod viz_api;

use std::cell::RefCell;
use std::collections::HashSet;
use std::io::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rhai::{Dynamic, Engine, Scope, AST};

use crate::tensor::{interrupt, Devices};
pub use errors::{Origins, ScriptError};
pub use limits::Limits;
pub use stack::{on_script_stack, SCRIPT_STACK_BYTES};
use stop::Stop;

/// The message of a script stopped by Ctrl-C.
pub const INTERRUPTED: &str = "interrupted (Ctrl-C)";

/// Where `print` output goes.
#[derive(Clone)]
pub enum PrintSink {
    /// Straight to standard output (`gpumem run`, the REPL).
    Stdout,
    /// Into a buffer (golden tests).
    Buffer(Rc<RefCell<String>>),
}

impl PrintSink {
    /// Writes one printed line.
    pub fn line(&self, text: &str) {
        match self {
            // A closed pipe (`gpumem run x.rhai | head`) is not the script's error: drop output.
            // Printed above any progress bar on screen, never under a stale copy of it.
            PrintSink::Stdout => progress_api::above_bars(|| {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{text}");
                let _ = stdout.flush();
            }),
            PrintSink::Buffer(buffer) => {
                let mut buffer = buffer.borrow_mut();
                buffer.push_str(text);
                buffer.push('\n');
            }
        }
    }
}

/// The functions earlier inputs of a session (REPL lines) defined, and which input defined each.
#[derive(Default)]
pub struct Definitions {
    functions: AST,
    origins: Origins,
}

/// A script's text without the UTF-8 byte order mark some editors put first, which Rhai
/// would otherwise report as an invisible unexpected character.
pub fn strip_bom(source: &str) -> &str {
    source.strip_prefix('\u{feff}').unwrap_or(source)
}

/// A Rhai engine bound to a session's devices, ready to run scripts. One device is a
/// [`Runtime`](crate::tensor::Runtime); several are [`Devices`].
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use gpumem::alloc::AllocConf;
/// use gpumem::device::sim::SimDevice;
/// use gpumem::script::{Host, PrintSink};
/// use gpumem::tensor::{Devices, Runtime};
///
/// // One simulated device.
/// let runtime = Runtime::sim(SimDevice::new(8 << 30), AllocConf::default())?;
/// let printed = Rc::new(RefCell::new(String::new()));
/// let host = Host::new(runtime, PrintSink::Buffer(Rc::clone(&printed)));
/// host.run_source("demo", r#"
///     let x = empty(1000, "uint8");   // rounded to 1024 bytes in a 2 MiB small segment
///     print(memory_allocated());
///     x = ();                         // freed, but the segment stays cached
///     print(memory_reserved());
/// "#)?;
/// assert_eq!(*printed.borrow(), "1024\n2097152\n");
///
/// // Two simulated devices, device 0 current.
/// let gpu = |index| Runtime::sim(SimDevice::new(8 << 30).numbered(index), AllocConf::default());
/// let printed = Rc::new(RefCell::new(String::new()));
/// let host = Host::new(Devices::new(vec![gpu(0)?, gpu(1)?], 0)?, PrintSink::Buffer(Rc::clone(&printed)));
/// host.run_source("two", r#"
///     let x = with_device(1, || empty(1000, "uint8"));
///     print(`${device_count()} ${x.device} ${memory_allocated(0)} ${memory_allocated(1)}`);
/// "#)?;
/// assert_eq!(*printed.borrow(), "2 sim:1 0 1024\n");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Host {
    engine: Engine,
    devices: Rc<Devices>,
    map_settings: viz_api::MapSettings,
    /// The Ctrl-C flag the engine polls, once [`Host::set_interrupt`] gave one.
    interrupt: Rc<RefCell<Option<Arc<AtomicBool>>>>,
    /// Where scripts may read and write files.
    paths: sandbox::SharedPolicy,
}

impl Host {
    /// An engine with every binding registered over `devices` (a [`Devices`], or one device's
    /// `Rc<Runtime>`), printing to `sink`, under the default [`Limits`].
    pub fn new(devices: impl Into<Devices>, sink: PrintSink) -> Host {
        Host::with_limits(devices, sink, Limits::DEFAULT)
    }

    /// An engine with every binding registered over `devices`, printing to `sink`, under
    /// `limits`. Imports resolve only to the embedded standard library ([`stdlib`]).
    pub fn with_limits(devices: impl Into<Devices>, sink: PrintSink, limits: Limits) -> Host {
        let devices = Rc::new(devices.into());
        let mut engine = Engine::new();
        limits.apply(&mut engine);
        engine.set_module_resolver(stdlib::EmbeddedResolver::default());
        let print_sink = sink.clone();
        engine.on_print(move |text| print_sink.line(text));
        engine.on_debug(move |text, _source, position| {
            sink.line(&format!("[debug {position}] {text}"))
        });
        let map_settings = viz_api::MapSettings::default();
        let paths: sandbox::SharedPolicy =
            Rc::new(RefCell::new(sandbox::PathPolicy::current_directory()));
        bindings::register(&mut engine, &devices, &map_settings, &paths);
        control::register(&mut engine);
        // Polled before every operation: the stack guard first, then Ctrl-C.
        let interrupt: Rc<RefCell<Option<Arc<AtomicBool>>>> = Rc::default();
        let flag = Rc::clone(&interrupt);
        engine.on_progress(move |_| {
            if stack::nearly_full() {
                return Some(Dynamic::from(Stop::StackFull));
            }
            let interrupted = flag
                .borrow()
                .as_ref()
                .is_some_and(|flag| flag.swap(false, Ordering::Relaxed));
            interrupted.then(|| Dynamic::from(Stop::Interrupted))
        });
        Host {
            engine,
            devices,
            map_settings,
            interrupt,
            paths,
        }
    }

    /// Sets where scripts may read and write files (`dump_snapshot`, `replay`). A new host
    /// allows the current directory only; the CLI adds the script's own directory and every
    /// `--allow-path`.
    pub fn set_path_policy(&self, policy: sandbox::PathPolicy) {
        *self.paths.borrow_mut() = policy;
    }

    /// Sets how `memory_map()` draws without a width argument: the terminal's width and
    /// whether to colour (plain 80 columns until called).
    pub fn set_map_options(&self, options: crate::viz::MapOptions) {
        self.map_settings.set(options);
    }

    /// How `memory_map()` draws without a width argument.
    pub fn map_options(&self) -> crate::viz::MapOptions {
        self.map_settings.get()
    }

    /// Keeps Rhai's call stack from now on, so events inside stdlib helpers are stamped with
    /// the script's own line too ([`history::track_call_sites`]; recorded runs only: it costs
    /// a copy of every call's arguments).
    pub fn track_call_sites(&mut self) {
        history::track_call_sites(&mut self.engine);
    }

    /// The devices scripts run against.
    pub fn devices(&self) -> &Rc<Devices> {
        &self.devices
    }

    /// The engine, for callers that compile or evaluate themselves (the REPL).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Makes running scripts stop with an "interrupted" error as soon as `flag` is set (the
    /// REPL's Ctrl-C handler sets it), in the engine and in long native work of the tensor
    /// layer on this thread (`interrupt`). The engine clears the flag when it stops a script.
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        interrupt::watch(Some(Arc::clone(&flag)));
        *self.interrupt.borrow_mut() = Some(flag);
    }

    /// Compiles and evaluates `source` in `scope`, keeping its variables (a name bound again
    /// with `let` replaces the old value, which is dropped: Python's rebinding), adding its function
    /// definitions to `definitions` (so they persist across REPL lines, and errors inside them
    /// point at the input that defined them), and returning the value of the last expression.
    pub fn eval_in(
        &self,
        scope: &mut Scope<'static>,
        definitions: &mut Definitions,
        name: &str,
        source: &str,
    ) -> Result<Dynamic, ScriptError> {
        let source = strip_bom(source);
        let ast = self.compile(name, source)?;
        for function in ast.iter_functions() {
            definitions.origins.insert(
                function.name.to_string(),
                (name.to_string(), source.to_string()),
            );
        }
        let merged = definitions.functions.merge(&ast);
        let result = self.engine.eval_ast_with_scope::<Dynamic>(scope, &merged);
        definitions.functions = merged.clone_functions_only();
        // `let x = ..` again shadows the old `x`; drop the hidden one now so its tensor is
        // freed, as rebinding a name in Python would.
        drop_shadowed(scope);
        result.map_err(|error| {
            ScriptError::runtime_with_origins(name, source, *error, &definitions.origins)
        })
    }

    /// Makes every embedded module available as `NAME::function` without an `import` (the
    /// REPL's convenience: an `import` lasts only for the line it is on).
    pub fn preload_stdlib(&mut self) -> Result<(), ScriptError> {
        for (name, _, source) in stdlib::MODULES {
            let file = format!("stdlib/{name}.rhai");
            let ast = self.compile(&file, source)?;
            let module = rhai::Module::eval_ast_as_new(Scope::new(), &ast, &self.engine)
                .map_err(|error| ScriptError::runtime(&file, source, *error))?;
            self.engine.register_static_module(name, module.into());
        }
        Ok(())
    }

    /// Compiles `source`, naming it `name` in errors.
    pub fn compile(&self, name: &str, source: &str) -> Result<AST, ScriptError> {
        let mut ast = self
            .engine
            .compile(source)
            .map_err(|error| ScriptError::parse(name, source, error))?;
        ast.set_source(name);
        Ok(ast)
    }

    /// Runs a whole script in a fresh scope; every variable is dropped at the end.
    pub fn run_source(&self, name: &str, source: &str) -> Result<(), ScriptError> {
        let source = strip_bom(source);
        let ast = self.compile(name, source)?;
        let mut scope = Scope::new();
        let result = self.engine.run_ast_with_scope(&mut scope, &ast);
        drop(scope);
        result.map_err(|error| ScriptError::runtime(name, source, *error))
    }
}

/// Keeps only the newest variable of each name (Rhai's `let` shadows instead of replacing), in
/// their original order; the hidden older values are dropped.
fn drop_shadowed(scope: &mut Scope<'static>) {
    let mut seen = HashSet::new();
    let mut keep: Vec<(String, bool, Dynamic)> = Vec::with_capacity(scope.len());
    // `iter_raw` yields the newest entries first.
    for (name, constant, value) in scope.iter_raw() {
        if seen.insert(name.to_string()) {
            keep.push((name.to_string(), constant, value.clone()));
        }
    }
    if keep.len() == scope.len() {
        return;
    }
    let mut fresh = Scope::new();
    for (name, constant, value) in keep.into_iter().rev() {
        if constant {
            fresh.push_constant_dynamic(name, value);
        } else {
            fresh.push_dynamic(name, value);
        }
    }
    *scope = fresh;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebinding_keeps_the_newest_value_of_each_name_in_order() {
        let mut scope = Scope::new();
        scope.push("a", 1_i64).push("b", 2_i64).push("a", 3_i64);
        drop_shadowed(&mut scope);
        let entries: Vec<(String, i64)> = scope
            .iter()
            .map(|(name, _, value)| (name.to_string(), value.as_int().unwrap_or(-1)))
            .collect();
        assert_eq!(entries, [("b".to_string(), 2), ("a".to_string(), 3)]);
    }
}
