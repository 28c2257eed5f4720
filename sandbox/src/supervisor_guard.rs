//! The harness may not slow its supervisor down. In a pod, `floe agent` is the agent
//! container's PID 1 and the harness runs as its child, as the same user: the same user may
//! set another of its processes to `SCHED_IDLE` or nice 19, pin it to one CPU or give it a
//! tiny `RLIMIT_CPU`. Behind a few busy processes the supervisor would then get no CPU, report
//! the harness's end past the grader's deadline, and a losing session would end as
//! infrastructure, retried instead of scored: a loss turned into "not scored".
//!
//! So the harness starts under a seccomp filter that refuses (`EPERM`) changing the scheduling,
//! priority, CPU affinity, I/O priority or resource limits of any process or thread whose id is
//! below its own: every thread of the supervisor was made before it (the supervisor's runtime
//! makes no thread once the harness runs: [`crate::agent_link::supervisor_runtime`]), and
//! every process of the agent's is made after it. A harness changing its own (`0`, or a
//! thread's or child's id, which come after it) is untouched. `setpriority` and `ioprio_set`
//! for a whole user (which the supervisor's user is) are refused, and for a process group
//! below the harness or the caller's own (which, in the supervisor's session, could be made
//! the supervisor's).
//!
//! Installing a filter needs `no_new_privs`, which the restricted profile's
//! `allowPrivilegeEscalation: false` sets on the container; a template that allows escalation
//! (a harness that runs `sudo`) keeps it off, and there the guard is off, with a warning.
//!
//! A 32-bit program (i386 on x86-64, arm on arm64) is checked against its own numbers rather
//! than killed at the architecture check, and x32's numbers are refused on x86-64 too.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::syscall_filter::FilterError;

/// The calls that change another process's scheduling, by their numbers on one architecture.
#[derive(Clone, Copy)]
struct Calls {
    setpriority: i64,
    sched_setparam: i64,
    sched_setscheduler: i64,
    sched_setaffinity: i64,
    sched_setattr: i64,
    ioprio_set: i64,
    prlimit64: i64,
}

const NATIVE: Calls = Calls {
    setpriority: libc::SYS_setpriority,
    sched_setparam: libc::SYS_sched_setparam,
    sched_setscheduler: libc::SYS_sched_setscheduler,
    sched_setaffinity: libc::SYS_sched_setaffinity,
    sched_setattr: libc::SYS_sched_setattr,
    ioprio_set: libc::SYS_ioprio_set,
    prlimit64: libc::SYS_prlimit64,
};

/// The 32-bit architecture this one runs programs of ([`crate::syscall_filter::compat_arch`]),
/// its audit value and its numbers (`arch/x86/entry/syscalls/syscall_32.tbl`,
/// `arch/arm/tools/syscall.tbl`).
fn compat() -> Option<(u32, Calls)> {
    let audit = crate::syscall_filter::compat_arch()?;
    let calls = if cfg!(target_arch = "x86_64") {
        Calls {
            setpriority: 97,
            sched_setparam: 154,
            sched_setscheduler: 156,
            sched_setaffinity: 241,
            sched_setattr: 351,
            ioprio_set: 289,
            prlimit64: 340,
        }
    } else {
        Calls {
            setpriority: 97,
            sched_setparam: 154,
            sched_setscheduler: 156,
            sched_setaffinity: 241,
            sched_setattr: 380,
            ioprio_set: 314,
            prlimit64: 369,
        }
    };
    Some((audit, calls))
}

const PRIO_PROCESS: u64 = 0;
const PRIO_PGRP: u64 = 1;
const PRIO_USER: u64 = 2;
const IOPRIO_WHO_PROCESS: u64 = 1;
const IOPRIO_WHO_PGRP: u64 = 2;
const IOPRIO_WHO_USER: u64 = 3;

/// The filter for a harness whose id will be above `first_own` - 1: ids below `first_own`
/// are the supervisor's.
pub fn program(first_own: u32) -> Result<BpfProgram, FilterError> {
    let native = compiled(&with_x32(NATIVE), first_own, std::env::consts::ARCH)?;
    let Some((audit, calls)) = compat() else {
        return Ok(native);
    };
    let compat = compiled(&[calls], first_own, std::env::consts::ARCH)?;
    crate::syscall_filter::spliced(native, audit, compat)
}

