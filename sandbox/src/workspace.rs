//! The task workspace and the evaluation copy.
//!
//! Before the agent starts, the prepared workspace is copied to a pristine snapshot. After the
//! agent, its changes are the difference between the snapshot and the workspace. The evaluator
//! then runs in a *fresh* copy of the snapshot with those changes applied — minus changes to
//! protected paths — and the hidden files written on top, so nothing the agent left behind
//! (a rewritten test, a planted `conftest.py`, a fake hidden test) reaches the grader unless the
//! job allows it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use serde::{Serialize, Serializer};

use crate::import_shadowing;
pub use crate::protected::Protected;
use crate::tree::{self, Dir, Kind};

/// The most bytes of the agent's changes copied into an evaluation copy: a workspace that holds
/// more (a 64 GiB sparse file, say) is the policy's failure, not a disk floe fills.
pub const MAX_CHANGED_BYTES: u64 = 2 << 30;

/// Test runners' configuration files, protected unless a job says
/// `evaluator.protectTestConfig: false`: they decide what a test run collects and how it
/// reports (`python_files = chk_*.py` in a `pytest.ini` skips the hidden tests; a `conftest.py`
/// hook rewrites outcomes; a `sitecustomize.py` runs before anything; a `.pth` file runs its
/// `import` lines at start-up; a `*.dist-info` or `*.egg-info` on the import path declares a
/// `pytest11` plugin, which pytest loads before collecting; an `.npmrc` sets the shell `npm
/// test` runs its script with, or `node-options=--require` preloads code into Jest; a
/// `.yarnrc.yml` names the yarn that runs, which with its plugins and Plug'n'Play loader is
/// in the tree; a Babel or SWC configuration transforms every test file, hidden ones
/// included, before Jest runs it). With them, what runs the tests: `node_modules` (`npm test`
/// and `npx jest` put `node_modules/.bin` first on their `PATH` whatever the evaluator's is,
/// so an added `node_modules/.bin/jest` printing a pass, or an edited
/// `node_modules/jest-cli`, was the runner), and `.git` (an evaluator that runs `git checkout`,
/// `git status` or `git diff` in the copy runs the hooks, `core.fsmonitor` and filters its
/// `.git` names: before the hidden tests are read, they could be rewritten; `.hg` and `.sl`
/// likewise, which Jest's `--onlyChanged` asks; under Yarn's Plug'n'Play the runner is loaded from
/// `.yarn/cache` and `.yarn/unplugged`, as laid out in `.pnp.data.json`).
pub const TEST_RUNNER_CONFIG: &[&str] = &[
    // The directories themselves too: a link by that name where the task has none would lead
    // the runner into the agent's files, and a `.git` file names a git directory elsewhere.
    "**/node_modules",
    "**/node_modules/**",
    "**/.git",
    "**/.git/**",
    "**/.hg",
    "**/.hg/**",
    "**/.sl",
    "**/.sl/**",
    "**/.yarn/cache",
    "**/.yarn/cache/**",
    "**/.yarn/unplugged",
    "**/.yarn/unplugged/**",
    "**/.pnp.data.json",
    "**/conftest.py",
    "**/pytest.ini",
    "**/.pytest.ini",
    "**/pytest.toml",
    "**/.pytest.toml",
    "**/pyproject.toml",
    "**/setup.cfg",
    "**/tox.ini",
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/*.pth",
    "**/*.dist-info/**",
    "**/*.egg-info/**",
    "**/jest.config.*",
    "**/vitest.config.*",
    "**/vite.config.*",
    "**/package.json",
    "**/.mocharc*",
    "**/.npmrc",
    "**/.yarnrc",
    "**/.yarnrc.yml",
    "**/babel.config.*",
    "**/.babelrc",
    "**/.babelrc.*",
    "**/vitest.workspace.*",
    "**/.swcrc",
    "**/.pnp.cjs",
    "**/.pnp.loader.mjs",
    "**/.yarn/releases/**",
    "**/.yarn/plugins/**",
];

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("file path {0:?} must be relative and stay inside the workspace")]
    UnsafePath(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Something the agent left cannot be read as task content (floe's own side is fine).
    #[error("the workspace's {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the agent's changes hold more than {limit} bytes")]
    TooLarge { limit: u64 },
    /// The workspace outgrew the task's by more than a listing takes: entries, path bytes,
    /// depth or bytes on disk.
    #[error("the workspace has {0}")]
    TooMuch(String),
}

impl WorkspaceError {
    /// Whether the agent's workspace caused it (the policy's failure), not floe's side.
    pub fn is_the_agents(&self) -> bool {
        matches!(
            self,
            Self::Unreadable { .. } | Self::TooLarge { .. } | Self::TooMuch(_)
        )
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError + '_ {
    move |source| WorkspaceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn agents(path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError + '_ {
    move |source| WorkspaceError::Unreadable {
        path: path.to_path_buf(),
        source,
    }
}

/// `relative` checked: no absolute path, no `..` (task files come from user YAML).
pub fn safe_relative(relative: &str) -> Result<&Path, WorkspaceError> {
    let rel = Path::new(relative);
    let ok = !relative.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && rel.components().any(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(rel)
    } else {
        Err(WorkspaceError::UnsafePath(relative.to_string()))
    }
}

/// `root/relative`, refusing absolute paths and `..`.
pub fn safe_join(root: &Path, relative: &str) -> Result<PathBuf, WorkspaceError> {
    safe_relative(relative).map(|rel| root.join(rel))
}

/// Write `path → content` files under `root`, creating directories. Nothing is written through
/// a link: a link (or file) where a directory or the file goes is removed first.
pub fn write_files(root: &Path, files: &BTreeMap<String, String>) -> Result<(), WorkspaceError> {
    let dir = Dir::create(root).map_err(io(root))?;
    for (relative, content) in files {
        let rel = safe_relative(relative)?;
        let at = root.join(rel);
        let (parent, name) = dir.make_parents(rel).map_err(io(&at))?;
        parent.remove(&name).map_err(io(&at))?;
        parent
            .create_file(&name, 0o644)
            .and_then(|mut f| f.write_all(content.as_bytes()))
            .map_err(io(&at))?;
    }
    Ok(())
}

/// Copy a tree (files with their permissions, symlinks as symlinks, directories); FIFOs,
/// sockets and devices are not task content and are left out.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), WorkspaceError> {
    let src = Dir::open(from).map_err(io(from))?;
    let dst = Dir::create(to).map_err(io(to))?;
    copy_dir(&src, &dst, from)
}

/// Empties `dir` (nothing followed), keeping the directory itself (a mount point); a `dir`
/// that is not there is made.
pub fn clear(dir: &Path) -> Result<(), WorkspaceError> {
    let d = Dir::create(dir).map_err(io(dir))?;
    for name in d.names().map_err(io(dir))? {
        d.remove(&name).map_err(io(&dir.join(&name)))?;
    }
    Ok(())
}

/// [`copy_tree`] into an existing directory, leaving out the top-level entries named `except`.
pub fn copy_tree_except(from: &Path, to: &Path, except: &[&str]) -> Result<(), WorkspaceError> {
    let src = Dir::open(from).map_err(io(from))?;
    let dst = Dir::open(to).map_err(io(to))?;
    for name in src.names().map_err(io(from))? {
        if !except.iter().any(|e| OsStr::new(e) == name) {
            copy_entry(&src, &name, &dst, &from.join(&name))?;
        }
    }
    Ok(())
}

fn copy_dir(src: &Dir, dst: &Dir, at: &Path) -> Result<(), WorkspaceError> {
    for name in src.names().map_err(io(at))? {
        copy_entry(src, &name, dst, &at.join(&name))?;
    }
    Ok(())
}

/// Copies `name` from `src` to `dst` (where nothing of that name is).
fn copy_entry(src: &Dir, name: &OsStr, dst: &Dir, at: &Path) -> Result<(), WorkspaceError> {
    match src.kind(name).map_err(io(at))? {
        Some(Kind::Link(target)) => dst.symlink(&target, name).map_err(io(at)),
        Some(Kind::Dir) => {
            let (from, to) = (
                src.subdir(name).map_err(io(at))?,
                dst.mkdir(name).map_err(io(at))?,
            );
            copy_dir(&from, &to, at)
        }
        Some(Kind::File { mode, .. }) => {
            let mut file = src.open_file(name).map_err(io(at))?;
            tree::copy_file(&mut file, mode, dst, name)
                .map(|_| ())
                .map_err(io(at))
        }
        // A FIFO nobody writes would block a reader forever: one `mkfifo` must not hang grading.
        Some(Kind::Other) | None => Ok(()),
    }
}

/// Copies the agent's `name` as [`allowed`] judged it (`kind`): a link with the target judged,
/// a regular file (opened without following a link) up to the length counted. What a process
/// of the agent's swapped in since is never what is copied.
fn copy_judged(
    src: &Dir,
    name: &OsStr,
    kind: &Kind,
    dst: &Dir,
    at: &Path,
) -> Result<(), WorkspaceError> {
    match kind {
        Kind::Link(target) => dst.symlink(target, name).map_err(io(at)),
        Kind::File { mode, len, .. } => {
            let file = src.open_file(name).map_err(io(at))?;
            tree::copy_file(&mut std::io::Read::take(file, *len), *mode, dst, name)
                .map(|_| ())
                .map_err(io(at))
        }
        Kind::Dir | Kind::Other => Ok(()),
    }
}

/// The bytes a copy of `name` would write (a directory's files, recursively).
fn size_of(dir: &Dir, name: &OsStr, kind: &Kind) -> std::io::Result<u64> {
    match kind {
        Kind::File { len, .. } => Ok(*len),
        Kind::Dir => {
            let sub = dir.subdir(name)?;
            let mut total = 0u64;
            for inner in sub.names()? {
                if let Some(k) = sub.kind(&inner)? {
                    total = total.saturating_add(size_of(&sub, &inner, &k)?);
                }
            }
            Ok(total)
        }
        Kind::Link(_) | Kind::Other => Ok(0),
    }
}

/// What a listing found.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub paths: BTreeSet<PathBuf>,
    /// The bytes of every path listed (what the listing holds in memory).
    pub path_bytes: u64,
    /// The bytes its regular files take on disk.
    pub allocated: u64,
}

/// How far a listing may go: the agent's workspace may outgrow the task's by so much, and no
/// more (a million nested names, or a disk filled through a file that is then discarded, is
/// the policy's failure, not floe's memory or disk).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    pub entries: usize,
    pub path_bytes: u64,
    pub allocated: u64,
    pub depth: usize,
}

