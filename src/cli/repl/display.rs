//! How the REPL shows a value: tensors through their `Display`, strings raw at the top level
//! (so `memory_summary()` prints as a table) and quoted inside containers, byte counts in maps
//! with their readable size beside them (`peak_reserved: 2097152 (2.00 MiB)`), and a map too
//! long for one line with one entry per line.

use rhai::{Array, Dynamic, Map};

use gpumem::alloc::format::format_size;
use gpumem::script::docs::is_byte_field;
use gpumem::tensor::Tensor;

/// A top-level map whose one-line form is longer than this prints one entry per line.
const ONE_LINE_CHARS: usize = 100;

/// The text the REPL prints for an expression's value.
pub fn show(value: &Dynamic) -> String {
    if value.is_string() {
        return value.to_string();
    }
    let one_line = nested(value);
    if one_line.chars().count() <= ONE_LINE_CHARS {
        return one_line;
    }
    match value.read_lock::<Map>() {
        Some(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(key, item)| format!("  {}", entry(key, item)))
                .collect();
            format!("#{{\n{}\n}}", entries.join(",\n"))
        }
        None => one_line,
    }
}

/// `key: value`, with a byte count's readable size after it.
fn entry(key: &str, item: &Dynamic) -> String {
    match item.as_int() {
        Ok(bytes) if is_byte_field(key) && bytes > 1024 => {
            format!("{key}: {bytes} ({})", format_size(bytes.unsigned_abs()))
        }
        _ => format!("{key}: {}", nested(item)),
    }
}

fn nested(value: &Dynamic) -> String {
    if let Some(tensor) = value.read_lock::<Tensor>() {
        return tensor.to_string();
    }
    if value.is_string() {
        return format!("{:?}", value.to_string());
    }
    if let Some(array) = value.read_lock::<Array>() {
        let items: Vec<String> = array.iter().map(nested).collect();
        return format!("[{}]", items.join(", "));
    }
    if let Some(map) = value.read_lock::<Map>() {
        let items: Vec<String> = map.iter().map(|(key, item)| entry(key, item)).collect();
        return format!("#{{{}}}", items.join(", "));
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_raw_at_top_level_and_quoted_inside() {
        assert_eq!(show(&Dynamic::from("a\nb")), "a\nb");
        let array: Array = vec![Dynamic::from("x"), Dynamic::from(3_i64)];
        assert_eq!(show(&Dynamic::from(array)), "[\"x\", 3]");
        let mut map = Map::new();
        map.insert("k".into(), Dynamic::from(1.5_f64));
        assert_eq!(show(&Dynamic::from(map)), "#{k: 1.5}");
    }

    #[test]
    fn byte_counts_read_as_sizes_and_long_maps_take_a_line_per_entry() {
        let mut pool = Map::new();
        pool.insert("cached_free".into(), Dynamic::from(20_971_520_i64));
        pool.insert("free_blocks".into(), Dynamic::from(5_i64));
        pool.insert("releasable".into(), Dynamic::from(512_i64));
        assert_eq!(
            show(&Dynamic::from(pool.clone())),
            "#{cached_free: 20971520 (20.00 MiB), free_blocks: 5, releasable: 512}"
        );
        let mut all = Map::new();
        for name in ["all", "large", "small"] {
            all.insert(name.into(), Dynamic::from(pool.clone()));
        }
        let shown = show(&Dynamic::from(all));
        assert!(
            shown.starts_with("#{\n  all: #{cached_free: 20971520 (20.00 MiB), "),
            "{shown}"
        );
        assert_eq!(shown.lines().count(), 5, "{shown}");
        assert!(shown.ends_with("releasable: 512}\n}"), "{shown}");
    }
}
