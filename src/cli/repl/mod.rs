//! The interactive REPL: a rustyline editor ([`helper`]) over a [`Repl`] that evaluates lines in
//! one long-lived scope, runs `:` commands ([`commands`]) and prints results ([`display`]).
//!
//! When standard input is not a terminal, lines are read without prompts or colours
//! ([`piped`]), so a transcript can be piped in (`gpumem --device sim < steps.rhai`).
//! [`continuation`] decides, for both, when input continues on the next line.

pub mod commands;
pub mod continuation;
pub mod display;
pub mod helper;
pub mod piped;

use std::cell::RefCell;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpumem::script::sandbox::PathPolicy;
use rhai::Scope;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{CompletionType, Config, Editor};

use gpumem::alloc::AllocConf;
use gpumem::device::sim::H200_TOTAL_MEMORY;
use gpumem::device::DeviceSpec;
use gpumem::script::{directives, Definitions, Host, Limits, PrintSink, ScriptError};
use gpumem::tensor::Devices;
use helper::ReplHelper;

/// Environment variable naming the history file (tests point it at a temporary file).
pub const HISTORY_VARIABLE: &str = "GPUMEM_HISTORY";

/// The prompt for a new input.
pub const PROMPT: &str = "gpumem> ";

/// The prompt for the next line of an unfinished input, as wide as [`PROMPT`].
pub const CONTINUATION_PROMPT: &str = "   ...> ";

/// What the loop does after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read the next line.
    Continue,
    /// Leave the REPL.
    Quit,
    /// A script called `exit(code)`: leave the REPL, ending the process with this status.
    Exit(u8),
}

/// The REPL's state: the engine, the variables and functions defined so far, and where output
/// goes. Independent of the line editor, so tests can drive it directly.
pub struct Repl {
    host: Host,
    device: DeviceSpec,
    scope: Scope<'static>,
    definitions: Definitions,
    out: PrintSink,
    errors: usize,
    lines: usize,
}

impl Repl {
    /// A REPL over `devices` (as `device` named them), printing to `out`, with the standard
    /// modules preloaded.
    pub fn new(
        devices: Devices,
        device: DeviceSpec,
        out: PrintSink,
        limits: Limits,
    ) -> Result<Repl, ScriptError> {
        let mut host = Host::with_limits(devices, out.clone(), limits);
        host.preload_stdlib()?;
        Ok(Repl {
            host,
            device,
            scope: Scope::new(),
            definitions: Definitions::default(),
            out,
            errors: 0,
            lines: 0,
        })
    }

