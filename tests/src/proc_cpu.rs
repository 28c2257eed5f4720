//! CPU time and memory of local processes, from `/proc` (Linux): what each part of a test
//! cluster on this one machine spent over a stretch of a benchmark.

use std::collections::BTreeMap;
use std::path::Path;

/// CPU time `pid` has used so far, all its threads, in seconds. Its live threads' time comes at
/// nanosecond precision (`schedstat`), but a thread that exits takes its time away from that
/// sum; the process's own `stat` keeps all of it, exited threads' too, in 10 ms clock ticks
/// (utime + stime, each the total runtime split and rounded down). So the larger of the two:
/// exact while no thread has exited, and never more than two ticks short after one did (a sum
/// over live threads alone once fell by 0.18 s, and `stat`'s ticks less the live threads' own
/// rounded ticks was off by a tick a thread). `None` once it is gone.
pub fn seconds(pid: u32) -> Option<f64> {
    let process_ticks =
        stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let live_ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    // `stat` counts in USER_HZ, 100 a second on Linux.
    Some((live_ns as f64 / 1e9).max(process_ticks as f64 / 100.0))
}

/// The fields of a `/proc/.../stat` line after `comm` (field 3, state, first).
fn stat_fields_after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// utime + stime of a `/proc/.../stat` line, in clock ticks.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // Fields 14 and 15, the 12th and 13th after comm.
    let mut fields = stat_fields_after_comm(stat)?.skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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
    stat_fields_after_comm(&stat)?.nth(1)?.parse().ok()
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

/// The machine's CPU time (`/proc/stat`, all CPUs) and the node's pods' (`kubepods` cgroup, v1
/// or v2), in seconds.
pub struct MachineCpu {
    // Clock ticks, kept whole: differences of float seconds can round a fully busy stretch's
    // busy time a hair above its total.
    busy_ticks: u64,
    total_ticks: u64,
    pods: Option<f64>,
}

impl MachineCpu {
    pub fn read() -> std::io::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal …: idle and iowait are not busy.
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).unwrap_or(&0) + ticks.get(4).unwrap_or(&0);
        let pods = std::fs::read_to_string("/sys/fs/cgroup/cpuacct/kubepods/cpuacct.usage")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|ns| ns / 1e9)
            .or_else(|| {
                let stat = std::fs::read_to_string("/sys/fs/cgroup/kubepods/cpu.stat").ok()?;
                let usec = stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
                Some(usec.trim().parse::<f64>().ok()? / 1e6)
            });
        Ok(Self {
            busy_ticks: total.saturating_sub(idle),
            total_ticks: total,
            pods,
        })
    }

    /// What was used since `before` was read.
    pub fn since(self, before: &Self) -> std::io::Result<CpuUse> {
        let cores = std::thread::available_parallelism()?.get();
        Ok(CpuUse {
            cores,
            // `/proc/stat` counts in USER_HZ, 100 a second on Linux.
            busy: self.busy_ticks.saturating_sub(before.busy_ticks) as f64 / 100.0,
            total: self.total_ticks.saturating_sub(before.total_ticks) as f64 / 100.0,
            pods: self.pods.zip(before.pods).map(|(a, b)| a - b),
        })
    }
}

/// CPU use over a stretch: the machine's, and the node's pods' where known.
pub struct CpuUse {
    cores: usize,
    busy: f64,
    total: f64,
    pods: Option<f64>,
}

impl std::fmt::Display for CpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let share = |s: f64| 100.0 * s / self.total.max(f64::EPSILON);
        write!(
            f,
            "{:.0} % busy of {} cores ({:.0} CPU-s)",
            share(self.busy),
            self.cores,
            self.busy
        )?;
        if let Some(pods) = self.pods {
            write!(
                f,
                "; the node's pods {:.0} CPU-s ({:.0} %)",
                pods,
                share(pods)
            )?;
        }
        Ok(())
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
        // A thread that used CPU and exited still counts (other tests' threads come and go in
        // this process too, so only a lower bound is certain).
        let before = seconds(me).ok_or_else(|| anyhow::anyhow!("no schedstat"))?;
        // The thread spins until it has itself used 0.2 CPU-s, not for 0.2 s of wall time: on a
        // machine other suites keep busy, a wall-time spin may get half of that.
        let used = std::thread::spawn(|| {
            let own_ns = || {
                std::fs::read_to_string("/proc/thread-self/schedstat")
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            };
            let start = own_ns();
            let t0 = std::time::Instant::now();
            let mut x = 0u64;
            while t0.elapsed() < std::time::Duration::from_secs(30) {
                for _ in 0..100_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
                let enough = match (start, own_ns()) {
                    (Some(a), Some(b)) => b >= a + 200_000_000,
                    _ => t0.elapsed() >= std::time::Duration::from_millis(200),
                };
                if enough {
                    break;
                }
            }
        });
        used.join()
            .map_err(|_| anyhow::anyhow!("the spinning thread panicked"))?;
        let after = seconds(me).ok_or_else(|| anyhow::anyhow!("no schedstat"))?;
        assert!(after - before >= 0.1, "{before} → {after}");
        let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
        let found = children(me).contains(&child.id());
        child.kill()?;
        child.wait()?;
        assert!(found, "the child is listed");
        Ok(())
    }

    #[test]
    fn the_machine_is_seen_busy_while_this_process_spins() -> anyhow::Result<()> {
        let before = MachineCpu::read()?;
        let spun = std::time::Instant::now();
        let mut x = 0u64;
        while spun.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let used = MachineCpu::read()?.since(&before)?;
        // One core spun for 0.3 s of the ~0.3 s × cores that passed (ticks are 10 ms).
        assert!(used.busy >= 0.2 && used.busy <= used.total, "{used}");
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
