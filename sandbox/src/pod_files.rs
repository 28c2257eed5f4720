//! The files a pod's containers share that a root grader could rewrite: the kubelet mounts one
//! `/etc/hosts` (and the runtime one `/etc/resolv.conf`) into every container of the pod,
//! writable and root's. A SWE-bench pod's grader runs the agent's code as root
//! ([`crate::children::AgentContainer::user`]): that code could point the name the gateway
//! ships the session to at nothing, and turn its loss into an unshipped, retried session. So
//! they are read before the session (before anything of the agent's runs) and put back as
//! they were after the evaluation, before anything ships.

use std::path::{Path, PathBuf};

/// What the pod's containers resolve names by.
pub const SHARED: [&str; 3] = ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"];

/// Larger than any such file honestly is; a file past it is not kept (nor put back).
const MAX_BYTES: u64 = 1 << 20;

/// The shared files as they were: path, mode, content.
pub struct Kept(Vec<(PathBuf, u32, Vec<u8>)>);

impl Kept {
    /// Reads `paths` (those that are regular files within [`MAX_BYTES`]).
    pub fn read(paths: &[&Path]) -> Self {
        Self(
            paths
                .iter()
                .filter_map(|p| {
                    use std::os::unix::fs::PermissionsExt;
                    let meta = std::fs::symlink_metadata(p).ok()?;
                    let mode = meta.permissions().mode();
                    (meta.is_file() && meta.len() <= MAX_BYTES)
                        .then(|| std::fs::read(p).ok().map(|b| (p.to_path_buf(), mode, b)))
                        .flatten()
                })
                .collect(),
        )
    }

    /// Puts back each kept file whose mode or content changed (in place: a mount point cannot
    /// be replaced by a rename). Returns the ones put back; `Err` for one that could not be.
    pub fn restore(&self) -> Result<Vec<PathBuf>, String> {
        use std::os::unix::fs::PermissionsExt;
        let mut restored = Vec::new();
        for (path, mode, kept) in &self.0 {
            let now = std::fs::symlink_metadata(path).map(|m| m.permissions().mode());
            if now.as_ref().ok() == Some(mode) && std::fs::read(path).ok().as_ref() == Some(kept) {
                continue;
            }
            let put_back = std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                .and_then(|()| std::fs::write(path, kept));
            put_back.map_err(|e| format!("putting back {}: {e}", path.display()))?;
            restored.push(path.clone());
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_file_is_put_back_and_an_untouched_one_left() {
        let dir = tempfile::tempdir().expect("tmp");
        let (hosts, resolv) = (dir.path().join("hosts"), dir.path().join("resolv.conf"));
        std::fs::write(&hosts, "10.0.0.7 trainer.ns.svc\n").expect("w");
        std::fs::write(&resolv, "nameserver 10.96.0.10\n").expect("w");
        let kept = Kept::read(&[&hosts, &resolv, &dir.path().join("absent")]);
        std::fs::write(&hosts, "127.0.0.1 trainer.ns.svc\n").expect("w");
        assert_eq!(kept.restore(), Ok(vec![hosts.clone()]));
        // Made unreadable to the gateway's user.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&resolv, std::fs::Permissions::from_mode(0o600))
                .expect("chmod");
            assert_eq!(kept.restore(), Ok(vec![resolv.clone()]));
            let mode = std::fs::metadata(&resolv).expect("m").permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
        }
        assert_eq!(
            std::fs::read_to_string(&hosts).expect("r"),
            "10.0.0.7 trainer.ns.svc\n"
        );
        assert_eq!(kept.restore(), Ok(vec![]));
    }
}
