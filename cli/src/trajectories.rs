//! `floe trajectories build|stats`: inspect what the builders make of captured sessions.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use floe_gateway::capture::{find_sessions, read_session_slim, CaptureReadError};
use floe_gateway::trajectory::{
    build_trajectory, BuildOptions, Builder, SessionInfo, SessionOutcome, Trajectory,
};

#[derive(Subcommand)]
pub enum TrajectoriesCommand {
    /// Build the trajectory of each session capture directory and print them as JSONL
    /// (unscored: no reward, `trainable: false`).
    Build {
        /// `prefix_merging` (default) or `per_request`.
        #[arg(long, default_value = "prefix_merging")]
        builder: Builder,
        /// End-of-turn token id (default: inferred from the calls that stopped).
        #[arg(long)]
        end_of_turn: Option<u32>,
        /// Longest merged trace, in tokens.
        #[arg(long)]
        max_length: Option<usize>,
        /// Leave out the calls of this request class, as a job's
        /// `trajectory.excludeRequestClasses` does (repeatable).
        #[arg(long = "exclude-class", value_name = "CLASS")]
        exclude_classes: Vec<String>,
        /// Build for imitation, as an sft job's dataset is: a tool call the harness could not
        /// parse trains no token.
        #[arg(long)]
        imitation: bool,
        /// Session capture directories, or directories holding them.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Totals per builder over session capture directories: samples, tokens, breaks by reason.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum TrajectoriesError {
    #[error("no session capture (completions.jsonl) under {0}")]
    NoSessions(String),
    #[error("cannot list {0}")]
    List(#[from] std::io::Error),
    #[error(transparent)]
    Read(#[from] CaptureReadError),
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn sessions(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, TrajectoriesError> {
    let found = find_sessions(dirs)?;
    if found.is_empty() {
        let names: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(TrajectoriesError::NoSessions(names.join(", ")));
    }
    Ok(found)
}

fn build_one(
    dir: &std::path::Path,
    options: &BuildOptions,
) -> Result<Trajectory, TrajectoriesError> {
    let capture = read_session_slim(dir)?;
    let meta = capture.meta.unwrap_or_default();
    let info = SessionInfo {
        session: if meta.session.is_empty() {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            meta.session
        },
        task: meta.task,
        group: meta.group,
        sample: meta.sample,
        metadata: meta.metadata,
    };
    Ok(build_trajectory(
        &info,
        &capture.records,
        options,
        &SessionOutcome::Unscored,
    ))
}

pub fn run(command: TrajectoriesCommand, out: &mut impl Write) -> Result<(), TrajectoriesError> {
    match command {
        TrajectoriesCommand::Build {
            builder,
            end_of_turn,
            max_length,
            exclude_classes,
            imitation,
            dirs,
        } => {
            let options = BuildOptions {
                builder,
                end_of_turn,
                max_length,
                exclude_classes,
                imitation,
            };
            for dir in sessions(&dirs)? {
                serde_json::to_writer(&mut *out, &build_one(&dir, &options)?)?;
                writeln!(out)?;
            }
        }
        TrajectoriesCommand::Stats { json, dirs } => {
            let dirs = sessions(&dirs)?;
            let mut totals = BTreeMap::new();
            for builder in [Builder::PerRequest, Builder::PrefixMerging] {
                let options = BuildOptions {
                    builder,
                    ..Default::default()
                };
                let mut total = Totals {
                    sessions: dirs.len() as u64,
                    ..Default::default()
                };
                for dir in &dirs {
                    total.add(&build_one(dir, &options)?);
                }
                totals.insert(builder_name(builder), total);
            }
            if json {
                serde_json::to_writer_pretty(&mut *out, &totals)?;
                writeln!(out)?;
            } else {
                print_table(&totals, out)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

fn builder_name(builder: Builder) -> &'static str {
    match builder {
        Builder::PerRequest => "per_request",
        Builder::PrefixMerging => "prefix_merging",
    }
}

#[derive(Default, serde::Serialize)]
struct Totals {
    sessions: u64,
    completions: u64,
    samples: u64,
    sampled_tokens: u64,
    total_tokens: u64,
    breaks: u64,
    starts: BTreeMap<String, u64>,
}

impl Totals {
    fn add(&mut self, t: &Trajectory) {
        let s = &t.stats;
        self.completions += s.completions;
        self.samples += s.traces;
        self.sampled_tokens += s.sampled_tokens;
        self.total_tokens += s.total_tokens;
        self.breaks += s.breaks;
        for (reason, n) in &s.starts {
            let name = serde_json::to_value(reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            *self.starts.entry(name).or_default() += n;
        }
    }
}

fn print_table(totals: &BTreeMap<&str, Totals>, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<15} {:>8} {:>11} {:>8} {:>15} {:>13} {:>7}  trace starts",
        "builder", "sessions", "completions", "samples", "trainable_toks", "total_toks", "breaks"
    )?;
    for (name, t) in totals {
        let starts: Vec<String> = t.starts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(
            out,
            "{:<15} {:>8} {:>11} {:>8} {:>15} {:>13} {:>7}  {}",
            name,
            t.sessions,
            t.completions,
            t.samples,
            t.sampled_tokens,
            t.total_tokens,
            t.breaks,
            starts.join(" ")
        )?;
    }
    Ok(())
}
