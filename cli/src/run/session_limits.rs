//! `floe run`'s per-session resource limits ([`floe_sandbox::limits`]): the flags, and the
//! limits this machine allows.

use floe_sandbox::limits::{self, Limits};

#[derive(clap::Args, Clone, Debug)]
pub struct SessionLimitArgs {
    /// Memory each session's harness and evaluator may use (a cgroup of the session's own),
    /// e.g. `4Gi`, `512Mi`; `0`: no limit. One session cannot starve a concurrent sibling.
    #[arg(long, default_value = "4Gi", value_parser = parse_bytes)]
    pub session_memory: u64,
    /// Processes (and threads) each session may have at once; `0`: no limit.
    #[arg(long, default_value_t = 1024)]
    pub session_pids: u64,
}

/// `4Gi`, `512Mi`, `100Ki` or a number of bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        _ => {
            return Err(format!(
                "{text:?}: a number of bytes, or one with Ki, Mi, Gi or Ti"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a number of bytes, or one with Ki, Mi, Gi or Ti"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
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

    #[test]
    fn sizes_are_kubernetes_style() {
        assert_eq!(parse_bytes("4Gi"), Ok(4 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("4GB").is_err());
        assert!(parse_bytes("Gi").is_err());
    }
}
