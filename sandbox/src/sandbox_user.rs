//! Whom the sandboxed processes are on the host when `floe run` is root.
//!
//! Bubblewrap maps the sandbox's user to the user that started it. For root that made the
//! agent host root to the file system (without root's capabilities): every file only root may
//! read was readable, root's home included, and every file it wrote was root's. In a root run
//! the sandbox is instead an unprivileged host user of its own (`--sandbox-user`, by default
//! `nobody`):
//! - floe makes one user namespace for the run, held open by an fd of its own, that maps root
//!   to root (bubblewrap sets the sandbox up as root, reading every path it binds as today) and
//!   the sandbox's uid 1000 to that host user; bubblewrap joins it (`--userns`) and keeps only
//!   `CAP_SETUID`/`CAP_SETGID`, with which `floe sandbox-exec`, the sandbox's first process,
//!   becomes uid 1000 before anything else runs ([`become_sandbox_user`]);
//! - what the agent is given to write (its workspace, its home, the evaluation copy) is that
//!   user's ([`give`]);
//! - a host directory that user cannot enter on the way to what the sandbox needs (the
//!   directories on `PATH`, `--out`) is shown as one it can pass through (mode 0711) holding
//!   only the entries on the way; root's home (mode 0700) holding its directories, each with
//!   its own mode, and none of its files ([`narrowed_here`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The uid/gid the sandboxed processes have in their user namespace: not root (some harnesses
/// refuse to run as root, and nothing in the sandbox needs it).
pub const INSIDE: u32 = 1000;

/// `--sandbox-user`'s default: `nobody`/`nogroup`, an identity that owns nothing.
pub const DEFAULT: (u32, u32) = (65534, 65534);

/// The file descriptor bubblewrap is given the run's user namespace on (`--userns 5`).
pub const USERNS_FD: &str = "5";

/// The shell that opens the run's user namespace on [`USERNS_FD`] for the `bwrap` it becomes:
/// `sh -c OPEN_USERNS floe-userns PATH bwrap ARGS…`; exit 125 if it cannot (before the
/// program exists, so a sandbox that never announced its start).
pub const OPEN_USERNS: &str = r#"exec 5<"$1" || exit 125; shift; exec "$@""#;

/// The host user a root run's sandboxes are, and the user namespace that maps them to it.
#[derive(Clone, Debug)]
pub struct SandboxUser {
    pub uid: u32,
    pub gid: u32,
    /// `/proc/<this process>/fd/<n>`: the namespace, held open for as long as any clone lives.
    userns_path: PathBuf,
    _userns: Arc<std::fs::File>,
}

impl PartialEq for SandboxUser {
    fn eq(&self, other: &Self) -> bool {
        (self.uid, self.gid, &self.userns_path) == (other.uid, other.gid, &other.userns_path)
    }
}

impl Eq for SandboxUser {}

#[derive(Debug, thiserror::Error)]
pub enum SandboxUserError {
    #[error("the sandbox's host user must not be root (uid/gid 0)")]
    Root,
    #[error("cannot make the sandbox's user namespace ({step}): {source}")]
    Namespace {
        step: &'static str,
        source: std::io::Error,
    },
}

