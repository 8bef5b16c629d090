//! How the REPL shows a value: tensors through their `Display`, strings raw at the top level
//! (so `memory_summary()` prints as a table) and quoted inside containers.

use rhai::{Array, Dynamic, Map};

use gpumem::tensor::Tensor;

/// The text the REPL prints for an expression's value.
pub fn show(value: &Dynamic) -> String {
    if value.is_string() {
        return value.to_string();
    }
    nested(value)
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
        let items: Vec<String> = map
            .iter()
            .map(|(key, item)| format!("{key}: {}", nested(item)))
            .collect();
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
}
