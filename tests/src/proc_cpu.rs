//! CPU time and memory of local processes, from `/proc` (Linux): what each part of a test
//! cluster on this one machine spent over a stretch of a benchmark.

use std::collections::BTreeMap;
use std::path::Path;

/// CPU time `pid` has used so far, all its threads, in seconds (`schedstat`: nanoseconds, not
/// the 10 ms ticks of `stat`). `None` once it is gone.
pub fn seconds(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Some(ns as f64 / 1e9)
}

/// `pid`'s resident set size and its peak (`VmRSS`, `VmHWM`), in KiB. `None` once it is gone.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some((field("VmRSS:"), field("VmHWM:")))
}

/// The running children of `parent`.
pub fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

/// The pid a control plane started by `scripts/kube-test-cluster/start.sh` recorded for one of
/// its parts (`apiserver`, `etcd`, `kcm`), beside its kubeconfig.
pub fn control_plane_pid(kubeconfig: &Path, part: &str) -> Option<u32> {
    let dir = kubeconfig.parent()?;
    std::fs::read_to_string(dir.join(format!("{part}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// CPU seconds by name at one moment; a group's is the sum over its pids.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(pub BTreeMap<String, f64>);

impl Snapshot {
    pub fn take(groups: &[(&str, Vec<u32>)]) -> Self {
        Snapshot(
            groups
                .iter()
                .map(|(name, pids)| {
                    let cpu = pids.iter().filter_map(|p| seconds(*p)).sum();
                    (name.to_string(), cpu)
                })
                .collect(),
        )
    }

    /// CPU seconds each group used since `earlier`.
    pub fn since(&self, earlier: &Snapshot) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v - earlier.0.get(k).copied().unwrap_or(0.0)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_seen_using_cpu_and_its_child_is_found() -> anyhow::Result<()> {
        let me = std::process::id();
        let before = seconds(me).ok_or_else(|| anyhow::anyhow!("no schedstat"))?;
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = seconds(me).ok_or_else(|| anyhow::anyhow!("no schedstat"))?;
        assert!(after > before, "{before} → {after}");
        let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
        let found = children(me).contains(&child.id());
        child.kill()?;
        child.wait()?;
        assert!(found, "the child is listed");
        Ok(())
    }

    #[test]
    fn a_snapshot_tells_the_difference_per_group() {
        let earlier = Snapshot([("a".to_string(), 1.0)].into_iter().collect());
        let later = Snapshot(
            [("a".to_string(), 1.5), ("b".to_string(), 0.25)]
                .into_iter()
                .collect(),
        );
        let d = later.since(&earlier);
        assert_eq!(d.get("a"), Some(&0.5));
        assert_eq!(d.get("b"), Some(&0.25));
    }
}
