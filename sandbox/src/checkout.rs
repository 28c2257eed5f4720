//! A task's `repository`: the workspace becomes a git repository's tree at one commit, with that
//! commit as its only history.
//!
//! One commit and no more, because a repository's later history holds the fix: an agent that
//! can `git log --all` (or read a tag made after the base commit) can copy it. The public
//! SWE-bench images keep the whole clone in `/testbed`; the workspace gets a fresh `.git` with
//! the base commit fetched at depth 1, no tags, no remote.
//!
//! When the repository's own checkout is at that commit (an image's `/testbed`), its working
//! tree is copied as it is — build products included (in-place extensions, `*.egg-info`) that
//! the image's environment needs and git does not hold. Otherwise (a local checkout of many
//! instances) the workspace is the commit's tree.

use std::path::Path;
use std::process::Stdio;

use floe_crds::rollout_job::TaskRepository;

use crate::workspace;

/// Makes `ws` (an existing directory) the repository's tree at its commit.
pub async fn check_out(repository: &TaskRepository, ws: &Path) -> Result<(), String> {
    check_out_from(Path::new(&repository.path), &repository.commit, ws).await
}

/// The same for a workspace that already holds a copy of the repository (a pod's seed step
/// copied the image's directory in): its `.git`, with all its history, is replaced by one
/// holding the commit alone, built in `scratch` (runner-private).
pub async fn check_out_in_place(commit: &str, ws: &Path, scratch: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let sha = git(
        ws,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{commit}^{{commit}}"),
        ],
    )
    .await
    .map_err(|e| format!("the seeded repository has no commit {commit}: {e}"))?;
    let head = git(ws, &["rev-parse", "--verify", "--quiet", "HEAD"])
        .await
        .unwrap_or_default();
    git(scratch, &["init", "-q"]).await?;
    let url = format!("file://{}", ws.display());
    git(
        scratch,
        &[
            "fetch",
            "-q",
            "--depth",
            "1",
            "--no-tags",
            // The source's own process reads it, without this command's `-c` (git clears them
            // for a local repository): a root runner (a SWE-bench pod's grader) reading the
            // seed's copy, which the agent's user owns, would be refused it as "dubious".
            "--upload-pack=git -c safe.directory=* upload-pack",
            &url,
            &sha,
        ],
    )
    .await?;
    let old = ws.join(".git");
    std::fs::remove_dir_all(&old).map_err(|e| format!("{}: {e}", old.display()))?;
    workspace::copy_tree(&scratch.join(".git"), &old).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(scratch);
    let _ = std::fs::remove_file(old.join("FETCH_HEAD"));
    if head == sha {
        // The index as the commit; the working tree stays the image's (its build products too).
        git(ws, &["reset", "-q", &sha]).await?;
    } else {
        // A copy checked out elsewhere: the commit's files, untracked ones kept.
        git(ws, &["reset", "-q", "--hard", &sha]).await?;
    }
    history_shown_as_the_images(ws).await?;
    tracing::info!(commit = %sha, "checked out in place");
    Ok(())
}

async fn check_out_from(source: &Path, commit: &str, ws: &Path) -> Result<(), String> {
    if !source.is_dir() {
        return Err(format!(
            "the task's repository {} is not a directory here",
            source.display()
        ));
    }
    let wanted = format!("{commit}^{{commit}}");
    let sha = git(source, &["rev-parse", "--verify", "--quiet", &wanted])
        .await
        .map_err(|e| {
            format!(
                "the task's repository {} has no commit {commit}: {e}",
                source.display(),
            )
        })?;
    let head = git(source, &["rev-parse", "--verify", "--quiet", "HEAD"])
        .await
        .unwrap_or_default();
    let url = format!("file://{}", source.display());
    git(ws, &["init", "-q"]).await?;
    git(
        ws,
        &["fetch", "-q", "--depth", "1", "--no-tags", &url, &sha],
    )
    .await?;
    if head == sha {
        workspace::copy_tree_except(source, ws, &[".git"]).map_err(|e| e.to_string())?;
        // The index as the commit: `git status` shows what the image changed and the agent will.
        git(ws, &["reset", "-q", &sha]).await?;
    } else {
        git(ws, &["reset", "-q", "--hard", &sha]).await?;
    }
    // It names where the commit came from; nothing the agent needs.
    let _ = std::fs::remove_file(ws.join(".git/FETCH_HEAD"));
    history_shown_as_the_images(ws).await?;
    tracing::info!(commit = %sha, from = %source.display(), working_tree = head == sha, "checked out");
    Ok(())
}

/// The base commit fetched alone has no parent, so `git show` (which SWE-bench's eval scripts
/// run before the tests) printed the whole tree as its diff: megabytes of a large repository
/// in the evaluation's log, past what its grading reads. In the images, with their history,
/// it prints one commit's change; here it prints the commit alone.
async fn history_shown_as_the_images(ws: &Path) -> Result<(), String> {
    git(ws, &["config", "log.showRoot", "false"])
        .await
        .map(drop)
}

