//! Where a machine keeps credentials, hidden from every sandbox of a local run. The sandbox
//! shows the host read-only, and its agent acts on files as `floe run`'s own user (as host
//! root in a root run, without its capabilities): that user's SSH keys, cloud and registry
//! logins and shell history, and in a root run the password hashes and host keys, are
//! otherwise one `cat` away, and whatever the agent reads lands in its trajectory.
//!
//! A list of well-known places, not a proof: a secret a user keeps elsewhere in their home is
//! still readable (docs/security.md says so).

use std::path::{Path, PathBuf};

use floe_sandbox::confine::Hidden;

/// Under a home directory: keys, logins and tokens of the tools ML teams use, and shell
/// histories (which hold the `export TOKEN=…` lines typed there).
pub const IN_HOME: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".password-store",
    ".local/share/keyrings",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".oci",
    ".kube",
    ".docker",
    ".config/containers/auth.json",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".npmrc",
    ".yarnrc.yml",
    ".pypirc",
    ".config/pip/pip.conf",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".cache/huggingface/token",
    ".cache/huggingface/stored_tokens",
    ".huggingface/token",
    ".config/wandb",
    ".kaggle",
    ".databrickscfg",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".config/rclone",
    ".s3cfg",
    ".boto",
    ".pgpass",
    ".my.cnf",
    // The coding agents' own logins, on the machines of the people who train them: a
    // subscription's OAuth token or an API key (each harness in a sandbox has a home of its
    // own, so none of these is the one it uses).
    ".codex/auth.json",
    ".claude/.credentials.json",
    ".claude.json",
    ".gemini/oauth_creds.json",
    ".gemini/.env",
    ".qwen/oauth_creds.json",
    ".qwen/.env",
    ".pi/agent/auth.json",
    ".env",
    ".bash_history",
    ".zsh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
];

/// On the host itself (what a root run's agent could otherwise read): password hashes, a
/// Kubernetes node's or control plane's credentials, secrets a container runtime mounted.
pub const ON_HOST: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/kubernetes",
    "/var/lib/kubelet/pki",
    "/run/secrets",
    "/var/run/secrets",
];

/// The places above that exist under `homes` and on the host (`root`, `/` but for tests),
/// canonical (bubblewrap mounts over real paths), each once, plus the host's SSH private keys.
pub fn credential_stores(homes: &[PathBuf], root: &Path) -> Vec<Hidden> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for home in homes {
        candidates.extend(IN_HOME.iter().map(|p| home.join(p)));
    }
    candidates.extend(ON_HOST.iter().map(|p| root.join(p.trim_start_matches('/'))));
    let ssh = root.join("etc/ssh");
    for entry in std::fs::read_dir(&ssh).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("ssh_host_") && name.ends_with("_key") {
            candidates.push(entry.path());
        }
    }
    let mut hidden: Vec<Hidden> = Vec::new();
    for path in candidates {
        // A link is hidden where it leads; a place that is not there needs no hiding.
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        let h = if real.is_dir() {
            Hidden::Dir(real)
        } else {
            Hidden::File(real)
        };
        if !hidden.contains(&h) {
            hidden.push(h);
        }
    }
    hidden
}

/// The homes of `floe run`'s user: `$HOME` and its account's (they differ under `sudo`
/// without `-H`, or in a container whose `HOME` was set elsewhere).
pub fn homes() -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::geteuid()) {
        if !homes.contains(&user.dir) {
            homes.push(user.dir);
        }
    }
    homes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stores_that_exist_are_hidden_where_they_lead_and_once(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        let home = root.join("home/alice");
        std::fs::create_dir_all(home.join(".ssh"))?;
        std::fs::create_dir_all(home.join(".cache/huggingface"))?;
        std::fs::write(home.join(".cache/huggingface/token"), "hf_x")?;
        std::fs::create_dir_all(root.join("etc/ssh"))?;
        std::fs::write(root.join("etc/ssh/ssh_host_ed25519_key"), "k")?;
        std::fs::write(root.join("etc/ssh/ssh_host_ed25519_key.pub"), "k")?;
        std::fs::write(root.join("etc/ssh/sshd_config"), "")?;
        std::fs::write(root.join("etc/shadow"), "root:*:")?;
        // The netrc a dotfiles repository links in; a second name for the same home.
        std::fs::create_dir_all(root.join("dotfiles"))?;
        std::fs::write(root.join("dotfiles/netrc"), "machine x password y")?;
        std::os::unix::fs::symlink(root.join("dotfiles/netrc"), home.join(".netrc"))?;
        std::os::unix::fs::symlink(&home, root.join("home/alias"))?;
        let hidden = credential_stores(&[home.clone(), root.join("home/alias")], &root);
        assert_eq!(
            hidden,
            [
                Hidden::Dir(home.join(".ssh")),
                Hidden::File(root.join("dotfiles/netrc")),
                Hidden::File(home.join(".cache/huggingface/token")),
                Hidden::File(root.join("etc/shadow")),
                Hidden::File(root.join("etc/ssh/ssh_host_ed25519_key")),
            ]
        );
        Ok(())
    }
}
