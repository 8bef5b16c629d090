//! The script layer: a Rhai engine with gpumem's bindings registered, run over one
//! [`Runtime`]. Thin glue — every binding converts its arguments and calls into
//! [`crate::tensor`] or [`crate::alloc`].

pub mod bindings;
pub mod errors;
pub mod memory_api;
pub mod tensor_api;
pub mod values_api;

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use rhai::{Engine, Scope, AST};

use crate::tensor::Runtime;
pub use errors::ScriptError;

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
            PrintSink::Stdout => println!("{text}"),
            PrintSink::Buffer(buffer) => {
                let mut buffer = buffer.borrow_mut();
                buffer.push_str(text);
                buffer.push('\n');
            }
        }
    }
}

/// A Rhai engine bound to a runtime, ready to run scripts.
pub struct Host {
    engine: Engine,
    runtime: Rc<Runtime>,
}

impl Host {
    /// An engine with every binding registered, printing to `sink`.
    pub fn new(runtime: Rc<Runtime>, sink: PrintSink) -> Host {
        let mut engine = Engine::new();
        // Explicit limits so debug and release builds behave alike (Rhai's defaults differ).
        engine
            .set_max_call_levels(64)
            .set_max_expr_depths(64, 64)
            .set_max_string_size(16 << 20)
            .set_max_array_size(1 << 24)
            .set_max_map_size(1 << 20);
        let print_sink = sink.clone();
        engine.on_print(move |text| print_sink.line(text));
        engine.on_debug(move |text, _source, position| {
            sink.line(&format!("[debug {position}] {text}"))
        });
        bindings::register(&mut engine, &runtime);
        Host { engine, runtime }
    }

    /// The runtime scripts run against.
    pub fn runtime(&self) -> &Rc<Runtime> {
        &self.runtime
    }

    /// The engine, for callers that compile or evaluate themselves (the REPL).
    pub fn engine(&self) -> &Engine {
        &self.engine
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
        let ast = self.compile(name, source)?;
        let mut scope = Scope::new();
        let result = self.engine.run_ast_with_scope(&mut scope, &ast);
        drop(scope);
        result.map_err(|error| ScriptError::runtime(name, source, *error))
    }

    /// Reads and runs a script file.
    pub fn run_file(&self, path: &Path) -> Result<(), ScriptError> {
        let name = path.display().to_string();
        let source = std::fs::read_to_string(path).map_err(|error| ScriptError::Io {
            path: name.clone(),
            message: error.to_string(),
        })?;
        self.run_source(&name, &source)
    }
}