    /// Stops running scripts when `flag` is set (Ctrl-C).
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.host.set_interrupt(flag);
    }

    /// How many inputs failed so far.
    pub fn errors(&self) -> usize {
        self.errors
    }

    /// Names of the variables in scope, for completion.
    pub fn variable_names(&self) -> Vec<String> {
        self.scope
            .iter_raw()
            .map(|(name, _, _)| name.to_string())
            .collect()
    }

    /// Handles one input: a `:` command or script text.
    pub fn handle(&mut self, input: &str) -> Flow {
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Flow::Continue;
        }
        if let Some(command) = trimmed.strip_prefix(':') {
            return self.command(command);
        }
        self.lines += 1;
        let name = format!("input{}", self.lines);
        self.eval(&name, input)
    }

    fn eval(&mut self, name: &str, source: &str) -> Flow {
        let result = self
            .host
            .eval_in(&mut self.scope, &mut self.definitions, name, source);
        match result {
            Ok(value) if value.is_unit() => {}
            Ok(value) => self.out.line(&display::show(&value)),
            Err(ScriptError::Exit(code)) => return Flow::Exit(code),
            Err(error) => self.error(&error.to_string()),
        }
        Flow::Continue
    }

    /// Gives up the unfinished `input` (a blank line was typed, or Ctrl-D): it is not run, and
    /// the error says what it lacked.
    pub fn give_up(&mut self, parser: &rhai::Engine, input: &str) {
        let first = input.lines().next().unwrap_or("").trim();
        self.error(&format!(
            "discarded the unfinished input starting `{first}`: {}; a blank line gives up an \
             unfinished input",
            continuation::why_unfinished(parser, input)
        ));
    }

    /// Reports an error (stderr, or the buffer) and counts it.
    pub fn error(&mut self, text: &str) {
        self.errors += 1;
        match &self.out {
            PrintSink::Stdout => eprintln!("{text}"),
            PrintSink::Buffer(_) => self.out.line(text),
        }
    }

    fn command(&mut self, command: &str) -> Flow {
        let (name, argument) = command
            .split_once(char::is_whitespace)
            .map_or((command, ""), |(name, rest)| (name, rest.trim()));
        let devices = Rc::clone(self.host.devices());
        match (name, argument) {
            ("quit" | "q" | "exit", _) => return Flow::Quit,
            ("help" | "h", "") => self.out.line(&commands::help()),
            ("help" | "h", topic) => match commands::help_for(topic) {
                Ok(text) => self.out.line(&text),
                Err(text) => self.error(&text),
            },
            ("vars", _) => self.out.line(&commands::vars(&self.scope)),
            ("mem", _) => self.out.line(&commands::mem(&devices)),
            ("summary", _) => self.out.line(&commands::summary(&devices.current())),
            ("map", _) => self
                .out
                .line(&commands::map(&devices, self.host.map_options())),
            ("load", "") => self.error(":load: which file? usage: :load FILE"),
            ("load", file) => return self.load(Path::new(file)),
            ("reset", _) => self.reset(),
            _ => self.error(&format!(
                "unknown command ':{name}'; :help lists the commands"
            )),
        }
        Flow::Continue
    }

    /// `:load FILE`: runs the file in this session. Its directives cannot change the device
    /// or config of a running session, so a script pinning different ones is refused.
    fn load(&mut self, path: &Path) -> Flow {
        let shown = path.display().to_string();
        let source = match crate::cli::read_text(path, "a script") {
            Ok(source) => source,
            Err(error) => {
                self.error(&format!(":load: {error}"));
                return Flow::Continue;
            }
        };
        match directives::parse(&source) {
            Ok(pinned) => {
                if let Err(reason) = self.accepts(&pinned) {
                    self.error(&format!(
                        ":load: {shown} {reason}; start gpumem with those flags, or use \
                         `gpumem run {shown}`"
                    ));
                    return Flow::Continue;
                }
            }
            Err(error) => {
                self.error(&format!(":load: {shown}: {error}"));
                return Flow::Continue;
            }
        }
        self.eval(&shown, &source)
    }

    /// Whether this session satisfies a script's directives; else why not.
    fn accepts(&self, pinned: &directives::Directives) -> Result<(), String> {
        if let Some(device) = &pinned.device {
            // Simulated machines are the same when their capacities are (`sim` is the H200).
            let totals = |spec: &DeviceSpec| match spec {
                DeviceSpec::Sim(sizes) => Some(
                    sizes
                        .iter()
                        .map(|size| size.unwrap_or(H200_TOTAL_MEMORY))
                        .collect::<Vec<u64>>(),
                ),
                DeviceSpec::Cuda(_) => None,
            };
            let same = *device == self.device
                || (totals(device).is_some() && totals(device) == totals(&self.device));
            if !same {
                let written = pinned.device_text.clone().unwrap_or(device.to_string());
                return Err(format!(
                    "pins `//! device: {written}` but this session runs on {}",
                    self.device
                ));
            }
        }
        if let Some(needed) = pinned.devices {
            let count = self.host.devices().count();
            if needed != count {
                return Err(format!(
                    "pins `//! devices: {needed}` but this session has {count} device{}",
                    if count == 1 { "" } else { "s" }
                ));
            }
        }
        if let Some(text) = &pinned.alloc_conf {
            let runtime = self.host.devices().current();
            let ours = runtime.allocator().config().clone();
            let wanted = AllocConf::parse(text).map_err(|error| {
                format!("pins `//! alloc-conf: {text}`, which is invalid: {error}")
            })?;
            let comparable = |conf: AllocConf| AllocConf {
                source: String::new(),
                ..conf
            };
            if comparable(wanted) != comparable(ours.clone()) {
                return Err(format!(
                    "pins `//! alloc-conf: {text}` but this session runs with '{}'",
                    ours.source
                ));
            }
        }
        Ok(())
    }

    /// `:reset`: drops every variable and function, then makes every device as a new process
    /// finds it (allocator, counters, peaks, history, generator; the simulated CUDA contexts
    /// too, while a GPU's context lives as long as the process).
    fn reset(&mut self) {
        self.scope.clear();
        self.definitions = Definitions::default();
        let devices = Rc::clone(self.host.devices());
        match devices.reset() {
            Ok(()) => self.out.line(&commands::reset_report(&devices)),
            Err(error) => self.error(&format!(":reset: {error}")),
        }
    }
}

