//! The task workspace and the evaluation copy.
//!
//! Before the agent starts, the prepared workspace is copied to a pristine snapshot. After the
//! agent, its changes are the difference between the snapshot and the workspace. The evaluator
//! then runs in a *fresh* copy of the snapshot with those changes applied — minus changes to
//! protected paths — and the hidden files written on top, so nothing the agent left behind
//! (a rewritten test, a planted `conftest.py`, a fake hidden test) reaches the grader unless the
//! job allows it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("file path {0:?} must be relative and stay inside the workspace")]
    UnsafePath(String),
    #[error("protected path pattern {0:?}: {1}")]
    Pattern(String, String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError + '_ {
    move |source| WorkspaceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `root/relative`, refusing absolute paths and `..` (task files come from user YAML).
pub fn safe_join(root: &Path, relative: &str) -> Result<PathBuf, WorkspaceError> {
    let rel = Path::new(relative);
    let ok = !relative.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(root.join(rel))
    } else {
        Err(WorkspaceError::UnsafePath(relative.to_string()))
    }
}

/// Write `path → content` files under `root`, creating directories.
pub fn write_files(root: &Path, files: &BTreeMap<String, String>) -> Result<(), WorkspaceError> {
    for (relative, content) in files {
        let path = safe_join(root, relative)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // Replace, never write through: the agent may have left a symlink at this path.
        if std::fs::symlink_metadata(&path).is_ok() {
            remove(&path)?;
        }
        std::fs::write(&path, content).map_err(io(&path))?;
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), WorkspaceError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    if meta.is_dir() {
        std::fs::remove_dir_all(path).map_err(io(path))
    } else {
        std::fs::remove_file(path).map_err(io(path))
    }
}

/// Copy a tree (files with their permissions, symlinks as symlinks, directories).
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        copy_entry(&src, &dst)?;
    }
    Ok(())
}

fn copy_entry(src: &Path, dst: &Path) -> Result<(), WorkspaceError> {
    let meta = std::fs::symlink_metadata(src).map_err(io(src))?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src).map_err(io(src))?;
        std::os::unix::fs::symlink(target, dst).map_err(io(dst))
    } else if meta.is_dir() {
        copy_tree(src, dst)
    } else if meta.is_file() {
        std::fs::copy(src, dst).map(|_| ()).map_err(io(dst))
    } else {
        // A FIFO (or socket, device) is not task content, and reading a FIFO nobody writes
        // blocks forever: an agent could hang its own grading with one `mkfifo`.
        Ok(())
    }
}

/// Every regular file and symlink under `root`, as `/`-separated relative paths (FIFOs,
/// sockets and devices are not content: never listed, compared or copied).
pub fn list(root: &Path) -> Result<BTreeSet<String>, WorkspaceError> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<(), WorkspaceError> {
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
            if meta.is_dir() {
                walk(root, &path, out)?;
            } else if !(meta.is_file() || meta.file_type().is_symlink()) {
                continue;
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

/// What the agent changed, by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
}

impl Changes {
    pub fn len(&self) -> usize {
        self.added.len() + self.modified.len() + self.deleted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sans-IO: classify paths given both listings and whether a path in both differs.
pub fn classify(
    before: &BTreeSet<String>,
    after: &BTreeSet<String>,
    differs: impl Fn(&str) -> bool,
) -> Changes {
    Changes {
        added: after.difference(before).cloned().collect(),
        modified: after
            .intersection(before)
            .filter(|p| differs(p))
            .cloned()
            .collect(),
        deleted: before.difference(after).cloned().collect(),
    }
}

/// The agent's changes: `pristine` (before) versus `workspace` (after). Content, file type,
/// symlink target and the executable bit count.
pub fn diff(pristine: &Path, workspace: &Path) -> Result<Changes, WorkspaceError> {
    let (before, after) = (list(pristine)?, list(workspace)?);
    Ok(classify(&before, &after, |p| {
        !same_entry(&pristine.join(p), &workspace.join(p))
    }))
}

fn same_entry(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let (Ok(ma), Ok(mb)) = (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) else {
        return false;
    };
    if ma.file_type().is_symlink() || mb.file_type().is_symlink() {
        return ma.file_type().is_symlink()
            && mb.file_type().is_symlink()
            && std::fs::read_link(a).ok() == std::fs::read_link(b).ok();
    }
    ma.len() == mb.len()
        && (ma.permissions().mode() & 0o111) == (mb.permissions().mode() & 0o111)
        && std::fs::read(a).ok() == std::fs::read(b).ok()
}

/// Paths the agent may not change for the grader: the job's protected globs and every hidden
/// file.
pub struct Protected {
    globs: GlobSet,
    exact: BTreeSet<String>,
}

impl Protected {
    pub fn new<'a>(
        patterns: &[String],
        hidden: impl IntoIterator<Item = &'a String>,
    ) -> Result<Self, WorkspaceError> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            let glob = globset::GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .or_else(|_| Glob::new(p))
                .map_err(|e| WorkspaceError::Pattern(p.clone(), e.to_string()))?;
            builder.add(glob);
        }
        Ok(Self {
            globs: builder
                .build()
                .map_err(|e| WorkspaceError::Pattern(patterns.join(", "), e.to_string()))?,
            exact: hidden
                .into_iter()
                .map(|p| p.trim_start_matches("./").to_string())
                .collect(),
        })
    }

    pub fn covers(&self, path: &str) -> bool {
        self.exact.contains(path) || self.globs.is_match(path)
    }
}

