use super::*;
use seccompiler::sock_filter;

/// What the kernel's classic-BPF seccomp interpreter returns for one call, for the opcodes a
/// compiled filter uses: the 32-bit and x32 paths checked without a 32-bit program.
fn run(program: &[sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
    // struct seccomp_data: nr, arch, instruction pointer, then the six arguments.
    let word = |offset: u32| -> u32 {
        match offset {
            0 => nr as u32,
            4 => arch,
            8 | 12 => 0,
            o if (16..64).contains(&o) => {
                let arg = args[((o - 16) / 8) as usize];
                if (o - 16) % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            o => panic!("a load at {o}"),
        }
    };
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let i = &program[pc];
        let code = u32::from(i.code);
        let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
        pc = match code {
            c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                acc = word(i.k);
                pc + 1
            }
            c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => {
                acc &= i.k;
                pc + 1
            }
            c if c == libc::BPF_JMP | libc::BPF_JA => pc + 1 + i.k as usize,
            c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => jump(acc == i.k),
            c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => jump(acc > i.k),
            c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => jump(acc >= i.k),
            c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => jump(acc & i.k != 0),
            c if c == libc::BPF_RET | libc::BPF_K => return i.k,
            c => panic!("opcode {c:#x} at {pc}"),
        };
    }
}

const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

#[test]
fn the_supervisors_ids_are_refused_on_every_abi_and_the_harnesss_own_are_not() {
    let program = program(40).expect("filter");
    let native_arch = if cfg!(target_arch = "x86_64") {
        0xC000_003E // AUDIT_ARCH_X86_64
    } else {
        0xC000_00B7 // AUDIT_ARCH_AARCH64
    };
    let (compat_arch, compat_calls) = compat().expect("a 32-bit architecture");
    let mut abis = vec![(native_arch, NATIVE), (compat_arch, compat_calls)];
    if cfg!(target_arch = "x86_64") {
        abis.push((native_arch, with_x32(NATIVE)[1]));
    }
    for (arch, calls) in abis {
        let verdict = |nr: i64, args: [u64; 6]| run(&program, arch, nr, args);
        for nr in [
            calls.sched_setscheduler,
            calls.sched_setattr,
            calls.sched_setparam,
            calls.sched_setaffinity,
            calls.prlimit64,
        ] {
            // PID 1, a supervisor thread (39), itself (0), its own thread or child (40, 41).
            assert_eq!(verdict(nr, [1, 5, 0, 0, 0, 0]), EPERM, "{arch:#x} {nr}");
            assert_eq!(verdict(nr, [39, 5, 0, 0, 0, 0]), EPERM, "{arch:#x} {nr}");
            for own in [0, 40, 41, 4_000_000] {
                assert_eq!(
                    verdict(nr, [own, 5, 0, 0, 0, 0]),
                    ALLOW,
                    "{arch:#x} {nr} {own}"
                );
            }
        }
        for (nr, process, group, user) in [
            (calls.setpriority, PRIO_PROCESS, PRIO_PGRP, PRIO_USER),
            (
                calls.ioprio_set,
                IOPRIO_WHO_PROCESS,
                IOPRIO_WHO_PGRP,
                IOPRIO_WHO_USER,
            ),
        ] {
            let at = |which: u64, who: u64| verdict(nr, [which, who, 19, 0, 0, 0]);
            assert_eq!(at(process, 1), EPERM);
            assert_eq!(at(process, 0), ALLOW, "itself");
            assert_eq!(at(process, 41), ALLOW, "its child");
            assert_eq!(at(group, 1), EPERM, "the supervisor's group");
            assert_eq!(
                at(group, 0),
                EPERM,
                "its own group, which may be the supervisor's"
            );
            assert_eq!(at(group, 41), ALLOW, "a group of its own making");
            assert_eq!(at(user, 0), EPERM, "its user, the supervisor's");
            assert_eq!(at(user, 1000), EPERM);
        }
        // Anything else is left to the kernel.
        assert_eq!(verdict(libc::SYS_getpid, [0; 6]), ALLOW);
    }
    // Another architecture still passes: only these two run here.
    assert_eq!(run(&program, 0x4000_0008, 156, [1, 5, 0, 0, 0, 0]), ALLOW);
}