impl Caps {
    /// floe's own trees (the task as prepared): only the depth, for the stack.
    pub const TASK: Self = Self {
        entries: usize::MAX,
        path_bytes: u64::MAX,
        allocated: u64::MAX,
        depth: 1024,
    };

    /// The agent's workspace: the task's listing and 200,000 entries, 64 MiB of paths and
    /// 8 GiB on disk more, 256 directories deep.
    pub fn beyond(task: &Listing) -> Self {
        Self {
            entries: task.paths.len() + 200_000,
            path_bytes: task.path_bytes + (64 << 20),
            allocated: task.allocated + (8 << 30),
            depth: 256,
        }
    }
}

/// Every regular file and symlink under `root`, relative to it (names are bytes; FIFOs,
/// sockets and devices are not content: never listed, compared or copied).
pub fn list(root: &Path) -> Result<BTreeSet<PathBuf>, WorkspaceError> {
    list_within(root, Caps::TASK).map(|l| l.paths)
}

/// [`list`] within `caps` ([`WorkspaceError::TooMuch`] beyond them).
pub fn list_within(root: &Path, caps: Caps) -> Result<Listing, WorkspaceError> {
    fn walk(
        dir: &Dir,
        rel: &Path,
        depth: usize,
        root: &Path,
        caps: Caps,
        out: &mut Listing,
    ) -> Result<(), WorkspaceError> {
        if depth > caps.depth {
            return Err(WorkspaceError::TooMuch(format!(
                "directories more than {} deep",
                caps.depth
            )));
        }
        for name in dir.names().map_err(io(&root.join(rel)))? {
            let path = rel.join(&name);
            let kind = dir.kind(&name).map_err(io(&root.join(&path)))?;
            if let Some(Kind::File { allocated, .. }) = kind {
                out.allocated = out.allocated.saturating_add(allocated);
                if out.allocated > caps.allocated {
                    return Err(WorkspaceError::TooMuch(format!(
                        "more than {} bytes on disk",
                        caps.allocated
                    )));
                }
            }
            match kind {
                Some(Kind::Dir) => {
                    let sub = dir.subdir(&name).map_err(io(&root.join(&path)))?;
                    walk(&sub, &path, depth + 1, root, caps, out)?;
                }
                Some(Kind::File { .. } | Kind::Link(_)) => {
                    out.path_bytes += path.as_os_str().len() as u64;
                    out.paths.insert(path);
                    if out.paths.len() > caps.entries || out.path_bytes > caps.path_bytes {
                        return Err(WorkspaceError::TooMuch(format!(
                            "more than {} files, or {} bytes of their names",
                            caps.entries, caps.path_bytes
                        )));
                    }
                }
                Some(Kind::Other) | None => {}
            }
        }
        Ok(())
    }
    let mut out = Listing::default();
    let dir = Dir::open(root).map_err(io(root))?;
    walk(&dir, Path::new(""), 0, root, caps, &mut out)?;
    Ok(out)
}

