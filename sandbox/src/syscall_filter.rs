//! The seccomp filter every sandboxed harness and evaluator runs under (local mode, installed by
//! `floe sandbox-exec` just before it starts the command). The sandbox's mount namespace shows
//! the host read-only, but a read-only mount does not stop `connect()` to a unix socket on it
//! (`/run/containerd/containerd.sock`, a Docker socket, systemd's): without this filter an
//! agent could ask a host daemon to do what the sandbox forbids. So, as Anthropic's
//! sandbox-runtime does on Linux, creating a unix-domain socket is refused (`EPERM`);
//! `socketpair` (pipes between processes) still works, stream ones only (a datagram pair can
//! `sendto` a host daemon's datagram socket by path: systemd's journal, its notify socket). So is a vsock socket: vsock knows no
//! network namespace, so from a sandbox with no network it would still reach the hypervisor's
//! or a VM host's services. io_uring is refused too: its socket and connect operations would
//! bypass a per-syscall filter. So are the kernel's keyrings (`add_key`, `keyctl`,
//! `request_key`, as Docker's default profile does): a user keyring belongs to a user
//! namespace, and every sandbox of a root run is the same user in one, so code under test
//! could keep a hidden test there for a later session of its task to read.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
#[error("cannot build the sandbox's seccomp filter: {0}")]
pub struct FilterError(String);

impl FilterError {
    pub(crate) fn new(why: &str) -> Self {
        FilterError(why.to_string())
    }
}

/// The compiled filters for this machine's architecture, each to install in turn: [`refused`],
/// reserving disk space as not supported ([`not_supported`]) and `clone3` as not there.
pub fn program() -> Result<Vec<BpfProgram>, FilterError> {
    Ok(vec![
        refused()?,
        not_supported()?,
        // `clone3` passes its flags in memory, where a filter cannot look for
        // `CLONE_NEWUSER` (refused on `clone` and `unshare`): as Docker's default profile
        // does, it is not there, and the C library falls back to `clone`.
        answering(whatever_its_arguments(libc::SYS_clone3), libc::ENOSYS)?,
    ])
}

/// `clone` with `CLONE_PARENT`, which makes the new process its parent's sibling: repeated,
/// code under test puts a process of its own among the children of the evaluator's shell,
/// which reaps it like its own, so it is never a straggler when the evaluator ends, and it can
/// rewrite the reward file a later step of the evaluator writes (a read-only review, session
/// 85).
fn sibling_clone() -> Result<SeccompRule, FilterError> {
    let err = |e: &dyn std::fmt::Display| FilterError(e.to_string());
    let sibling = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_PARENT as u64),
        libc::CLONE_PARENT as u64,
    )
    .map_err(|e| err(&e))?;
    SeccompRule::new(vec![sibling]).map_err(|e| err(&e))
}

/// The filters a pod's evaluator runs under (its grader's init, the runner, counts what the
/// code under test leaves behind): `clone` with `CLONE_PARENT` refused ([`sibling_clone`]),
/// and `clone3`, whose flags no filter can read, not there (the C library falls back to
/// `clone`). The rest is the pod's own profile's. A 32-bit program (i386 on x86-64, arm on
/// arm64) is held to the same under its own numbers, never killed at the architecture check
/// as seccompiler's programs kill a call of another architecture: before these filters it ran.
pub fn no_adoption() -> Result<Vec<BpfProgram>, FilterError> {
    let refusing_siblings = |clone: Vec<i64>| -> Result<BpfProgram, FilterError> {
        let mut rules = BTreeMap::new();
        for nr in clone {
            rules.insert(nr, vec![sibling_clone()?]);
        }
        refusing(rules)
    };
    let no_clone3 = |nr: i64| answering(BTreeMap::from([(nr, vec![])]), libc::ENOSYS);
    let native = [
        refusing_siblings(with_x32(libc::SYS_clone))?,
        answering(whatever_its_arguments(libc::SYS_clone3), libc::ENOSYS)?,
    ];
    // `clone` is 120 and `clone3` 435 on i386 and on arm (their flags first there too).
    let Some(audit) = compat_arch() else {
        return Ok(native.into());
    };
    let [siblings, clone3] = native;
    Ok(vec![
        spliced(siblings, audit, refusing_siblings(vec![120])?)?,
        spliced(clone3, audit, no_clone3(435)?)?,
    ])
}

