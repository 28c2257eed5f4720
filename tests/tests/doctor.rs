//! `floe doctor` on this machine, as a newcomer runs it: what the test machine has passes, and
//! a machine without Node (or with one too old) is told so, with the fix, exit 1.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use anyhow::Result;
use floe_tests::floe_bin;

fn doctor(path: Option<&str>, args: &[&str]) -> Result<(i32, String)> {
    let mut cmd = Command::new(floe_bin()?);
    cmd.arg("doctor").args(args);
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    let out = cmd.output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    ))
}

#[test]
fn this_machine_has_what_local_mode_needs() -> Result<()> {
    let (code, text) = doctor(None, &[])?;
    assert_eq!(code, 0, "{text}");
    for part in ["sandbox", "node", "npm", "python3", "disk"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("ok ") && l.contains(part)),
            "{part}: {text}"
        );
    }
    assert!(text.contains("bubblewrap"), "{text}");
    Ok(())
}

#[test]
fn a_missing_or_old_node_is_named_with_its_fix() -> Result<()> {
    // Not under /tmp: the sandbox's probe looks `true` up on this PATH, and a sandbox has a
    // /tmp of its own.
    std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR"))?;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin)?;
    // Everything this machine has but Node and npm: `python3` and `curl` run as found on the
    // test's own PATH (a pyenv shim needs it), `bwrap` and `true` (run inside the probe
    // sandbox, which does not follow a link out of this directory) as copies or links.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let real = |tool: &str| {
        std::env::split_paths(&path)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow::anyhow!("{tool} on this machine"))
    };
    for tool in ["python3", "curl"] {
        let wrapper = bin.join(tool);
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nPATH='{}' exec {tool} \"$@\"\n",
                path.to_string_lossy()
            ),
        )?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    }
    std::os::unix::fs::symlink(real("bwrap")?, bin.join("bwrap"))?;
    std::fs::copy(real("true")?, bin.join("true"))?;
    let path = bin.display().to_string();
    let (code, text) = doctor(Some(&path), &[])?;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL node") && l.ends_with("`node` is not on PATH")),
        "{text}"
    );
    assert!(text.contains("fix: install Node 20.6 or newer"), "{text}");
    assert!(text.contains("FAIL npm"), "{text}");
    assert!(text.contains("2 problem(s) to fix"), "{text}");

    let node = bin.join("node");
    std::fs::write(&node, "#!/bin/sh\necho v18.19.0\n")?;
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o755))?;
    let (code, text) = doctor(Some(&path), &[])?;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("Node v18.19.0 is older than 20.6, which the harnesses need"),
        "{text}"
    );
    Ok(())
}
