//! docs/cli.md, the `floe` command reference, is generated from the clap definitions; and every
//! `floe …` command line in README.md and docs/*.md must name a real subcommand and real flags.
//! Regenerate docs/cli.md with `FLOE_BLESS=1 cargo test -p floe --bin floe cli_reference` (also
//! run by scripts/generate.sh).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::Cli;

const REFERENCE: &str = "docs/cli.md";

/// Mismatches the docs check found that are known wrong and being fixed in the docs: each is
/// `(file, "floe … : what")`, the report line without its line number. Remove an entry once its
/// doc is fixed (the test fails on entries that no longer occur).
const KNOWN_WRONG: &[(&str, &str)] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The help as the reference shows it, the same on every machine: no terminal-width wrapping,
/// and `[env: NAME]` without the variable's value in this environment.
fn stable(cmd: clap::Command) -> clap::Command {
    cmd.term_width(0)
        .mut_args(|a| a.hide_env_values(true))
        .mut_subcommands(stable)
}

/// `floe` with its subcommands' names, global flags and `help` filled in.
fn cli() -> clap::Command {
    let mut cmd = stable(Cli::command());
    cmd.build();
    cmd
}

/// The command and its subcommands, depth first in definition order; neither the hidden ones
/// (started by floe itself) nor `help`.
fn documented(cmd: &clap::Command, out: &mut Vec<clap::Command>) {
    out.push(cmd.clone());
    for sub in cmd.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            documented(sub, out);
        }
    }
}

