//! The paths the agent may not change for the grader (sans-IO): protected globs, hidden
//! files, and what would be imported or stand in their place.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::import_shadowing;

/// A protected-path pattern that is no glob.
#[derive(Debug, thiserror::Error)]
#[error("protected path pattern {0:?}: {1}")]
pub struct PatternError(String, String);

/// Paths the agent may not change for the grader: the job's protected globs and every hidden
/// file (and the reward file).
pub struct Protected {
    globs: GlobSet,
    exact: BTreeSet<PathBuf>,
    /// Test modules protected by their literal path (a SWE-bench test patch's files).
    modules: Vec<PathBuf>,
    /// Directories that hold a hidden or protected path: a link or file the agent puts there
    /// would be written through, or would shadow what the grader relies on.
    guarded: BTreeSet<PathBuf>,
    /// Where a module named after a test runner's or the standard library's may not be added
    /// ([`crate::runner_shadowing`]): with the test runners' configuration, the top and the
    /// directories of scripts the evaluator runs by path.
    runner_module_dirs: Vec<PathBuf>,
}

/// A pattern as it is meant: `./tests/**` is `tests/**`, and a path with no wildcard (`tests`,
/// `tests/`) names a file or a directory, whose files are then protected too (`tests/**`):
/// as written, these matched nothing or only the directory's own entry, and the files a job
/// meant to keep were the agent's to edit. A pattern that leaves the tree (absolute, `..`)
/// can protect nothing there and is refused.
fn as_written(p: &str) -> Result<Vec<String>, PatternError> {
    let mut q = p;
    while let Some(rest) = q.strip_prefix("./") {
        q = rest;
    }
    let q = q.trim_end_matches('/');
    let leaves = q.starts_with('/') || Path::new(q).components().any(|c| c.as_os_str() == "..");
    if leaves || q.is_empty() {
        return Err(PatternError(
            p.to_string(),
            "must name paths inside the workspace: relative, with no `..`".into(),
        ));
    }
    let wildcard = q.bytes().any(|b| b"*?[{".contains(&b));
    Ok(if wildcard {
        vec![q.to_string()]
    } else {
        vec![q.to_string(), format!("{q}/**")]
    })
}

impl Protected {
    pub fn new<'a>(
        patterns: &[String],
        hidden: impl IntoIterator<Item = &'a String>,
    ) -> Result<Self, PatternError> {
        let mut builder = GlobSetBuilder::new();
        let mut guarded = BTreeSet::new();
        let patterns = patterns
            .iter()
            .map(|p| as_written(p))
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let patterns = &patterns;
        for p in patterns {
            let glob = globset::GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .or_else(|_| Glob::new(p))
                .map_err(|e| PatternError(p.clone(), e.to_string()))?;
            builder.add(glob);
            // `tests/**`, `tests/test_*.py`: `tests` holds protected paths.
            let literal: PathBuf = Path::new(p)
                .components()
                .take_while(|c| !c.as_os_str().as_bytes().iter().any(|b| b"*?[{".contains(b)))
                .collect();
            let dir = if literal.as_os_str() == OsStr::new(p) {
                literal.parent().map(Path::to_path_buf).unwrap_or_default()
            } else {
                literal
            };
            guarded.extend(dir.ancestors().map(Path::to_path_buf));
        }
        // A protected test module is shadowed by what Python imports in its place: Django's
        // runner imports `utils_tests.test_text`, which a package `test_text/` beside the test
        // patch's `test_text.py` would answer.
        let modules = patterns
            .iter()
            .filter_map(|p| import_shadowing::literal_module(p))
            .map(PathBuf::from)
            .collect();
        let exact: BTreeSet<PathBuf> = hidden
            .into_iter()
            .map(|p| Path::new(p.trim_start_matches("./")).components().collect())
            .collect();
        for p in &exact {
            guarded.extend(p.ancestors().skip(1).map(Path::to_path_buf));
        }
        guarded.remove(Path::new(""));
        Ok(Self {
            globs: builder
                .build()
                .map_err(|e| PatternError(patterns.join(", "), e.to_string()))?,
            exact,
            modules,
            guarded,
            runner_module_dirs: Vec::new(),
        })
    }

    /// Also refuse what would stand in a test runner's place ([`Self::adds_a_runner_module`]),
    /// at the top and in `script_dirs` (relative to the top).
    pub fn refusing_runner_modules(self, script_dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut dirs = vec![PathBuf::new()];
        dirs.extend(script_dirs.into_iter().map(|d| {
            d.components()
                .filter(|c| !matches!(c, std::path::Component::CurDir))
                .collect::<PathBuf>()
        }));
        dirs.sort();
        dirs.dedup();
        Self {
            runner_module_dirs: dirs,
            ..self
        }
    }

    /// Whether `path`, beyond the task's paths (`pristine`), adds a module a test runner would
    /// import in place of its own or the standard library's.
    pub fn adds_a_runner_module(&self, path: &Path, pristine: &BTreeSet<PathBuf>) -> bool {
        crate::runner_shadowing::adds_a_runner_module(path, &self.runner_module_dirs, pristine)
    }

    /// Whether `pattern` names paths inside the tree (as [`Self::new`] takes it).
    pub fn names_the_tree(pattern: &str) -> bool {
        as_written(pattern).is_ok()
    }

    pub fn covers(&self, path: &Path) -> bool {
        self.exact.contains(path) || self.globs.is_match(path)
    }

    /// Whether `path` would be imported in place of a hidden file, or stand where it is
    /// ([`crate::import_shadowing::shadows`]).
    pub fn shadows_hidden(&self, path: &Path) -> bool {
        self.exact
            .iter()
            .any(|hidden| path != hidden && import_shadowing::shadows(path, hidden))
            || self.modules.iter().any(|module| {
                path != module
                    && (import_shadowing::beside(path, module)
                        || import_shadowing::test_package_init(path, module))
            })
    }

    /// Whether `path` is a directory that holds a protected or hidden path.
    pub fn guards(&self, path: &Path) -> bool {
        self.guarded.contains(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protects(pattern: &str, path: &str) -> bool {
        Protected::new(&[pattern.to_string()], std::iter::empty::<&String>())
            .expect("a pattern")
            .covers(Path::new(path))
    }

    /// The spellings a job author writes for a directory protect the files in it: `./tests/**`
    /// and `tests` matched nothing in them before.
    #[test]
    fn a_pattern_protects_what_it_names_however_it_is_spelled() {
        for pattern in ["tests/**", "./tests/**", "tests", "tests/", "./tests/"] {
            assert!(protects(pattern, "tests/test_visible.py"), "{pattern}");
            assert!(protects(pattern, "tests/deep/x.py"), "{pattern}");
            assert!(!protects(pattern, "testsuite.py"), "{pattern}");
        }
        assert!(protects("./grade.sh", "grade.sh"));
        assert!(
            !protects("tests/*.py", "tests/deep/x.py"),
            "a wildcard is as written"
        );
        for outside in ["/tests/**", "../tests/**", "tests/../../x", "./", ""] {
            assert!(
                Protected::new(&[outside.to_string()], std::iter::empty::<&String>()).is_err(),
                "{outside:?}"
            );
        }
    }
}
