//! `floe run`'s per-session resource limits ([`floe_sandbox::limits`]): the flags, and the
//! limits this machine allows.

use floe_sandbox::limits::{self, parse_bytes, Limits};

#[derive(clap::Args, Clone, Debug)]
pub struct SessionLimitArgs {
    /// Memory each session's harness and evaluator may use (a cgroup of the session's own),
    /// e.g. `4Gi`, `512Mi`; `0`: no limit. One session cannot starve a concurrent sibling.
    #[arg(long, default_value = "4Gi", value_parser = parse_bytes)]
    pub session_memory: u64,
    /// Processes (and threads) each session may have at once; `0`: no limit.
    #[arg(long, default_value_t = 1024)]
    pub session_pids: u64,
    /// Disk each session's workspace and harness home may fill together, e.g. `8Gi`; `0`: no
    /// limit. Measured every 2 s while the harness runs; past it the harness is stopped and
    /// the session scores as the policy's failure (`disk_limit`).
    #[arg(long, default_value = "8Gi", value_parser = parse_bytes)]
    pub session_disk: u64,
}

/// Sessions at a time: `--concurrency`, else the job's `spec.concurrency`, else 2.
pub fn concurrency(flag: Option<usize>, spec: Option<i32>) -> usize {
    flag.or(spec.and_then(|c| usize::try_from(c).ok()))
        .unwrap_or(2)
        .max(1)
}

/// Says at start when `--out` ([`out_room_warning`]) has less room than the sessions at once
/// may fill.
pub fn warn_when_out_is_small(out: &std::path::Path, concurrency: usize, session_disk: u64) {
    let room = free_bytes(out).and_then(|free| out_room_warning(free, concurrency, session_disk));
    if let Some(why) = room {
        eprintln!("floe run: --out {}: {why}", out.display());
    }
}

/// Bytes an unprivileged writer may still fill on `path`'s file system (its nearest existing
/// ancestor's).
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let stat = nix::sys::statvfs::statvfs(existing).ok()?;
    Some((stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64))
}

/// Why `--out`'s file system (`free` bytes left) may fill before any session reaches its disk
/// budget: `concurrency` sessions at once may each fill `session_disk` (`0`: no budget, so
/// any amount). A full disk fails floe's own writes (captures, trajectories, the evaluator's
/// copy) for every session at once, which then end as infrastructure, not as the policy's.
/// `None`: room enough.
pub fn out_room_warning(free: u64, concurrency: usize, session_disk: u64) -> Option<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if session_disk == 0 {
        return None; // no budget to weigh against: said at start as no limit
    }
    let need = session_disk.saturating_mul(concurrency as u64);
    (free < need).then(|| {
        format!(
            "{:.1} GiB free, and {concurrency} session(s) at once may each fill --session-disk \
             ({:.1} GiB), and twice that more while graded: the disk can fill first, failing \
             every session's writes (infrastructure, never scored); lower --session-disk or \
             --concurrency, or free space there",
            gib(free),
            gib(session_disk)
        )
    })
}

/// What the run's one gateway (every session's) takes at once: room for each sandbox's whole
/// share (its relay's cap), so sandboxes that fill theirs cannot starve a sibling's calls.
/// Every connection comes from this host (the relays, a harness without a sandbox), one peer.
pub fn gateway_connections(concurrency: usize) -> floe_gateway::serve_limited::Limits {
    use floe_gateway::serve_limited::Limits as Connections;
    let most = MIN_GATEWAY_CONNECTIONS
        .max(concurrency.saturating_mul(floe_sandbox::relay::MAX_CONNECTIONS) + 64);
    Connections {
        max_connections: most,
        max_per_peer: most,
        this_host_share: most,
        ..Connections::SHARED
    }
}

/// The least `floe run`'s gateway takes at once, however few sessions run.
const MIN_GATEWAY_CONNECTIONS: usize = 1024;

/// The size of each sandbox's `/tmp`: half of `--session-memory` where bubblewrap can size a
/// tmpfs (its pages count against the session's memory, so a full `/tmp` says "no space"
/// before the memory limit kills the harness); `0` leaves tmpfs's default.
pub fn tmp_bytes(args: &SessionLimitArgs, bwrap_version: &str) -> u64 {
    if sizes_tmpfs(bwrap_version) {
        args.session_memory / 2
    } else {
        0
    }
}

/// Whether `bubblewrap X.Y.Z` takes `--size` (0.7 and later).
fn sizes_tmpfs(version: &str) -> bool {
    let numbers: Vec<u64> = version
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .split('.')
        .map_while(|n| n.parse().ok())
        .collect();
    matches!(numbers.as_slice(), [major, minor, ..] if (*major, *minor) >= (0, 7))
}

/// The limits every session of this run gets, or why there are none (said at start and in
/// the summary: a session can then starve its siblings).
pub fn resolve(args: &SessionLimitArgs) -> Result<Limits, String> {
    if args.session_memory == 0 && args.session_pids == 0 {
        return Err("--session-memory 0 --session-pids 0".into());
    }
    let hierarchy = limits::detect()?;
    Ok(Limits {
        hierarchy,
        // 0 means none: the largest value each file takes.
        memory_bytes: if args.session_memory == 0 {
            i64::MAX as u64
        } else {
            args.session_memory
        },
        pids: if args.session_pids == 0 {
            4_194_304
        } else {
            args.session_pids
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--out` is weighed against every session at once filling its budget, not one.
    #[test]
    fn out_is_too_small_when_the_sessions_at_once_can_fill_it_within_their_budgets() {
        let gib = 1u64 << 30;
        assert_eq!(out_room_warning(16 * gib, 2, 8 * gib), None);
        let warned = out_room_warning(16 * gib - 1, 2, 8 * gib);
        assert!(
            warned
                .as_deref()
                .is_some_and(|w| w.starts_with("16.0 GiB free, and 2 session(s)")),
            "{warned:?}"
        );
        assert!(out_room_warning(gib, 4, 8 * gib).is_some());
        // No budget: nothing to weigh (the run says so at start).
        assert_eq!(out_room_warning(0, 4, 0), None);
        assert!(out_room_warning(0, usize::MAX, u64::MAX).is_some());
    }

    /// Every sandbox's relay may fill its share and the gateway still has room to spare.
    #[test]
    fn the_shared_gateway_has_room_for_every_sandboxs_share() {
        let relay = floe_sandbox::relay::MAX_CONNECTIONS;
        for concurrency in [1, 2, 31, 32, 64, 500] {
            let limits = gateway_connections(concurrency);
            let cap = limits.max_connections;
            assert!(cap > concurrency * relay, "{concurrency}: {cap}");
            assert!(cap >= MIN_GATEWAY_CONNECTIONS);
            assert_eq!(
                limits.this_host_share, cap,
                "every connection is this host's"
            );
        }
    }

    #[test]
    fn tmpfs_is_sized_from_bubblewrap_0_7() {
        assert!(sizes_tmpfs("bubblewrap 0.8.0"));
        assert!(sizes_tmpfs("bubblewrap 0.7.0"));
        assert!(sizes_tmpfs("bubblewrap 1.0"));
        assert!(!sizes_tmpfs("bubblewrap 0.6.1"));
        assert!(!sizes_tmpfs("bubblewrap"));
    }
}