fn invocation(cmd: &clap::Command) -> String {
    cmd.get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

/// GitHub's anchor for a heading `` `floe x y` ``.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ')
        .map(|c| {
            if c == ' ' {
                '-'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

fn reference_markdown() -> String {
    let mut commands = Vec::new();
    documented(&cli(), &mut commands);
    let mut md = String::from("# `floe` command reference\n\n");
    md.push_str(
        "<!-- Generated from the clap definitions in cli/src: do not edit. Regenerate with\n\
         `FLOE_BLESS=1 cargo test -p floe --bin floe cli_reference` (or scripts/generate.sh). -->\n\n",
    );
    md.push_str(
        "Each command's `--help`. Subcommands that floe starts itself (hidden from `floe --help`) \
         are left out.\n\n",
    );
    for cmd in &commands {
        let name = invocation(cmd);
        md.push_str(&format!("- [`{name}`](#{})\n", anchor(&name)));
    }
    for cmd in &mut commands {
        let name = invocation(cmd);
        md.push_str(&format!("\n## `{name}`\n\n"));
        if let Some(about) = cmd.get_about() {
            md.push_str(&format!("{about}\n\n"));
        }
        let help = cmd.render_long_help().to_string();
        md.push_str("```text\n");
        for line in help.trim_end().lines() {
            md.push_str(line.trim_end());
            md.push('\n');
        }
        md.push_str("```\n");
    }
    md
}

#[test]
fn cli_reference_matches_the_definitions() {
    let expected = reference_markdown();
    let path = root().join(REFERENCE);
    if std::env::var_os("FLOE_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("write docs/cli.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{REFERENCE} is out of date with the clap definitions; run \
         `FLOE_BLESS=1 cargo test -p floe --bin floe cli_reference` and commit the result"
    );
}

/// A stretch of markdown that may hold a command: a fenced code block's line (continued lines
/// joined) or an inline code span.
struct Snippet {
    line: usize,
    text: String,
    fenced: bool,
}

/// The fenced code lines and inline code spans of a markdown file.
fn snippets(markdown: &str) -> Vec<Snippet> {
    let mut out = Vec::new();
    // The prose, with fenced blocks blanked (lines kept, for the line numbers).
    let mut prose = String::new();
    let mut fence: Option<(char, usize)> = None;
    let mut continued: Option<Snippet> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed
            .chars()
            .next()
            .filter(|c| *c == '`' || *c == '~')
            .map(|c| (c, trimmed.chars().take_while(|d| *d == c).count()))
            .filter(|(_, n)| *n >= 3);
        match (fence, marker) {
            (None, Some(open)) => fence = Some(open),
            (Some((c, n)), Some((d, m))) if c == d && m >= n && trimmed.trim_end().len() == m => {
                fence = None;
                out.extend(continued.take());
            }
            (Some(_), _) => {
                let mut snippet = continued.take().unwrap_or(Snippet {
                    line: i + 1,
                    text: String::new(),
                    fenced: true,
                });
                match line.trim_end().strip_suffix('\\') {
                    Some(head) => {
                        snippet.text.push_str(head);
                        snippet.text.push(' ');
                        continued = Some(snippet);
                    }
                    None => {
                        snippet.text.push_str(line);
                        out.push(snippet);
                    }
                }
                prose.push('\n');
                continue;
            }
            (None, None) => prose.push_str(line),
        }
        prose.push('\n');
    }
    out.extend(continued);
    // Inline spans: a run of n backticks up to the next run of exactly n, within a paragraph.
    let bytes = prose.as_bytes();
    let run_at = |at: usize| bytes[at..].iter().take_while(|b| **b == b'`').count();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'`' {
            at += 1;
            continue;
        }
        let n = run_at(at);
        let start = at + n;
        let mut end = start;
        let close = loop {
            match prose[end..].find('`') {
                None => break None,
                Some(offset) => {
                    end += offset;
                    let m = run_at(end);
                    if m == n {
                        break Some(end);
                    }
                    end += m;
                }
            }
        };
        match close {
            Some(close) if !prose[start..close].contains("\n\n") => {
                out.push(Snippet {
                    line: prose[..at].matches('\n').count() + 1,
                    text: prose[start..close].replace('\n', " "),
                    fenced: false,
                });
                at = close + n;
            }
            _ => at = start,
        }
    }
    out
}

fn is_env_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Where a word ends a command: a pipe, a list, a redirection, a comment, `--`.
fn ends_command(word: &str) -> bool {
    matches!(word, "|" | "||" | "&&" | ";" | "&" | "--" | ")")
        || word.starts_with(['#', '>', '<'])
        || word.starts_with("2>")
        || word.starts_with("|")
}

/// The words after each `floe` that starts a command in `text`.
fn invocations(text: &str) -> Vec<Vec<&str>> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut found = Vec::new();
    // Whether the next word starts a command (env assignments and a `$ ` prompt may come first).
    let mut at_start = true;
    for (i, word) in words.iter().enumerate() {
        if word.starts_with('#') {
            break;
        }
        let bare = word.strip_prefix("$(").unwrap_or(word);
        let is_floe = bare == "floe" || bare.ends_with("/floe");
        if is_floe && (at_start || bare.len() != word.len()) {
            let rest = &words[i + 1..];
            let end = rest
                .iter()
                .position(|w| ends_command(w))
                .unwrap_or(rest.len());
            found.push(rest[..end].to_vec());
        }
        at_start = if at_start && (is_env_assignment(word) || *word == "$") {
            true
        } else {
            matches!(*word, "|" | "||" | "&&" | ";") || word.ends_with(';')
        };
    }
    found
}

/// The long flags (and their aliases) of `cmd`, its global flags included; `true` where the flag
/// takes a value.
fn long_flags(cmd: &clap::Command) -> Vec<(String, bool)> {
    cmd.get_arguments()
        .flat_map(|a| {
            let takes_value = a.get_action().takes_values();
            a.get_long()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
                .map(move |l| (l.to_string(), takes_value))
        })
        .collect()
}

/// What is wrong with `floe WORDS…`, if anything: `floe x y --flag: no such flag`, one per
/// problem.
fn check(cli: &clap::Command, words: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut cmd = cli;
    let mut path = String::from("floe");
    let mut expect_subcommand = true;
    let mut skip_value = false;
    for word in words {
        let word = word.trim_start_matches(['[', '(']);
        if skip_value {
            skip_value = false;
            continue;
        }
        if let Some(flag) = word.strip_prefix("--") {
            let (name, inline_value) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name.is_empty() {
                continue;
            }
            match long_flags(cmd).into_iter().find(|(l, _)| *l == name) {
                Some((_, takes_value)) => skip_value = takes_value && !inline_value,
                None => problems.push(format!("{path} --{name}: no such flag")),
            }
            continue;
        }
        if word.starts_with('-') || !expect_subcommand {
            continue;
        }
        if cmd.has_subcommands() {
            let looks_like_a_name = word.starts_with(|c: char| c.is_ascii_lowercase())
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !looks_like_a_name {
                // A placeholder (`SUBCOMMAND`, `<command>`, `…`): nothing more to check.
                break;
            }
            match cmd.find_subcommand(word) {
                Some(sub) => {
                    path = format!("{path} {}", sub.get_name());
                    cmd = sub;
                }
                None => {
                    problems.push(format!("{path} {word}: no such subcommand"));
                    break;
                }
            }
        } else {
            // A positional argument, or a placeholder for one.
            expect_subcommand = false;
        }
    }
    problems
}

fn checked_docs() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        // Generated from the definitions it would be checked against.
        .filter(|path| path != REFERENCE)
        .collect();
    files.sort();
    files.insert(0, "README.md".to_string());
    files
}

