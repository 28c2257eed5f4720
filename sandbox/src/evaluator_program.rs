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
    let leads = |rel: &Path| with_where_it_leads(rel, pristine, eval_dir);
    let mut out = Vec::new();
    if program.contains('/') {
        if let Some(rel) = inside(program, eval_dir) {
            out.extend(leads(&rel).map(|p| glob_literal(&p)));
        }
        return out;
    }
    // An empty entry is the working directory, as `.` is.
    for dir in path_var.into_iter().flat_map(|p| p.split(':')) {
        let dir = if dir.is_empty() { "." } else { dir };
        let Some(rel) = inside(dir, eval_dir) else {
            continue;
        };
        // `PATH=.`: the copy's top itself; its other files stay the agent's.
        if rel.as_os_str().is_empty() {
            out.extend(leads(Path::new(program)).map(|p| glob_literal(&p)));
            continue;
        }
        for d in leads(&rel) {
            out.push(format!("{}/*", glob_literal(&d)));
        }
        out.extend(leads(&rel.join(program)).map(|p| glob_literal(&p)));
    }
    out
}

/// The script an interpreter in the evaluator's `command` runs (`bash grade.sh`, `python3
/// tests/grade.py`, `sh -c ./grade.sh`), as a path with a `/` (`./grade.sh`): it is the
/// evaluator as much as a program run by its path is. `None` when the program is no
/// interpreter, or runs no file of its own (`python -m pytest`, `bash -c 'pytest -q'`).
pub(crate) fn interpreted_script(command: &[String]) -> Option<String> {
    let (program, args) = command.split_first()?;
    let name = program.rsplit('/').next().unwrap_or(program);
    let shell = matches!(name, "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh");
    let python = name.starts_with("python") || name.starts_with("pypy");
    // The options that take the next word as theirs, and those that run no file (a module, a
    // command string, standard input).
    let (taking, no_file): (&[&str], &[&str]) = if shell {
        (
            &["-o", "-O", "+o", "+O", "--rcfile", "--init-file"],
            &["-s", "-"],
        )
    } else if python {
        (&["-X", "-W"], &["-m", "-c", "-"])
    } else if matches!(name, "node" | "nodejs") {
        (
            &["-r", "--require", "--import", "--loader"],
            &["-e", "--eval", "-p", "--print", "-"],
        )
    } else if matches!(name, "perl" | "ruby") {
        (&["-I", "-C", "-r", "-x"], &["-e", "-E", "-"])
    } else if name == "php" {
        (&["-c", "-d", "-z"], &["-r", "-"])
    } else {
        return None;
    };
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let word = word.as_str();
        // A cluster of one-letter options: a shell's `-lc` or `-ce` takes a command string,
        // Python's `-Bc` or `-Bm` ends with the option whose argument follows.
        let cluster = word
            .strip_prefix('-')
            .filter(|w| !w.starts_with('-') && w.len() > 1)
            .unwrap_or_default();
        let word = if (shell && cluster.contains('c')) || (python && cluster.ends_with('c')) {
            "-c"
        } else if python && cluster.ends_with('m') {
            "-m"
        } else {
            word
        };
        if shell && word == "-c" {
            // A shell's command string: the file it starts with, when it names one by path.
            let mut first = words.next()?.split_whitespace();
            let first = first
                .next()
                .filter(|w| *w != "exec")
                .or_else(|| first.next())?;
            return first.contains('/').then(|| first.to_string());
        }
        if no_file.contains(&word) {
            return None;
        }
        if taking.contains(&word) {
            words.next();
        } else if !word.starts_with('-') {
            return Some(if word.contains('/') {
                word.to_string()
            } else {
                format!("./{word}")
            });
        }
    }
    None
}

