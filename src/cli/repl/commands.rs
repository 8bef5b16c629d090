//! The REPL's `:` commands. One table ([`COMMANDS`]) feeds `:help` and tab completion.

use std::fmt::Write as _;

use std::rc::Rc;

use rhai::{Array, Dynamic, Map, Scope};

use gpumem::alloc::format::format_size;
use gpumem::alloc::summary::memory_summary;
use gpumem::script::docs::{Kind, BINDINGS};
use gpumem::script::stdlib::{module_docs, MODULES};
use gpumem::tensor::{Devices, Runtime, Tensor};

/// A `:` command's documentation.
pub struct Command {
    /// What is typed, e.g. `:vars`.
    pub name: &'static str,
    /// Its arguments, if any.
    pub args: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
}

/// Every `:` command.
pub const COMMANDS: &[Command] = &[
    Command {
        name: ":help",
        args: "[NAME]",
        summary: "this list, or the description of one binding, command, module or module function",
    },
    Command {
        name: ":vars",
        args: "",
        summary:
            "live tensors (in arrays and maps too) with the storage each keeps alive, largest first",
    },
    Command {
        name: ":mem",
        args: "",
        summary: "allocated, reserved, and cudaMemGetInfo's used (total − free) of each device in use, with the part outside the allocator (the CUDA context); creates no context",
    },
    Command {
        name: ":summary",
        args: "",
        summary: "memory_summary(): PyTorch's table",
    },
    Command {
        name: ":map",
        args: "",
        summary: "memory_map() of each device in use: every segment drawn as cells, with a legend",
    },
    Command {
        name: ":load",
        args: "FILE",
        summary: "run a script here; its variables stay",
    },
    Command {
        name: ":reset",
        args: "",
        summary: "drop every variable and function; every device as a new process finds it (counters, peaks, generator, simulated context)",
    },
    Command {
        name: ":quit",
        args: "",
        summary: "leave (Ctrl-D works too)",
    },
];

/// `:help` without arguments: commands, bindings, dtypes and modules.
pub fn help() -> String {
    let mut text = String::from("Commands:\n");
    for command in COMMANDS {
        let call = format!("{} {}", command.name, command.args);
        let _ = writeln!(text, "  {:<34} {}", call.trim_end(), command.summary);
    }
    for (title, kind) in [
        ("Functions", Kind::Function),
        ("Tensor properties", Kind::Property),
        ("Tensor methods", Kind::Method),
        ("Private pools (`let pool = mem_pool();`)", Kind::Pool),
        (
            "Out-of-memory errors (`catch (e)`; print(e) shows PyTorch's text and the why line)",
            Kind::Error,
        ),
        ("Streams (`let s = stream();`)", Kind::Stream),
    ] {
        let _ = writeln!(text, "{title}:");
        for doc in BINDINGS.iter().filter(|doc| doc.kind == kind) {
            let _ = writeln!(text, "  {:<34} {}", doc.signature, doc.summary);
        }
    }
    text.push_str(
        "Shapes: an integer or an array of integers. Dtypes: float32 (default), float16, \
         bfloat16, float64, int64, int32, uint8, bool.\nModules (always loaded here; in files \
         `import \"NAME\" as NAME;`):\n",
    );
    for (name, summary, _) in MODULES {
        let _ = writeln!(text, "  {:<34} {summary}", format!("{name}::"));
        for function in module_docs(name) {
            let call = format!("{name}::{}", function.signature);
            let _ = writeln!(text, "    {call:<32} {}", first_sentence(&function.doc));
        }
    }
    text.push_str(
        "Ctrl-C stops a running script; variables stay. An unfinished input continues at the \
         `...>` prompt; a blank line there gives it up.",
    );
    text
}

/// The first sentence of a doc comment, as a one-line summary.
fn first_sentence(doc: &str) -> &str {
    doc.split_once(". ").map_or(doc, |(first, _)| first)
}