impl SandboxUser {
    /// Makes the run's user namespace (root only: writing another uid's mapping needs
    /// `CAP_SETUID`). A child (`floe sandbox-userns`, [`hold_new_namespace`]) enters a new user
    /// namespace and waits; its maps are written from here, the namespace is kept through
    /// `/proc/<child>/ns/user`, and the child is let go.
    pub fn create(floe: &Path, uid: u32, gid: u32) -> Result<Self, SandboxUserError> {
        use std::io::{BufRead, Write};
        if uid == 0 || gid == 0 {
            return Err(SandboxUserError::Root);
        }
        let step = |step| move |source| SandboxUserError::Namespace { step, source };
        let mut holder = std::process::Command::new(floe)
            .arg(HOLDER_COMMAND)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(step("a child in a new namespace"))?;
        let written = (|| {
            let mut said = String::new();
            if let Some(out) = holder.stdout.as_mut() {
                std::io::BufReader::new(out).read_line(&mut said)?;
            }
            if said.trim() != HOLDER_READY {
                return Err(std::io::Error::other(
                    "the child did not enter a new user namespace",
                ));
            }
            let proc_dir = PathBuf::from(format!("/proc/{}", holder.id()));
            // Each map in one write, as the kernel requires.
            for (file, host) in [("uid_map", uid), ("gid_map", gid)] {
                let map = format!("0 0 1\n{INSIDE} {host} 1\n");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(proc_dir.join(file))?
                    .write_all(map.as_bytes())?;
            }
            std::fs::File::open(proc_dir.join("ns/user"))
        })();
        drop(holder.stdin.take());
        let _ = holder.kill();
        let _ = holder.wait();
        let userns = written.map_err(step("its maps"))?;
        let userns_path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            std::os::fd::AsRawFd::as_raw_fd(&userns)
        ));
        Ok(Self {
            uid,
            gid,
            userns_path,
            _userns: Arc::new(userns),
        })
    }

    pub fn userns_path(&self) -> &Path {
        &self.userns_path
    }

    /// One that names a namespace held elsewhere (for tests of the command line).
    #[doc(hidden)]
    pub fn held_at(uid: u32, gid: u32, path: &str) -> std::io::Result<Self> {
        Ok(Self {
            uid,
            gid,
            userns_path: path.into(),
            _userns: Arc::new(std::fs::File::open("/dev/null")?),
        })
    }
}

/// The hidden `floe` subcommand that holds a new user namespace for [`SandboxUser::create`].
pub const HOLDER_COMMAND: &str = "sandbox-userns";
const HOLDER_READY: &str = "floe sandbox-userns: ready";

/// `floe sandbox-userns`: enter a new user namespace (a process of one thread, as
/// `unshare(2)` requires), say so, and wait until stdin closes.
pub fn hold_new_namespace() -> i32 {
    use std::io::{Read, Write};
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
        eprintln!("floe sandbox-userns: unshare(CLONE_NEWUSER): {e}");
        return 1;
    }
    let mut out = std::io::stdout();
    if writeln!(out, "{HOLDER_READY}")
        .and_then(|_| out.flush())
        .is_err()
    {
        return 1;
    }
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    0
}

/// `UID:GID` (or `UID`, the group the same number), for `--sandbox-user`.
pub fn parse(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text.split_once(':').unwrap_or((text, text));
    let number = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{text:?} is not UID:GID (numbers, e.g. 65534:65534)"))
    };
    match (number(uid)?, number(gid)?) {
        (0, _) | (_, 0) => Err("the sandbox's host user must not be root (uid/gid 0)".into()),
        ids => Ok(ids),
    }
}

/// Whether the user `uid`/`gid` (no supplementary groups) may pass through a directory of this
/// ownership and mode: the permission class that applies is the first that matches, as the
/// kernel checks it (an ACL is not read: a directory it opens is narrowed all the same).
pub fn searchable(owner: u32, group: u32, mode: u32, uid: u32, gid: u32) -> bool {
    let bit = if owner == uid {
        0o100
    } else if group == gid {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
}

/// A host directory the sandbox's user cannot enter, shown to it as an empty directory it can
/// pass through (mode 0711) holding only `keep`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Narrowed {
    pub dir: PathBuf,
    pub keep: Vec<Kept>,
}

/// An entry of a narrowed directory, shown to the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kept {
    /// A directory, bound read-only from the host (its own mode applies inside).
    Dir(PathBuf),
    /// A link, made again as the same link: inside, it leads through the sandbox's own view,
    /// where the hidden paths are hidden (bound, it would show its target past them).
    Link { path: PathBuf, target: PathBuf },
}

