//! Where a script may read and write files. gpumem is a sandbox, and people run experiment
//! scripts that others wrote: a script reads and writes only beneath its own directory and the
//! current directory (plus any directory the user grants with `--allow-path DIR`). That rules
//! out absolute paths elsewhere, `..` that climbs out, and symbolic links that lead out.
//!
//! What the user types on the command line (`--report`, `--timeline`, `:load`) is the user's
//! own and never passes through here; only paths a script computes do (`dump_snapshot`,
//! `replay`).
//!
//! The check is made on the path as written (so nothing outside is touched to judge it) and
//! again on the path with every symbolic link resolved (so a link inside cannot lead out).

use std::cell::RefCell;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use thiserror::Error;

/// Why a script may not use a path. Every message names the rule and the flag that widens it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SandboxError {
    /// The path, as written, lies outside every allowed directory.
    #[error("'{path}' is outside the directories a script may use ({allowed}); scripts read and write only beneath their own directory and the current directory: give --allow-path DIR to allow another")]
    Outside {
        /// The path as the script gave it.
        path: String,
        /// The allowed directories, as a list for the message.
        allowed: String,
    },
    /// The path lies inside, but a symbolic link on it leads outside.
    #[error("'{path}' leads outside the directories a script may use through a symbolic link (to '{target}'); give --allow-path DIR to allow its target")]
    LinkOut {
        /// The path as the script gave it.
        path: String,
        /// Where it really leads.
        target: String,
    },
    /// The path is empty or cannot be judged (no current directory).
    #[error("'{path}': {reason}")]
    Unusable {
        /// The path as the script gave it.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The policy a host's bindings consult, shared so the host can change it after the engine is
/// built ([`super::Host::set_path_policy`]).
pub type SharedPolicy = Rc<RefCell<PathPolicy>>;

/// The directories a script may read and write beneath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPolicy {
    /// Where relative paths start (the process's current directory when the policy was made).
    base: PathBuf,
    /// Allowed roots, absolute and lexically normal; resolved through links where they exist.
    roots: Vec<Root>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Root {
    /// The root as given, made absolute and normal.
    written: PathBuf,
    /// The root with its links resolved (equal to `written` when it does not exist).
    resolved: PathBuf,
}

impl PathPolicy {
    /// The policy for a script at `script` (its directory is allowed; `None` for the REPL or a
    /// script from standard input), the current directory, and the `extra` directories the
    /// user allowed with `--allow-path`.
    pub fn for_script(
        script: Option<&Path>,
        extra: &[PathBuf],
    ) -> Result<PathPolicy, SandboxError> {
        let base = std::env::current_dir().map_err(|error| SandboxError::Unusable {
            path: ".".into(),
            reason: format!("cannot read the current directory: {error}"),
        })?;
        let mut dirs = vec![base.clone()];
        if let Some(script) = script {
            let dir = script.parent().unwrap_or(Path::new(""));
            dirs.push(dir.to_path_buf());
        }
        dirs.extend(extra.iter().cloned());
        Ok(PathPolicy::with_roots(base, &dirs))
    }

    /// A policy allowing `dirs` (relative ones taken from `base`), with relative script paths
    /// starting at `base`.
    pub fn with_roots(base: PathBuf, dirs: &[PathBuf]) -> PathPolicy {
        let mut roots: Vec<Root> = Vec::new();
        for dir in dirs {
            let written = normalize(&base.join(dir));
            let resolved = std::fs::canonicalize(&written).unwrap_or_else(|_| written.clone());
            let root = Root { written, resolved };
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        PathPolicy { base, roots }
    }

    /// The policy of a host nobody configured: the current directory only (nothing at all if
    /// the current directory cannot be read).
    pub fn current_directory() -> PathPolicy {
        PathPolicy::for_script(None, &[]).unwrap_or_else(|_| PathPolicy {
            base: PathBuf::from("/"),
            roots: Vec::new(),
        })
    }

    /// The path a script may read `path` at, or why not.
    pub fn readable(&self, path: &str) -> Result<PathBuf, SandboxError> {
        let written = self.inside(path)?;
        // An existing file (or a link to one) must really lie inside; one that does not exist
        // is left to the reader, whose "not found" tells nothing about the outside.
        match std::fs::canonicalize(&written) {
            Ok(resolved) => self.resolved_inside(path, &resolved)?,
            Err(_) => self.parent_inside(path, &written)?,
        }
        Ok(written)
    }

    /// The path a script may write `path` at, or why not: the file's directory (with its links
    /// resolved) must lie inside, and so must the file itself if it already exists (it may be
    /// a link).
    pub fn writable(&self, path: &str) -> Result<PathBuf, SandboxError> {
        let written = self.inside(path)?;
        self.parent_inside(path, &written)?;
        if let Ok(resolved) = std::fs::canonicalize(&written) {
            self.resolved_inside(path, &resolved)?;
        }
        Ok(written)
    }

    /// The allowed directories, for messages.
    pub fn allowed(&self) -> String {
        self.roots
            .iter()
            .map(|root| root.written.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `path` made absolute and normal, if it lies beneath a root as written.
    fn inside(&self, path: &str) -> Result<PathBuf, SandboxError> {
        if path.is_empty() || path.contains('\0') {
            return Err(SandboxError::Unusable {
                path: path.into(),
                reason: "not a usable path".into(),
            });
        }
        let written = normalize(&self.base.join(path));
        if self
            .roots
            .iter()
            .any(|root| written.starts_with(&root.written))
        {
            Ok(written)
        } else {
            Err(SandboxError::Outside {
                path: path.into(),
                allowed: self.allowed(),
            })
        }
    }

    fn resolved_inside(&self, path: &str, resolved: &Path) -> Result<(), SandboxError> {
        if self
            .roots
            .iter()
            .any(|root| resolved.starts_with(&root.resolved))
        {
            Ok(())
        } else {
            Err(SandboxError::LinkOut {
                path: path.into(),
                target: resolved.display().to_string(),
            })
        }
    }

    /// The nearest existing ancestor of `written`, links resolved, must lie inside.
    fn parent_inside(&self, path: &str, written: &Path) -> Result<(), SandboxError> {
        let mut ancestor = written.parent();
        while let Some(dir) = ancestor {
            if let Ok(resolved) = std::fs::canonicalize(dir) {
                return self.resolved_inside(path, &resolved);
            }
            ancestor = dir.parent();
        }
        Ok(())
    }
}

/// `path` with `.` dropped and `..` applied, lexically (no file system access; `..` at the
/// root stays at the root).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("gpumem-sandbox-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("work/sub")).expect("scratch");
            std::fs::create_dir_all(dir.join("outside")).expect("scratch");
            Scratch(std::fs::canonicalize(&dir).expect("canonical"))
        }

        fn policy(&self) -> PathPolicy {
            PathPolicy::with_roots(self.0.join("work"), &[PathBuf::from(".")])
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn relative_paths_inside_are_allowed() {
        let scratch = Scratch::new("inside");
        let policy = scratch.policy();
        assert_eq!(
            policy.writable("out.pickle"),
            Ok(scratch.0.join("work/out.pickle"))
        );
        assert!(policy.writable("sub/../sub/out.pickle").is_ok());
        assert!(policy.readable("sub/missing.pickle").is_ok());
    }

    #[test]
    fn absolute_paths_and_climbing_out_are_refused() {
        let scratch = Scratch::new("outside");
        let policy = scratch.policy();
        let outside = scratch.0.join("outside/x.pickle");
        let error = policy
            .writable(&outside.display().to_string())
            .expect_err("absolute path outside");
        assert!(matches!(error, SandboxError::Outside { .. }));
        assert!(error.to_string().contains("--allow-path"));
        assert!(matches!(
            policy.readable("../outside/x.pickle"),
            Err(SandboxError::Outside { .. })
        ));
        assert!(matches!(
            policy.readable("sub/../../outside/x.pickle"),
            Err(SandboxError::Outside { .. })
        ));
        assert!(matches!(
            policy.readable("/etc/passwd"),
            Err(SandboxError::Outside { .. })
        ));
        assert!(policy.readable("").is_err());
    }

    #[test]
    fn symbolic_links_out_are_refused() {
        let scratch = Scratch::new("links");
        let secret = scratch.0.join("outside/secret");
        std::fs::write(&secret, b"v").expect("write");
        std::os::unix::fs::symlink(&secret, scratch.0.join("work/link")).expect("link");
        std::os::unix::fs::symlink(scratch.0.join("outside"), scratch.0.join("work/dir"))
            .expect("link");
        let policy = scratch.policy();
        assert!(matches!(
            policy.readable("link"),
            Err(SandboxError::LinkOut { .. })
        ));
        assert!(matches!(
            policy.writable("link"),
            Err(SandboxError::LinkOut { .. })
        ));
        assert!(matches!(
            policy.writable("dir/new.pickle"),
            Err(SandboxError::LinkOut { .. })
        ));
        assert!(matches!(
            policy.readable("dir/missing"),
            Err(SandboxError::LinkOut { .. })
        ));
    }

    #[test]
    fn allow_path_widens_the_sandbox() {
        let scratch = Scratch::new("allow");
        let policy = PathPolicy::with_roots(
            scratch.0.join("work"),
            &[PathBuf::from("."), scratch.0.join("outside")],
        );
        let outside = scratch.0.join("outside/x.pickle").display().to_string();
        assert!(policy.writable(&outside).is_ok());
        assert!(policy.readable("../outside/x.pickle").is_ok());
        assert!(policy.allowed().contains("outside"));
    }

    #[test]
    fn normalizing_is_lexical() {
        assert_eq!(normalize(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(normalize(Path::new("/../a")), PathBuf::from("/a"));
    }
}