/// `:help MODULE` or `:help MODULE::FUNCTION`: a module's functions, or one function (every
/// overload) with its whole doc comment.
fn module_help(name: &str) -> Option<String> {
    let (module, function) = name.split_once("::").unwrap_or((name, ""));
    let (_, summary, _) = MODULES.iter().find(|(known, _, _)| *known == module)?;
    let functions = module_docs(module);
    if function.is_empty() {
        let mut text =
            format!("{module}:: — {summary} (`import \"{module}\" as {module};` in files)");
        for function in &functions {
            let _ = write!(
                text,
                "\n  {module}::{:<30} {}",
                function.signature,
                first_sentence(&function.doc)
            );
        }
        return Some(text);
    }
    let overloads: Vec<String> = functions
        .iter()
        .filter(|documented| documented.name == function)
        .map(|documented| format!("{module}::{}\n  {}", documented.signature, documented.doc))
        .collect();
    (!overloads.is_empty()).then(|| overloads.join("\n"))
}

/// `:help NAME`: every binding, command, module or module function of that name (`:help mem`
/// shows the `:mem` command and the `mem` module).
pub fn help_for(name: &str) -> Result<String, String> {
    let mut found: Vec<String> = Vec::new();
    let bare = name.trim_start_matches('.');
    for doc in BINDINGS.iter().filter(|doc| doc.name == bare) {
        let mut text = format!(
            "{}\n  {}\n  example: {}",
            doc.signature, doc.summary, doc.example
        );
        if let Some(details) = gpumem::script::docs::details(doc.name) {
            for line in details.lines() {
                let _ = write!(text, "\n  {line}");
            }
        }
        found.push(text);
    }
    let command = format!(":{}", name.trim_start_matches(':'));
    if let Some(command) = COMMANDS.iter().find(|c| c.name == command) {
        found.push(format!(
            "{} {}\n  {}",
            command.name, command.args, command.summary
        ));
    }
    if let Some(text) = module_help(name.trim_end_matches("::")) {
        found.push(text);
    }
    if found.is_empty() {
        return Err(format!(
            ":help: no binding, command or module function named '{name}'"
        ));
    }
    Ok(found.join("\n"))
}