/// What reached the evaluation copy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub applied: Changes,
    /// Changes to protected paths, not applied.
    pub discarded: Vec<String>,
}

/// Build the evaluation copy: `pristine` copied to `eval`, the agent's `changes` (read from
/// `workspace`) applied except on protected paths, then the hidden files written on top.
pub fn evaluation_copy(
    pristine: &Path,
    workspace: &Path,
    eval: &Path,
    changes: &Changes,
    protected: &Protected,
    hidden: &BTreeMap<String, String>,
) -> Result<Applied, WorkspaceError> {
    copy_tree(pristine, eval)?;
    let mut result = Applied::default();
    let mut keep = |path: &String, into: &mut Vec<String>| {
        if protected.covers(path) {
            result.discarded.push(path.clone());
            false
        } else {
            into.push(path.clone());
            true
        }
    };
    for path in changes.added.iter().chain(&changes.modified) {
        let bucket = if changes.added.contains(path) {
            &mut result.applied.added
        } else {
            &mut result.applied.modified
        };
        if keep(path, bucket) {
            let dst = safe_join(eval, path)?;
            if std::fs::symlink_metadata(&dst).is_ok() {
                remove(&dst)?;
            }
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            copy_entry(&safe_join(workspace, path)?, &dst)?;
        }
    }
    for path in &changes.deleted {
        if keep(path, &mut result.applied.deleted) {
            let dst = safe_join(eval, path)?;
            if std::fs::symlink_metadata(&dst).is_ok() {
                remove(&dst)?;
            }
        }
    }
    write_files(eval, hidden)?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_fifo_the_agent_left_is_neither_diffed_nor_copied() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let (pristine, ws, eval) = (
            dir.path().join("p"),
            dir.path().join("w"),
            dir.path().join("e"),
        );
        std::fs::create_dir_all(&pristine)?;
        std::fs::write(pristine.join("calc.py"), "x")?;
        copy_tree(&pristine, &ws)?;
        // Nobody will ever write to it: reading it would block the runner forever.
        let made = std::process::Command::new("mkfifo")
            .arg(ws.join("calc.py.fifo"))
            .status()?;
        assert!(made.success());
        std::fs::write(ws.join("new.py"), "y")?;
        let changes = diff(&pristine, &ws)?;
        assert_eq!(changes.added, ["new.py"]);
        let protected = Protected::new(&[], std::iter::empty())?;
        evaluation_copy(
            &pristine,
            &ws,
            &eval,
            &changes,
            &protected,
            &BTreeMap::new(),
        )?;
        assert!(eval.join("new.py").exists());
        assert!(!eval.join("calc.py.fifo").exists());
        Ok(())
    }

    #[test]
    fn unsafe_paths_are_refused() {
        let root = Path::new("/w");
        for bad in ["/etc/passwd", "../x", "a/../../x", ""] {
            assert!(safe_join(root, bad).is_err(), "{bad}");
        }
        assert_eq!(
            safe_join(root, "a/./b.py").ok(),
            Some(PathBuf::from("/w/a/./b.py"))
        );
    }

    #[test]
    fn classify_is_a_set_difference() {
        let before: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let after: BTreeSet<String> = ["b", "c", "d"].map(String::from).into();
        let changes = classify(&before, &after, |p| p == "c");
        assert_eq!(changes.added, ["d"]);
        assert_eq!(changes.modified, ["c"]);
        assert_eq!(changes.deleted, ["a"]);
    }

    #[test]
    fn protected_globs_and_hidden_files() -> Result<(), WorkspaceError> {
        let hidden = ["tests/test_hidden.py".to_string()];
        let p = Protected::new(&["tests/**".into(), "**/conftest.py".into()], &hidden)?;
        assert!(p.covers("tests/test_visible.py"));
        assert!(p.covers("tests/deep/x.py"));
        assert!(p.covers("conftest.py"));
        assert!(p.covers("pkg/conftest.py"));
        assert!(!p.covers("calc.py"));
        assert!(!p.covers("testsuite.py"));
        let only_hidden = Protected::new(&[], &hidden)?;
        assert!(only_hidden.covers("tests/test_hidden.py"));
        assert!(!only_hidden.covers("tests/test_visible.py"));
        Ok(())
    }

    #[test]
    fn the_evaluation_copy_applies_the_agent_diff_but_not_tampering() -> Result<(), WorkspaceError>
    {
        let tmp = tempfile::tempdir().map_err(io(Path::new("tmp")))?;
        let (pristine, work, eval) = (
            tmp.path().join("pristine"),
            tmp.path().join("work"),
            tmp.path().join("eval"),
        );
        write_files(
            &pristine,
            &files(&[
                ("calc.py", "def add(a, b): return a - b\n"),
                ("tests/test_visible.py", "assert add(1, 2) == 3\n"),
                ("notes.txt", "keep\n"),
                ("old.txt", "remove me\n"),
            ]),
        )?;
        copy_tree(&pristine, &work)?;
        // The agent fixes the code, deletes a file, adds one, guts the visible test, plants a
        // conftest and a fake hidden test.
        write_files(
            &work,
            &files(&[
                ("calc.py", "def add(a, b): return a + b\n"),
                ("new.py", "x = 1\n"),
                ("tests/test_visible.py", "pass\n"),
                ("conftest.py", "import sys; sys.exit(0)\n"),
                ("tests/test_hidden.py", "pass\n"),
            ]),
        )?;
        std::fs::remove_file(work.join("old.txt")).map_err(io(&work))?;
        let changes = diff(&pristine, &work)?;
        assert_eq!(
            changes.added,
            ["conftest.py", "new.py", "tests/test_hidden.py"]
        );
        assert_eq!(changes.modified, ["calc.py", "tests/test_visible.py"]);
        assert_eq!(changes.deleted, ["old.txt"]);

        let hidden = files(&[("tests/test_hidden.py", "assert add(2, 2) == 4\n")]);
        let protected =
            Protected::new(&["tests/**".into(), "**/conftest.py".into()], hidden.keys())?;
        let applied = evaluation_copy(&pristine, &work, &eval, &changes, &protected, &hidden)?;
        assert_eq!(applied.applied.added, ["new.py"]);
        assert_eq!(applied.applied.modified, ["calc.py"]);
        assert_eq!(applied.applied.deleted, ["old.txt"]);
        assert_eq!(
            applied.discarded,
            [
                "conftest.py",
                "tests/test_hidden.py",
                "tests/test_visible.py"
            ]
        );
        let read = |p: &str| std::fs::read_to_string(eval.join(p)).unwrap_or_default();
        assert_eq!(read("calc.py"), "def add(a, b): return a + b\n");
        assert_eq!(read("tests/test_visible.py"), "assert add(1, 2) == 3\n");
        assert_eq!(read("tests/test_hidden.py"), "assert add(2, 2) == 4\n");
        assert!(!eval.join("conftest.py").exists());
        assert!(!eval.join("old.txt").exists());
        assert_eq!(read("notes.txt"), "keep\n");
        // The agent's own workspace is untouched by evaluation.
        assert_eq!(
            std::fs::read_to_string(work.join("tests/test_hidden.py")).unwrap_or_default(),
            "pass\n"
        );
        Ok(())
    }

    #[test]
    fn a_symlink_planted_at_a_hidden_path_is_replaced_not_written_through(
    ) -> Result<(), WorkspaceError> {
        let tmp = tempfile::tempdir().map_err(io(Path::new("tmp")))?;
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, "untouched").map_err(io(&outside))?;
        let root = tmp.path().join("eval");
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        std::os::unix::fs::symlink(&outside, root.join("t.py")).map_err(io(&root))?;
        write_files(&root, &files(&[("t.py", "real")]))?;
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap_or_default(),
            "untouched"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("t.py")).unwrap_or_default(),
            "real"
        );
        Ok(())
    }
}