/// The audit value of the 32-bit architecture this one runs programs of (i386 on x86-64, arm
/// on arm64), if any.
pub(crate) fn compat_arch() -> Option<u32> {
    if cfg!(target_arch = "x86_64") {
        Some(0x4000_0003) // AUDIT_ARCH_I386
    } else if cfg!(target_arch = "aarch64") {
        Some(0x4000_0028) // AUDIT_ARCH_ARM
    } else {
        None
    }
}

/// One program of `native` and `compat`, both compiled by seccompiler for this machine's
/// architecture: `compat`'s architecture check made `audit`'s (and a mismatch there allowed:
/// no other architecture runs here), and `native`'s mismatch, which kills, a jump to it.
pub(crate) fn spliced(
    native: BpfProgram,
    audit: u32,
    mut compat: BpfProgram,
) -> Result<BpfProgram, FilterError> {
    if compat.len() < 3 || native.len() < 3 {
        return Err(FilterError::new(
            "the compiled filter has no architecture check",
        ));
    }
    compat[1].k = audit;
    compat[2] = seccompiler::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    };
    let mut whole = native;
    let jump = u32::try_from(whole.len() - 3)
        .map_err(|_| FilterError::new("the native filter is too long"))?;
    whole[2] = seccompiler::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JA) as u16,
        jt: 0,
        jf: 0,
        k: jump,
    };
    whole.extend(compat);
    Ok(whole)
}

/// `syscall` (and its x32 twin) matched whatever its arguments: an empty rule list.
fn whatever_its_arguments(syscall: i64) -> BTreeMap<i64, Vec<SeccompRule>> {
    with_x32(syscall)
        .into_iter()
        .map(|nr| (nr, vec![]))
        .collect()
}

/// Reserving disk space, answered `EOPNOTSUPP` as a file system without it does: `fallocate`
/// takes the disk at once, the whole of it in one call, long before the disk budget's next
/// look (a local run's disk is every session's, the run's own files included). Programs that
/// use it fall back to writing (`posix_fallocate` does), which the budget sees as it goes. The
/// `ioctl`s that reserve space are `fallocate` by another name (XFS's, which ext4 and btrfs
/// take too: `FS_IOC_RESVSP`, `FS_IOC_RESVSP64`, `FS_IOC_ZERO_RANGE`; 32-bit layouts too).
fn not_supported() -> Result<BpfProgram, FilterError> {
    let err = |e: &dyn std::fmt::Display| FilterError(e.to_string());
    let mut rules = whatever_its_arguments(libc::SYS_fallocate);
    // `XFS_IOC_ALLOCSP` and `ALLOCSP64` too, which allocate on kernels before 5.17.
    let reserving = [
        0x4030_5828u64,
        0x4030_582a,
        0x4030_5839,
        0x4030_580a,
        0x4030_5824,
        0x402c_5828,
        0x402c_582a,
        0x402c_5839,
        0x402c_580a,
        0x402c_5824,
    ]
    .into_iter()
    .map(|cmd| {
        let cmd = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, cmd)
            .map_err(|e| err(&e))?;
        SeccompRule::new(vec![cmd]).map_err(|e| err(&e))
    })
    .collect::<Result<Vec<_>, _>>()?;
    // x32's `ioctl` has a number of its own (514).
    let x32_ioctl: &[i64] = if cfg!(target_arch = "x86_64") {
        &[514 | 0x4000_0000]
    } else {
        &[]
    };
    for nr in with_x32(libc::SYS_ioctl)
        .into_iter()
        .chain(x32_ioctl.iter().copied())
    {
        rules.insert(nr, reserving.clone());
    }
    answering(rules, libc::EOPNOTSUPP)
}