/// Whether `patch` applies to the commit of the repository in `dir` (its index, which a
/// checkout leaves as the commit): checked on the untouched snapshot, so a patch that does not
/// apply is the instance's fault, never the agent's.
pub async fn patch_applies(dir: &Path, patch: &str) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(["-c", "safe.directory=*", "-C"])
        .arg(dir)
        .args(["apply", "--check", "--cached", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let out = crate::process::output_with_input(cmd, patch.as_bytes().to_vec())
        .await
        .map_err(|e| format!("git apply: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// `git -C dir args…`, its trimmed stdout; an error says what failed.
async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new("git")
        // An image's repository belongs to whoever built it; the session runs as another user.
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "protocol.file.allow=always",
            "-C",
        ])
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("git (the task's repository needs git in the sandbox image): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.email=t@t",
                "-c",
                "user.name=t",
                "-c",
                "safe.directory=*",
                "-C",
            ])
            .arg(dir)
            .args(args)
            .output()
            .expect("git");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A repository with a base commit, a later "fix" commit and a tag on it.
    fn repository(root: &Path) -> (std::path::PathBuf, String) {
        let src = root.join("src");
        std::fs::create_dir_all(&src).expect("mkdir");
        run(&src, &["init", "-q"]);
        std::fs::write(src.join("calc.py"), "def add(a, b):\n    return a - b\n").expect("w");
        run(&src, &["add", "."]);
        run(&src, &["commit", "-qm", "base"]);
        let base = run(&src, &["rev-parse", "HEAD"]);
        std::fs::write(src.join("calc.py"), "def add(a, b):\n    return a + b\n").expect("w");
        run(&src, &["commit", "-qam", "the fix"]);
        run(&src, &["tag", "v1"]);
        (src, base)
    }

    #[tokio::test]
    async fn the_workspace_has_the_base_commit_and_no_later_history() {
        let root = tempfile::tempdir().expect("tmp");
        let (src, base) = repository(root.path());
        let ws = root.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        let repo = TaskRepository {
            path: src.to_string_lossy().into(),
            commit: base[..12].to_string(),
        };
        check_out(&repo, &ws).await.expect("checkout");
        assert_eq!(
            std::fs::read_to_string(ws.join("calc.py")).expect("read"),
            "def add(a, b):\n    return a - b\n"
        );
        assert_eq!(run(&ws, &["rev-parse", "HEAD"]), base);
        assert_eq!(run(&ws, &["log", "--all", "--format=%s"]), "base");
        assert_eq!(run(&ws, &["tag"]), "");
        assert_eq!(run(&ws, &["remote"]), "");
        assert_eq!(run(&ws, &["status", "--porcelain"]), "");
        // SWE-bench's eval scripts run `git show`: the commit, not the whole tree as its diff.
        assert!(!run(&ws, &["show"]).contains("calc.py"), "no root diff");
        let all_objects = run(&ws, &["cat-file", "--batch-all-objects", "--batch-check"]);
        assert!(!all_objects.contains("commit") || all_objects.matches("commit").count() == 1);
    }

    /// A SWE-bench pod's grader runs as root, and the seed it checks out in place is the
    /// agent's user's: git reads another user's repository only when told it is safe.
    #[tokio::test]
    async fn a_root_runner_checks_out_a_seed_another_user_owns() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: a repository of another user's cannot be made here");
            return;
        }
        let root = tempfile::tempdir().expect("tmp");
        let (src, base) = repository(root.path());
        run(&src, &["checkout", "-q", &base]);
        crate::sandbox_user::give(&src, 1000, 1000).expect("given");
        check_out_in_place(&base, &src, &root.path().join("scratch"))
            .await
            .expect("in place");
        assert_eq!(run(&src, &["log", "--all", "--format=%s"]), "base");
    }

    #[tokio::test]
    async fn a_seeded_workspace_keeps_its_files_and_loses_its_later_history() {
        let root = tempfile::tempdir().expect("tmp");
        let (src, base) = repository(root.path());
        // The seed: the image's directory copied whole, `.git` and a build product included,
        // checked out at the base commit as the public images are.
        run(&src, &["checkout", "-q", &base]);
        std::fs::write(src.join("_ext.so"), "built").expect("w");
        check_out_in_place(&base, &src, &root.path().join("scratch"))
            .await
            .expect("in place");
        assert_eq!(run(&src, &["log", "--all", "--format=%s"]), "base");
        assert_eq!(run(&src, &["tag"]), "");
        assert_eq!(run(&src, &["status", "--porcelain"]), "?? _ext.so");
        assert!(!run(&src, &["show"]).contains("calc.py"), "no root diff");
        assert!(!root.path().join("scratch").exists());
        // A copy at another commit (the fix) gets the base commit's files.
        let (other, base) = repository(&root.path().join("other"));
        check_out_in_place(&base, &other, &root.path().join("scratch"))
            .await
            .expect("in place");
        assert_eq!(
            std::fs::read_to_string(other.join("calc.py")).expect("read"),
            "def add(a, b):\n    return a - b\n"
        );
        assert_eq!(run(&other, &["log", "--all", "--format=%s"]), "base");
    }

    #[tokio::test]
    async fn a_checkout_at_the_commit_keeps_its_untracked_build_products() {
        let root = tempfile::tempdir().expect("tmp");
        let (src, _) = repository(root.path());
        let head = run(&src, &["rev-parse", "HEAD"]);
        std::fs::write(src.join("_ext.so"), "built").expect("w");
        let ws = root.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        let repo = TaskRepository {
            path: src.to_string_lossy().into(),
            commit: "HEAD".into(),
        };
        check_out(&repo, &ws).await.expect("checkout");
        assert_eq!(
            std::fs::read_to_string(ws.join("_ext.so")).expect("read"),
            "built"
        );
        assert_eq!(run(&ws, &["rev-parse", "HEAD"]), head);
        assert_eq!(run(&ws, &["status", "--porcelain"]), "?? _ext.so");
        // A commit it lacks is the task's error, said with the repository.
        let missing = TaskRepository {
            path: src.to_string_lossy().into(),
            commit: "0000000000000000000000000000000000000001".into(),
        };
        let other = root.path().join("ws2");
        std::fs::create_dir(&other).expect("mkdir");
        let err = check_out(&missing, &other)
            .await
            .expect_err("no such commit");
        assert!(
            err.contains("has no commit 0000000000000000000000000000000000000001"),
            "{err}"
        );
    }
}
