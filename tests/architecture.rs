//! The rules of the house that the compiler cannot check (../shared/DESIGN.md, issue 15):
//! which layer may import which, no import loops between the modules of one folder, and no
//! public submodule that nothing outside the library uses.
//!
//! The test reads the crate's own sources: every `crate::…` and `super::…` path outside
//! comments and outside `#[cfg(test)]` modules is an import of the module it names. That is a
//! textual reading, not the compiler's, which is why it errs on the strict side: a path in code
//! counts as much as one in a `use`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`["snapshot", "pickle", "vm"]`; the root is `[]`).
type ModulePath = Vec<String>;

/// Every module of the crate with the modules its code names.
struct Crate {
    imports: BTreeMap<ModulePath, BTreeSet<ModulePath>>,
}

impl Crate {
    fn read() -> Crate {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        collect_rust_files(&root, &mut files);
        let modules: BTreeMap<ModulePath, String> = files
            .iter()
            .map(|file| (module_path(&root, file), code_of(file)))
            .collect();
        let known: BTreeSet<ModulePath> = modules.keys().cloned().collect();
        let imports = modules
            .iter()
            .map(|(module, code)| (module.clone(), named_modules(module, code, &known)))
            .collect();
        Crate { imports }
    }

    /// The modules under `folder` (at any depth) that import something under `target`.
    fn importers(&self, folder: &[&str], target: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for (module, imports) in &self.imports {
            if !starts_with(module, folder) {
                continue;
            }
            for import in imports {
                if starts_with(import, target) {
                    found.push(format!("{} imports {}", show(module), show(import)));
                }
            }
        }
        found
    }

    /// Loops between the direct children of each folder: `a → b → a` where `a` and `b` (or
    /// modules inside them) import each other.
    fn sibling_loops(&self) -> Vec<String> {
        let folders: BTreeSet<ModulePath> = self
            .imports
            .keys()
            .flat_map(|module| (0..module.len()).map(|depth| module[..depth].to_vec()))
            .collect();
        let mut loops = Vec::new();
        for folder in folders {
            let child = |module: &ModulePath| -> Option<String> {
                (module.len() > folder.len() && module[..folder.len()] == folder[..])
                    .then(|| module[folder.len()].clone())
            };
            let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (module, imports) in &self.imports {
                let Some(from) = child(module) else { continue };
                for import in imports {
                    if let Some(to) = child(import) {
                        if to != from {
                            graph.entry(from.clone()).or_default().insert(to);
                        }
                    }
                }
            }
            for cycle in cycles(&graph) {
                loops.push(format!("in {}/: {}", show(&folder), cycle.join(" ↔ ")));
            }
        }
        loops
    }
}

fn starts_with(module: &[String], prefix: &[&str]) -> bool {
    module.len() >= prefix.len() && module.iter().zip(prefix).all(|(a, b)| a == b)
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

fn collect_rust_files(folder: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(folder).expect("src/ is readable");
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") && !path.ends_with("main.rs") {
            // main.rs only declares the binary's `cli` module, which the walk reads by itself;
            // kept out because it would name the crate root a second time.
            files.push(path);
        }
    }
}