/// Where history is kept: `$GPUMEM_HISTORY`, else `$XDG_STATE_HOME/gpumem_history`, else
/// `~/.gpumem_history`.
pub fn history_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(HISTORY_VARIABLE) {
        return Some(PathBuf::from(path));
    }
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(state).join("gpumem_history"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".gpumem_history"))
}

/// Why the REPL could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    /// The line editor failed.
    #[error("line editor: {0}")]
    Editor(#[from] ReadlineError),
    /// The standard library did not load.
    #[error("{0}")]
    Script(#[from] ScriptError),
    /// Standard input could not be read.
    #[error("cannot read standard input: {0}")]
    Input(#[from] std::io::Error),
}

/// Runs the REPL on standard input until `:quit`, `exit(code)` or end of input, and returns the
/// process exit status: the code given to `exit`, else for piped input 1 when an input failed
/// (or the input ended inside an unfinished block) and 0 otherwise; 0 when interactive.
pub fn run(
    devices: Devices,
    device: DeviceSpec,
    limits: Limits,
    paths: PathPolicy,
) -> Result<u8, ReplError> {
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let mut repl = Repl::new(devices, device, PrintSink::Stdout, limits)?;
    repl.host.set_path_policy(paths);
    if !interactive {
        let stdin = std::io::stdin().lock();
        return Ok(match piped::run(&mut repl, stdin)? {
            Flow::Exit(code) => code,
            _ if repl.errors() > 0 => 1,
            _ => 0,
        });
    }
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    repl.host
        .set_map_options(crate::cli::paint::stdout_map_options());
    let interrupt = Arc::new(AtomicBool::new(false));
    let handler_flag = Arc::clone(&interrupt);
    if let Err(error) = ctrlc::set_handler(move || handler_flag.store(true, Ordering::Relaxed)) {
        eprintln!("gpumem: Ctrl-C will not interrupt scripts: {error}");
    }
    repl.set_interrupt(Arc::clone(&interrupt));

    let config = Config::builder()
        .completion_type(CompletionType::List)
        .auto_add_history(false)
        .history_ignore_dups(true)?
        .max_history_size(10_000)?
        .build();
    let variables = Rc::new(RefCell::new(Vec::new()));
    let mut editor: Editor<ReplHelper, DefaultHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(ReplHelper::new(Rc::clone(&variables), color)));
    let history = history_path();
    if let Some(path) = &history {
        // A missing file just means a first session.
        let _ = editor.load_history(path);
    }
    println!("gpumem REPL — :help lists commands and bindings, Ctrl-D leaves");
    let parser = rhai::Engine::new_raw();
    // The lines of an input still unfinished (an open brace, a trailing operator, ...).
    let mut pending = String::new();
    loop {
        let prompt = if pending.is_empty() {
            PROMPT
        } else {
            CONTINUATION_PROMPT
        };
        match editor.readline(prompt) {
            Ok(line) => {
                if !pending.is_empty() && line.trim().is_empty() {
                    remember(&mut editor, history.as_deref(), &pending);
                    repl.give_up(&parser, &std::mem::take(&mut pending));
                    continue;
                }
                if !pending.is_empty() {
                    pending.push('\n');
                }
                pending.push_str(&line);
                if continuation::needs_more(&parser, &pending) {
                    continue;
                }
                let input = std::mem::take(&mut pending);
                remember(&mut editor, history.as_deref(), &input);
                interrupt.store(false, Ordering::Relaxed);
                let flow = repl.handle(&input);
                *variables.borrow_mut() = repl.variable_names();
                match flow {
                    Flow::Continue => {}
                    Flow::Quit => break,
                    Flow::Exit(code) => return Ok(code),
                }
            }
            // Ctrl-C abandons the line being typed, and the unfinished input it continues.
            Err(ReadlineError::Interrupted) => pending.clear(),
            Err(ReadlineError::Eof) => {
                if !pending.is_empty() {
                    repl.give_up(&parser, &pending);
                }
                break;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(0)
}

/// Adds a whole input (all its lines) to the history, saving it when there is a file.
fn remember(editor: &mut Editor<ReplHelper, DefaultHistory>, path: Option<&Path>, input: &str) {
    if input.trim().is_empty() {
        return;
    }
    let _ = editor.add_history_entry(input);
    if let Some(path) = path {
        save_history(editor, path);
    }
}

fn save_history(editor: &mut Editor<ReplHelper, DefaultHistory>, path: &Path) {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    if let Err(error) = editor.save_history(path) {
        eprintln!("gpumem: cannot save history to {}: {error}", path.display());
    }
}
