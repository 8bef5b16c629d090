//! The REPL's `:` commands. One table ([`COMMANDS`]) feeds `:help` and tab completion.

use std::fmt::Write as _;

use rhai::{Array, Dynamic, Scope};

use crate::alloc::format::format_size;
use crate::alloc::summary::memory_summary;
use crate::script::docs::{Kind, BINDINGS};
use crate::script::stdlib::MODULES;
use crate::tensor::{Runtime, Tensor};

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
        summary: "this list, or one binding's description",
    },
    Command {
        name: ":vars",
        args: "",
        summary: "live tensors with their sizes, largest first",
    },
    Command {
        name: ":mem",
        args: "",
        summary: "one line: allocated, reserved, driver used",
    },
    Command {
        name: ":summary",
        args: "",
        summary: "memory_summary(): PyTorch's table",
    },
    Command {
        name: ":load",
        args: "FILE",
        summary: "run a script here; its variables stay",
    },
    Command {
        name: ":reset",
        args: "",
        summary: "drop every variable and function, then empty the cache",
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
    }
    text.push_str(
        "Ctrl-C stops a running script; variables stay. A blank line ends an unfinished block.",
    );
    text
}

/// `:help NAME`: one binding or command.
pub fn help_for(name: &str) -> Result<String, String> {
    let bare = name.trim_start_matches('.');
    if let Some(doc) = BINDINGS.iter().find(|doc| doc.name == bare) {
        return Ok(format!(
            "{}\n  {}\n  example: {}",
            doc.signature, doc.summary, doc.example
        ));
    }
    let command = format!(":{}", name.trim_start_matches(':'));
    if let Some(found) = COMMANDS.iter().find(|c| c.name == command) {
        return Ok(format!(
            "{} {}\n  {}",
            found.name, found.args, found.summary
        ));
    }
    Err(format!(":help: no binding or command named '{name}'"))
}

/// `:vars`: every tensor reachable from a variable (directly or as an array element), largest
/// first.
pub fn vars(scope: &Scope<'_>) -> String {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, _, value) in scope.iter_raw() {
        collect(name.to_string(), value, &mut tensors);
    }
    if tensors.is_empty() {
        return "no live tensors".to_string();
    }
    tensors.sort_by(|a, b| b.1.nbytes().cmp(&a.1.nbytes()).then(a.0.cmp(&b.0)));
    let width = tensors
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    tensors
        .iter()
        .map(|(name, tensor)| {
            format!(
                "{name:<width$}  {:>12}  {tensor}",
                format_size(tensor.nbytes())
            )
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
    }
}

/// `:mem`: allocated, reserved, and what the driver reports in use (total − free).
pub fn mem(runtime: &Runtime) -> String {
    let allocator = runtime.allocator();
    let stat = |key: &str| allocator.stats().get(key).unwrap_or(0).max(0) as u64;
    let driver = match allocator.device().mem_get_info() {
        Ok((free, total)) => format!(
            "{} of {}",
            format_size(total.saturating_sub(free)),
            format_size(total)
        ),
        Err(error) => format!("unavailable ({error})"),
    };
    format!(
        "allocated {}, reserved {}, driver used {driver}",
        format_size(stat("allocated_bytes.all.current")),
        format_size(stat("reserved_bytes.all.current")),
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
        assert!(help_for("nope").is_err_and(|t| t.contains("'nope'")));
    }
}