fn lossy<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(paths.iter().map(|p| p.to_string_lossy()))
}

/// What the agent changed, by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    #[serde(serialize_with = "lossy")]
    pub added: Vec<PathBuf>,
    #[serde(serialize_with = "lossy")]
    pub modified: Vec<PathBuf>,
    #[serde(serialize_with = "lossy")]
    pub deleted: Vec<PathBuf>,
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
    before: &BTreeSet<PathBuf>,
    after: &BTreeSet<PathBuf>,
    differs: impl Fn(&Path) -> bool,
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
/// symlink target and the executable bit count. What cannot be read in the workspace is
/// [`WorkspaceError::Unreadable`]: the agent's doing.
pub fn diff(pristine: &Path, workspace: &Path) -> Result<Changes, WorkspaceError> {
    let task = list_within(pristine, Caps::TASK)?;
    let after = list_within(workspace, Caps::beyond(&task))
        .map_err(to_agents)?
        .paths;
    let before = task.paths;
    let (p, w) = (
        Dir::open(pristine).map_err(io(pristine))?,
        Dir::open(workspace).map_err(agents(workspace))?,
    );
    Ok(classify(&before, &after, |rel| {
        !same_entry(&p, &w, rel).unwrap_or(false)
    }))
}

fn to_agents(e: WorkspaceError) -> WorkspaceError {
    match e {
        WorkspaceError::Io { path, source } => WorkspaceError::Unreadable { path, source },
        other => other,
    }
}