/// What is refused (`EPERM`): unix and vsock sockets, datagram socket pairs (one can `sendto`
/// a host daemon's datagram socket by path, as `socket` cannot), `clone` with `CLONE_PARENT`
/// (a process adopted by its grandparent), new user namespaces (as a
/// pod's `RuntimeDefault` profile refuses them: in one of its own the agent could mount the
/// session's cgroup and rewrite its limits, or reach kernel code, `nf_tables` and the like,
/// that only a namespace's root may), io_uring, keyrings, `bpf`, `userfaultfd` and
/// `perf_event_open`.
fn refused() -> Result<BpfProgram, FilterError> {
    let err = |e: &dyn std::fmt::Display| FilterError(e.to_string());
    let family = |af: libc::c_int| -> Result<SeccompRule, FilterError> {
        let first_argument =
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, af as u64)
                .map_err(|e| err(&e))?;
        SeccompRule::new(vec![first_argument]).map_err(|e| err(&e))
    };
    let refused_families = vec![family(libc::AF_UNIX)?, family(libc::AF_VSOCK)?];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for socket in with_x32(libc::SYS_socket) {
        rules.insert(socket, refused_families.clone());
    }
    // The type's low bits, without SOCK_NONBLOCK and SOCK_CLOEXEC: a unix `SOCK_RAW` pair is
    // made a datagram one by the kernel.
    let pair_of = |kind: libc::c_int| -> Result<SeccompRule, FilterError> {
        let kind = SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xf),
            kind as u64,
        )
        .map_err(|e| err(&e))?;
        SeccompRule::new(vec![kind]).map_err(|e| err(&e))
    };
    let datagram_pairs = vec![pair_of(libc::SOCK_DGRAM)?, pair_of(libc::SOCK_RAW)?];
    for pair in with_x32(libc::SYS_socketpair) {
        rules.insert(pair, datagram_pairs.clone());
    }
    let new_user_namespace = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
        libc::CLONE_NEWUSER as u64,
    )
    .map_err(|e| err(&e))?;
    let new_user_namespace = SeccompRule::new(vec![new_user_namespace]).map_err(|e| err(&e))?;
    for nr in with_x32(libc::SYS_unshare) {
        rules.insert(nr, vec![new_user_namespace.clone()]);
    }
    let sibling = sibling_clone()?;
    for nr in with_x32(libc::SYS_clone) {
        rules.insert(nr, vec![new_user_namespace.clone(), sibling.clone()]);
    }
    // An empty rule list matches the syscall whatever its arguments.
    for refused in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_add_key,
        libc::SYS_keyctl,
        libc::SYS_request_key,
        // Kernel surfaces no test needs, refused as Docker's default profile does for a
        // container without the capabilities: eBPF programs, page faults handled in user
        // space (a classic way to widen a kernel race), performance counters.
        libc::SYS_bpf,
        libc::SYS_userfaultfd,
        libc::SYS_perf_event_open,
    ] {
        for nr in with_x32(refused) {
            rules.insert(nr, vec![]);
        }
    }
    refusing(rules)
}

/// The relay's own filter (`floe sandbox-exec` itself, once its command is started): it only
/// accepts, dials and copies bytes, so starting a program, tracing, other processes' memory,
/// namespaces and mounts are refused. Unlike the command's filter it allows unix sockets (the
/// gateway's).
pub fn relay() -> Result<BpfProgram, FilterError> {
    let refused = [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_bpf,
        libc::SYS_userfaultfd,
        libc::SYS_perf_event_open,
        libc::SYS_open_by_handle_at,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    // x32's own numbers for the calls whose arguments differ in size (`execve` is 520 there):
    // the x32 bit alone does not cover them.
    let x32_only: &[i64] = if cfg!(target_arch = "x86_64") {
        &[520, 521, 539, 540, 545].map(|n| n | 0x4000_0000)
    } else {
        &[]
    };
    let rules: BTreeMap<i64, Vec<SeccompRule>> = refused
        .into_iter()
        .flat_map(with_x32)
        .chain(x32_only.iter().copied())
        .map(|s| (s, vec![]))
        .collect();
    refusing(rules)
}

/// A filter that refuses (`EPERM`) what `rules` match and allows everything else, for this
/// machine's architecture.
fn refusing(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, FilterError> {
    answering(rules, libc::EPERM)
}

/// A filter that answers what `rules` match with `errno` and allows everything else, for this
/// machine's architecture.
fn answering(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: libc::c_int,
) -> Result<BpfProgram, FilterError> {
    let err = |e: &dyn std::fmt::Display| FilterError(e.to_string());
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| err(&e))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| err(&e))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(&e))
}

