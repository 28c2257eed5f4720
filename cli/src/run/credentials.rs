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
    // A root Podman's registry logins.
    "/run/containers/0/auth.json",
];

/// Variables that name a credential file, or a directory a credential tool keeps its logins in,
/// each hidden whole. The sandbox does not inherit a credential-like variable, but the file it
/// names is still where it was, and an agent can guess the path, or find it in a shell's rc file.
pub const NAMING_A_STORE: &[&str] = &[
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AZURE_CONFIG_DIR",
    "AZURE_FEDERATED_TOKEN_FILE",
    "OCI_CLI_CONFIG_FILE",
    "DOCKER_CONFIG",
    "REGISTRY_AUTH_FILE",
    "NETRC",
    "GNUPGHOME",
    "PASSWORD_STORE_DIR",
    "GH_CONFIG_DIR",
    "NPM_CONFIG_USERCONFIG",
    "PIP_CONFIG_FILE",
    "HF_TOKEN_PATH",
    "WANDB_CONFIG_DIR",
    "KAGGLE_CONFIG_DIR",
    "DATABRICKS_CONFIG_FILE",
    "TF_CLI_CONFIG_FILE",
    "RCLONE_CONFIG",
    "BOTO_CONFIG",
    "PGPASSFILE",
    "HISTFILE",
    "SSH_AUTH_SOCK",
    "KUBE_CONFIG_PATH",
    "DOCKER_CERT_PATH",
    "SOPS_AGE_KEY_FILE",
    "GIT_SSL_KEY",
    // Kerberos' ticket cache, as `FILE:/path` or a path.
    "KRB5CCNAME",
];

/// Variables that move a directory the lists above name a file in: where a tool keeps its
/// token when the variable is set (`HF_HOME=/data/hf` keeps it in `/data/hf/token`).
pub const MOVING_A_STORE: &[(&str, &[&str])] = &[
    ("HF_HOME", &["token", "stored_tokens"]),
    ("CARGO_HOME", &["credentials", "credentials.toml"]),
    ("CODEX_HOME", &["auth.json"]),
    ("CLAUDE_CONFIG_DIR", &[".credentials.json", ".claude.json"]),
    // Podman's and skopeo's login, when no `REGISTRY_AUTH_FILE` says otherwise.
    ("XDG_RUNTIME_DIR", &["containers/auth.json"]),
];

/// The XDG variables, each with the part of a home it stands for: [`IN_HOME`]'s entries under
/// that part are also looked for under the variable's directory.
const XDG: &[(&str, &str)] = &[
    ("XDG_CONFIG_HOME", ".config/"),
    ("XDG_DATA_HOME", ".local/share/"),
    ("XDG_CACHE_HOME", ".cache/"),
];

/// The places `vars` (the environment of `floe run`) name or move credentials to. A directory
/// that holds one of `keep` (a home, the working directory, a `PATH` entry: what the sandbox
/// must show), or `/`, is not taken: a variable pointed at a home would hide the home.
pub fn named_by_environment(vars: &[(String, String)], keep: &[PathBuf]) -> Vec<PathBuf> {
    let value = |name: &str| {
        vars.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v.strip_prefix("FILE:").unwrap_or(v)))
    };
    let mut named: Vec<PathBuf> = NAMING_A_STORE.iter().filter_map(|n| value(n)).collect();
    // A list of files, `:`-separated, as kubectl reads it.
    if let Some((_, list)) = vars.iter().find(|(k, _)| k == "KUBECONFIG") {
        named.extend(list.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
    }
    for (var, files) in MOVING_A_STORE {
        if let Some(dir) = value(var) {
            named.extend(files.iter().map(|f| dir.join(f)));
        }
    }
    for (var, part) in XDG {
        if let Some(dir) = value(var) {
            named.extend(
                IN_HOME
                    .iter()
                    .filter_map(|p| p.strip_prefix(part))
                    .map(|rest| dir.join(rest)),
            );
        }
    }
    let keep: Vec<PathBuf> = keep
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .collect();
    named
        .into_iter()
        .filter(|p| {
            let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            real.parent().is_some() && !keep.iter().any(|k| k.starts_with(&real))
        })
        .collect()
}

/// The places above that exist under `homes`, on the host (`root`, `/` but for tests) and in
/// `named` ([`named_by_environment`]), canonical (bubblewrap mounts over real paths), each once,
/// plus the host's SSH private keys.
pub fn credential_stores(homes: &[PathBuf], root: &Path, named: &[PathBuf]) -> Vec<Hidden> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for home in homes {
        candidates.extend(IN_HOME.iter().map(|p| home.join(p)));
    }
    candidates.extend_from_slice(named);
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
        // Nothing of the kernel's: `HISTFILE=/dev/null` (or a history linked there) would
        // cover the sandbox's own `/dev/null` with a bind that cannot be opened.
        if ["/dev", "/proc", "/sys"]
            .iter()
            .any(|k| real.starts_with(k))
        {
            continue;
        }
        let Ok(kind) = std::fs::symlink_metadata(&real).map(|m| m.file_type()) else {
            continue;
        };
        use std::os::unix::fs::FileTypeExt;
        let h = if kind.is_dir() {
            Hidden::Dir(real)
        } else if kind.is_file() || kind.is_socket() {
            Hidden::File(real)
        } else {
            continue;
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
        let hidden = credential_stores(&[home.clone(), root.join("home/alias")], &root, &[]);
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

    #[test]
    fn the_files_and_directories_the_environment_names_are_hidden_but_never_a_home(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        let home = root.join("home/alice");
        std::fs::create_dir_all(&home)?;
        let keys = root.join("keys");
        std::fs::create_dir_all(keys.join("gcloud"))?;
        std::fs::create_dir_all(root.join("hf"))?;
        for file in ["sa.json", "kube-a", "kube-b"] {
            std::fs::write(keys.join(file), "secret")?;
        }
        std::fs::write(root.join("hf/token"), "hf_x")?;
        let var = |k: &str, v: &Path| (k.to_string(), v.display().to_string());
        let vars = vec![
            var("GOOGLE_APPLICATION_CREDENTIALS", &keys.join("sa.json")),
            (
                "KUBECONFIG".into(),
                format!(
                    "{}::{}",
                    keys.join("kube-a").display(),
                    keys.join("kube-b").display()
                ),
            ),
            var("HF_HOME", &root.join("hf")),
            // `gcloud` under it, as `.config/gcloud` under a home.
            var("XDG_CONFIG_HOME", &keys),
            // A variable pointed at the home or at `/` would hide what the sandbox needs.
            var("DOCKER_CONFIG", &home),
            var("GNUPGHOME", Path::new("/")),
            ("NETRC".into(), String::new()),
            // Not to be covered: the sandbox's own `/dev/null` is needed.
            var("HISTFILE", Path::new("/dev/null")),
            var("UNRELATED", &keys.join("sa.json")),
        ];
        let named = named_by_environment(&vars, std::slice::from_ref(&home));
        let hidden = credential_stores(&[], &root, &named);
        assert_eq!(
            hidden,
            [
                Hidden::File(keys.join("sa.json")),
                Hidden::File(keys.join("kube-a")),
                Hidden::File(keys.join("kube-b")),
                Hidden::File(root.join("hf/token")),
                Hidden::Dir(keys.join("gcloud")),
            ]
        );
        Ok(())
    }
}