/// The directories, relative to the copy's top, where Python looks for modules before the
/// standard library: those of the scripts the evaluator's `command` runs by path (its
/// program, a `*.py` argument; where a link there leads), and those of `PYTHONPATH` inside
/// the copy.
pub(crate) fn script_dirs(
    command: &[String],
    python_path: Option<&str>,
    eval_dir: &Path,
    pristine: &Path,
) -> Vec<PathBuf> {
    let scripts = command
        .iter()
        .enumerate()
        .filter(|(i, word)| word.contains('/') && (*i == 0 || word.ends_with(".py")))
        .filter_map(|(_, word)| inside(word, eval_dir))
        .flat_map(|script| {
            let real = resolve(&script, pristine, eval_dir).map(|(real, _)| real);
            [Some(script), real]
        })
        .flatten()
        .filter_map(|script| script.parent().map(Path::to_path_buf));
    // A directory on it that is a link: the diff sees its files where it leads.
    let path = python_path
        .into_iter()
        .flat_map(|p| p.split(':'))
        .filter(|d| !d.is_empty())
        .filter_map(|d| inside(d, eval_dir))
        .flat_map(|dir| {
            let real = resolve(&dir, pristine, eval_dir).map(|(real, _)| real);
            [Some(dir), real]
        })
        .flatten();
    let mut dirs: Vec<PathBuf> = scripts.chain(path).collect();
    dirs.sort();
    dirs.dedup();
    dirs
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
/// and every link on the way (a link in the middle, repointed, would lead elsewhere).
fn with_where_it_leads(
    rel: &Path,
    pristine: &Path,
    eval_dir: &Path,
) -> impl Iterator<Item = String> {
    let mut paths = vec![rel.to_path_buf()];
    if let Some((real, links)) = resolve(rel, pristine, eval_dir) {
        paths.extend(links);
        paths.push(real);
    }
    let mut seen = std::collections::BTreeSet::new();
    paths
        .into_iter()
        .filter(|p| !p.as_os_str().is_empty() && seen.insert(p.clone()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .into_iter()
}

/// Where `rel` leads in the task's tree, its links followed one component at a time as the
/// evaluation copy will have them (relative targets in the tree, absolute ones under
/// `eval_dir`), at most 32 of them; a name the task lacks is taken as named (the agent may
/// make it, and what it makes there is then kept from it). `None` when it leaves the tree.
fn resolve(rel: &Path, pristine: &Path, eval_dir: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let mut crossed = Vec::new();
    let mut todo: Vec<std::ffi::OsString> = rel
        .components()
        .rev()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    let mut at = PathBuf::new();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match Path::new(&part).components().next() {
            Some(Component::CurDir) | None => {}
            Some(Component::ParentDir) => {
                if !at.pop() {
                    return None;
                }
            }
            Some(Component::Normal(name)) => {
                let next = at.join(name);
                let meta = std::fs::symlink_metadata(pristine.join(&next));
                if !meta.is_ok_and(|m| m.file_type().is_symlink()) {
                    at = next;
                    continue;
                }
                links += 1;
                let target = std::fs::read_link(pristine.join(&next)).ok()?;
                crossed.push(next);
                if links > 32 {
                    return None;
                }
                let target = if target.is_absolute() {
                    at = PathBuf::new();
                    target.strip_prefix(eval_dir).ok()?.to_path_buf()
                } else {
                    target
                };
                todo.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| c.as_os_str().to_os_string()),
                );
            }
            Some(Component::RootDir | Component::Prefix(_)) => return None,
        }
    }
    Some((at, crossed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_an_interpreter_runs_is_found_and_nothing_else() {
        let script = |words: &[&str]| {
            interpreted_script(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
        };
        let found = |words: &[&str], path: &str| assert_eq!(script(words).as_deref(), Some(path));
        found(&["bash", "grade.sh"], "./grade.sh");
        found(&["/bin/sh", "-e", "tests/run.sh", "x"], "tests/run.sh");
        found(&["bash", "-o", "pipefail", "grade.sh"], "./grade.sh");
        found(&["sh", "-c", "./grade.sh --all"], "./grade.sh");
        found(&["sh", "-c", "exec tool/grade.sh"], "tool/grade.sh");
        found(&["bash", "-lc", "./grade.sh"], "./grade.sh");
        found(&["python3", "-u", "-X", "dev", "grade.py"], "./grade.py");
        found(&["/usr/bin/python3.11", "tests/grade.py"], "tests/grade.py");
        found(&["node", "--require", "x.js", "grade.js"], "./grade.js");
        found(&["perl", "-w", "grade.pl"], "./grade.pl");
        // An option's own argument is no script (`lib` protected whole scored a fix 0).
        found(&["ruby", "-I", "lib", "test/x_test.rb"], "test/x_test.rb");
        found(&["perl", "-I", "lib", "t/a.t"], "t/a.t");
        found(
            &["php", "-d", "memory_limit=1G", "grade.php"],
            "./grade.php",
        );
        for none in [
            &["python3", "-m", "pytest", "tests"][..],
            &["python", "-c", "print(1)"],
            &["bash", "-c", "pytest -q"],
            &["bash", "-lc", "pytest -q"],
            &["bash", "-ce", "pytest -q"],
            &["python3", "-Bm", "pytest"],
            &["python3", "-Bc", "print(1)"],
            &["bash"],
            &["pytest", "tests/test_x.py"],
            &["./grade.sh", "arg.sh"],
            &["node", "-e", "1"],
        ] {
            assert_eq!(script(none), None, "{none:?}");
        }
    }
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
            ["lib/grade.sh", "lib", "tool/lib/grade.sh"]
        );
        // The image's own programs, and paths that climb out, are not the task's.
        assert!(owned_patterns("/usr/bin/python", None, eval, pristine).is_empty());
        assert!(owned_patterns("../x/grade", None, eval, pristine).is_empty());
    }

    /// Links as the copy will have them: an absolute one into the evaluation directory (a
    /// pod's `/testbed`), and one to what the task lacks (the agent could make it).
    #[test]
    fn links_are_followed_in_the_tree_as_the_copy_has_it() {
        let t = tree();
        let root = t.path();
        symlink("/testbed/tool/lib/grade.sh", root.join("bin/abs")).expect("a link");
        symlink("../made/later.sh", root.join("bin/later")).expect("a link");
        symlink("/etc/passwd", root.join("bin/out")).expect("a link");
        let eval = Path::new("/testbed");
        assert_eq!(
            owned_patterns("bin/abs", None, eval, root),
            ["bin/abs", "tool/lib/grade.sh"]
        );
        assert_eq!(
            owned_patterns("bin/later", None, eval, root),
            ["bin/later", "made/later.sh"]
        );
        assert_eq!(owned_patterns("bin/out", None, eval, root), ["bin/out"]);
        // A link in the middle is kept too: repointed, the chain would lead elsewhere.
        symlink("../lib/grade.sh", root.join("bin/chained")).expect("a link");
        assert_eq!(
            owned_patterns("bin/chained", None, eval, root),
            ["bin/chained", "lib", "tool/lib/grade.sh"]
        );
    }

    #[test]
    fn the_scripts_a_command_runs_by_path_name_their_directories() {
        let eval = Path::new("/testbed");
        let command = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let t = tree();
        let pristine = t.path();
        let dirs = |words: &[&str], python_path: Option<&str>| {
            script_dirs(&command(words), python_path, eval, pristine)
        };
        assert_eq!(
            dirs(&["python", "tests/runtests.py", "-v", "a/b"], None),
            [PathBuf::from("tests")]
        );
        assert_eq!(dirs(&["./bin/test", "x.py"], None), [PathBuf::from("bin")]);
        assert_eq!(dirs(&["/testbed/run/go.py"], None), [PathBuf::from("run")]);
        // A script that is a link: Python looks beside where it leads.
        assert_eq!(
            dirs(&["./bin/grade"], None),
            [PathBuf::from("bin"), PathBuf::from("tool/lib")]
        );
        assert_eq!(
            dirs(
                &["python", "-m", "pytest"],
                Some("src:/usr/lib/x:/testbed/lib2")
            ),
            [PathBuf::from("lib2"), PathBuf::from("src")]
        );
        assert_eq!(
            dirs(&["python", "-m", "pytest"], Some("lib")),
            [PathBuf::from("lib"), PathBuf::from("tool/lib")]
        );
        assert!(dirs(&["python", "-m", "pytest"], None).is_empty());
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
