//! The Rhai standard library shipped inside the binary (`stdlib/*.rhai`), served to
//! `import "mem" as mem;` by a resolver that knows only these embedded sources. Scripts cannot
//! import files: the sandbox has no file-system module resolution.

use std::cell::RefCell;
use std::collections::HashMap;

use rhai::module_resolvers::ModuleResolver;
use rhai::{Engine, EvalAltResult, Module, Position, Scope, Shared};

/// A compiled module shared between imports (Rhai's `Shared<Module>`).
type SharedModule = Shared<Module>;

/// The embedded modules: import name, one-line description, source.
pub const MODULES: [(&str, &str, &str); 2] = [
    (
        "mem",
        "byte formatting, a status line, fill-until-OOM, a fresh start for experiments",
        include_str!("../../stdlib/mem.rhai"),
    ),
    (
        "check",
        "assertions for golden tests: eq, in_range, is_true, fails",
        include_str!("../../stdlib/check.rhai"),
    ),
];

/// Resolves imports against [`MODULES`], compiling each module once on first use.
#[derive(Default)]
pub struct EmbeddedResolver {
    cache: RefCell<HashMap<String, SharedModule>>,
}

impl ModuleResolver for EmbeddedResolver {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        position: Position,
    ) -> Result<SharedModule, Box<EvalAltResult>> {
        if let Some(module) = self.cache.borrow().get(path) {
            return Ok(module.clone());
        }
        let Some((_, _, source)) = MODULES.iter().find(|(name, _, _)| *name == path) else {
            let known: Vec<&str> = MODULES.iter().map(|(name, _, _)| *name).collect();
            return Err(EvalAltResult::ErrorRuntime(
                format!(
                    "import: no module named '{path}'; gpumem's modules are: {} (scripts cannot import files)",
                    known.join(", ")
                )
                .into(),
                position,
            )
            .into());
        };
        let mut ast = engine.compile(*source).map_err(|error| {
            EvalAltResult::ErrorInModule(path.to_string(), error.into(), position)
        })?;
        ast.set_source(format!("stdlib/{path}.rhai"));
        let module = Module::eval_ast_as_new(Scope::new(), &ast, engine)
            .map_err(|error| EvalAltResult::ErrorInModule(path.to_string(), error, position))?;
        let module: SharedModule = Shared::new(module);
        self.cache
            .borrow_mut()
            .insert(path.to_string(), module.clone());
        Ok(module)
    }
}