/// `nr`, and on x86-64 its x32 twin (`nr | 0x40000000`): an x32 call passes the filter's
/// architecture check, so on a kernel with x32 enabled it must be refused by number too.
fn with_x32(nr: i64) -> Vec<i64> {
    if cfg!(target_arch = "x86_64") {
        vec![nr, nr | 0x4000_0000]
    } else {
        vec![nr]
    }
}

/// Installs `program` on every thread of this process at once (`SECCOMP_FILTER_FLAG_TSYNC`).
pub fn apply_all_threads(program: &BpfProgram) -> Result<(), FilterError> {
    seccompiler::apply_filter_all_threads(program)
        .map_err(|e| FilterError(format!("cannot install the relay's filter: {e}")))
}

/// Installs `program` on the calling thread (with `no_new_privs`): it then holds for that thread
/// and every process it starts.
pub fn apply(program: &BpfProgram) -> std::io::Result<()> {
    seccompiler::apply_filter(program).map_err(|e| std::io::Error::other(e.to_string()))
}

/// [`apply`] for each of `programs`, in turn.
pub fn apply_each(programs: &[BpfProgram]) -> std::io::Result<()> {
    programs.iter().try_for_each(apply)
}

/// Test only: `python3 -c probe arg` started from a thread that ran `install` first (a
/// filter, as `floe sandbox-exec` and `floe agent` install theirs), which must succeed; its
/// stdout.
#[cfg(test)]
pub(crate) fn python_under(
    install: impl FnOnce() + Send + 'static,
    probe: &'static str,
    arg: &str,
) -> String {
    let arg = arg.to_string();
    let out = std::thread::spawn(move || {
        install();
        std::process::Command::new("python3")
            .args(["-c", probe, &arg])
            .output()
            .expect("python3 runs")
    })
    .join()
    .expect("thread");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a spawning thread runs first: `filters` installed, each in turn.
    fn installing(filters: Vec<BpfProgram>) -> impl FnOnce() + Send + 'static {
        move || apply_each(&filters).expect("filters installed")
    }

    /// A child under the filters: unix and vsock sockets, keyrings and the kernel surfaces
    /// refused, reserving disk space not supported, everything else as before.
    #[test]
    fn a_filtered_child_cannot_create_unix_sockets_but_keeps_pipes_and_inet() {
        let filters = program().expect("filters");
        let probe = r#"
import ctypes, os, socket, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
# add_key("user", "p", "x", 1, KEY_SPEC_USER_KEYRING)
numbers = dict(zip(("add_key", "bpf", "userfaultfd", "perf_event_open", "clone"), map(int, sys.argv[1].split())))
added = libc.syscall(numbers["add_key"], b"user", b"p", b"x", 1, -4)
print("add_key:", "allowed" if added >= 0 else errno.errorcode[ctypes.get_errno()])
try:
    socket.socket(socket.AF_UNIX)
    print("unix: allowed")
except OSError as e:
    print("unix:", errno.errorcode[e.errno])
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    print("vsock: allowed")
except OSError as e:
    print("vsock:", errno.errorcode[e.errno])
a, b = socket.socketpair()
print("socketpair: ok")
for kind in (socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, socket.SOCK_RAW):
    try:
        socket.socketpair(socket.AF_UNIX, kind)
        print("datagram pair: allowed")
    except OSError as e:
        print("datagram pair:", errno.errorcode[e.errno])
socket.socket(socket.AF_INET).close()
print("inet: ok")
with open("/dev/shm/floe-fallocate-probe", "wb") as f:
    # struct space_resv: l_type, l_whence, l_start, l_len, ...
    resv = (ctypes.c_int64 * 6)(0, 0, 4096, 0, 0, 0)
    got = libc.ioctl(f.fileno(), ctypes.c_ulong(0x4030582a), resv)
    e = ctypes.get_errno()
    print("reserving ioctl:", "allowed" if got == 0 else "EOPNOTSUPP" if e == errno.EOPNOTSUPP else e)
    got = libc.fallocate(f.fileno(), 0, ctypes.c_long(0), ctypes.c_long(4096))
    e = ctypes.get_errno()
    # errno names EOPNOTSUPP's number ENOTSUP, its other name on Linux.
    print("fallocate:", "allowed" if got == 0 else "EOPNOTSUPP" if e == errno.EOPNOTSUPP else e)
    # glibc's falls back to writing.
    os.posix_fallocate(f.fileno(), 0, 4096)
    print("posix_fallocate: ok")
os.unlink("/dev/shm/floe-fallocate-probe")
CLONE_NEWUSER = 0x10000000
got = libc.unshare(CLONE_NEWUSER)
print("user namespace:", "allowed" if got == 0 else errno.errorcode[ctypes.get_errno()])
# clone(CLONE_PARENT | SIGCHLD): a child that would be this process's sibling.
got = libc.syscall(numbers["clone"], 0x8000 | 17, 0, 0, 0, 0)
if got == 0:
    os._exit(0)
print("sibling clone:", "allowed" if got > 0 else errno.errorcode[ctypes.get_errno()])
# Arguments each answers otherwise (EINVAL, a descriptor, EFAULT): EPERM is the filter's.
for name, args in (("bpf", (9999, 0, 0)), ("userfaultfd", (1,)), ("perf_event_open", (0, 0, -1, -1, 0))):
    got = libc.syscall(numbers[name], *args)
    print(name + ":", "allowed" if got >= 0 else errno.errorcode[ctypes.get_errno()])
import subprocess, threading
t = threading.Thread(target=lambda: None)
t.start()
t.join()
print("thread: ok", subprocess.run(["true"]).returncode)
"#;
        // As `floe sandbox-exec` does: a thread of its own installs the filters, then starts it.
        let text = python_under(
            installing(filters),
            probe,
            &[
                libc::SYS_add_key,
                libc::SYS_bpf,
                libc::SYS_userfaultfd,
                libc::SYS_perf_event_open,
                libc::SYS_clone,
            ]
            .map(|nr| nr.to_string())
            .join(" "),
        );
        assert_eq!(
            text,
            "add_key: EPERM\nunix: EPERM\nvsock: EPERM\nsocketpair: ok\n\
             datagram pair: EPERM\ndatagram pair: EPERM\ninet: ok\nreserving ioctl: EOPNOTSUPP\n\
             fallocate: EOPNOTSUPP\nposix_fallocate: ok\n\
             user namespace: EPERM\nsibling clone: EPERM\nbpf: EPERM\nuserfaultfd: EPERM\nperf_event_open: EPERM\n\
             thread: ok 0\n"
        );
    }

    /// A pod evaluator's filters: no sibling clone, and nothing else of the sandbox's.
    #[test]
    fn a_pod_evaluator_cannot_clone_a_sibling_but_keeps_the_rest() {
        let filters = no_adoption().expect("filters");
        let probe = r#"
import ctypes, errno, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
got = libc.syscall(int(sys.argv[1]), 0x8000 | 17, 0, 0, 0, 0)
if got == 0:
    os._exit(0)
print("sibling clone:", "allowed" if got > 0 else errno.errorcode[ctypes.get_errno()])
socket.socket(socket.AF_UNIX).close()
print("unix: ok", subprocess.run(["true"]).returncode)
"#;
        let text = python_under(installing(filters), probe, &libc::SYS_clone.to_string());
        assert_eq!(text, "sibling clone: EPERM\nunix: ok 0\n");
    }

    /// The relay's filter: it keeps dialling unix sockets, but cannot start a program.
    #[test]
    fn the_relay_filter_refuses_exec_but_keeps_unix_sockets() {
        let filter = relay().expect("filter");
        let (spawned, socket) = std::thread::spawn(move || {
            apply(&filter).expect("filter installed");
            let spawned = std::process::Command::new("true").status();
            // Nothing listens there: ENOENT says the socket was created and dialled.
            let dialled = std::os::unix::net::UnixStream::connect("/nonexistent/floe.sock")
                .map_err(|e| e.raw_os_error());
            (spawned.map_err(|e| e.raw_os_error()), dialled)
        })
        .join()
        .expect("thread");
        assert_eq!(spawned.err(), Some(Some(libc::EPERM)));
        assert_eq!(
            socket.err(),
            Some(Some(libc::ENOENT)),
            "unix sockets must still work"
        );
    }
}
