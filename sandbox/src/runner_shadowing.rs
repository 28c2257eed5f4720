//! What the agent may not add where a Python test runner looks for modules first: a module
//! named after one the runner imports from elsewhere. `python -m pytest` (so `python -m
//! unittest`, or `python -c`) puts the working directory first on `sys.path`, and a script
//! run by its path (`python tests/runtests.py`) its own directory, ahead of the standard
//! library and site-packages: a `pytest.py` or `pytest/` package there *is* pytest, and one
//! that prints `1 passed` and exits 0 is the only summary the log holds, no hidden test having
//! run; a `json.py`, an `argparse.py` or a plugin's name (`anyio.py`) runs in pytest's process
//! before any test is collected. Unlike a module the tests import, nothing of the task needs
//! to touch the agent's code. Only additions are refused (what makes such a name importable
//! there where the task did not: a module file, or a package's `__init__`, a directory the
//! task has not): the repository's own files of such names stay the agent's to fix.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::import_shadowing::importable_as;

/// The standard library's top-level modules (Python 3.11's `sys.stdlib_module_names` and those
/// added up to 3.14: on 3.13 `opcode` imports `_opcode_metadata`, which pytest reaches through
/// `inspect` before any test, so a workspace's `_opcode_metadata.py` forged a run where 3.11's
/// list was all there was; with those removed since 3.11 and before: `distutils`, `imp`,
/// `asynchat`, `asyncore`, `smtpd`, and PEP 594's;
/// without `test`, which no runner imports and a workspace often adds), the test runners' own
/// (pytest with what its versions import and common plugins load at start-up, nose,
/// unittest2). Sorted. Besides, any `pytest_*` (plugins pytest loads by entry point).
const SHADOWED: &[&str] = &[
    "__future__",
    "_abc",
    "_aix_support",
    "_android_support",
    "_apple_support",
    "_ast",
    "_asyncio",
    "_bisect",
    "_blake2",
    "_bootsubprocess",
    "_bz2",
    "_codecs",
    "_codecs_cn",
    "_codecs_hk",
    "_codecs_iso2022",
    "_codecs_jp",
    "_codecs_kr",
    "_codecs_tw",
    "_collections",
    "_collections_abc",
    "_colorize",
    "_compat_pickle",
    "_compression",
    "_contextvars",
    "_crypt",
    "_csv",
    "_ctypes",
    "_curses",
    "_curses_panel",
    "_datetime",
    "_dbm",
    "_decimal",
    "_distutils_hack",
    "_elementtree",
    "_frozen_importlib",
    "_frozen_importlib_external",
    "_functools",
    "_gdbm",
    "_hashlib",
    "_heapq",
    "_hmac",
    "_hypothesis_ftz_detector",
    "_hypothesis_pytestplugin",
    "_imp",
    "_interpchannels",
    "_interpqueues",
    "_interpreters",
    "_io",
    "_ios_support",
    "_json",
    "_locale",
    "_lsprof",
    "_lzma",
    "_markupbase",
    "_md5",
    "_msi",
    "_multibytecodec",
    "_multiprocessing",
    "_opcode",
    "_opcode_metadata",
    "_operator",
    "_osx_support",
    "_overlapped",
    "_pickle",
    "_posixshmem",
    "_posixsubprocess",
    "_py_abc",
    "_py_warnings",
    "_pydatetime",
    "_pydecimal",
    "_pyio",
    "_pylong",
    "_pyrepl",
    "_pytest",
    "_queue",
    "_random",
    "_remote_debugging",
    "_scproxy",
    "_sha1",
    "_sha2",
    "_sha256",
    "_sha3",
    "_sha512",
    "_signal",
    "_sitebuiltins",
    "_socket",
    "_sqlite3",
    "_sre",
    "_ssl",
    "_stat",
    "_statistics",
    "_string",
    "_strptime",
    "_struct",
    "_suggestions",
    "_symtable",
    "_sysconfig",
    "_thread",
    "_threading_local",
    "_tkinter",
    "_tokenize",
    "_tracemalloc",
    "_typing",
    "_uuid",
    "_warnings",
    "_weakref",
    "_weakrefset",
    "_winapi",
    "_wmi",
    "_zoneinfo",
    "_zstd",
    "abc",
    "aifc",
    "annotationlib",
    "antigravity",
    "anyio",
    "argparse",
    "array",
    "ast",
    "asynchat",
    "asyncio",
    "asyncore",
    "atexit",
    "atomicwrites",
    "attr",
    "attrs",
    "audioop",
    "base64",
    "bdb",
    "binascii",
    "bisect",
    "builtins",
    "bz2",
    "cProfile",
    "calendar",
    "cgi",
    "cgitb",
    "chunk",
    "cmath",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "colorama",
    "colorsys",
    "compileall",
    "compression",
    "concurrent",
    "configparser",
    "contextlib",
    "contextvars",
    "copy",
    "copyreg",
    "coverage",
    "crypt",
    "csv",
    "ctypes",
    "curses",
    "dataclasses",
    "datetime",
    "dbm",
    "decimal",
    "difflib",
    "dis",
    "distutils",
    "doctest",
    "email",
    "encodings",
    "ensurepip",
    "enum",
    "errno",
    "exceptiongroup",
    "execnet",
    "faker",
    "faulthandler",
    "fcntl",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gc",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "grp",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "hypothesis",
    "idlelib",
    "idna",
    "imaplib",
    "imghdr",
    "imp",
    "importlib",
    "importlib_metadata",
    "iniconfig",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "lib2to3",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mailcap",
    "marshal",
    "math",
    "mimetypes",
    "mmap",
    "mock",
    "modulefinder",
    "more_itertools",
    "msilib",
    "msvcrt",
    "multiprocessing",
    "netrc",
    "nis",
    "nntplib",
    "nose",
    "nose2",
    "nt",
    "ntpath",
    "nturl2path",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "ossaudiodev",
    "packaging",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pipes",
    "pkg_resources",
    "pkgutil",
    "platform",
    "plistlib",
    "pluggy",
    "poplib",
    "posix",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "pty",
    "pwd",
    "py",
    "py_compile",
    "pyclbr",
    "pydoc",
    "pydoc_data",
    "pyexpat",
    "pygments",
    "pytest",
    "queue",
    "quopri",
    "random",
    "re",
    "readline",
    "reprlib",
    "resource",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "select",
    "selectors",
    "setuptools",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "six",
    "smtpd",
    "smtplib",
    "sndhdr",
    "sniffio",
    "socket",
    "socketserver",
    "spwd",
    "sqlite3",
    "sre_compile",
    "sre_constants",
    "sre_parse",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "sunau",
    "symtable",
    "sys",
    "sysconfig",
    "syslog",
    "tabnanny",
    "tarfile",
    "telnetlib",
    "tempfile",
    "termios",
    "textwrap",
    "this",
    "threading",
    "time",
    "timeit",
    "tkinter",
    "token",
    "tokenize",
    "toml",
    "tomli",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "trio",
    "tty",
    "turtle",
    "turtledemo",
    "types",
    "typing",
    "typing_extensions",
    "unicodedata",
    "unittest",
    "unittest2",
    "urllib",
    "uu",
    "uuid",
    "venv",
    "warnings",
    "wave",
    "wcwidth",
    "weakref",
    "webbrowser",
    "winreg",
    "winsound",
    "wsgiref",
    "xdist",
    "xdrlib",
    "xml",
    "xmlrpc",
    "zipapp",
    "zipfile",
    "zipimport",
    "zipp",
    "zlib",
    "zoneinfo",
];