/// On x86-64, each call again under its x32 number (`nr | 0x40000000`): an x32 call passes
/// the architecture check as x86-64's.
fn with_x32(calls: Calls) -> Vec<Calls> {
    if !cfg!(target_arch = "x86_64") {
        return vec![calls];
    }
    let x = |nr: i64| nr | 0x4000_0000;
    vec![
        calls,
        Calls {
            setpriority: x(calls.setpriority),
            sched_setparam: x(calls.sched_setparam),
            sched_setscheduler: x(calls.sched_setscheduler),
            sched_setaffinity: x(calls.sched_setaffinity),
            sched_setattr: x(calls.sched_setattr),
            ioprio_set: x(calls.ioprio_set),
            prlimit64: x(calls.prlimit64),
        },
    ]
}

fn compiled(tables: &[Calls], first_own: u32, arch: &str) -> Result<BpfProgram, FilterError> {
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
            .map_err(|e| FilterError::new(&e.to_string()))
    };
    let rule = |conditions: Vec<SeccompCondition>| {
        SeccompRule::new(conditions).map_err(|e| FilterError::new(&e.to_string()))
    };
    let below = u64::from(first_own);
    // `id` (argument `arg`) names another than the caller and is below the harness.
    let supervisors = |arg: u8| -> Result<Vec<SeccompCondition>, FilterError> {
        Ok(vec![
            cond(arg, SeccompCmpOp::Ne, 0)?,
            cond(arg, SeccompCmpOp::Lt, below)?,
        ])
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for calls in tables {
        for by_pid in [
            calls.sched_setparam,
            calls.sched_setscheduler,
            calls.sched_setaffinity,
            calls.sched_setattr,
            calls.prlimit64,
        ] {
            rules.insert(by_pid, vec![rule(supervisors(0)?)?]);
        }
        let by_which = |process: u64, group: u64, user: u64| -> Result<_, FilterError> {
            let mut process_rule = vec![cond(0, SeccompCmpOp::Eq, process)?];
            process_rule.extend(supervisors(1)?);
            Ok(vec![
                rule(process_rule)?,
                // A group below the harness, or the caller's own (0).
                rule(vec![
                    cond(0, SeccompCmpOp::Eq, group)?,
                    cond(1, SeccompCmpOp::Lt, below)?,
                ])?,
                rule(vec![cond(0, SeccompCmpOp::Eq, user)?])?,
            ])
        };
        rules.insert(
            calls.setpriority,
            by_which(PRIO_PROCESS, PRIO_PGRP, PRIO_USER)?,
        );
        rules.insert(
            calls.ioprio_set,
            by_which(IOPRIO_WHO_PROCESS, IOPRIO_WHO_PGRP, IOPRIO_WHO_USER)?,
        );
    }
    let arch = TargetArch::try_from(arch).map_err(|e| FilterError::new(&e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| FilterError::new(&e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| FilterError::new(&e.to_string()))
}

/// Whether this process has `no_new_privs`, which an unprivileged filter needs (and which,
/// set here, would take `sudo` from a template that allows escalation).
pub fn available() -> bool {
    nix::sys::prctl::get_no_new_privs().unwrap_or(false)
}

/// Installs the guard on the calling thread, for a harness this thread starts next: every
/// thread of this process was made before this one (ids up to this thread's), and the
/// harness will be made after it.
pub fn install_for_next_child() -> std::io::Result<()> {
    let this_thread = rustix::thread::gettid().as_raw_nonzero().get();
    let first_own = u32::try_from(this_thread)
        .map_err(|_| std::io::Error::other("a thread id out of range"))?
        .saturating_add(1);
    let program = program(first_own).map_err(std::io::Error::other)?;
    crate::syscall_filter::apply(&program)
}

#[cfg(test)]
#[path = "supervisor_guard_tests.rs"]
mod tests;
