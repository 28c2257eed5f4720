//! What a file of the agent's would be imported as in place of a hidden test: Python's rules
//! for a hidden Python module (a module file or package of its name beside it, its directory's
//! `__init__`, a module beside a package on its way), the file's own place for anything else.

use std::path::Path;

/// The module Python would import a file of this name as: `m.py`, `m.pyc`, and extension
/// modules, `m.so`, `m.abi3.so`, `m.cpython-311-x86_64-linux-gnu.so` (`.pyd` on Windows).
/// `None` for anything else (`m.txt`, a dotfile).
pub(crate) fn importable_as(file: &str) -> Option<&str> {
    let (module, rest) = file.split_once('.')?;
    let python = matches!(rest, "py" | "pyc" | "pyw" | "so" | "pyd")
        || rest.ends_with(".so")
        || rest.ends_with(".pyd");
    (python && !module.is_empty()).then_some(module)
}

/// Whether the agent's `path` would be imported in place of the hidden file `hidden`, or
/// would stand where it is. Beside `tests/test_hidden.py`, a `tests/test_hidden.so` (or
/// `.abi3.so`, `.cpython-311-…so`, `.pyc`: any name Python imports as that module), or a
/// package directory `tests/test_hidden/`, is imported in its place. So is a package on its
/// way: a `tests.py` beside a `tests/` without `__init__.py` (a namespace package comes last),
/// or the `__init__.py` of the hidden module's own directory made, changed or removed (one
/// that sets `__path__` sends `tests.test_hidden` to a directory of the agent's).
///
/// Python's rules only for a hidden Python module: any other hidden file (a co-located
/// `calc.test.js`, a Rust `tests.rs`) keeps what stands in its place or in a directory of its
/// stem, so that `calc.js` beside `calc.test.js` stays the agent's to fix.
pub(crate) fn shadows(path: &Path, hidden: &Path) -> bool {
    let Some((dir, _)) = python_module(hidden) else {
        let (Some(dir), Some(stem)) = (hidden.parent(), hidden.file_stem()) else {
            return false;
        };
        return path.starts_with(dir.join(stem))
            || (path.parent() == Some(dir) && path.file_stem() == Some(stem));
    };
    if beside(path, hidden) {
        return true;
    }
    let imported_as = named(path).and_then(importable_as);
    // Only the hidden module's own directory has its `__init__` kept: further up are the
    // packages of the code under test (`astropy/__init__.py` above `astropy/units/tests/`),
    // which a fix may change, and whose code runs in the evaluator's process anyway.
    let own_init = !dir.as_os_str().is_empty()
        && path.parent() == Some(dir)
        && imported_as == Some("__init__");
    own_init
        || dir
            .ancestors()
            .filter(|package| !package.as_os_str().is_empty())
            .any(|package| path.parent() == package.parent() && imported_as == named(package))
}

/// Whether the agent's `path` is what Python would import in place of the module file
/// `module` (a `.py`) from its own directory: a module file of its name (`test_text.so`,
/// `.pyc`) or a package directory `test_text/`. For a protected module this alone, not the
/// `__init__` or package rules of [`shadows`]: the test patch's files sit among the code a fix
/// may change (`django/contrib/admin/tests.py` beside `django/contrib/admin/__init__.py`).
pub(crate) fn beside(path: &Path, module: &Path) -> bool {
    let Some((dir, module)) = python_module(module) else {
        return false;
    };
    path.starts_with(dir.join(module))
        || (path.parent() == Some(dir) && named(path).and_then(importable_as) == Some(module))
}

/// Whether the agent's `path` is the `__init__` of a test package on a protected test
/// module's way (its own directory, or one above it, that is or lies within a `tests`, `test`
/// or `testing` directory): a `__path__` set there sends `tests.utils_tests.test_text` to a
/// copy of the agent's that swallows every failure. A test package's `__init__` is no fix's
/// business; a `tests.py` among the code under test (`django/contrib/admin/`) keeps its
/// directory's, and so do the packages above a `tests` directory (`astropy/units/`).
pub(crate) fn test_package_init(path: &Path, module: &Path) -> bool {
    let Some((dir, _)) = python_module(module) else {
        return false;
    };
    let Some(package) = path.parent() else {
        return false;
    };
    let is_test_dir = |c: std::path::Component| {
        matches!(c.as_os_str().to_str(), Some("tests" | "test" | "testing"))
    };
    named(path).and_then(importable_as) == Some("__init__")
        && !package.as_os_str().is_empty()
        && dir.starts_with(package)
        && package.components().any(is_test_dir)
}

/// A `.py` file's directory and the module it is imported as.
fn python_module(file: &Path) -> Option<(&Path, &str)> {
    let dir = file.parent()?;
    let module = named(file)
        .filter(|n| n.ends_with(".py"))
        .and_then(importable_as)?;
    Some((dir, module))
}

fn named(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str())
}

/// Compiled Python the interpreter would take over its source (an "unchecked hash" `.pyc` is
/// never compared with the `.py`): Python writes its own when the evaluator runs.
pub(crate) fn is_bytecode(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "__pycache__")
        || path.extension().is_some_and(|e| e == "pyc" || e == "pyo")
}