/// Whether `name` is a module a runner would import in place of its own.
fn shadowed(name: &str) -> bool {
    name.starts_with("pytest_") || SHADOWED.binary_search(&name).is_ok()
}

/// Whether the agent's `path` makes a module of a [`shadowed`] name importable in one of
/// `dirs` (each relative to the tree's top, `""` the top itself) where `pristine` (the task's
/// paths) did not: a module file there (`name.py`, any file Python imports as `name`), a
/// directory of that name the task has not, or what is in it, or the `__init__` that makes a
/// directory of the task's a package.
pub(crate) fn adds_a_runner_module(
    path: &Path,
    dirs: &[PathBuf],
    pristine: &BTreeSet<PathBuf>,
) -> bool {
    dirs.iter().any(|dir| {
        let Ok(rest) = path.strip_prefix(dir) else {
            return false;
        };
        let mut parts = rest.components();
        let Some(Component::Normal(top)) = parts.next() else {
            return false;
        };
        let Some(name) = top.to_str() else {
            return false;
        };
        if !shadowed(importable_as(name).unwrap_or(name)) {
            return false;
        }
        if !pristine.contains(&dir.join(top)) {
            return true;
        }
        // A directory of the task's, made a package by an `__init__` it did not have.
        let init = parts.next().and_then(|c| c.as_os_str().to_str());
        parts.next().is_none()
            && init.and_then(importable_as) == Some("__init__")
            && !pristine.contains(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_for_its_search() {
        assert!(SHADOWED.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_runner_or_library_module_added_at_the_top_is_refused_and_nothing_else() {
        let pristine: BTreeSet<PathBuf> = [
            "calc.py",
            "tests",
            "tests/test_calc.py",
            "json",
            "json/data.txt",
            "types",
            "types/__init__.py",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let top = [PathBuf::new()];
        for refused in [
            "pytest.py",
            "pytest/__main__.py",
            "_pytest/main.py",
            "unittest.py",
            "argparse.py",
            "anyio.py",
            "pytest_timeout.py",
            "pluggy.cpython-311-x86_64-linux-gnu.so",
            "inspect/__init__.py",
            // Python 3.13's and 3.14's, imported before any test (`opcode`, `traceback`).
            "_opcode_metadata.py",
            "_colorize.py",
            "annotationlib.py",
            // The task's data directory made a package that answers for the library's.
            "json/__init__.py",
        ] {
            assert!(
                adds_a_runner_module(Path::new(refused), &top, &pristine),
                "{refused}"
            );
        }
        for allowed in [
            "calc.py",
            "helpers.py",
            "pkg/json.py",
            "json/extra.py",
            "json/sub/__init__.py",
            "types/__init__.py",
            "tests/pytest.py",
            "test/test_new.py",
            "pytest.md",
            "notes.txt",
        ] {
            assert!(
                !adds_a_runner_module(Path::new(allowed), &top, &pristine),
                "{allowed}"
            );
        }
    }

    /// A script run by its path (`python tests/runtests.py`) imports from its own directory
    /// first: there too.
    #[test]
    fn the_directory_of_a_script_the_evaluator_runs_counts_too() {
        let pristine: BTreeSet<PathBuf> = ["tests", "tests/runtests.py"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let dirs = [PathBuf::new(), PathBuf::from("tests")];
        assert!(adds_a_runner_module(
            Path::new("tests/argparse.py"),
            &dirs,
            &pristine
        ));
        assert!(adds_a_runner_module(
            Path::new("argparse.py"),
            &dirs,
            &pristine
        ));
        assert!(!adds_a_runner_module(
            Path::new("tests/helpers.py"),
            &dirs,
            &pristine
        ));
        assert!(!adds_a_runner_module(
            Path::new("pkg/argparse.py"),
            &dirs,
            &pristine
        ));
    }
}
