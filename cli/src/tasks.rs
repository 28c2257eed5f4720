//! `floe tasks`: what a job (or a task file) would run, checked as `floe run` and the operator
//! check it, without a cluster and without running anything. For SWE-bench instances: each
//! instance's image, repository and commit, test lists, log parser and test command.

use std::path::PathBuf;

use clap::Args;
use floe_crds::rollout_job::{SweBenchTasks, Task, TaskSource};
use floe_crds::swebench::{Checkouts, EVAL_SCRIPT};

#[derive(Args)]
pub struct TasksArgs {
    /// A RolloutJob file (its tasks, wherever its `spec.tasks` says), or a JSONL task file.
    file: PathBuf,
    /// The JSONL file holds SWE-bench instances (as `tasks.swebench` reads them).
    #[arg(long)]
    swebench: bool,
    /// With `--swebench`: the image template of instances that name none (`{id}`: the public
    /// images' spelling of the instance id).
    #[arg(long)]
    image: Option<String>,
    /// Print the tasks as floe task JSON lines (what `tasks.swebench` makes of each instance)
    /// instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Exit 0 when every task is valid, 2 (with the line that says why) otherwise.
pub fn main(args: &TasksArgs) -> i32 {
    match load(args) {
        Ok(tasks) => {
            let out = if args.json {
                tasks
                    .iter()
                    .map(|t| serde_json::to_string(t).unwrap_or_default() + "\n")
                    .collect()
            } else {
                summary(&tasks)
            };
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("floe tasks: {e}");
            2
        }
    }
}

fn load(args: &TasksArgs) -> Result<Vec<Task>, String> {
    let is_job = args
        .file
        .extension()
        .is_some_and(|e| e == "yaml" || e == "yml");
    if is_job {
        if args.swebench || args.image.is_some() {
            return Err(
                "--swebench and --image are for a JSONL file; a job says it in spec.tasks".into(),
            );
        }
        // As `floe run` reads it: paths relative to the job file, made absolute.
        let file = std::path::absolute(&args.file).map_err(|e| e.to_string())?;
        return crate::run::load_plan(&file)
            .map(|plan| plan.tasks)
            .map_err(|e| e.to_string());
    }
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let mut settings = SweBenchTasks::default();
    if let Some(image) = &args.image {
        settings.image = image.clone();
    }
    let source = TaskSource {
        swebench: args.swebench.then_some(settings),
        ..Default::default()
    };
    // The parser checks each task against the schema and the ids for duplicates.
    floe_crds::task_file::parse_source(&text, &source, Checkouts::Image)
        .map_err(|e| format!("task file {}, {e}", args.file.display()))
}

/// One block per task, then the totals.
fn summary(tasks: &[Task]) -> String {
    let mut out = String::new();
    let mut images = std::collections::BTreeSet::new();
    let mut repos = std::collections::BTreeSet::new();
    for task in tasks {
        out.push_str(&task.id);
        out.push('\n');
        if let Some(image) = &task.image {
            images.insert(image.clone());
            out.push_str(&format!("  image       {image}\n"));
        }
        if let Some(r) = &task.repository {
            out.push_str(&format!("  repository  {} at {}\n", r.path, r.commit));
        }
        let evaluation = task.evaluation.clone().unwrap_or_default();
        if let Some(g) = &evaluation.swebench {
            repos.insert(g.repo.clone());
            out.push_str(&format!(
                "  swebench    {} {} · {} FAIL_TO_PASS, {} PASS_TO_PASS · {} ({})\n",
                g.repo,
                g.version,
                g.fail_to_pass.len(),
                g.pass_to_pass.len(),
                g.log_parser,
                g.eval_type
            ));
        }
        if let Some(script) = evaluation.hidden_files.get(EVAL_SCRIPT) {
            for line in floe_crds::swebench::test_commands(script) {
                out.push_str(&format!("  test        {line}\n"));
            }
        }
        let hidden = evaluation.hidden_files.len();
        if hidden > 0 {
            out.push_str(&format!(
                "  hidden      {hidden} file(s), the evaluator's only\n"
            ));
        }
    }
    out.push_str(&format!(
        "{} task(s), {} image(s), {} SWE-bench repositor{}\n",
        tasks.len(),
        images.len(),
        repos.len(),
        if repos.len() == 1 { "y" } else { "ies" }
    ));
    out
}
