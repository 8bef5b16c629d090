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

/// One function of an embedded module as its source declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleFunction {
    /// The module's import name, e.g. `mem`.
    pub module: &'static str,
    /// The function's name, e.g. `format_size`.
    pub name: &'static str,
    /// The declaration without `fn` and the body, e.g. `format_size(bytes)`.
    pub signature: &'static str,
    /// Its `///` doc comment, the lines joined with spaces.
    pub doc: String,
}

/// Every function `module` declares, each overload on its own, in source order, with the
/// `///` comment right above it: what `:help mem::NAME` prints and completion offers.
pub fn module_docs(module: &str) -> Vec<ModuleFunction> {
    let Some((name, _, source)) = MODULES.iter().find(|(name, _, _)| *name == module) else {
        return Vec::new();
    };
    let mut functions = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in source.lines() {
        if let Some(comment) = line.strip_prefix("///") {
            doc.push(comment.trim());
            continue;
        }
        if let Some(rest) = line.strip_prefix("fn ") {
            let signature = rest.split('{').next().unwrap_or(rest).trim();
            let function = signature.split('(').next().unwrap_or(signature).trim();
            functions.push(ModuleFunction {
                module: name,
                name: function,
                signature,
                doc: doc.join(" "),
            });
        }
        doc.clear();
    }
    functions
}

/// The distinct function names `module` declares, in source order.
pub fn module_functions(module: &str) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for function in module_docs(module) {
        if !names.contains(&function.name) {
            names.push(function.name);
        }
    }
    names
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_function_is_documented() {
        for (module, _, _) in MODULES {
            let functions = module_docs(module);
            assert!(!functions.is_empty(), "{module} declares functions");
            for function in functions {
                assert!(
                    function.doc.len() > 20,
                    "{module}::{} has no doc comment",
                    function.signature
                );
                assert!(function.signature.starts_with(function.name));
            }
        }
        assert_eq!(
            module_functions("check"),
            ["eq", "in_range", "is_true", "fails"]
        );
        assert!(module_docs("nope").is_empty());
    }
}
