//! The files of the task's tree that decide which program the evaluator runs, kept from the
//! agent like the evaluator's other files. A relative program path (`./grade.sh`) was kept as
//! written, but what it is a link to (`tool/lib/grade.sh`), an absolute path into the
//! evaluation copy (a pod's `/testbed/run.sh`) and a bare name found on a `PATH` entry inside
//! the copy (`PATH=bin:…`, `node_modules/.bin`) were the agent's to rewrite: an evaluator
//! that writes a reward of 1 without running a test. On a `PATH` directory of the copy, every
//! entry is kept (an added `python` or `jest` there answers for the real one, even to a
//! script the evaluator runs).

use std::path::{Component, Path, PathBuf};

use floe_crds::swebench::glob_literal;

/// Protected-path patterns for the evaluator's `program`, found as `execvp` would from the
/// evaluation copy (`eval_dir`, whose task files are `pristine`) with `path_var`.
pub(crate) fn owned_patterns(
    program: &str,
    path_var: Option<&str>,
    eval_dir: &Path,
    pristine: &Path,
) -> Vec<String> {
    let mut out = Vec::new();
    if program.contains('/') {
        if let Some(rel) = inside(program, eval_dir) {
            out.extend(with_where_it_leads(&rel, pristine).map(|p| glob_literal(&p)));
        }
        return out;
    }
    for dir in path_var.unwrap_or_default().split(':') {
        if dir.is_empty() {
            continue;
        }
        let Some(rel) = inside(dir, eval_dir) else {
            continue;
        };
        // `PATH=.`: the copy's top itself; its other files stay the agent's.
        if rel.as_os_str().is_empty() {
            out.extend(with_where_it_leads(Path::new(program), pristine).map(|p| glob_literal(&p)));
            continue;
        }
        for d in with_where_it_leads(&rel, pristine) {
            out.push(format!("{}/*", glob_literal(&d)));
        }
        out.extend(with_where_it_leads(&rel.join(program), pristine).map(|p| glob_literal(&p)));
    }
    out
}

/// `p` (relative to the copy, or absolute under `eval_dir`) as a path relative to the copy,
/// `None` when it is elsewhere (a program of the image's, not the task's).
fn inside(p: &str, eval_dir: &Path) -> Option<PathBuf> {
    let p = Path::new(p);
    let rel = if p.is_absolute() {
        p.strip_prefix(eval_dir).ok()?
    } else {
        p
    };
    normal(rel)
}

/// Lexically normal: `.` dropped, `..` applied; `None` if it climbs out.
fn normal(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// `rel` and, when the task's tree makes it a link (or a path through one), where it leads
/// inside the tree.
fn with_where_it_leads(rel: &Path, pristine: &Path) -> impl Iterator<Item = String> {
    let real = pristine.canonicalize().ok().and_then(|root| {
        let resolved = pristine.join(rel).canonicalize().ok()?;
        Some(resolved.strip_prefix(&root).ok()?.to_path_buf())
    });
    let mut paths = vec![rel.to_string_lossy().into_owned()];
    if let Some(real) = real.filter(|r| r.as_path() != rel && !r.as_os_str().is_empty()) {
        paths.push(real.to_string_lossy().into_owned());
    }
    paths.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root = dir.path();
        for d in [
            "bin",
            "tool/lib",
            "node_modules/jest/bin",
            "node_modules/.bin",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("a directory");
        }
        std::fs::write(root.join("tool/lib/grade.sh"), "#!/bin/sh\n").expect("a file");
        symlink("../tool/lib/grade.sh", root.join("bin/grade")).expect("a link");
        symlink("tool/lib", root.join("lib")).expect("a link");
        std::fs::write(root.join("node_modules/jest/bin/jest.js"), "").expect("a file");
        symlink("../jest/bin/jest.js", root.join("node_modules/.bin/jest")).expect("a link");
        dir
    }

    #[test]
    fn a_program_path_is_kept_with_where_its_links_lead() {
        let t = tree();
        let (eval, pristine) = (Path::new("/testbed"), t.path());
        assert_eq!(
            owned_patterns("./bin/grade", None, eval, pristine),
            ["bin/grade", "tool/lib/grade.sh"]
        );
        assert_eq!(
            owned_patterns("/testbed/lib/grade.sh", None, eval, pristine),
            ["lib/grade.sh", "tool/lib/grade.sh"]
        );
        // The image's own programs, and paths that climb out, are not the task's.
        assert!(owned_patterns("/usr/bin/python", None, eval, pristine).is_empty());
        assert!(owned_patterns("../x/grade", None, eval, pristine).is_empty());
    }

    #[test]
    fn a_bare_name_keeps_every_entry_of_the_path_directories_inside_the_copy() {
        let t = tree();
        let (eval, pristine) = (Path::new("/testbed"), t.path());
        let path = "node_modules/.bin:/usr/bin:/testbed/bin";
        assert_eq!(
            owned_patterns("jest", Some(path), eval, pristine),
            [
                "node_modules/.bin/*",
                "node_modules/.bin/jest",
                "node_modules/jest/bin/jest.js",
                "bin/*",
                "bin/jest",
            ]
        );
        assert_eq!(
            owned_patterns("grade", Some(".:/usr/bin"), eval, pristine),
            ["grade"]
        );
        assert!(owned_patterns("python", Some("/usr/bin:/bin"), eval, pristine).is_empty());
        assert!(owned_patterns("python", None, eval, pristine).is_empty());
    }
}
