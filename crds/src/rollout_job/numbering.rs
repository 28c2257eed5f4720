//! Which session is which: a job's sessions are numbered epoch-major, then task-major, so each
//! GRPO group's samples are neighbours (claimed together) and each epoch's groups come before
//! the next epoch's. The operator and `floe run` both map an index to its place here.

/// Where session `index` falls in its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionPlace {
    /// The pass over the task set, from 0.
    pub epoch: u32,
    /// The task's position in the job's task list.
    pub task: usize,
    /// The sample within its group, from 0.
    pub sample: u32,
}

/// Sessions of a job of `tasks` tasks, `samples` per task and `epochs` passes.
pub fn session_count(tasks: usize, samples: u32, epochs: u32) -> u64 {
    (tasks as u64)
        .saturating_mul(u64::from(samples.max(1)))
        .saturating_mul(u64::from(epochs.max(1)))
}

/// The place of session `index` in a job of `tasks` tasks, `samples` per task and `epochs`
/// passes; `None` past the last session. Epoch 0 visits the tasks in list order; each later
/// epoch in an order of its own ([`epoch_order`]).
pub fn session_at(index: u64, samples: u32, tasks: usize, epochs: u32) -> Option<SessionPlace> {
    let samples = u64::from(samples.max(1));
    let per_epoch = (tasks as u64).checked_mul(samples)?;
    if per_epoch == 0 || index >= per_epoch.checked_mul(u64::from(epochs.max(1)))? {
        return None;
    }
    let epoch = u32::try_from(index / per_epoch).ok()?;
    let within = index % per_epoch;
    let position = within / samples;
    Some(SessionPlace {
        epoch,
        task: usize::try_from(epoch_order(position, tasks as u64, epoch)).ok()?,
        sample: u32::try_from(within % samples).ok()?,
    })
}

/// The task visited at `position` of epoch `epoch`, over `n` tasks: the identity for epoch 0,
/// otherwise a pseudo-random permutation keyed by the epoch (a balanced Feistel network on the
/// smallest power-of-four domain that holds `n`, cycle-walked back into `0..n`). Computed per
/// position in constant expected time, so no permutation of a large task list is ever held.
pub fn epoch_order(position: u64, n: u64, epoch: u32) -> u64 {
    if epoch == 0 || n <= 1 || position >= n {
        return position;
    }
    // Domain 2^(2·half) ≥ n, split into two halves of `half` bits.
    let bits = 64 - (n - 1).leading_zeros();
    let half = bits.div_ceil(2).max(1);
    let mask = (1u64 << half) - 1;
    let mut x = position;
    loop {
        let (mut left, mut right) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f = mix(u64::from(epoch) << 8 | round, right) & mask;
            (left, right) = (right, left ^ f);
        }
        x = (left << half) | right;
        // A bijection of the domain: walking from a position in 0..n lands in 0..n again,
        // at most domain/n ≤ 4 steps on average.
        if x < n {
            return x;
        }
    }
}

/// SplitMix64's finaliser over a key and a value: the Feistel round function.
fn mix(key: u64, value: u64) -> u64 {
    let mut z = value ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_epoch_is_task_major_in_list_order() {
        let places: Vec<(usize, u32)> = (0..6)
            .filter_map(|i| session_at(i, 2, 3, 1))
            .map(|p| (p.task, p.sample))
            .collect();
        assert_eq!(places, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
        assert_eq!(session_at(6, 2, 3, 1), None, "past the last session");
        assert_eq!(session_at(0, 2, 0, 1), None, "no tasks");
    }

    #[test]
    fn each_later_epoch_visits_every_task_once_in_its_own_order() {
        for n in [2u64, 3, 7, 16, 17, 100, 1000] {
            let mut orders = Vec::new();
            for epoch in 0..4 {
                let mut order: Vec<u64> = (0..n).map(|p| epoch_order(p, n, epoch)).collect();
                orders.push(order.clone());
                order.sort_unstable();
                assert_eq!(order, (0..n).collect::<Vec<_>>(), "epoch {epoch} of {n}");
            }
            assert_eq!(orders[0], (0..n).collect::<Vec<_>>(), "epoch 0 is the list");
            if n >= 7 {
                assert_ne!(orders[1], orders[0], "{n} tasks: epoch 1 is shuffled");
                assert_ne!(orders[2], orders[1], "{n} tasks: each epoch its own order");
            }
        }
    }

    #[test]
    fn epochs_follow_one_another_with_whole_groups() {
        // 3 tasks × 2 samples × 2 epochs: sessions 6-11 are epoch 1.
        let second: Vec<SessionPlace> = (6..12).filter_map(|i| session_at(i, 2, 3, 2)).collect();
        assert_eq!(second.len(), 6);
        assert!(second.iter().all(|p| p.epoch == 1));
        let mut tasks: Vec<usize> = second.iter().map(|p| p.task).collect();
        assert!(
            tasks.chunks(2).all(|g| g[0] == g[1]),
            "a group's samples together"
        );
        tasks.dedup();
        tasks.sort_unstable();
        assert_eq!(tasks, [0, 1, 2]);
        assert_eq!(session_at(12, 2, 3, 2), None);
    }
}
