//! Directory trees touched only through descriptors, never through a link.
//!
//! The workspace is the agent's: by the time floe reads it (the diff) or writes next to what the
//! agent left (the evaluation copy, hidden files), any component of any path may be a symlink
//! to somewhere else (`tests -> /proc/self/cwd`), a directory mode 000, a FIFO, or a name that
//! is not UTF-8. So every operation here starts from an open directory and moves one component
//! at a time with `O_NOFOLLOW` (`openat`, `statat`, `unlinkat`, `mkdirat`): a link is read as a
//! link or removed, never followed; names are bytes. A directory floe cannot enter (mode 000 in
//! a run that is not root's) is made enterable first: the agent is gone by then, and the tree
//! is the session's own.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// What a name in a directory is (the name itself, not what a link points to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `allocated`: bytes on disk (a sparse file's holes take none).
    File {
        mode: u32,
        len: u64,
        allocated: u64,
    },
    Link(Vec<u8>),
    Dir,
    /// A FIFO, socket or device: not task content.
    Other,
}

/// An open directory.
pub struct Dir {
    fd: OwnedFd,
}

fn err(e: Errno) -> io::Error {
    io::Error::from(e)
}

impl Dir {
    /// `path` itself, which must be a directory and not a link (floe's own paths).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::open(path, dir_flags(), Mode::empty()).map_err(err)?;
        Ok(Self { fd })
    }

    /// [`Dir::open`], but a directory floe cannot enter (the agent's own root, `chmod 300`
    /// in a run that is not root's) is made enterable first, as [`Dir::subdir`] does below.
    pub fn open_entering(path: &Path) -> io::Result<Self> {
        match Self::open(path) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                    return Err(e);
                };
                // (Opened for reading: its names can be listed.)
                Self::open(parent)?.subdir(name)
            }
            other => other,
        }
    }

    /// `path`, created (with its parents) if missing.
    pub fn create(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        Self::open(path)
    }

    /// What `name` is here; `None` if nothing is.
    pub fn kind(&self, name: &OsStr) -> io::Result<Option<Kind>> {
        let stat = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        Ok(Some(match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Kind::File {
                mode: stat.st_mode & 0o7777,
                len: u64::try_from(stat.st_size).unwrap_or(0),
                allocated: u64::try_from(stat.st_blocks)
                    .unwrap_or(0)
                    .saturating_mul(512),
            },
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Link(
                rustix::fs::readlinkat(&self.fd, name, Vec::new())
                    .map_err(err)?
                    .into_bytes(),
            ),
            _ => Kind::Other,
        }))
    }

    /// The directory `name` (never through a link); one floe cannot enter is made enterable.
    pub fn subdir(&self, name: &OsStr) -> io::Result<Self> {
        match rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty()) {
            Err(Errno::ACCESS) => {
                self.add_owner_bits(name, 0o700)?;
                rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty())
            }
            other => other,
        }
        .map(|fd| Self { fd })
        .map_err(err)
    }

    /// Each name in this directory (but `.` and `..`) to `each`, as read, until it breaks: a
    /// directory of millions of names is never held in memory.
    pub fn each_name(
        &self,
        mut each: impl FnMut(&OsStr) -> std::ops::ControlFlow<()>,
    ) -> io::Result<()> {
        let mut dir = rustix::fs::Dir::read_from(&self.fd).map_err(err)?;
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(err)?;
            let bytes = entry.file_name().to_bytes();
            if bytes != b"." && bytes != b".." && each(OsStr::from_bytes(bytes)).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Every name in this directory (but `.` and `..`), as bytes.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        let mut dir = rustix::fs::Dir::read_from(&self.fd).map_err(err)?;
        while let Some(entry) = dir.read() {
            let bytes = entry.map_err(err)?.file_name().to_bytes().to_vec();
            if bytes != b"." && bytes != b".." {
                names.push(OsString::from_vec(bytes));
            }
        }
        names.sort();
        Ok(names)
    }

    /// Opens the regular file `name` for reading (never through a link); one floe cannot read
    /// is made readable.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Err(Errno::ACCESS) => {
                self.add_owner_bits(name, 0o400)?;
                rustix::fs::openat(&self.fd, name, flags, Mode::empty())
            }
            other => other,
        }
        .map_err(err)?;
        let file = File::from(fd);
        // NONBLOCK only so that a FIFO swapped in cannot block the open; a regular file's reads
        // never block, and anything else is refused here.
        if !file.metadata()?.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok(file)
    }

    /// Creates the file `name`, which must not exist (so nothing is written through a link).
    pub fn create_file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode & 0o777))
            .map_err(err)?;
        let file = File::from(fd);
        // The umask may have taken bits the copy must keep (the executable bit); set-id and
        // sticky bits are never copied (a root run would make the agent's file set-uid root).
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o777)).map_err(err)?;
        Ok(file)
    }

    pub fn symlink(&self, target: &[u8], name: &OsStr) -> io::Result<()> {
        rustix::fs::symlinkat(OsStr::from_bytes(target), &self.fd, name).map_err(err)
    }

    /// Makes the directory `name` (an existing one is kept) and opens it.
    pub fn mkdir(&self, name: &OsStr) -> io::Result<Self> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => self.subdir(name),
            Err(e) => Err(err(e)),
        }
    }

    /// Makes `name` (itself, never what a link points to) `uid`/`gid`'s.
    pub fn chown(&self, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
        let (uid, gid) = (
            rustix::fs::Uid::from_raw(uid),
            rustix::fs::Gid::from_raw(gid),
        );
        rustix::fs::chownat(
            &self.fd,
            name,
            Some(uid),
            Some(gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(err)
    }

    /// Removes `name` whatever it is (a directory with everything in it), never following a
    /// link; nothing there is not an error. The tree may be as deep as the code that made it
    /// liked (what the code under test leaves is held to no cap): it is emptied from a stack of
    /// its own, no recursion (20,000 levels would overflow a thread's stack), with at most
    /// [`REMOVE_DEPTH`] directories open at once; a directory below that is moved up to `name`
    /// itself (renamed by descriptor, within the tree) and emptied from there.
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        if !matches!(self.kind(name)?, Some(Kind::Dir)) {
            return match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
                Err(Errno::NOENT) => Ok(()),
                other => other.map_err(err),
            };
        }
        let mut stack = vec![Emptying::enter(self, name)?];
        let mut moved_up = 0u64;
        while let Some(i) = stack.len().checked_sub(1) {
            let Some(inner) = stack[i].next_name()? else {
                let Some(done) = stack.pop() else { break };
                match i.checked_sub(1) {
                    None => {
                        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR).map_err(err)?
                    }
                    Some(p) => Emptying::change(&mut stack, p, self, |d| {
                        rustix::fs::unlinkat(&d.fd, &done.name, AtFlags::REMOVEDIR)
                    })?,
                }
                continue;
            };
            match stack[i].dir.kind(&inner)? {
                None => {}
                Some(Kind::Dir) if stack.len() < REMOVE_DEPTH => {
                    let next = Emptying::enter(&stack[i].dir, &inner)?;
                    stack.push(next);
                }
                Some(Kind::Dir) => {
                    // Renaming a directory writes its `..`: it must be writable, and so must
                    // the top, which takes it.
                    stack[i].dir.add_owner_bits(&inner, 0o700)?;
                    if !stack[0].writable {
                        self.add_owner_bits(name, 0o700)?;
                        stack[0].writable = true;
                    }
                    let top = stack[0].dir.reopen()?;
                    let up = loop {
                        let candidate = OsString::from(format!(".floe-removing-{moved_up}"));
                        moved_up += 1;
                        if top.kind(&candidate)?.is_none() {
                            break candidate;
                        }
                    };
                    Emptying::change(&mut stack, i, self, |d| {
                        rustix::fs::renameat(&d.fd, &inner, &top.fd, &up)
                    })?;
                }
                Some(_) => Emptying::change(&mut stack, i, self, |d| {
                    rustix::fs::unlinkat(&d.fd, &inner, AtFlags::empty())
                })?,
            }
        }
        Ok(())
    }

    /// The directory holding `rel` and its last name, made as needed: anything but a directory
    /// in the way (a link, a file) is removed, never followed. `rel` must be a safe relative
    /// path ([`crate::workspace::safe_join`]'s rules).
    pub fn make_parents(&self, rel: &Path) -> io::Result<(Self, OsString)> {
        let (parents, last) = split(rel)?;
        let mut dir = self.reopen()?;
        for name in parents {
            if !matches!(dir.kind(name)?, Some(Kind::Dir) | None) {
                dir.remove(name)?;
            }
            dir = dir.mkdir(name)?;
        }
        Ok((dir, last.to_os_string()))
    }

    /// The directory holding `rel` and its last name, if every parent is a real directory.
    pub fn find_parent(&self, rel: &Path) -> io::Result<Option<(Self, OsString)>> {
        let (parents, last) = split(rel)?;
        let mut dir = self.reopen()?;
        for name in parents {
            if dir.kind(name)? != Some(Kind::Dir) {
                return Ok(None);
            }
            dir = dir.subdir(name)?;
        }
        Ok(Some((dir, last.to_os_string())))
    }

    /// What `rel` is, without following a link anywhere on the way.
    pub fn kind_at(&self, rel: &Path) -> io::Result<Option<Kind>> {
        match self.find_parent(rel)? {
            Some((dir, name)) => dir.kind(&name),
            None => Ok(None),
        }
    }

    fn reopen(&self) -> io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
        })
    }

    fn add_owner_bits(&self, name: &OsStr, bits: u32) -> io::Result<()> {
        // Pinned first, never through a link: `chmodat` by name follows one, and the agent may
        // still be swapping names (the disk budget walks its workspace while it runs). An
        // `O_PATH` descriptor needs no permission on the file itself; its `/proc/self/fd` entry
        // is that inode, whatever the name points to by now.
        let pinned = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let stat = rustix::fs::fstat(&pinned).map_err(err)?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            return Err(io::Error::other("a link"));
        }
        let mode = Mode::from_raw_mode((stat.st_mode & 0o7777) | bits);
        let by_descriptor = format!("/proc/self/fd/{}", pinned.as_raw_fd());
        rustix::fs::chmod(by_descriptor.as_str(), mode).map_err(err)
    }
}