/// `:vars`: every tensor reachable from a variable (directly, or inside arrays and maps at any
/// depth), largest first. The size shown is the storage the tensor keeps alive — for a view,
/// its base's whole storage — and tensors that share one storage say so.
pub fn vars(scope: &Scope<'_>) -> String {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, _, value) in scope.iter_raw() {
        collect(name.to_string(), value, &mut tensors);
    }
    if tensors.is_empty() {
        return "no live tensors".to_string();
    }
    let kept = |tensor: &Tensor| tensor.storage().nbytes();
    tensors.sort_by(|a, b| kept(&b.1).cmp(&kept(&a.1)).then(a.0.cmp(&b.0)));
    let width = tensors
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    tensors
        .iter()
        .map(|(name, tensor)| {
            let mut line = format!(
                "{name:<width$}  {:>12}  {tensor}",
                format_size(kept(tensor))
            );
            let mut notes = Vec::new();
            if !tensor.is_whole_storage() {
                notes.push(format!("a view of {}", format_size(tensor.nbytes())));
            }
            let sharing: Vec<&str> = tensors
                .iter()
                .filter(|(other, t)| other != name && Rc::ptr_eq(t.storage(), tensor.storage()))
                .map(|(other, _)| other.as_str())
                .collect();
            if !sharing.is_empty() {
                notes.push(format!("storage shared with {}", sharing.join(", ")));
            }
            if !notes.is_empty() {
                let _ = write!(line, "  ({})", notes.join("; "));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn collect(name: String, value: &Dynamic, out: &mut Vec<(String, Tensor)>) {
    if let Some(tensor) = value.read_lock::<Tensor>() {
        out.push((name, tensor.clone()));
    } else if let Some(array) = value.read_lock::<Array>() {
        for (index, item) in array.iter().enumerate() {
            collect(format!("{name}[{index}]"), item, out);
        }
    } else if let Some(map) = value.read_lock::<Map>() {
        for (key, item) in map.iter() {
            collect(format!("{name}.{key}"), item, out);
        }
    }
}

/// `:mem`: allocated, reserved, and what the driver reports in use (total − free), for the
/// current device and every other one in use (holding memory or a context). It creates no
/// context: a device without one says so instead of asking `cudaMemGetInfo`, which would
/// create it.
pub fn mem(devices: &Devices) -> String {
    let all = devices.all();
    if let [only] = all.as_slice() {
        return device_line(only);
    }
    let current = devices.current_index();
    let mut lines = Vec::new();
    let mut unused = Vec::new();
    for (index, runtime) in all.iter().enumerate() {
        let reserved = runtime.allocator().stats().reserved_bytes.all.current > 0;
        if index == current || reserved || runtime.has_context() {
            lines.push(format!(
                "{}{}: {}",
                runtime.device_label(),
                if index == current { " (current)" } else { "" },
                device_line(runtime)
            ));
        } else {
            unused.push(runtime.device_label().to_string());
        }
    }
    if !unused.is_empty() {
        lines.push(format!(
            "not in use (no context, nothing reserved): {}",
            unused.join(", ")
        ));
    }
    lines.join("\n")
}

/// One device's `:mem` figures, with the part of cudaMemGetInfo's used that is outside the
/// allocator: the CUDA context (docs/memory-figures.md) and any other process.
fn device_line(runtime: &Runtime) -> String {
    let allocator = runtime.allocator();
    let stats = allocator.stats();
    let reserved = stats.reserved_bytes.all.current.max(0) as u64;
    let driver = if runtime.has_context() {
        match runtime.mem_get_info() {
            Ok((free, total)) => {
                let used = total.saturating_sub(free);
                format!(
                    "cudaMemGetInfo used {} of {} = reserved + {} outside the allocator (the CUDA context, and any other process)",
                    format_size(used),
                    format_size(total),
                    format_size(used.saturating_sub(reserved))
                )
            }
            Err(error) => format!("cudaMemGetInfo used unavailable ({error})"),
        }
    } else {
        "no CUDA context yet".to_string()
    };
    format!(
        "allocated {}, reserved {}, {driver}",
        format_size(stats.allocated_bytes.all.current.max(0) as u64),
        format_size(reserved),
    )
}

/// `:map`: the segment map, drawn with `options` (the terminal's width and colour), of the
/// current device and every other one holding memory, each under its name when there are
/// several.
pub fn map(devices: &Devices, options: gpumem::viz::MapOptions) -> String {
    let draw = |runtime: &Runtime| {
        gpumem::viz::map::render(
            &gpumem::viz::MemoryLayout::of(&runtime.allocator()),
            &options,
        )
    };
    let all = devices.all();
    if let [only] = all.as_slice() {
        return draw(only);
    }
    let current = devices.current_index();
    let mut parts = Vec::new();
    let mut unused = Vec::new();
    for (index, runtime) in all.iter().enumerate() {
        let reserved = runtime.allocator().stats().reserved_bytes.all.current > 0;
        if index == current || reserved {
            parts.push(format!(
                "{}{}:\n{}",
                runtime.device_label(),
                if index == current { " (current)" } else { "" },
                draw(runtime)
            ));
        } else {
            unused.push(runtime.device_label().to_string());
        }
    }
    if !unused.is_empty() {
        parts.push(format!("no segments: {}", unused.join(", ")));
    }
    parts.join("\n")
}

/// What `:reset` did, device by device: everything an allocator counts is fresh; a simulated
/// device's context is gone until first use, a GPU's stays until the process ends.
pub fn reset_report(devices: &Devices) -> String {
    let kept: Vec<String> = devices
        .all()
        .iter()
        .filter(|runtime| runtime.has_context())
        .map(|runtime| runtime.device_label().to_string())
        .collect();
    let context = if kept.is_empty() {
        "no CUDA context until a call needs one".to_string()
    } else {
        format!(
            "the CUDA context of {} stays (only the end of the process releases it)",
            kept.join(", ")
        )
    };
    format!(
        "reset: every variable and function dropped; every device as a new process finds it: no segments, counters and peaks at zero, generator at its default seed, {context}\n{}",
        mem(devices)
    )
}

/// `:summary`: PyTorch's memory summary.
pub fn summary(runtime: &Runtime) -> String {
    let allocator = runtime.allocator();
    memory_summary(allocator.stats(), allocator.device().index(), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::alloc::AllocConf;
    use gpumem::device::sim::SimDevice;
    use gpumem::tensor::DType;

    #[test]
    fn vars_finds_tensors_in_maps_and_shows_the_storage_views_keep() {
        let runtime = Runtime::sim(SimDevice::h200(), AllocConf::default()).expect("runtime");
        let base = Tensor::empty(&runtime, &[1024, 1024], DType::UInt8).expect("tensor");
        let view = base.slice(0, 0, 1).expect("view");
        let mut map = Map::new();
        map.insert("w".into(), Dynamic::from(view));
        map.insert(
            "inner".into(),
            Dynamic::from(vec![Dynamic::from(
                Tensor::empty(&runtime, &[512], DType::UInt8).expect("tensor"),
            )]),
        );
        let mut scope = Scope::new();
        scope.push("m", map);
        let text = vars(&scope);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("m.w  ") && lines[0].contains("1024.00 KiB"),
            "{text}"
        );
        assert!(lines[0].ends_with("(a view of 1024 bytes)"), "{text}");
        assert!(lines[1].starts_with("m.inner[0]  "), "{text}");
        assert!(!lines[1].contains("view"), "{text}");
        scope.push("base", base);
        let text = vars(&scope);
        assert!(
            text.contains("(a view of 1024 bytes; storage shared with base)"),
            "{text}"
        );
        assert!(text.contains("(storage shared with m.w)"), "{text}");
    }

    #[test]
    fn help_lists_every_binding_and_command() {
        let text = help();
        for doc in BINDINGS {
            assert!(text.contains(doc.signature), "{} missing", doc.name);
        }
        for command in COMMANDS {
            assert!(text.contains(command.name), "{} missing", command.name);
        }
        assert!(help_for("randn").is_ok_and(|t| t.contains("randn(shape[, dtype])")));
        assert!(help_for("vars").is_ok_and(|t| t.contains(":vars")));
        assert!(
            help_for("synchronize").is_ok_and(|t| t.contains("synchronize([device])")
                && t.contains("s.synchronize()")),
            "a name documented for functions and streams shows both"
        );
        assert!(help_for("nope").is_err_and(|t| t.contains("'nope'")));
    }

    #[test]
    fn every_module_function_has_help() {
        let text = help();
        for (module, _, _) in MODULES {
            let functions = gpumem::script::stdlib::module_docs(module);
            for function in &functions {
                let name = format!("{module}::{}", function.name);
                let shown = help_for(&name).unwrap_or_else(|error| panic!("{error}"));
                assert!(
                    shown.contains(&format!("{module}::{}", function.signature)),
                    "{shown}"
                );
                assert!(shown.contains(&function.doc), "{shown}");
                assert!(
                    text.contains(&format!("{module}::{}", function.signature)),
                    "{name} not in :help"
                );
            }
            let listing = help_for(module).expect("a module has help");
            for function in &functions {
                assert!(listing.contains(function.signature), "{listing}");
            }
        }
    }

    #[test]
    fn no_form_is_listed_twice() {
        // The forms a signature lists: its parts separated by ", " outside brackets.
        let forms = |signature: &'static str| {
            let mut forms = Vec::new();
            let (mut depth, mut start) = (0i32, 0);
            for (index, c) in signature.char_indices() {
                match c {
                    '(' | '[' => depth += 1,
                    ')' | ']' => depth -= 1,
                    ',' if depth == 0 => {
                        forms.push(signature[start..index].trim());
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            forms.push(signature[start..].trim());
            forms
        };
        let mut seen = std::collections::BTreeMap::new();
        for doc in BINDINGS {
            for form in forms(doc.signature) {
                if let Some(other) = seen.insert(form, doc.name) {
                    panic!("`{form}` is listed under both {other} and {}", doc.name);
                }
            }
        }
    }

    #[test]
    fn help_says_what_external_and_releasable_mean() {
        let text = help_for("fragmentation").expect("documented");
        // External fragmentation can be high for a cache empty_cache() returns whole: the two
        // figures are explained side by side.
        assert!(text.contains("releasable"), "{text}");
        assert!(text.contains("empty_cache() would return"), "{text}");
        assert!(text.contains("1 - largest_free / cached_free"), "{text}");
        assert!(text.contains("harmless"), "{text}");
    }
}