/// `src/snapshot/pickle/vm.rs` → `snapshot::pickle::vm`; `mod.rs`, `lib.rs` and `main.rs`
/// name their folder.
fn module_path(root: &Path, file: &Path) -> ModulePath {
    let relative = file.strip_prefix(root).expect("under src/");
    let mut parts: ModulePath = relative
        .with_extension("")
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// A file's code without comments and without its unit-test module (tests may reach anywhere).
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("source is readable");
    let mut code = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            // Unit tests sit at the end of a file by the house style; what follows is tests.
            break;
        }
        let line = match line.find("//") {
            // A `//` inside a string literal ("https://…") cuts nothing that matters here:
            // paths of modules do not follow it on the same line in this code base.
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The known modules that `module`'s code names through `crate::` or `super::` paths (the
/// longest known prefix of each path, not the module itself).
fn named_modules(
    module: &ModulePath,
    code: &str,
    known: &BTreeSet<ModulePath>,
) -> BTreeSet<ModulePath> {
    let mut named = BTreeSet::new();
    let bytes = code.as_bytes();
    for start in [("crate::", 0usize), ("super::", 1usize)] {
        let (prefix, ups) = start;
        let mut from = 0;
        while let Some(found) = code[from..].find(prefix) {
            let at = from + found;
            from = at + prefix.len();
            // `super::super::x`, `crate::a::b::{c, d}`: read the identifiers that follow.
            let preceded_by_ident =
                at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            if preceded_by_ident || (ups == 1 && at >= 7 && &code[at - 7..at] == "super::") {
                continue;
            }
            let mut base: ModulePath = if ups == 0 {
                Vec::new()
            } else {
                // `super` of a folder's mod.rs is the folder's parent; of a file, its folder.
                let mut parent = module.clone();
                parent.pop();
                parent
            };
            let mut rest = &code[at + prefix.len()..];
            while let Some(more) = rest.strip_prefix("super::") {
                base.pop();
                rest = more;
            }
            let path: Vec<&str> = rest
                .split("::")
                .map(|part| {
                    part.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or("")
                })
                .take_while(|part| !part.is_empty())
                .collect();
            let mut full = base;
            full.extend(path.iter().map(|part| part.to_string()));
            while !full.is_empty() {
                if known.contains(&full) {
                    if &full != module && !starts_with(module, &as_strs(&full)) {
                        named.insert(full);
                    }
                    break;
                }
                full.pop();
            }
        }
    }
    named
}

fn as_strs(module: &[String]) -> Vec<&str> {
    module.iter().map(String::as_str).collect()
}

/// The strongly connected groups of more than one node (Tarjan's algorithm), each listed in
/// name order.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        groups: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, node: &'g str) {
            let next = self.index.len();
            self.index.insert(node, next);
            self.low.insert(node, next);
            self.stack.push(node);
            self.on_stack.insert(node);
            let graph = self.graph;
            for target in graph.get(node).into_iter().flatten() {
                let target = target.as_str();
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[node].min(self.low[target]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[node].min(self.index[target]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    group.push(member.to_string());
                    if member == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.groups.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.groups
}

#[test]
fn peers_stay_peers_and_data_flows_downhill() {
    let krate = Crate::read();
    let mut broken = Vec::new();
    // snapshot/ and viz/ work from allocator events: neither imports the other or tensor/.
    for (folder, target) in [
        ("snapshot", "viz"),
        ("snapshot", "tensor"),
        ("viz", "snapshot"),
        ("viz", "tensor"),
    ] {
        broken.extend(krate.importers(&[folder], &[target]));
    }
    // device/ imports nothing above it; the allocator nothing above it either.
    for above in ["alloc", "tensor", "snapshot", "viz", "script", "cli"] {
        broken.extend(krate.importers(&["device"], &[above]));
    }
    for above in ["tensor", "snapshot", "viz", "script", "cli"] {
        broken.extend(krate.importers(&["alloc"], &[above]));
    }
    // tensor/ sits under snapshot/, viz/ and script/.
    for above in ["snapshot", "viz", "script", "cli"] {
        broken.extend(krate.importers(&["tensor"], &[above]));
    }
    // Only the binary's command line sits above the script layer.
    for folder in ["alloc", "device", "tensor", "snapshot", "viz", "script"] {
        broken.extend(krate.importers(&[folder], &["cli"]));
    }
    assert!(
        broken.is_empty(),
        "imports against the layering:\n{}",
        broken.join("\n")
    );
}

#[test]
fn no_import_loops_between_modules_of_one_folder() {
    let loops = Crate::read().sibling_loops();
    assert!(loops.is_empty(), "import loops:\n{}", loops.join("\n"));
}

#[test]
fn the_reader_sees_imports_it_must_see() {
    // The checks above pass vacuously if the reading finds nothing: pin a few known imports.
    let krate = Crate::read();
    let path = |text: &str| -> ModulePath { text.split("::").map(str::to_string).collect() };
    let imports_of = |module: &str| {
        krate
            .imports
            .get(&path(module))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        imports_of("tensor").contains(&path("alloc")),
        "tensor/ uses the allocator"
    );
    assert!(
        imports_of("script::control").contains(&path("script::args")),
        "control.rs takes its argument helpers from args.rs"
    );
    // A `super::` path from a file names its sibling.
    assert!(imports_of("script::args").contains(&path("script::stop")));
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&graph), vec![vec!["a".to_string(), "b".to_string()]]);
}

/// Every `pub mod NAME;` beneath the seven roots, as `(path of the module, NAME)`.
fn public_submodules() -> Vec<(ModulePath, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_rust_files(&root, &mut files);
    let mut found = Vec::new();
    for file in files {
        let parent = module_path(&root, &file);
        if parent.is_empty() || parent[0] == "cli" {
            // lib.rs declares the roots; the binary's modules are no one's face.
            continue;
        }
        for line in code_of(&file).lines() {
            if let Some(name) = line
                .trim()
                .strip_prefix("pub mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            {
                found.push((parent.clone(), name.to_string()));
            }
        }
    }
    found
}

/// The text of every file outside the library that may use it: the binary (src/cli,
/// src/main.rs), integration tests, benches and the fuzz target.
fn library_users() -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![manifest.join("src/main.rs")];
    for folder in ["src/cli", "tests", "benches", "fuzz"] {
        let folder = manifest.join(folder);
        if folder.is_dir() {
            collect_rust_files(&folder, &mut files);
        }
    }
    files
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .collect()
}

/// Whether `word` occurs in `text` as a whole identifier.
fn names_word(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[test]
fn a_public_submodule_is_used_outside_the_library() {
    // Issue 15's curated face: beneath the seven roots a module is public only because the
    // binary, a test, a bench or the fuzz target reaches it; everything else is `pub(crate)`.
    // Read textually: some file outside the library names `gpumem::ROOT` and the module's name.
    let users = library_users();
    let modules = public_submodules();
    assert!(
        modules.len() > 10,
        "the reading found only {} public submodules",
        modules.len()
    );
    let unused: Vec<String> = modules
        .iter()
        .filter(|(parent, name)| {
            let root = format!("gpumem::{}", parent[0]);
            !users
                .iter()
                .any(|text| text.contains(&root) && names_word(text, name))
        })
        .map(|(parent, name)| format!("{}::{name}", show(parent)))
        .collect();
    assert!(
        unused.is_empty(),
        "public modules nothing outside the library uses (make them pub(crate)):\n{}",
        unused.join("\n")
    );
}
