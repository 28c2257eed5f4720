//! The end of a train run's sessions: the trainer trains what is left and writes the final
//! model, unless a signal cuts it short.

use super::super::signals::{Signals, Stop};
use super::Training;

/// What finishing the trainer came to.
pub struct Finished {
    pub status: Option<serde_json::Value>,
    pub failure: Option<String>,
    pub stopped: Option<Stop>,
}

/// The trainer trains what is left and writes the final model; a signal cuts it short.
pub async fn finish(t: &mut Training, signals: &mut Signals) -> Finished {
    eprintln!("[train] sessions done: the trainer trains what is left and writes the final model");
    let (mut failure, mut stopped) = (None, None);
    let status = tokio::select! {
        r = t.finish() => match r {
            Ok(status) => Some(status),
            Err(e) => {
                failure = Some(e.to_string());
                t.status().await
            }
        },
        stop = signals.recv() => {
            stopped = Some(stop);
            t.status().await
        }
    };
    Finished {
        status,
        failure,
        stopped,
    }
}
