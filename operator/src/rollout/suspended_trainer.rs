//! A train job suspended after it started. Kueue preempts a job by suspending it and hands its
//! quota to another; a trainer left running kept the GPUs Kueue counted free. Once none of its
//! sessions runs and every failure is told (or it cannot hear them: not Ready), the trainer
//! pod ends (its SIGTERM checkpoints the steps since its last checkpoint), and a resumed job
//! makes it again: it goes on from that checkpoint, replaying from the claim what it had not
//! trained. Only with a checkpoint volume: without one the trainer's steps live only in its
//! pod, which keeps running (sans-IO).

/// What the round knows of a train job and its trainer pod.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuspendedTrainer {
    pub suspended: bool,
    /// `spec.train.checkpoint` names a claim.
    pub checkpointed: bool,
    /// The trainer pod is there and not being deleted.
    pub pod_alive: bool,
    /// The trainer pod is Ready: it can be told what failed.
    pub pod_ready: bool,
    /// The trainer said it finished (its final model written): the job's end takes it.
    pub finished: bool,
    /// Every session of the job's own is done: the trainer trains the last groups and writes
    /// the final model (told to finish this round), which stopping it would hold up until the
    /// job is resumed.
    pub sessions_done: bool,
    /// Sessions running after this round.
    pub running: u32,
    /// Failures the trainer has not been told of yet.
    pub untold_failures: usize,
}

impl SuspendedTrainer {
    /// Whether the trainer pod ends now.
    pub fn stops(&self) -> bool {
        self.suspended
            && self.checkpointed
            && self.pod_alive
            && !self.finished
            && !self.sessions_done
            && self.running == 0
            // Told first if it can hear them; one that cannot (Pending, crash-looping) is
            // told once the resumed job's trainer is back (they stay in the job's status),
            // and must not keep GPUs while the job is suspended meanwhile.
            && (self.untold_failures == 0 || !self.pod_ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suspended() -> SuspendedTrainer {
        SuspendedTrainer {
            suspended: true,
            checkpointed: true,
            pod_alive: true,
            pod_ready: true,
            ..SuspendedTrainer::default()
        }
    }

    #[test]
    fn a_trainer_that_cannot_hear_its_untold_failures_stops_all_the_same() {
        let unready = SuspendedTrainer {
            untold_failures: 1,
            pod_ready: false,
            ..suspended()
        };
        assert!(unready.stops());
    }

    #[test]
    fn a_suspended_trainer_with_a_checkpoint_stops_once_nothing_is_owed_to_it() {
        assert!(suspended().stops());
        let waits = [
            // Its sessions still ship to it.
            SuspendedTrainer {
                running: 1,
                ..suspended()
            },
            // A failure it must hear before its groups can complete.
            SuspendedTrainer {
                untold_failures: 1,
                ..suspended()
            },
            // Its steps would be lost.
            SuspendedTrainer {
                checkpointed: false,
                ..suspended()
            },
            // The job's end takes it.
            SuspendedTrainer {
                finished: true,
                ..suspended()
            },
            // It trains the last groups and writes the final model.
            SuspendedTrainer {
                sessions_done: true,
                ..suspended()
            },
            SuspendedTrainer {
                pod_alive: false,
                ..suspended()
            },
            SuspendedTrainer {
                suspended: false,
                ..suspended()
            },
        ];
        for w in waits {
            assert!(!w.stops(), "{w:?}");
        }
    }
}
