//! The script sandbox end to end (issue 21): a script run by `gpumem run`, `gpumem test` or the
//! REPL reads and writes files only beneath its own directory and the current directory,
//! unless `--allow-path DIR` widens it; what the user types on the command line stays theirs.

mod common;

use std::path::{Path, PathBuf};

use common::{gpumem_in, outcome, scratch, write};

/// A layout: `root/cwd` (the current directory), `root/scripts` (the script's own),
/// `root/outside` (neither).
struct Layout {
    root: PathBuf,
}

impl Layout {
    fn new(name: &str) -> Layout {
        let root = std::fs::canonicalize(scratch(name)).expect("scratch");
        for dir in ["cwd", "scripts", "outside"] {
            std::fs::create_dir_all(root.join(dir)).expect("dir");
        }
        Layout { root }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Runs `script` (written to scripts/s.rhai) from cwd/, with `extra` flags.
    fn run(&self, script: &str, extra: &[&str]) -> (String, String, i32) {
        let file = write(&self.dir("scripts"), "s.rhai", script);
        let file = file.display().to_string();
        let mut args = vec!["--device", "sim"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["run", &file]);
        outcome(&gpumem_in(Some(&self.dir("cwd")), &args, ""))
    }
}

fn dump(path: &Path) -> String {
    format!(
        "record_memory_history(true); let x = empty(1024, \"uint8\"); dump_snapshot(\"{}\");",
        path.display()
    )
}

#[test]
fn scripts_write_beneath_their_own_and_the_current_directory() {
    let layout = Layout::new("sandbox-inside");
    let (_, err, code) = layout.run(&dump(Path::new("here.pickle")), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(layout.dir("cwd/here.pickle").exists());
    let own = layout.dir("scripts/own.pickle");
    let (_, err, code) = layout.run(&dump(&own), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(own.exists());
}

#[test]
fn absolute_paths_and_dot_dot_outside_are_refused_with_the_rule_and_the_flag() {
    let layout = Layout::new("sandbox-outside");
    let target = layout.dir("outside/x.pickle");
    for path in [
        target.clone(),
        PathBuf::from("../outside/x.pickle"),
        PathBuf::from("sub/../../outside/x.pickle"),
    ] {
        let (_, err, code) = layout.run(&dump(&path), &[]);
        assert_eq!(code, 1, "{path:?}: {err}");
        assert!(
            err.contains("outside the directories a script may use"),
            "{err}"
        );
        assert!(err.contains("--allow-path"), "{err}");
        assert!(!target.exists(), "nothing written for {path:?}");
    }
}

#[test]
fn replay_cannot_probe_files_outside() {
    let layout = Layout::new("sandbox-probe");
    let secret = layout.dir("outside/secret.txt");
    std::fs::write(&secret, "very secret").expect("write");
    let script = format!("replay(\"{}\");", secret.display());
    let (_, err, code) = layout.run(&script, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("outside the directories"), "{err}");
    // Nothing of the file's content shows (the reader would say "unknown opcode 0x76").
    assert!(!err.contains("opcode"), "{err}");
}

#[test]
fn symbolic_links_leading_out_are_refused() {
    let layout = Layout::new("sandbox-links");
    std::os::unix::fs::symlink(layout.dir("outside"), layout.dir("cwd/door")).expect("link");
    std::fs::write(layout.dir("outside/secret.txt"), "s").expect("write");
    std::os::unix::fs::symlink(
        layout.dir("outside/secret.txt"),
        layout.dir("cwd/alias.pickle"),
    )
    .expect("link");
    let (_, err, code) = layout.run(&dump(Path::new("door/x.pickle")), &[]);
    assert_eq!(code, 1);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!layout.dir("outside/x.pickle").exists());
    let (_, err, code) = layout.run("replay(\"alias.pickle\");", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("symbolic link"), "{err}");
}

#[test]
fn allow_path_widens_the_sandbox() {
    let layout = Layout::new("sandbox-allow");
    let target = layout.dir("outside/x.pickle");
    let allowed = layout.dir("outside").display().to_string();
    let (_, err, code) = layout.run(&dump(&target), &["--allow-path", &allowed]);
    assert_eq!(code, 0, "{err}");
    assert!(target.exists());
}

#[test]
fn the_repl_and_golden_runner_keep_the_same_rule() {
    let layout = Layout::new("sandbox-repl");
    let target = layout.dir("outside/x.pickle");
    let out = gpumem_in(
        Some(&layout.dir("cwd")),
        &["--device", "sim"],
        &format!("{}\n", dump(&target)),
    );
    let (_, err, code) = outcome(&out);
    assert_ne!(code, 0);
    assert!(err.contains("outside the directories"), "{err}");
    let script = write(&layout.dir("scripts"), "g.rhai", &dump(&target));
    write(&layout.dir("scripts"), "g.out", "");
    let out = gpumem_in(
        Some(&layout.dir("cwd")),
        &["--device", "sim", "test", &script.display().to_string()],
        "",
    );
    let (stdout, stderr, code) = outcome(&out);
    assert_ne!(code, 0);
    assert!(
        format!("{stdout}{stderr}").contains("outside the directories"),
        "{stdout}{stderr}"
    );
    assert!(!target.exists());
}
