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
}

impl Protected {
    pub fn new<'a>(
        patterns: &[String],
        hidden: impl IntoIterator<Item = &'a String>,
    ) -> Result<Self, PatternError> {
        let mut builder = GlobSetBuilder::new();
        let mut guarded = BTreeSet::new();
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
        })
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