/// The most directories [`Dir::remove`] holds open at once.
const REMOVE_DEPTH: usize = 64;

/// A directory [`Dir::remove`] is emptying: its names as listed, and whether it was made
/// writable.
struct Emptying {
    dir: Dir,
    name: OsString,
    names: std::vec::IntoIter<OsString>,
    writable: bool,
}

impl Emptying {
    /// `parent`'s directory `name`, listed. (One it cannot enter, mode 000, `subdir` opens
    /// after adding its owner's bits; one readable but not searchable, `chmod 444`, lists no
    /// names until they are added too.)
    fn enter(parent: &Dir, name: &OsStr) -> io::Result<Self> {
        let dir = parent.subdir(name)?;
        let mut writable = false;
        let names = match dir.names() {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                parent.add_owner_bits(name, 0o700)?;
                writable = true;
                dir.names()?
            }
            other => other?,
        };
        Ok(Self {
            dir,
            name: name.to_os_string(),
            names: names.into_iter(),
            writable,
        })
    }

    /// The next name to remove; once all listed are gone, those it holds now (a directory
    /// moved up into the top one), until it is empty.
    fn next_name(&mut self) -> io::Result<Option<OsString>> {
        if let Some(name) = self.names.next() {
            return Ok(Some(name));
        }
        self.names = self.dir.names()?.into_iter();
        Ok(self.names.next())
    }

    /// `change` in `stack[i]`'s directory; refused there (made read-only, `chmod 555`, by the
    /// code the evaluator ran), its owner's bits are added (by its parent: `root` for the
    /// first) and it is tried again.
    fn change(
        stack: &mut [Emptying],
        i: usize,
        root: &Dir,
        change: impl Fn(&Dir) -> Result<(), Errno>,
    ) -> io::Result<()> {
        match change(&stack[i].dir).map_err(err) {
            Err(e) if !stack[i].writable && e.kind() == io::ErrorKind::PermissionDenied => {
                let parent = i.checked_sub(1).map_or(root, |p| &stack[p].dir);
                parent.add_owner_bits(&stack[i].name, 0o700)?;
                stack[i].writable = true;
                change(&stack[i].dir).map_err(err)
            }
            other => other,
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// `a/b/c` → (`[a, b]`, `c`); `.` components dropped; anything else refused.
fn split(rel: &Path) -> io::Result<(Vec<&OsStr>, &OsStr)> {
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            _ => return Err(io::Error::other(format!("unsafe path {rel:?}"))),
        }
    }
    let last = names
        .pop()
        .ok_or_else(|| io::Error::other(format!("empty path {rel:?}")))?;
    Ok((names, last))
}

