//! What to add to Rhai's "Function not found" so that a learner knows what to type instead:
//! the nearest known name (`did you mean `randn`?`), how a known function is called when only
//! its arguments were wrong, and that a shape is one array (`randn([10, 10])`, not
//! `randn(10, 10)`).
//!
//! Known names are gpumem's bindings ([`super::docs::BINDINGS`]), the functions of the
//! embedded modules (`mem::format_size`), Rhai's own functions (`print`, `len`, ...) and the
//! script's own functions. Nearness is the optimal string alignment distance (strsim's
//! `osa_distance`: insertions, deletions, substitutions and swaps of two neighbours).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use super::docs::{Kind, BINDINGS};
use super::stdlib;

/// The creation functions whose first argument is the shape.
const SHAPED: [&str; 5] = ["randn", "empty", "zeros", "ones", "full"];

/// The largest distance still offered as a suggestion for a name of `length` characters: one
/// edit for short names, two up to eight characters, three beyond (never the whole name).
fn allowed_distance(length: usize) -> usize {
    match length {
        0..=2 => 0,
        3..=4 => 1,
        5..=8 => 2,
        _ => 3,
    }
}

/// Rhai's own function names (its standard packages), computed once.
fn rhai_functions() -> &'static BTreeSet<String> {
    static NAMES: OnceLock<BTreeSet<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        rhai::Engine::new()
            .gen_fn_signatures(true)
            .iter()
            .filter_map(|signature| signature.split('(').next())
            .filter(|name| is_identifier(name))
            .map(str::to_string)
            .collect()
    })
}

/// Whether `name` is a plain identifier (not an operator, a getter `get$x` or an indexer).
fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The names of the functions `source` defines (`fn name(`).
fn defined_in(source: &str) -> impl Iterator<Item = &str> {
    source.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix("fn ")?;
        let name = rest.split('(').next()?.trim();
        is_identifier(name).then_some(name)
    })
}

/// Every name a call may use: bindings (functions, methods, properties), `module::function`
/// of the embedded modules, Rhai's functions and `own` (the script's).
fn known_names<'a>(own: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = BINDINGS
        .iter()
        .filter(|doc| doc.kind != Kind::Error && is_identifier(doc.name))
        .map(|doc| doc.name.to_string())
        .collect();
    for (module, _, _) in stdlib::MODULES {
        for function in stdlib::module_functions(module) {
            names.insert(format!("{module}::{function}"));
        }
    }
    names.extend(rhai_functions().iter().cloned());
    names.extend(own.map(str::to_string));
    names
}

/// The part of a name after its module, if it has one (`mem::x` → `x`).
fn bare(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}

/// The known name nearest to `wanted`, if one is near enough. A qualified name is also
/// compared by its last part, so `mem::fragmentation` finds the built-in `fragmentation`.
fn nearest<'a>(wanted: &str, names: &'a BTreeSet<String>) -> Option<&'a str> {
    let wanted_bare = bare(wanted);
    let limit = allowed_distance(wanted_bare.chars().count());
    names
        .iter()
        .filter(|name| name.as_str() != wanted)
        .map(|name| {
            let whole = strsim::osa_distance(wanted, name);
            let parts = strsim::osa_distance(wanted_bare, bare(name));
            // A name in another namespace costs one more than the same name in this one.
            let namespaced = usize::from(wanted.contains("::") != name.contains("::"));
            (whole.min(parts + namespaced), name.as_str())
        })
        .filter(|&(distance, _)| distance <= limit)
        .min_by_key(|&(distance, name)| (distance, name.len()))
        .map(|(_, name)| name)
}

