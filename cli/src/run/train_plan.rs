//! `floe run`'s question to the trainer before a train job starts anything: its memory plan
//! for the job's step (`floe-trainer plan`, the same program the run would start).

use std::path::Path;
use std::process::Stdio;

use serde_json::Value;
use tokio::process::Command;

use super::RunError;

/// `floe-trainer`, or the module in the Python given.
fn trainer_command(trainer_python: Option<&Path>) -> Command {
    match trainer_python {
        Some(py) => {
            let mut c = Command::new(py);
            c.args(["-m", "floe_trainer.cli"]);
            c
        }
        None => Command::new("floe-trainer"),
    }
}

/// `floe-trainer plan`: the trainer's memory plan for this config, made without loading the
/// model. A step that cannot fit (exit 3) fails the run before any process starts, with the
/// trainer's one line; `memoryPlan: Warn` lets it through with that line in the trainer's log.
pub async fn check_memory_plan(
    config: &Value,
    trainer_python: Option<&Path>,
) -> Result<(), RunError> {
    let out = trainer_command(trainer_python)
        .arg("plan")
        .env("FLOE_TRAINER_CONFIG", config.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| RunError::Preflight(format!("cannot run the trainer's memory plan: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    match out.status.code() {
        Some(0) => {
            let planned: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            if let (Some(need), Some(have)) = (
                planned["totalBytes"].as_f64(),
                planned["capacityBytes"].as_f64(),
            ) {
                let gib = f64::from(1u32 << 30);
                eprintln!(
                    "[train] memory plan: a training step needs {:.1} GiB of the {:.1} GiB the trainer has",
                    need / gib,
                    have / gib
                );
            }
            Ok(())
        }
        Some(3) => Err(RunError::Preflight(last.trim().to_string())),
        _ => Err(RunError::Preflight(format!(
            "the trainer exited while making its memory plan ({}): {}",
            out.status,
            last.trim()
        ))),
    }
}