/// A child started under the guard, for real: the test process stands for the supervisor.
#[test]
fn a_guarded_child_cannot_idle_or_renice_this_process_but_keeps_its_own() {
    let probe = r#"
import ctypes, errno, os, resource, sys, threading
sup = int(sys.argv[1])
def tried(name, f):
    try:
        f()
        print(name, "allowed")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
tried("idle", lambda: os.sched_setscheduler(sup, os.SCHED_IDLE, os.sched_param(0)))
tried("nice", lambda: os.setpriority(os.PRIO_PROCESS, sup, 19))
tried("user", lambda: os.setpriority(os.PRIO_USER, 0, 19))
tried("pin", lambda: os.sched_setaffinity(sup, {0}))
tried("cpu", lambda: resource.prlimit(sup, resource.RLIMIT_CPU, (1, 1)))
tried("own nice", lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))
tried("own idle", lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0)))
def thread():
    tried("thread", lambda: os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 6))
t = threading.Thread(target=thread)
t.start()
t.join()
child = os.fork()
if child == 0:
    os.read(os.open("/dev/null", os.O_RDONLY), 1)
    os._exit(0)
tried("child", lambda: os.setpriority(os.PRIO_PROCESS, child, 10))
os.waitpid(child, 0)
"#;
    let me = std::process::id().to_string();
    let text = crate::syscall_filter::python_under(
        || install_for_next_child().expect("guard installed"),
        probe,
        &me,
    );
    assert_eq!(
        text,
        "idle EPERM\nnice EPERM\nuser EPERM\npin EPERM\ncpu EPERM\nown nice allowed\n\
         own idle allowed\nthread allowed\nchild allowed\n"
    );
}

/// A pod evaluator's filters ([`crate::syscall_filter::no_adoption`]): `clone` with
/// `CLONE_PARENT` refused and `clone3` not there on every ABI, a 32-bit program's under its own
/// numbers; nothing else refused, and no 32-bit call killed at the architecture check (before
/// these filters, a 32-bit program ran in the grader).
#[test]
fn a_pod_evaluators_filters_hold_32_bit_programs_to_the_same_and_kill_none() {
    let programs = crate::syscall_filter::no_adoption().expect("filters");
    let native_arch = if cfg!(target_arch = "x86_64") {
        0xC000_003E // AUDIT_ARCH_X86_64
    } else {
        0xC000_00B7 // AUDIT_ARCH_AARCH64
    };
    let (compat_arch, _) = compat().expect("a 32-bit architecture");
    // The first filter the kernel reports that is not "allow" decides (the strictest).
    let verdict = |arch: u32, nr: i64, flags: u64| {
        programs
            .iter()
            .map(|p| run(p, arch, nr, [flags, 0, 0, 0, 0, 0]))
            .find(|v| *v != ALLOW)
            .unwrap_or(ALLOW)
    };
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let sibling = libc::CLONE_PARENT as u64 | 17;
    for (arch, clone, clone3) in [
        (native_arch, libc::SYS_clone, libc::SYS_clone3),
        (compat_arch, 120, 435),
    ] {
        assert_eq!(verdict(arch, clone, sibling), EPERM, "{arch:#x}");
        // A thread's or a fork's flags pass.
        assert_eq!(verdict(arch, clone, 0x3d0f00), ALLOW, "{arch:#x}");
        assert_eq!(verdict(arch, clone, 17), ALLOW, "{arch:#x}");
        assert_eq!(verdict(arch, clone3, 0), enosys, "{arch:#x}");
        // Any other call passes (i386's `write` is 4, arm's too; x86-64's 1).
        assert_eq!(verdict(arch, 4, 0), ALLOW, "{arch:#x}");
    }
}