fn same_entry(a: &Dir, b: &Dir, rel: &Path) -> std::io::Result<bool> {
    let (Some((da, name)), Some((db, _))) = (a.find_parent(rel)?, b.find_parent(rel)?) else {
        return Ok(false);
    };
    Ok(match (da.kind(&name)?, db.kind(&name)?) {
        (Some(Kind::Link(x)), Some(Kind::Link(y))) => x == y,
        (
            Some(Kind::File {
                mode: ma, len: la, ..
            }),
            Some(Kind::File {
                mode: mb, len: lb, ..
            }),
        ) => {
            la == lb
                && (ma & 0o111) == (mb & 0o111)
                && tree::same_content(&mut da.open_file(&name)?, &mut db.open_file(&name)?)?
        }
        _ => false,
    })
}

/// What reached the evaluation copy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub applied: Changes,
    /// Changes not applied: to protected paths (or their directories), and files that were
    /// a directory or a FIFO by the time the copy was made.
    #[serde(serialize_with = "lossy")]
    pub discarded: Vec<PathBuf>,
}

/// Whether the agent's change at `path` may reach the evaluation copy: not a protected path,
/// not a link or file where a directory holding protected or hidden paths goes, nothing that
/// would remove a protected path of the task, and no link that leaves the tree.
fn allowed(
    path: &Path,
    kind: Option<&Kind>,
    protected: &Protected,
    pristine: &BTreeSet<PathBuf>,
) -> bool {
    // A protected path turned into a directory would be removed for what the agent put in it.
    if protected.covers(path)
        || protected.guards(path)
        || path.ancestors().skip(1).any(|a| protected.covers(a))
        || protected.shadows_hidden(path)
        || protected.adds_a_runner_module(path, pristine)
        || import_shadowing::is_bytecode(path)
    {
        return false;
    }
    // Replacing a directory of the task removes everything in it.
    let under = pristine
        .range(path.to_path_buf()..)
        .take_while(|p| p.starts_with(path))
        .filter(|p| p.as_path() != path);
    if under.clone().any(|p| protected.covers(p)) {
        return false;
    }
    match kind {
        Some(Kind::Link(target)) => stays_inside(path, Path::new(OsStr::from_bytes(target))),
        _ => true,
    }
}

