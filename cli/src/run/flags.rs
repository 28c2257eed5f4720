//! `floe run`'s flags before anything runs: what would make a run do nothing (refused), and
//! every path made absolute.

use std::path::PathBuf;

use super::{RunArgs, RunError};

/// Flags that would make a run do nothing, or something other than asked.
pub fn check(args: &RunArgs) -> Result<(), RunError> {
    if args.sessions == Some(0) {
        return Err(RunError::Usage(
            "--sessions 0 runs nothing: give at least 1 (or leave it out for every session)".into(),
        ));
    }
    if args.concurrency == Some(0) {
        return Err(RunError::Usage("--concurrency must be at least 1".into()));
    }
    Ok(())
}

/// Every path the run hands a child process (bubblewrap's bind sources, the runner's workspace,
/// the trainer's output) is absolute: a relative one names something else from the child's
/// working directory, and bubblewrap resolves a bind source against its own.
pub fn absolute_paths(args: &mut RunArgs) -> Result<(), RunError> {
    // A bare program name (`python3`) is looked up on PATH, not in the working directory.
    let named_by_path = |p: &Option<PathBuf>| {
        p.as_ref()
            .filter(|p| p.components().count() > 1 || p.is_absolute())
            .is_some()
    };
    let (vllm, trainer) = (
        named_by_path(&args.vllm_python),
        named_by_path(&args.trainer_python),
    );
    for path in [
        Some(&mut args.out),
        Some(&mut args.job),
        args.vllm_python.as_mut().filter(|_| vllm),
        args.trainer_python.as_mut().filter(|_| trainer),
    ]
    .into_iter()
    .flatten()
    {
        // Joined to the working directory as the kernel would (`..` kept, no link followed).
        *path = std::path::absolute(&*path)
            .map_err(|e| RunError::Usage(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
