//! The trainer's own ingest (`floe_trainer.ingest`, the standard library only) served by a
//! `python3` process of its own: what a train job's trainer pod answers at `/v1/trajectories`
//! and `/v1/partial`, without a model to train. For the gateway's side of that contract
//! against the real thing, where [`crate::TestIngest`] only records.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::workspace_root;

const SERVE: &str = r#"
import sys
from pathlib import Path
from floe_trainer.ingest import Ingest, Store, make_server
ingest = Ingest(Store(Path(sys.argv[1])), lambda t: None)
srv = make_server(ingest, ("127.0.0.1", int(sys.argv[2])), lambda: {"ingest": dict(ingest.counts)})
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// As the trainer does on the operator's ruling that the session failed by its agent's doing.
const SCORE: &str = r#"
import json, sys
from pathlib import Path
from floe_trainer.ingest import Ingest, Store
ingest = Ingest(Store(Path(sys.argv[1])), lambda t: None)
scored = ingest.score_partial(sys.argv[2], sys.argv[3], int(sys.argv[4]), "evicted")
print(json.dumps({"scored": scored is not None, "counts": ingest.counts}))
"#;

pub struct TrainerIngest {
    /// `…/v1/trajectories`, as a gateway's sink names it.
    pub url: String,
    /// The ingest's store: `<session>.json`, `partial/`.
    pub dir: PathBuf,
    port: u16,
    child: Child,
}

fn python(script: &str) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(script)
        .env("PYTHONPATH", workspace_root().join("trainer"));
    cmd
}

impl TrainerIngest {
    pub fn start(dir: &Path) -> Result<Self> {
        Self::start_on(dir, 0)
    }

    fn start_on(dir: &Path, port: u16) -> Result<Self> {
        let mut child = python(SERVE)
            .arg(dir)
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("python3 serving floe_trainer.ingest")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("its stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        let port: u16 = line
            .trim()
            .parse()
            .with_context(|| format!("the ingest's port, not {line:?}"))?;
        Ok(Self {
            url: format!("http://127.0.0.1:{port}/v1/trajectories"),
            dir: dir.to_path_buf(),
            port,
            child,
        })
    }

    /// Stop it (SIGKILL, as a trainer pod lost) and start another on the same port and files:
    /// it holds the snapshots on disk, and nothing of what it took since it started.
    pub fn restart(&mut self) -> Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        *self = Self::start_on(&self.dir, self.port)?;
        Ok(())
    }

    /// Its `/v1/status` (here: `{"ingest": counts}`).
    pub async fn status(&self) -> Result<Value> {
        let url = self.url.replace("/v1/trajectories", "/v1/status");
        Ok(reqwest::get(url).await?.error_for_status()?.json().await?)
    }

    /// Score `session`'s last snapshot as the agent's loss from the files alone, in a process
    /// of its own (as a trainer restarted since would): whether it was, and the counts.
    pub fn score_partial(&self, session: &str, group: &str, sample: u32) -> Result<Value> {
        let out = python(SCORE)
            .arg(&self.dir)
            .args([session, group, &sample.to_string()])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "scoring failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Drop for TrainerIngest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