/// Whether the link at `at` pointing to `target` resolves inside the tree without leaving it:
/// a link out of the workspace would let the grader read what the agent keeps elsewhere.
/// Relative, its `..` only leading and no more than the link is deep: a `..` after a name
/// applies to where that name leads, which may itself be a link (`a -> .`, then
/// `a/a/../../..` leaves the tree), so it is refused.
fn stays_inside(at: &Path, target: &Path) -> bool {
    let depth = at.components().count().saturating_sub(1);
    let mut ups = 0;
    let mut named = false;
    for c in target.components() {
        match c {
            Component::Normal(_) => named = true,
            Component::CurDir => {}
            Component::ParentDir if !named => ups += 1,
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    ups <= depth
}

/// Build the evaluation copy: `pristine` copied to `eval`, the agent's `changes` (read from
/// `workspace`) applied except where [`allowed`] says no, then the hidden files written on top,
/// every directory on their way a real one (a link there is removed, never written through).
pub fn evaluation_copy(
    pristine: &Path,
    workspace: &Path,
    eval: &Path,
    changes: &Changes,
    protected: &Protected,
    hidden: &BTreeMap<String, String>,
) -> Result<Applied, WorkspaceError> {
    copy_tree(pristine, eval)?;
    let before = list(pristine)?;
    let (ws, dst) = (
        Dir::open(workspace).map_err(agents(workspace))?,
        Dir::open(eval).map_err(io(eval))?,
    );
    let mut result = Applied::default();
    let mut copied = 0u64;
    for (path, added) in changes
        .added
        .iter()
        .map(|p| (p, true))
        .chain(changes.modified.iter().map(|p| (p, false)))
    {
        let from = ws.find_parent(path).map_err(agents(path))?;
        let kind = match &from {
            Some((dir, name)) => dir.kind(name).map_err(agents(path))?,
            None => None,
        };
        if !allowed(path, kind.as_ref(), protected, &before) {
            result.discarded.push(path.clone());
            continue;
        }
        let (Some((src, name)), Some(kind)) = (from, kind) else {
            continue; // gone since the listing: nothing to apply
        };
        // The listing holds files and links only: a directory (or a FIFO) there now was
        // swapped in since, by a process of the agent's still running, and would be copied
        // whole, unjudged (its `conftest.py`, past the size cap).
        if matches!(kind, Kind::Dir | Kind::Other) {
            result.discarded.push(path.clone());
            continue;
        }
        // Counted before a byte is written: a 64 GiB sparse file is refused, not copied.
        copied += size_of(&src, &name, &kind).map_err(agents(path))?;
        if copied > MAX_CHANGED_BYTES {
            return Err(WorkspaceError::TooLarge {
                limit: MAX_CHANGED_BYTES,
            });
        }
        let (parent, last) = dst.make_parents(path).map_err(io(&eval.join(path)))?;
        parent.remove(&last).map_err(io(&eval.join(path)))?;
        copy_judged(&src, &name, &kind, &parent, path).map_err(to_agents)?;
        let bucket = if added {
            &mut result.applied.added
        } else {
            &mut result.applied.modified
        };
        bucket.push(path.clone());
    }
    for path in &changes.deleted {
        if !allowed(path, None, protected, &before) {
            result.discarded.push(path.clone());
            continue;
        }
        if let Some((parent, last)) = dst.find_parent(path).map_err(io(&eval.join(path)))? {
            parent.remove(&last).map_err(io(&eval.join(path)))?;
        }
        result.applied.deleted.push(path.clone());
    }
    result.discarded.sort();
    write_files(eval, hidden)?;
    Ok(result)
}

/// The evaluator's report file (`reward.path`) in the evaluation copy: read only if it is a
/// regular file reached without a link, and at most `limit` bytes. `Err` says why not.
pub fn read_report(eval: &Path, relative: &str, limit: u64) -> Result<String, String> {
    let rel = safe_relative(relative).map_err(|e| e.to_string())?;
    let dir = Dir::open(eval).map_err(|e| format!("{}: {e}", eval.display()))?;
    let Some((parent, name)) = dir
        .find_parent(rel)
        .map_err(|e| format!("{relative}: {e}"))?
    else {
        return Err(format!("{relative}: no such file (or a link on its way)"));
    };
    match parent.kind(&name).map_err(|e| format!("{relative}: {e}"))? {
        Some(Kind::File { len, .. }) if len <= limit => {}
        Some(Kind::File { len, .. }) => {
            return Err(format!("{relative}: {len} bytes, more than {limit}"))
        }
        Some(Kind::Link(_)) => return Err(format!("{relative}: a link, not a file")),
        Some(_) => return Err(format!("{relative}: not a regular file")),
        None => return Err(format!("{relative}: no such file")),
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(
            parent
                .open_file(&name)
                .map_err(|e| format!("{relative}: {e}"))?,
            limit,
        ),
        &mut text,
    )
    .map_err(|e| format!("{relative}: {e}"))?;
    String::from_utf8(text).map_err(|_| format!("{relative}: not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(paths: &[PathBuf]) -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A task of one file (`calc.py`) under `dir`: its pristine snapshot, the workspace made of
    /// it, and where the evaluation copy goes.
    fn one_file_task(dir: &Path) -> std::io::Result<(PathBuf, PathBuf, PathBuf)> {
        let (pristine, ws, eval) = (dir.join("p"), dir.join("w"), dir.join("e"));
        std::fs::create_dir_all(&pristine)?;
        std::fs::write(pristine.join("calc.py"), "x")?;
        copy_tree(&pristine, &ws).map_err(std::io::Error::other)?;
        Ok((pristine, ws, eval))
    }

    #[test]
    fn a_fifo_the_agent_left_is_neither_diffed_nor_copied() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let (pristine, ws, eval) = one_file_task(dir.path())?;
        // Nobody will ever write to it: reading it would block the runner forever.
        let made = std::process::Command::new("mkfifo")
            .arg(ws.join("calc.py.fifo"))
            .status()?;
        assert!(made.success());
        std::fs::write(ws.join("new.py"), "y")?;
        let changes = diff(&pristine, &ws)?;
        assert_eq!(names(&changes.added), ["new.py"]);
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

    /// What a process of the agent's swaps in after the diff listed a file is not copied: a
    /// directory in its place (its `conftest.py` unjudged, past the size cap) was copied whole.
    #[test]
    fn what_was_swapped_in_after_the_listing_is_not_copied(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (pristine, ws, eval) = one_file_task(dir.path())?;
        std::fs::write(ws.join("new.py"), "y")?;
        std::fs::write(ws.join("calc.py"), "fixed")?;
        let changes = diff(&pristine, &ws)?;
        assert_eq!(
            (names(&changes.added), names(&changes.modified)),
            (vec!["new.py".to_string()], vec!["calc.py".to_string()])
        );
        // After the listing: the new file made a directory.
        std::fs::remove_file(ws.join("new.py"))?;
        std::fs::create_dir_all(ws.join("new.py"))?;
        std::fs::write(ws.join("new.py/conftest.py"), "forged")?;
        let applied = evaluation_copy(
            &pristine,
            &ws,
            &eval,
            &changes,
            &Protected::new(&[], std::iter::empty())?,
            &BTreeMap::new(),
        )?;
        assert_eq!(names(&applied.discarded), ["new.py"]);
        assert!(!eval.join("new.py").exists());
        assert_eq!(std::fs::read_to_string(eval.join("calc.py"))?, "fixed");
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
        let before: BTreeSet<PathBuf> = ["a", "b", "c"].map(PathBuf::from).into();
        let after: BTreeSet<PathBuf> = ["b", "c", "d"].map(PathBuf::from).into();
        let changes = classify(&before, &after, |p| p == Path::new("c"));
        assert_eq!(names(&changes.added), ["d"]);
        assert_eq!(names(&changes.modified), ["c"]);
        assert_eq!(names(&changes.deleted), ["a"]);
    }

    #[test]
    fn protected_globs_and_hidden_files() -> Result<(), Box<dyn std::error::Error>> {
        let hidden = ["tests/test_hidden.py".to_string()];
        let p = Protected::new(&["tests/**".into(), "**/conftest.py".into()], &hidden)?;
        assert!(p.covers(Path::new("tests/test_visible.py")));
        assert!(p.covers(Path::new("tests/deep/x.py")));
        assert!(p.covers(Path::new("conftest.py")));
        assert!(p.covers(Path::new("pkg/conftest.py")));
        assert!(!p.covers(Path::new("calc.py")));
        assert!(!p.covers(Path::new("testsuite.py")));
        let only_hidden = Protected::new(&[], &hidden)?;
        assert!(only_hidden.covers(Path::new("tests/test_hidden.py")));
        assert!(!only_hidden.covers(Path::new("tests/test_visible.py")));
        Ok(())
    }

    #[test]
    fn the_evaluation_copy_applies_the_agent_diff_but_not_tampering(
    ) -> Result<(), Box<dyn std::error::Error>> {
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
            names(&changes.added),
            ["conftest.py", "new.py", "tests/test_hidden.py"]
        );
        assert_eq!(
            names(&changes.modified),
            ["calc.py", "tests/test_visible.py"]
        );
        assert_eq!(names(&changes.deleted), ["old.txt"]);

        let hidden = files(&[("tests/test_hidden.py", "assert add(2, 2) == 4\n")]);
        let protected =
            Protected::new(&["tests/**".into(), "**/conftest.py".into()], hidden.keys())?;
        let applied = evaluation_copy(&pristine, &work, &eval, &changes, &protected, &hidden)?;
        assert_eq!(names(&applied.applied.added), ["new.py"]);
        assert_eq!(names(&applied.applied.modified), ["calc.py"]);
        assert_eq!(names(&applied.applied.deleted), ["old.txt"]);
        assert_eq!(
            names(&applied.discarded),
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

    /// pristine → workspace (the agent's `act`) → evaluation copy, with `protected` and
    /// `hidden`; returns the evaluation copy's directory and what was applied.
    fn graded(
        tmp: &Path,
        task: &[(&str, &str)],
        act: impl FnOnce(&Path) -> std::io::Result<()>,
        protected: &[&str],
        hidden: &[(&str, &str)],
    ) -> Result<(PathBuf, Applied), Box<dyn std::error::Error>> {
        let (pristine, ws, eval) = (tmp.join("p"), tmp.join("w"), tmp.join("e"));
        write_files(&pristine, &files(task))?;
        copy_tree(&pristine, &ws)?;
        act(&ws)?;
        let changes = diff(&pristine, &ws)?;
        let hidden = files(hidden);
        let patterns: Vec<String> = protected.iter().map(|p| p.to_string()).collect();
        let protected = Protected::new(&patterns, hidden.keys())?;
        let applied = evaluation_copy(&pristine, &ws, &eval, &changes, &protected, &hidden)?;
        Ok((eval, applied))
    }

    #[test]
    fn a_link_over_the_hidden_tests_directory_is_discarded_and_never_written_through(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside)?;
        let target = outside.clone();
        // The issue's forgery: `tests` a link (to the process's cwd, or anywhere), a passing
        // `test_hidden.py` where the link leads.
        let (eval, applied) = graded(
            tmp.path(),
            &[("calc.py", "bug")],
            move |ws| {
                std::os::unix::fs::symlink(&target, ws.join("tests"))?;
                std::fs::write(ws.join("test_hidden.py"), "pass")
            },
            &[],
            &[("tests/test_hidden.py", "real")],
        )?;
        assert!(names(&applied.discarded).contains(&"tests".to_string()));
        assert!(std::fs::symlink_metadata(eval.join("tests"))?.is_dir());
        assert_eq!(
            std::fs::read_to_string(eval.join("tests/test_hidden.py"))?,
            "real"
        );
        assert!(
            std::fs::read_dir(&outside)?.next().is_none(),
            "written through"
        );
        // A dangling link in the same place is no different.
        let tmp = tempfile::tempdir()?;
        let (eval, _) = graded(
            tmp.path(),
            &[("calc.py", "bug")],
            |ws| std::os::unix::fs::symlink("/nonexistent/dir", ws.join("tests")),
            &[],
            &[("tests/test_hidden.py", "real")],
        )?;
        assert_eq!(
            std::fs::read_to_string(eval.join("tests/test_hidden.py"))?,
            "real"
        );
        Ok(())
    }

    #[test]
    fn a_protected_directory_cannot_be_swapped_for_a_link_or_a_file(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let task = [("calc.py", "bug"), ("tests/test_visible.py", "real test")];
        for protected in ["tests/**", "**/test_*.py"] {
            let tmp = tempfile::tempdir()?;
            let (eval, applied) = graded(
                tmp.path(),
                &task,
                |ws| {
                    std::fs::remove_dir_all(ws.join("tests"))?;
                    std::fs::create_dir(ws.join("mine"))?;
                    std::fs::write(ws.join("mine/test_visible.py"), "pass")?;
                    std::os::unix::fs::symlink("mine", ws.join("tests"))
                },
                &[protected],
                &[],
            )?;
            assert!(
                names(&applied.discarded).contains(&"tests".to_string()),
                "{protected}: {applied:?}"
            );
            assert_eq!(
                std::fs::read_to_string(eval.join("tests/test_visible.py"))?,
                "real test",
                "{protected}"
            );
        }
        Ok(())
    }

    #[test]
    fn links_that_leave_the_tree_are_discarded_links_inside_it_kept(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let (eval, applied) = graded(
            tmp.path(),
            &[("calc.py", "bug"), ("pkg/mod.py", "x")],
            |ws| {
                std::os::unix::fs::symlink("/etc", ws.join("abs"))?;
                std::os::unix::fs::symlink("../../elsewhere", ws.join("pkg/up"))?;
                std::os::unix::fs::symlink("../calc.py", ws.join("pkg/calc.py"))
            },
            &[],
            &[],
        )?;
        assert_eq!(names(&applied.discarded), ["abs", "pkg/up"]);
        assert_eq!(names(&applied.applied.added), ["pkg/calc.py"]);
        assert_eq!(
            std::fs::read_link(eval.join("pkg/calc.py"))?,
            Path::new("../calc.py")
        );
        Ok(())
    }

    #[test]
    fn names_that_are_not_utf8_are_content_like_any_other() -> Result<(), Box<dyn std::error::Error>>
    {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir()?;
        let odd = OsStr::from_bytes(b"caf\xe9.py").to_os_string();
        let name = odd.clone();
        let (eval, applied) = graded(
            tmp.path(),
            &[("calc.py", "bug")],
            move |ws| std::fs::write(ws.join(&name), "x"),
            &[],
            &[],
        )?;
        assert_eq!(applied.applied.added, [PathBuf::from(&odd)]);
        assert_eq!(std::fs::read_to_string(eval.join(&odd))?, "x");
        // It serialises (lossily) for the summary.
        assert!(serde_json::to_string(&applied)?.contains("caf"));
        Ok(())
    }

    #[test]
    fn the_report_is_read_only_from_a_regular_file_within_the_limit(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        std::fs::write(dir.join("reward.json"), r#"{"reward": 1}"#)?;
        assert_eq!(read_report(dir, "reward.json", 100)?, r#"{"reward": 1}"#);
        assert!(read_report(dir, "reward.json", 5).is_err());
        std::fs::create_dir(dir.join("sub"))?;
        std::os::unix::fs::symlink("/dev/zero", dir.join("sub/zero.json"))?;
        assert!(read_report(dir, "sub/zero.json", 100).is_err());
        std::os::unix::fs::symlink(dir.join("sub"), dir.join("via"))?;
        std::fs::write(dir.join("sub/r.json"), "1")?;
        assert!(
            read_report(dir, "via/r.json", 100).is_err(),
            "through a link"
        );
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join("fifo.json"))
            .status()?;
        assert!(made.success());
        assert!(read_report(dir, "fifo.json", 100).is_err());
        Ok(())
    }

    #[test]
    fn a_huge_sparse_file_is_refused_before_a_byte_is_copied(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let result = graded(
            tmp.path(),
            &[("calc.py", "bug")],
            |ws| std::fs::File::create(ws.join("big.bin"))?.set_len(64 << 30),
            &[],
            &[],
        );
        let err = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("more than"), "{err}");
        let copied = tmp.path().join("e/big.bin");
        assert!(!copied.exists(), "copied");
        Ok(())
    }

    #[test]
    fn test_runner_configuration_is_protected_wherever_it_is(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let patterns: Vec<String> = TEST_RUNNER_CONFIG.iter().map(|p| p.to_string()).collect();
        let p = Protected::new(&patterns, std::iter::empty())?;
        for path in [
            "pytest.ini",
            "pyproject.toml",
            "pkg/setup.cfg",
            "tests/conftest.py",
            "tox.ini",
            "sitecustomize.py",
            ".venv/lib/python3.11/site-packages/evil.pth",
            "zz.dist-info/entry_points.txt",
            "calc.egg-info/entry_points.txt",
            "web/jest.config.js",
            ".mocharc.yml",
            ".npmrc",
            "web/.yarnrc.yml",
            "babel.config.js",
            ".babelrc",
            ".babelrc.json",
            ".yarn/releases/yarn-4.1.0.cjs",
            ".pnp.cjs",
            "node_modules/.bin/jest",
            "web/node_modules/jest-cli/build/run.js",
            ".git/hooks/post-checkout",
            ".git/config",
            "vendor/lib/.git/config",
            "node_modules",
            "web/node_modules",
            ".git",
            ".hg/hgrc",
            ".sl/config",
            ".yarn/unplugged",
            ".yarn/cache/jest-npm-29.7.0-abc.zip",
            ".yarn/unplugged/jest-cli-npm-29.7.0/node_modules/jest-cli/bin/jest.js",
            ".pnp.data.json",
        ] {
            assert!(p.covers(Path::new(path)), "{path}");
        }
        assert!(!p.covers(Path::new("calc.py")));
        assert!(!p.covers(Path::new("src/node_modules.md")));
        assert!(!p.covers(Path::new(".gitignore")));
        assert!(!p.covers(Path::new("docs/pytest.md")));
        Ok(())
    }

    #[test]
    fn a_protected_file_made_a_directory_and_modules_that_shadow_hidden_ones_are_discarded(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let (eval, applied) = graded(
            tmp.path(),
            &[
                ("calc.py", "bug"),
                ("tests/test_regress.py", "real regression test"),
            ],
            |ws| {
                std::fs::remove_file(ws.join("tests/test_regress.py"))?;
                std::fs::create_dir_all(ws.join("tests/test_regress.py"))?;
                std::fs::write(ws.join("tests/test_regress.py/x"), "")?;
                std::fs::write(ws.join("tests/test_hidden.so"), "")?;
                std::fs::create_dir_all(ws.join("tests/test_hidden"))?;
                std::fs::write(ws.join("tests/test_hidden/__init__.py"), "")?;
                std::fs::create_dir_all(ws.join("tests/__pycache__"))?;
                std::fs::write(ws.join("tests/__pycache__/test_hidden.cpython-311.pyc"), "")?;
                std::fs::write(ws.join("tests/test_other.py"), "fine")
            },
            &["**/test_*.py"],
            &[("tests/test_hidden.py", "real")],
        )?;
        assert_eq!(
            std::fs::read_to_string(eval.join("tests/test_regress.py"))?,
            "real regression test"
        );
        assert!(!eval.join("tests/test_hidden.so").exists());
        assert!(!eval.join("tests/test_hidden").exists());
        assert!(!eval.join("tests/__pycache__").exists());
        assert_eq!(
            names(&applied.discarded),
            [
                "tests/__pycache__/test_hidden.cpython-311.pyc",
                "tests/test_hidden/__init__.py",
                "tests/test_hidden.so",
                "tests/test_other.py",
                "tests/test_regress.py",
                "tests/test_regress.py/x",
            ]
        );
        Ok(())
    }

    /// A SWE-bench test patch's files are protected by literal paths, not hidden: a package
    /// beside a protected test module would be imported in its place by a runner that loads
    /// tests by name (Django's `runtests.py utils_tests.test_text`).
    #[test]
    fn a_package_shadowing_a_protected_test_module_is_discarded(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let (eval, applied) = graded(
            tmp.path(),
            &[
                ("text.py", "bug"),
                ("tests/__init__.py", ""),
                ("tests/test_text.py", "the test patch's"),
                ("pkg/__init__.py", ""),
                ("pkg/tests.py", "the test patch's"),
            ],
            |ws| {
                // A test package's own `__init__` could send the module elsewhere
                // (`__path__`); a package of the code under test is a fix's to change.
                std::fs::write(ws.join("tests/__init__.py"), "__path__.insert(0, 'x')")?;
                std::fs::write(ws.join("pkg/__init__.py"), "changed")?;
                std::fs::create_dir_all(ws.join("tests/test_text"))?;
                std::fs::write(ws.join("tests/test_text/__init__.py"), "all pass")?;
                std::fs::write(ws.join("tests/data.py"), "fine")?;
                std::fs::write(ws.join("text.py"), "fix")
            },
            &["tests/test_text.py", "tests/data.json", "pkg/tests.py"],
            &[],
        )?;
        assert!(!eval.join("tests/test_text").exists());
        assert_eq!(std::fs::read_to_string(eval.join("text.py"))?, "fix");
        assert_eq!(std::fs::read_to_string(eval.join("tests/__init__.py"))?, "");
        assert_eq!(
            std::fs::read_to_string(eval.join("pkg/__init__.py"))?,
            "changed"
        );
        // A protected file that is not a Python module keeps only its own path.
        assert_eq!(std::fs::read_to_string(eval.join("tests/data.py"))?, "fine");
        assert_eq!(
            names(&applied.discarded),
            ["tests/__init__.py", "tests/test_text/__init__.py"]
        );
        Ok(())
    }

    #[test]
    fn a_link_through_a_link_cannot_climb_out() {
        // `a -> .` then `x -> a/a/../../..`: lexically inside, really above the root.
        assert!(!stays_inside(Path::new("x"), Path::new("a/a/../../..")));
        assert!(!stays_inside(Path::new("x"), Path::new("..")));
        assert!(!stays_inside(Path::new("x"), Path::new("/etc")));
        assert!(stays_inside(Path::new("pkg/x"), Path::new("../calc.py")));
        assert!(!stays_inside(
            Path::new("pkg/x"),
            Path::new("../../calc.py")
        ));
        assert!(stays_inside(Path::new("x"), Path::new("a/a/b")));
    }

    #[test]
    fn a_workspace_may_outgrow_the_task_only_so_far() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let (task, ws) = (tmp.path().join("t"), tmp.path().join("w"));
        write_files(&task, &files(&[("calc.py", "bug")]))?;
        copy_tree(&task, &ws)?;
        let mut deep = ws.clone();
        for _ in 0..300 {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep)?;
        std::fs::write(deep.join("f"), "")?;
        let err = diff(&task, &ws)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("deep"), "{err}");
        let caps = Caps {
            entries: 3,
            ..Caps::beyond(&list_within(&task, Caps::TASK)?)
        };
        std::fs::remove_dir_all(ws.join("d"))?;
        for i in 0..5 {
            std::fs::write(ws.join(format!("f{i}")), "")?;
        }
        let err = list_within(&ws, caps).err();
        assert!(matches!(err, Some(WorkspaceError::TooMuch(_))), "{err:?}");
        Ok(())
    }
}