/// The Python module a protected path names when it is a literal path (a SWE-bench test
/// patch's files are protected as such, each metacharacter escaped as `[c]`): `None` for a
/// pattern that matches more than one path, or for a file that is not a `.py` module.
pub(crate) fn literal_module(pattern: &str) -> Option<String> {
    let mut path = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                let (escaped, close) = (chars.next()?, chars.next()?);
                (close == ']').then_some(())?;
                path.push(escaped);
            }
            '*' | '?' | ']' | '{' | '}' => return None,
            c => path.push(c),
        }
    }
    path.ends_with(".py").then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_python_would_import_in_place_of_a_hidden_module_shadows_it() {
        let hidden = Path::new("tests/unit/test_hidden.py");
        for path in [
            "tests/unit/test_hidden.so",
            "tests/unit/test_hidden.abi3.so",
            "tests/unit/test_hidden.cpython-311-x86_64-linux-gnu.so",
            "tests/unit/test_hidden.pyc",
            "tests/unit/test_hidden/__init__.py",
            // The packages on its way: a module beside one, or its __init__.
            "tests/unit.py",
            "tests/unit.cpython-311-x86_64-linux-gnu.so",
            "tests/unit/__init__.py",
            "tests.py",
        ] {
            assert!(shadows(Path::new(path), hidden), "{path}");
        }
        for path in [
            "tests/unit/test_other.py",
            "tests/unit/test_hidden_helpers.py",
            "tests/other/__init__.py",
            "tests/other.py",
            "unit.py",
            "calc.py",
            "__init__.py",
            // A package further up is the code under test's: a fix may change it.
            "tests/__init__.py",
            // Not what Python imports.
            "tests/unit.txt",
            "tests/unit.iso",
            "tests/unit/test_hidden.md",
        ] {
            assert!(!shadows(Path::new(path), hidden), "{path}");
        }
        // Other languages' hidden tests keep only what stands in their place: the code beside
        // them is the agent's to fix.
        for (hidden, path, shadowed) in [
            ("src/calc.test.js", "src/calc.js", false),
            ("src/calc.test.js", "src/calc/index.js", false),
            ("src/calc.test.js", "src/calc.test.ts", true),
            ("src/calc.test.js", "src/calc.test/x.js", true),
            ("src/parser/tests.rs", "src/parser.rs", false),
            ("pkg/calc/calc_test.go", "pkg/calc.go", false),
            (".env.test", "calc.py", false),
            (".floe-swebench/eval.sh", ".gitignore", false),
            (".floe-swebench/eval.sh", ".floe-swebench/eval/x", true),
        ] {
            assert_eq!(
                shadows(Path::new(path), Path::new(hidden)),
                shadowed,
                "{path} beside {hidden}"
            );
        }
    }

    #[test]
    fn a_test_packages_own_init_is_kept_for_its_protected_modules() {
        // A test patch's module in a test package: its `__init__` could redirect it.
        let module = Path::new("tests/utils_tests/test_text.py");
        assert!(test_package_init(
            Path::new("tests/utils_tests/__init__.py"),
            module
        ));
        assert!(test_package_init(
            Path::new("tests/utils_tests/__init__.so"),
            module
        ));
        let nested = Path::new("astropy/units/tests/test_quantity.py");
        assert!(test_package_init(
            Path::new("astropy/units/tests/__init__.py"),
            nested
        ));
        // A test package further up the way too (`tests.unit` of `tests.unit.foo.test_x`).
        assert!(test_package_init(Path::new("tests/__init__.py"), module));
        let deep = Path::new("tests/unit/foo/test_x.py");
        assert!(test_package_init(Path::new("tests/unit/__init__.py"), deep));
        // The code under test's packages stay the agent's to fix.
        assert!(!test_package_init(
            Path::new("astropy/units/__init__.py"),
            nested
        ));
        assert!(!test_package_init(Path::new("astropy/__init__.py"), nested));
        assert!(!test_package_init(
            Path::new("tests/other/__init__.py"),
            module
        ));
        assert!(!test_package_init(Path::new("__init__.py"), module));
        let among_code = Path::new("django/contrib/admin/tests.py");
        assert!(!test_package_init(
            Path::new("django/contrib/admin/__init__.py"),
            among_code
        ));
        assert!(!test_package_init(
            Path::new("tests/utils_tests/helpers.py"),
            module
        ));
    }

    #[test]
    fn only_a_literal_python_path_names_a_module() {
        assert_eq!(
            literal_module("tests/utils_tests/test_text.py").as_deref(),
            Some("tests/utils_tests/test_text.py")
        );
        assert_eq!(
            literal_module("tests/test_[[]odd[]].py").as_deref(),
            Some("tests/test_[odd].py")
        );
        for pattern in [
            "tests/**",
            "**/conftest.py",
            "tests/test_?.py",
            "a/{b,c}.py",
            "t.json",
        ] {
            assert_eq!(literal_module(pattern), None, "{pattern}");
        }
    }
}