#[test]
fn docs_command_lines_name_real_subcommands_and_flags() {
    let cli = cli();
    let mut problems = Vec::new();
    let mut known_seen = BTreeSet::new();
    for file in checked_docs() {
        let markdown = std::fs::read_to_string(root().join(&file)).expect("read doc");
        for snippet in snippets(&markdown) {
            let text = if snippet.fenced {
                snippet.text.trim_start().trim_start_matches("$ ")
            } else {
                snippet.text.trim()
            };
            for words in invocations(text) {
                for problem in check(&cli, &words) {
                    let known = KNOWN_WRONG
                        .iter()
                        .position(|(f, p)| *f == file && *p == problem);
                    match known {
                        Some(k) => {
                            known_seen.insert(k);
                        }
                        None => problems.push(format!("{file}:{}: {problem}", snippet.line)),
                    }
                }
            }
        }
    }
    let stale: Vec<String> = KNOWN_WRONG
        .iter()
        .enumerate()
        .filter(|(k, _)| !known_seen.contains(k))
        .map(|(_, (f, p))| format!("{f}: {p}"))
        .collect();
    assert!(
        problems.is_empty(),
        "command lines in the docs that `floe` does not accept:\n{}",
        problems.join("\n")
    );
    assert!(
        stale.is_empty(),
        "KNOWN_WRONG entries no longer found in the docs (fixed? remove them):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_docs_check_reads_commands_as_a_shell_would() {
    let cli = cli();
    let problems = |text: &str| -> Vec<String> {
        snippets(text)
            .iter()
            .flat_map(|s| invocations(s.text.trim_start().trim_start_matches("$ ")))
            .flat_map(|words| check(&cli, &words))
            .collect()
    };
    assert!(problems("`floe run JOB.yaml --out DIR [--concurrency N]`").is_empty());
    assert!(problems("`floe --log-format json run job.yaml --out d`").is_empty());
    assert!(problems("`floe trajectories build --builder=per_request DIR`").is_empty());
    assert!(problems("`floe crds | kubectl apply -f -`, `floe-operator --bogus`").is_empty());
    assert!(problems("```sh\n# floe run --bogus\nfloe crds # --bogus\n```\n").is_empty());
    assert!(problems("`floe sandbox-exec --listen A --socket S -- cmd --bogus`").is_empty());
    assert_eq!(
        problems("```\nFOO=1 floe gateway --listen A \\\n  --bogus\n```\n"),
        ["floe gateway --bogus: no such flag"]
    );
    assert_eq!(
        problems("x `echo $(floe crds --bogus)` and `a && /bin/floe nope`"),
        [
            "floe crds --bogus: no such flag",
            "floe nope: no such subcommand"
        ]
    );
    assert_eq!(
        problems("`floe trajectories stats\n--bogus`"),
        ["floe trajectories stats --bogus: no such flag"]
    );
}