impl Kept {
    pub fn path(&self) -> &Path {
        match self {
            Kept::Dir(p) | Kept::Link { path: p, .. } => p,
        }
    }
}

/// What [`narrowed`] needs to know of the host: `stat`, the ownership and mode of a directory
/// (following links; `None`: not there, or not a directory); `link`, where a path that is itself
/// a link leads (as written in it).
pub struct Host<S, L> {
    pub stat: S,
    pub link: L,
}

/// For the paths the sandbox needs (absolute), each directory on the way that `uid`/`gid`
/// cannot enter, with the entries of it on the way to them; parents first. A closed directory
/// whose owner is neither root nor that user keeps nothing: bubblewrap sets the sandbox up as
/// root in the run's namespace, where such an owner is not mapped, so it could not read it.
pub fn narrowed<S, L>(needed: &[PathBuf], uid: u32, gid: u32, host: &Host<S, L>) -> Vec<Narrowed>
where
    S: Fn(&Path) -> Option<(u32, u32, u32)>,
    L: Fn(&Path) -> Option<PathBuf>,
{
    let mut found: BTreeMap<PathBuf, BTreeSet<Kept>> = BTreeMap::new();
    for path in needed
        .iter()
        .filter(|p| p.is_absolute() && (host.stat)(p).is_some())
    {
        let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
        ancestors.reverse();
        for dir in ancestors {
            let Some((owner, group, mode)) = (host.stat)(dir) else {
                break;
            };
            if searchable(owner, group, mode, uid, gid) {
                continue;
            }
            let kept = found.entry(dir.to_path_buf()).or_default();
            let Some(child) = path
                .strip_prefix(dir)
                .ok()
                .and_then(|rest| rest.components().next())
                .map(|c| dir.join(c))
                .filter(|_| owner == 0 || owner == uid)
            else {
                break;
            };
            if let Some(target) = (host.link)(&child) {
                // The rest of the way is the target's, which is needed as well (canonical).
                kept.insert(Kept::Link {
                    path: child,
                    target,
                });
                break;
            }
            kept.insert(Kept::Dir(child));
        }
    }
    found
        .into_iter()
        .map(|(dir, keep)| Narrowed {
            dir,
            keep: keep.into_iter().collect(),
        })
        .collect()
}

/// [`narrowed`] on this host: the directories on `path_var` (as written, and where their links
/// lead) and `more`; and each of `homes` (those of `floe run`'s user) that `uid`/`gid` cannot
/// enter, shown with every directory in it (each with its own mode, links as links) and none
/// of its files: the tools a home holds live in directories (`~/.pyenv`, `~/miniconda3`,
/// `~/.cache`), its loose secrets in files (`~/.env`, `~/.netrc`).
pub fn narrowed_here(
    path_var: Option<&str>,
    more: &[PathBuf],
    homes: &[PathBuf],
    uid: u32,
    gid: u32,
) -> Vec<Narrowed> {
    let host = Host {
        stat: |dir: &Path| {
            std::fs::metadata(dir)
                .ok()
                .filter(|m| m.is_dir())
                .map(|m| (m.uid(), m.gid(), m.mode()))
        },
        link: |path: &Path| {
            std::fs::symlink_metadata(path)
                .ok()
                .filter(|m| m.file_type().is_symlink())
                .and_then(|_| std::fs::read_link(path).ok())
        },
    };
    let mut needed: Vec<PathBuf> = more.to_vec();
    for dir in path_var
        .unwrap_or_default()
        .split(':')
        .filter(|d| d.starts_with('/'))
    {
        let dir = PathBuf::from(dir);
        if let Ok(real) = std::fs::canonicalize(&dir) {
            needed.push(real);
        }
        needed.push(dir);
    }
    let mut all = narrowed(&needed, uid, gid, &host);
    for home in homes {
        let Some((owner, group, mode)) = (host.stat)(home) else {
            continue;
        };
        if searchable(owner, group, mode, uid, gid) {
            continue;
        }
        let readable = owner == 0 || owner == uid;
        let dirs = std::fs::read_dir(home)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|_| readable)
            .map(|e| e.path())
            .filter(|p| (host.stat)(p).is_some())
            .map(|p| match (host.link)(&p) {
                Some(target) => Kept::Link { path: p, target },
                None => Kept::Dir(p),
            });
        match all.iter_mut().find(|n| &n.dir == home) {
            Some(n) => n.keep.extend(dirs),
            None => all.push(Narrowed {
                dir: home.clone(),
                keep: dirs.collect(),
            }),
        }
    }
    for n in &mut all {
        n.keep.sort();
        n.keep.dedup();
    }
    // Parents first: a narrowed directory inside another is mounted over what that one keeps.
    all.sort_by(|a, b| a.dir.cmp(&b.dir));
    all
}