/// The hint appended to Rhai's `Function not found: SIGNATURE` (`randm (array)`,
/// `reshpe (Tensor, array)`, `mem::format_sise (i64)`), or an empty string. `call` is the
/// source text from the failed call on (to quote its arguments); `source` and `own` give the
/// script's own functions.
pub fn for_missing_function<'a>(
    signature: &str,
    call: &str,
    source: &'a str,
    own: impl Iterator<Item = &'a str>,
) -> String {
    let (name, arguments) = match signature.split_once('(') {
        Some((name, rest)) => (name.trim(), rest.trim_end_matches(')')),
        None => (signature.trim(), ""),
    };
    let arguments: Vec<&str> = arguments
        .split(',')
        .map(str::trim)
        .filter(|argument| !argument.is_empty())
        .collect();
    if SHAPED.contains(&name) && arguments.len() >= 2 && arguments.iter().all(|a| *a == "i64") {
        let written = call_arguments(name, call).unwrap_or_else(|| {
            (0..arguments.len())
                .map(|index| format!("d{index}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        return format!("; a shape is one argument, an array: {name}([{written}])");
    }
    if let Some(doc) = BINDINGS.iter().find(|doc| doc.name == name) {
        return format!(
            "; {name} exists but not with these arguments: it is called as {} (:help {name})",
            doc.signature
        );
    }
    let names = known_names(defined_in(source).chain(own));
    match nearest(name, &names) {
        Some(near) => format!("; did you mean `{near}`?"),
        None => String::new(),
    }
}

/// The arguments of the call `name(...)` at the start of `call`, as written, if they can be
/// read (the text up to the matching parenthesis).
fn call_arguments(name: &str, call: &str) -> Option<String> {
    let rest = call.strip_prefix(name)?.trim_start().strip_prefix('(')?;
    let mut depth = 0usize;
    for (index, c) in rest.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' if depth == 0 => return Some(rest[..index].trim().to_string()),
            ')' | ']' | '}' => depth = depth.checked_sub(1)?,
            '"' | '`' | '\'' => return None,
            _ => {}
        }
    }
    None
}

/// The hint for a creation function called with integers where the shape array belongs, as
/// `randn(10, 10)` is: the call written with the shape as an array.
pub fn shape_as_array(function: &str, dims: &[rhai::INT]) -> String {
    let dims: Vec<String> = dims.iter().map(ToString::to_string).collect();
    format!(
        "a shape is one argument, an array: {function}([{}])",
        dims.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(signature: &str) -> String {
        for_missing_function(
            signature,
            "",
            "fn helper_one(x) { x }\n",
            std::iter::empty(),
        )
    }

    #[test]
    fn near_names_are_suggested_and_far_ones_are_not() {
        assert_eq!(hint("randm (array)"), "; did you mean `randn`?");
        assert_eq!(hint("reshpe (Tensor, array)"), "; did you mean `reshape`?");
        assert_eq!(
            hint("mem::format_sise (i64)"),
            "; did you mean `mem::format_size`?"
        );
        assert_eq!(
            hint("format_sise (i64)"),
            "; did you mean `mem::format_size`?"
        );
        assert_eq!(
            hint("mem::fragmentation ()"),
            "; did you mean `fragmentation`?"
        );
        assert_eq!(hint("prnt (i64)"), "; did you mean `print`?");
        assert_eq!(hint("helper_on (i64)"), "; did you mean `helper_one`?");
        assert_eq!(hint("xyzzy_plugh ()"), "");
        assert_eq!(hint("ab ()"), "", "two letters are too short to guess from");
    }

    #[test]
    fn shapes_and_known_functions_say_how_to_call_them() {
        assert_eq!(
            hint("zeros (i64, i64, i64)"),
            "; a shape is one argument, an array: zeros([d0, d1, d2])"
        );
        let quoted = for_missing_function(
            "zeros (i64, i64, i64)",
            "zeros(2, n + 1, (4)); print(1)",
            "",
            std::iter::empty(),
        );
        assert_eq!(
            quoted,
            "; a shape is one argument, an array: zeros([2, n + 1, (4)])"
        );
        assert!(hint("randn (string)").contains("it is called as randn(shape[, dtype])"));
        assert_eq!(
            shape_as_array("randn", &[10, 10]),
            "a shape is one argument, an array: randn([10, 10])"
        );
    }
}
