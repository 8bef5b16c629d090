//! Finding golden scripts: every `X.rhai` under the given files and folders.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The extension of a golden script.
pub const SCRIPT_EXTENSION: &str = "rhai";
/// The extension of its expected output, beside it.
pub const EXPECTED_EXTENSION: &str = "out";

/// A path given to `gpumem test` that cannot be searched.
#[derive(Debug, Error)]
pub enum DiscoverError {
    /// The path does not exist or cannot be read.
    #[error("cannot read {path}: {message}")]
    Unreadable {
        /// The path as given.
        path: PathBuf,
        /// The operating system's reason.
        message: String,
    },
    /// A file was named that is not a `.rhai` script.
    #[error("{0} is not a .rhai script")]
    NotAScript(PathBuf),
    /// Nothing to run under the given paths.
    #[error("no .rhai scripts found under {0}")]
    Empty(String),
}

/// The expected-output file of a script: `X.rhai` → `X.out`.
pub fn expected_path(script: &Path) -> PathBuf {
    script.with_extension(EXPECTED_EXTENSION)
}

/// Every script under `paths` (files are taken as they are, folders searched recursively),
/// sorted by path, so runs report in a stable order. A file reached twice (named directly and
/// inside a folder, or through two spellings) is kept once, under the first path that reached it.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, DiscoverError> {
    let mut scripts = Scripts::default();
    for path in paths {
        let metadata = std::fs::metadata(path).map_err(|error| DiscoverError::Unreadable {
            path: path.clone(),
            message: error.to_string(),
        })?;
        if metadata.is_dir() {
            walk(path, &mut scripts)?;
        } else if is_script(path) {
            scripts.insert(path.clone());
        } else {
            return Err(DiscoverError::NotAScript(path.clone()));
        }
    }
    if scripts.sorted.is_empty() {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(DiscoverError::Empty(names.join(", ")));
    }
    Ok(scripts.sorted.into_iter().collect())
}

/// Scripts found so far: the paths to report, the files they name, and the folders searched
/// (by canonical path, so a symbolic link back up the tree is not followed round again).
#[derive(Default)]
struct Scripts {
    sorted: BTreeSet<PathBuf>,
    files: HashSet<PathBuf>,
    folders: HashSet<PathBuf>,
}

impl Scripts {
    fn insert(&mut self, path: PathBuf) {
        let file = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if self.files.insert(file) {
            self.sorted.insert(path);
        }
    }
}

fn is_script(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == SCRIPT_EXTENSION)
}

fn walk(folder: &Path, scripts: &mut Scripts) -> Result<(), DiscoverError> {
    let canonical = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    if !scripts.folders.insert(canonical) {
        return Ok(());
    }
    let unreadable = |error: std::io::Error| DiscoverError::Unreadable {
        path: folder.to_path_buf(),
        message: error.to_string(),
    };
    for entry in std::fs::read_dir(folder).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        // Follows symbolic links, as `metadata` does for the paths given; `walk` skips a folder
        // already searched, so links that loop end.
        if path.is_dir() {
            walk(&path, scripts)?;
        } else if is_script(&path) {
            scripts.insert(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpumem-discover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("b/deeper")).expect("mkdir");
        for file in ["z.rhai", "a.rhai", "a.out", "notes.txt", "b/deeper/c.rhai"] {
            std::fs::write(dir.join(file), "").expect("write");
        }
        dir
    }

    #[test]
    fn finds_scripts_recursively_sorted_and_deduplicated() {
        let dir = scratch("walk");
        let found = discover(&[dir.clone(), dir.join("a.rhai")]).expect("found");
        let names: Vec<_> = found
            .iter()
            .map(|p| p.strip_prefix(&dir).expect("inside").to_path_buf())
            .collect();
        assert_eq!(
            names,
            vec![
                PathBuf::from("a.rhai"),
                PathBuf::from("b/deeper/c.rhai"),
                PathBuf::from("z.rhai")
            ]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bad_paths_are_errors() {
        let dir = scratch("bad");
        assert!(matches!(
            discover(&[dir.join("missing")]),
            Err(DiscoverError::Unreadable { .. })
        ));
        assert!(matches!(
            discover(&[dir.join("notes.txt")]),
            Err(DiscoverError::NotAScript(_))
        ));
        std::fs::create_dir_all(dir.join("empty")).expect("mkdir");
        assert!(matches!(
            discover(&[dir.join("empty")]),
            Err(DiscoverError::Empty(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[cfg(unix)]
    #[test]
    fn symlinked_folders_that_loop_are_searched_once() {
        let dir = scratch("loop");
        std::os::unix::fs::symlink(".", dir.join("self")).expect("symlink");
        std::os::unix::fs::symlink("..", dir.join("b/up")).expect("symlink");
        // Two links that loop: followed blindly they make 2^40 paths before the OS says no.
        let found = discover(std::slice::from_ref(&dir)).expect("found");
        assert_eq!(found.len(), 3, "{found:?}");
        let mut scripts = Scripts::default();
        walk(&dir, &mut scripts).expect("walks");
        assert_eq!(scripts.folders.len(), 3, "the folder, b and b/deeper");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn expected_output_sits_beside_the_script() {
        assert_eq!(
            expected_path(Path::new("t/x.rhai")),
            PathBuf::from("t/x.out")
        );
    }
}