/// Makes `root` and everything under it `uid`/`gid`'s, links themselves and never what they
/// point to: what the sandbox is given to write (floe made it, as root). Below `root` it moves
/// through directory descriptors, one name at a time: the evaluation copy holds whatever
/// the agent left, and a path of its longer than `PATH_MAX` (twenty directories of 255-byte
/// names) must not fail the hand-over, which would make its session infrastructure's.
pub fn give(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        give_below(&crate::tree::Dir::open(root)?, uid, gid)?;
    }
    Ok(())
}

fn give_below(dir: &crate::tree::Dir, uid: u32, gid: u32) -> std::io::Result<()> {
    // The names first, then down: one descriptor a level (the evaluation copy may be 257
    // levels deep), not also the one a directory being read holds.
    for name in dir.names()? {
        dir.chown(&name, uid, gid)?;
        if let Some(crate::tree::Kind::Dir) = dir.kind(&name)? {
            give_below(&dir.subdir(&name)?, uid, gid)?;
        }
    }
    Ok(())
}

/// In `floe sandbox-exec`, before anything else runs: become [`INSIDE`] (the host user the
/// run's namespace maps it to), with no supplementary group and no capability left in any set,
/// the bounding and ambient ones included, which is checked.
pub fn become_sandbox_user(uid: u32, gid: u32) -> Result<(), String> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    use rustix::thread::{CapabilitySet, CapabilitySets};
    // Each capability on its own, those this kernel knows (it refuses to read the others).
    let known = || {
        CapabilitySet::all()
            .iter()
            .filter(|c| rustix::thread::capability_is_in_bounding_set(*c).is_ok())
    };
    for cap in known() {
        if rustix::thread::capability_is_in_bounding_set(cap) == Ok(true) {
            rustix::thread::remove_capability_from_bounding_set(cap)
                .map_err(|e| format!("dropping {cap:?} from the bounding set: {e}"))?;
        }
    }
    rustix::thread::clear_ambient_capability_set().map_err(|e| format!("ambient set: {e}"))?;
    setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    let (g, u) = (Gid::from_raw(gid), Uid::from_raw(uid));
    setresgid(g, g, g).map_err(|e| format!("setresgid({gid}): {e}"))?;
    setresuid(u, u, u).map_err(|e| format!("setresuid({uid}): {e}"))?;
    // Leaving uid 0 clears the permitted, effective and ambient sets; the inheritable one is
    // cleared here, and every set checked.
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(|e| format!("capset: {e}"))?;
    let left = rustix::thread::capabilities(None).map_err(|e| format!("capget: {e}"))?;
    let kept = known().find(|c| {
        rustix::thread::capability_is_in_bounding_set(*c) == Ok(true)
            || rustix::thread::capability_is_in_ambient_set(*c) == Ok(true)
    });
    if !(left.effective.is_empty() && left.permitted.is_empty() && left.inheritable.is_empty())
        || kept.is_some()
    {
        return Err(format!(
            "capabilities are left after becoming the sandbox's user: {left:?}, {kept:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_permission_class_is_the_first_that_matches() {
        // Owner class: 0700 for its owner, not the others.
        assert!(searchable(0, 0, 0o700, 0, 0));
        assert!(!searchable(0, 0, 0o700, 65534, 65534));
        // The owner's bits rule the owner even when the others' would let them through.
        assert!(!searchable(5, 0, 0o071, 5, 9));
        assert!(searchable(0, 9, 0o710, 65534, 9));
        assert!(searchable(0, 0, 0o711, 65534, 65534));
        assert!(searchable(0, 0, 0o755, 65534, 65534));
    }

    #[test]
    fn only_the_entries_on_the_way_to_what_is_needed_are_kept() {
        // /root 0700 holding a harness under ~/.cache, a pyenv Python and a link to tools;
        // /srv/locked 0750 holding tools; /home/alice 0700, alice's; /usr/bin open.
        let host = Host {
            stat: |dir: &Path| -> Option<(u32, u32, u32)> {
                match dir.to_str()? {
                    "/" | "/usr" | "/usr/bin" | "/srv" | "/home" | "/opt" => Some((0, 0, 0o755)),
                    "/root" => Some((0, 0, 0o700)),
                    "/root/.cache" | "/root/.cache/h" | "/root/.pyenv" => Some((0, 0, 0o755)),
                    "/root/.cache/h/bin" | "/root/.pyenv/shims" => Some((0, 0, 0o755)),
                    "/root/tools" | "/opt/tools" | "/root/tools/bin" => Some((0, 0, 0o755)),
                    "/srv/locked" => Some((0, 50, 0o750)),
                    "/srv/locked/tools" => Some((0, 50, 0o755)),
                    "/home/alice" => Some((1000, 1000, 0o700)),
                    "/home/alice/bin" => Some((1000, 1000, 0o755)),
                    _ => None,
                }
            },
            link: |path: &Path| (path == Path::new("/root/tools")).then(|| "/opt/tools".into()),
        };
        let needed: Vec<PathBuf> = [
            "/usr/bin",
            "/root/.cache/h/bin",
            "/root/.pyenv/shims",
            "/root/tools/bin",
            "/srv/locked/tools",
            "/home/alice/bin",
            "/root/missing/bin",
            "relative/bin",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let narrowed = narrowed(&needed, 65534, 65534, &host);
        assert_eq!(
            narrowed,
            vec![
                // alice's: bubblewrap, root in the run's namespace, could not read it.
                Narrowed {
                    dir: "/home/alice".into(),
                    keep: vec![],
                },
                Narrowed {
                    dir: "/root".into(),
                    keep: vec![
                        Kept::Dir("/root/.cache".into()),
                        Kept::Dir("/root/.pyenv".into()),
                        Kept::Link {
                            path: "/root/tools".into(),
                            target: "/opt/tools".into()
                        },
                    ],
                },
                Narrowed {
                    dir: "/srv/locked".into(),
                    keep: vec![Kept::Dir("/srv/locked/tools".into())],
                },
            ]
        );
        // The group that may enter is not narrowed for a member.
        assert_eq!(self::narrowed(&needed[4..5], 65534, 50, &host), vec![]);
    }

    #[test]
    fn a_closed_home_shows_its_directories_and_none_of_its_files(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        let home = root.join("home");
        for dir in [
            ".pyenv/shims",
            ".cache/tool/bin",
            "private/bin",
            "../data/cache",
        ] {
            std::fs::create_dir_all(home.join(dir))?;
        }
        std::fs::write(home.join(".env"), "TOKEN=x\n")?;
        std::os::unix::fs::symlink(root.join("data/cache"), home.join("cached"))?;
        std::os::unix::fs::symlink(home.join(".env"), home.join("env-link"))?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
        std::fs::set_permissions(home.join("private"), std::fs::Permissions::from_mode(0o700))?;
        let path_var = format!("/usr/bin:{}", home.join("private/bin").display());
        // As a user that is neither the home's owner nor in its group.
        let (uid, gid) = (4_000_000_000, 4_000_000_000);
        let owner = std::fs::metadata(&home)?;
        let narrowed = narrowed_here(Some(&path_var), &[], std::slice::from_ref(&home), uid, gid);
        // Its directories only, a link to one as a link (never its files, nor a link to one);
        // and only when bubblewrap, root in the run's namespace, could read them: root's.
        let mut want = vec![Narrowed {
            dir: home.clone(),
            keep: vec![],
        }];
        if owner.uid() == 0 {
            want[0].keep = vec![
                Kept::Dir(home.join(".cache")),
                Kept::Dir(home.join(".pyenv")),
                Kept::Dir(home.join("private")),
                Kept::Link {
                    path: home.join("cached"),
                    target: root.join("data/cache"),
                },
            ];
            // Closed itself, and on the way to PATH: only that.
            want.push(Narrowed {
                dir: home.join("private"),
                keep: vec![Kept::Dir(home.join("private/bin"))],
            });
        }
        assert_eq!(narrowed, want);
        // Its owner enters it: nothing to narrow.
        assert_eq!(
            narrowed_here(Some(&path_var), &[], &[home], owner.uid(), owner.gid()),
            vec![]
        );
        Ok(())
    }

    #[test]
    fn giving_a_tree_never_follows_its_links() -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let outside = root.path().join("outside");
        std::fs::write(&outside, "not the sandbox's")?;
        let tree = root.path().join("ws");
        std::fs::create_dir_all(tree.join("a/b"))?;
        std::fs::write(tree.join("a/b/f"), "x")?;
        std::os::unix::fs::symlink(&outside, tree.join("a/link"))?;
        let me = std::fs::metadata(&outside)?;
        // Root gives it away; anyone else can only give it to themselves.
        let (uid, gid) = match me.uid() {
            0 => (65534, 65534),
            _ => (me.uid(), me.gid()),
        };
        give(&tree, uid, gid)?;
        for p in ["", "a", "a/b", "a/b/f"] {
            let m = std::fs::metadata(tree.join(p))?;
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
        }
        let link = std::fs::symlink_metadata(tree.join("a/link"))?;
        assert_eq!((link.uid(), link.gid()), (uid, gid));
        // What the link points to keeps its owner.
        let after = std::fs::metadata(&outside)?;
        assert_eq!((after.uid(), after.gid()), (me.uid(), me.gid()));
        Ok(())
    }

    #[test]
    fn a_tree_deeper_than_path_max_is_given_whole() -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let me = std::fs::metadata(root.path())?;
        let (uid, gid) = match me.uid() {
            0 => (65534, 65534),
            _ => (me.uid(), me.gid()),
        };
        // Twenty directories of 255-byte names: a path of over 5,000 bytes to the file.
        let name = std::ffi::OsString::from("a".repeat(255));
        let mut dir = crate::tree::Dir::open(root.path())?;
        for _ in 0..20 {
            dir = dir.mkdir(&name)?;
        }
        drop(dir.create_file(std::ffi::OsStr::new("deep"), 0o644)?);
        give(root.path(), uid, gid)?;
        let mut dir = crate::tree::Dir::open(root.path())?;
        for _ in 0..20 {
            dir = dir.subdir(&name)?;
        }
        let file = dir.open_file(std::ffi::OsStr::new("deep"))?;
        let m = file.metadata()?;
        assert_eq!((m.uid(), m.gid()), (uid, gid));
        Ok(())
    }

    #[test]
    fn the_host_user_is_given_as_numbers_and_never_root() {
        assert_eq!(parse("65534:65534"), Ok((65534, 65534)));
        assert_eq!(parse("1234"), Ok((1234, 1234)));
        assert_eq!(parse("1234:100"), Ok((1234, 100)));
        assert!(parse("0:0").is_err());
        assert!(parse("1234:0").is_err());
        assert!(parse("nobody").is_err());
    }
}