/// Whether two open files hold the same bytes, read in chunks (a file may be larger than
/// memory).
pub fn same_content(a: &mut File, b: &mut File) -> io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(a, &mut x)?;
        let m = read_full(b, &mut y)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Copies `from` into a new file `name` in `to`, keeping its permission bits; returns the
/// bytes copied.
pub fn copy_file(from: &mut impl io::Read, mode: u32, to: &Dir, name: &OsStr) -> io::Result<u64> {
    let mut out = to.create_file(name, mode | 0o600)?;
    let n = io::copy(from, &mut out)?;
    out.flush()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_bits_go_on_the_named_directory_never_through_a_link() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir()?;
        let locked = tmp.path().join("locked");
        std::fs::create_dir(&locked)?;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000))?;
        let target = tmp.path().join("target");
        std::fs::create_dir(&target)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o500))?;
        std::os::unix::fs::symlink(&target, tmp.path().join("link"))?;
        let dir = Dir::open(tmp.path())?;
        dir.add_owner_bits(OsStr::new("locked"), 0o700)?;
        let mode = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(&locked)?, 0o700);
        assert!(dir.add_owner_bits(OsStr::new("link"), 0o700).is_err());
        assert_eq!(mode(&target)?, 0o500, "chmod went through the link");
        Ok(())
    }

    #[test]
    fn a_directory_made_read_only_goes_with_what_it_holds() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().to_path_buf();
        std::thread::spawn(move || -> io::Result<()> {
            // This thread alone without root's power over permissions (which would write any
            // directory, and the test could not fail): capabilities are per thread.
            use rustix::thread::CapabilitySet;
            let mut caps = rustix::thread::capabilities(None)?;
            caps.effective.remove(
                CapabilitySet::DAC_OVERRIDE
                    | CapabilitySet::DAC_READ_SEARCH
                    | CapabilitySet::FOWNER,
            );
            rustix::thread::set_capabilities(None, caps)?;
            let ro = root.join("ro");
            for (sub, mode) in [("a", 0o555), ("b", 0o444), ("c", 0o000)] {
                std::fs::create_dir_all(ro.join(sub))?;
                std::fs::write(ro.join(sub).join("f"), "x")?;
                std::fs::set_permissions(ro.join(sub), std::fs::Permissions::from_mode(mode))?;
            }
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555))?;
            Dir::open(&root)?.remove(OsStr::new("ro"))?;
            assert!(!ro.exists());
            Ok(())
        })
        .join()
        .map_err(|_| io::Error::other("the thread panicked"))?
    }

    /// What the code under test leaves is held to no depth: a tree deeper than a thread's
    /// stack would recurse (or than the descriptors a process may hold, one per level) goes
    /// whole, read-only directories on the way included.
    #[test]
    fn a_tree_deeper_than_a_stack_would_recurse_goes() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let top = Dir::open(tmp.path())?.mkdir(OsStr::new("deep"))?;
        let mut dir = top.reopen()?;
        for level in 0..5000 {
            dir.create_file(OsStr::new("f"), 0o644)?.write_all(b"x")?;
            if level % 700 == 0 {
                dir.mkdir(OsStr::new("ro"))?
                    .create_file(OsStr::new("g"), 0o644)?;
                rustix::fs::chmodat(&dir.fd, "ro", Mode::from_raw_mode(0o555), AtFlags::empty())
                    .map_err(err)?;
            }
            dir = dir.mkdir(OsStr::new("d"))?;
        }
        drop((top, dir));
        let root = tmp.path().to_path_buf();
        // A small stack: recursing one frame per level overflows it (and aborts the process).
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || Dir::open(&root)?.remove(OsStr::new("deep")))?
            .join()
            .map_err(|_| io::Error::other("the thread panicked"))??;
        assert!(!tmp.path().join("deep").exists());
        Ok(())
    }

    #[test]
    fn a_link_in_the_way_is_removed_not_followed() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside)?;
        let root = tmp.path().join("root");
        std::fs::create_dir(&root)?;
        std::os::unix::fs::symlink(&outside, root.join("tests"))?;
        let dir = Dir::open(&root)?;
        let (parent, name) = dir.make_parents(Path::new("tests/test_hidden.py"))?;
        parent.create_file(&name, 0o644)?.write_all(b"real")?;
        assert!(
            std::fs::read_dir(&outside)?.next().is_none(),
            "written through"
        );
        assert!(std::fs::symlink_metadata(root.join("tests"))?.is_dir());
        assert_eq!(std::fs::read(root.join("tests/test_hidden.py"))?, b"real");
        Ok(())
    }

    #[test]
    fn names_are_bytes_and_mode_000_is_entered() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir()?;
        let odd = OsStr::from_bytes(b"caf\xe9.py");
        std::fs::write(tmp.path().join(odd), "x")?;
        let locked = tmp.path().join("locked");
        std::fs::create_dir(&locked)?;
        std::fs::write(locked.join("f"), "y")?;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000))?;
        let dir = Dir::open(tmp.path())?;
        assert_eq!(
            dir.names()?,
            [OsString::from_vec(b"caf\xe9.py".to_vec()), "locked".into()]
        );
        let sub = dir.subdir(OsStr::new("locked"))?;
        assert_eq!(sub.names()?, [OsString::from("f")]);
        Ok(())
    }

    #[test]
    fn a_fifo_is_not_opened_as_a_file() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let made = std::process::Command::new("mkfifo")
            .arg(tmp.path().join("reward.json"))
            .status()?;
        assert!(made.success());
        let dir = Dir::open(tmp.path())?;
        assert_eq!(dir.kind(OsStr::new("reward.json"))?, Some(Kind::Other));
        assert!(dir.open_file(OsStr::new("reward.json")).is_err());
        Ok(())
    }
}
