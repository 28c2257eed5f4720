import pytest
from tiny import tiny_trainer

from floe_trainer.batching import GroupBuffer
from floe_trainer.learn_demo import trajectory
from floe_trainer.wire import Trajectory, parse


def traj(group, sample, reward, trainable=True, versions=(0,), overlong=0):
    return Trajectory(
        session=f"{group}-{sample}",
        task="t",
        group=group,
        sample=sample,
        trainable=trainable,
        reward=reward if trainable else None,
        policy_versions=list(versions),
        traces=[],
        overlong_turns=overlong,
    )


def test_masked_overlong_sessions_keep_their_reward_in_the_baseline():
    for mask in (False, True):
        b = GroupBuffer(num_samples=3, mask_overlong=mask)
        b.add(traj("g", 0, 1.0), now=0)
        b.add(traj("g", 1, 0.0, overlong=2), now=0)
        b.add(traj("g", 2, 0.0), now=0)
        [g] = b.take_ready(now=0, policy_version=0)
        # The advantages are the whole group's either way: the masked session's 0 is in them.
        assert g.advantages == pytest.approx([1.41421, -0.70711, -0.70711], abs=1e-4)
        assert g.masked == [False, mask, False]


def test_a_group_of_masked_sessions_only_is_dropped_as_overlong():
    b = GroupBuffer(num_samples=2, mask_overlong=True)
    b.add(traj("g", 0, 1.0, overlong=1), now=0)
    b.add(traj("g", 1, 0.0, overlong=1), now=0)
    assert b.take_ready(now=0, policy_version=0) == []
    assert (b.dropped["overlong"], b.groups_dropped) == (1, 1)
    # Checked again as its step starts: the one unmasked sample went stale, so nothing left of
    # the group would train.
    b = GroupBuffer(num_samples=3, mask_overlong=True, max_staleness=1)
    b.add(traj("h", 0, 1.0, versions=(1,), overlong=1), now=0)
    b.add(traj("h", 1, 0.5, versions=(0,)), now=0)
    b.add(traj("h", 2, 0.0, versions=(1,), overlong=1), now=0)
    [g] = b.take_ready(now=0, policy_version=1)
    assert g.masked == [True, False, True]
    assert b.still_fresh([g], policy_version=2) == []
    assert (b.dropped["stale"], b.dropped["overlong"]) == (1, 1)
    # Without the mask the same two samples still teach.
    b = GroupBuffer(num_samples=3, max_staleness=1)
    b.add(traj("h", 0, 1.0, versions=(1,), overlong=1), now=0)
    b.add(traj("h", 1, 0.5, versions=(0,)), now=0)
    b.add(traj("h", 2, 0.0, versions=(1,)), now=0)
    [g] = b.still_fresh(b.take_ready(now=0, policy_version=1), policy_version=2)
    assert g.masked == [False, False] and g.rewards == [1.0, 0.0]


def test_a_group_is_ready_when_every_sample_arrived():
    b = GroupBuffer(num_samples=2)
    b.add(traj("g", 0, 1.0), now=0)
    assert b.take_ready(now=1, policy_version=0) == []
    b.add(traj("g", 1, 0.0), now=1)
    [g] = b.take_ready(now=1, policy_version=0)
    assert g.group == "g" and g.rewards == [1.0, 0.0]
    assert g.advantages == pytest.approx([1.0, -1.0], abs=1e-5)
    assert b.pending == {}


def test_untrainable_sessions_never_join_a_group_as_zero():
    b = GroupBuffer(num_samples=2)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 1, None, trainable=False), now=0)
    assert b.dropped["untrainable"] == 1
    assert b.take_ready(now=0, policy_version=0) == [], "the failed sample does not complete it"
    b.add(traj("g", 1, 0.0), now=1)  # its retry, on a fresh pod, carries the same sample
    [g] = b.take_ready(now=1, policy_version=0)
    assert g.rewards == [1.0, 0.0]


def test_min_fraction_and_grace():
    b = GroupBuffer(num_samples=4, min_fraction=0.5, grace_seconds=10)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 1, 0.0), now=0)
    assert b.take_ready(now=9, policy_version=0) == []
    [g] = b.take_ready(now=10, policy_version=0)
    assert len(g.trajectories) == 2


def test_the_grace_runs_from_the_first_trajectory_not_a_failure_ruling_before_it():
    # A sample ruled failed for good early (its pod never ran) is no arrival: the sessions
    # still running get their grace from the first that arrives.
    b = GroupBuffer(num_samples=4, min_fraction=0.5, grace_seconds=300)
    b.sample_failed("g", 3, now=0)
    b.add(traj("g", 0, 1.0), now=1000)
    b.add(traj("g", 1, 0.0), now=1000)
    assert b.take_ready(now=1000, policy_version=0) == []
    assert b.take_ready(now=1299, policy_version=0) == []
    [g] = b.take_ready(now=1300, policy_version=0)
    assert g.rewards == [1.0, 0.0]


def test_min_fraction_rounds_up_without_a_floats_error():
    # 0.56 * 25 is 14.000000000000002 and 0.14 * 50 is 7.000000000000001 in floats.
    for fraction, samples, need in [
        (0.56, 25, 14),
        (0.14, 50, 7),
        (0.5, 5, 3),
        (1.0, 8, 8),
        (0.01, 4, 1),
    ]:
        b = GroupBuffer(num_samples=samples, min_fraction=fraction, grace_seconds=0)
        assert b.needed() == need, (fraction, samples)
        for s in range(need - 1):
            b.add(traj("g", s, float(s % 2)), now=0)
        if need > 2:
            assert b.take_ready(now=0, policy_version=0) == [], (fraction, samples)
        b.add(traj("g", need - 1, float((need - 1) % 2)), now=0)
        if need >= 2:
            [g] = b.take_ready(now=0, policy_version=0)
            assert len(g.trajectories) == need, (fraction, samples)


def test_uniform_rewards_are_dropped_and_counted():
    b = GroupBuffer(num_samples=2)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 1, 1.0), now=0)
    assert b.take_ready(now=0, policy_version=0) == []
    assert b.dropped["zero_advantage"] == 1
    assert b.groups_dropped == 1, "a whole group gone: the staleness gate opens the next one"


def test_stale_trajectories_are_dropped_and_counted():
    b = GroupBuffer(num_samples=3, max_staleness=1)
    b.add(traj("g", 0, 1.0, versions=(3,)), now=0)
    b.add(traj("g", 1, 0.0, versions=(1, 3)), now=0)  # sampled partly at version 1
    assert b.take_ready(now=0, policy_version=3) == [], "sample 2 may still come"
    assert b.dropped["stale"] == 1
    b.add(traj("g", 2, 0.5, versions=(3,)), now=0)
    # The stale sample counts as arrived (no session sends it again): the group trains on
    # the two fresh ones rather than wait for it until the job ends.
    [g] = b.take_ready(now=0, policy_version=3)
    assert g.rewards == [1.0, 0.5]


def test_a_group_left_with_one_fresh_sample_is_dropped_as_incomplete_not_held():
    b = GroupBuffer(num_samples=2, max_staleness=0)
    b.add(traj("g", 0, 1.0, versions=(0,)), now=0)
    b.add(traj("g", 1, 0.0, versions=(1,)), now=0)
    assert b.take_ready(now=0, policy_version=1) == []
    assert b.pending == {}, "not waiting for a sample that will not come"
    assert (b.dropped["stale"], b.dropped["incomplete"]) == (1, 1)


def test_a_duplicate_sample_counts_once():
    b = GroupBuffer(num_samples=2)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 0, 0.0), now=0)
    assert b.dropped["duplicate_sample"] == 1


def test_leftovers_train_partial_groups_and_count_what_cannot_teach():
    b = GroupBuffer(num_samples=4)
    b.add(traj("partial", 0, 1.0), now=0)
    b.add(traj("partial", 1, 0.0), now=0)
    b.add(traj("single", 0, 1.0), now=0)
    b.add(traj("flat", 0, 1.0), now=0)
    b.add(traj("flat", 1, 1.0), now=0)
    assert b.take_ready(now=1, policy_version=0) == [], "nothing is ready while more may come"
    [g] = b.take_ready(now=1, policy_version=0, leftovers=True)
    assert g.group == "partial" and g.rewards == [1.0, 0.0]
    assert b.dropped == {"incomplete": 1, "zero_advantage": 1}
    assert b.groups_dropped == 2
    assert b.pending == {}


def test_a_late_sample_of_a_taken_group_is_dropped_not_a_new_group():
    b = GroupBuffer(num_samples=2)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 1, 0.0), now=0)
    assert len(b.take_ready(now=0, policy_version=0)) == 1
    # A retry's second delivery, or a straggler: the group has trained (or been dropped).
    b.add(traj("g", 2, 1.0), now=1)
    b.add(traj("g", 3, 0.0), now=1)
    assert b.pending == {} and b.dropped["late"] == 2
    assert b.take_ready(now=1, policy_version=0, leftovers=True) == []


def test_staleness_is_checked_again_when_the_step_starts():
    b = GroupBuffer(num_samples=3, max_staleness=1)
    for s, (r, v) in enumerate([(1.0, 0), (0.0, 1), (0.5, 1)]):
        b.add(traj("g", s, r, versions=(v,)), now=0)
    [g] = b.take_ready(now=0, policy_version=1)
    # Fresh when taken; two steps later, when its step starts, sample 0 is too old: the
    # others train with their own baseline.
    [kept] = b.still_fresh([g], policy_version=2)
    assert kept.rewards == [0.0, 0.5] and b.dropped["stale"] == 1
    assert kept.advantages[0] < 0 < kept.advantages[1]
    # At version 3 none is fresh: the group is dropped and counted.
    assert b.still_fresh([g], policy_version=3) == []
    assert b.dropped["incomplete"] == 1 and b.groups_dropped == 1


def test_a_sample_that_failed_for_good_completes_its_group_without_it():
    b = GroupBuffer(num_samples=3, min_fraction=1.0)
    b.add(traj("g", 0, 1.0), now=0)
    b.add(traj("g", 1, 0.0), now=0)
    assert b.take_ready(now=0, policy_version=0) == [], "sample 2 may still come"
    b.sample_failed("g", 2, now=1)
    [g] = b.take_ready(now=1, policy_version=0)
    assert g.rewards == [1.0, 0.0] and b.dropped["failed"] == 1
    # Said again (a retried report), or of a group already taken: nothing changes.
    b.sample_failed("g", 2, now=2)
    assert b.dropped["failed"] == 1 and b.pending == {}
    # A group all of whose sessions failed is dropped as incomplete, not held to the end.
    for s in range(3):
        b.sample_failed("h", s, now=3)
    assert b.take_ready(now=3, policy_version=0) == []
    assert b.pending == {} and b.dropped["incomplete"] == 1
    # A sample that arrived, then reported failed (an earlier attempt's trajectory came, its
    # pod lost before the report): it stands, uncounted, and a checkpoint does not keep it.
    b.add(traj("k", 0, 1.0), now=4)
    b.sample_failed("k", 0, now=4)
    assert b.dropped["failed"] == 4 and b.saved(set())["failed_samples"] == {}
    b.add(traj("k", 1, 0.0), now=4)
    assert b.take_ready(now=4, policy_version=0) == [], "sample 2 may still come"
    b.add(traj("k", 2, 0.0), now=4)
    [k] = b.take_ready(now=4, policy_version=0)
    assert k.rewards == [1.0, 0.0, 0.0] and b.dropped["failed"] == 4


def test_a_version_the_trainer_never_reached_or_lost_is_stale():
    b = GroupBuffer(num_samples=2, max_staleness=1)
    b.add(traj("future", 0, 0.0, versions=(7,)), now=0)
    b.add(traj("future", 1, 1.0, versions=(7,)), now=0)
    assert b.take_ready(now=0, policy_version=3) == []
    assert b.dropped["stale"] == 2
    # Versions 4..6 lost: 7 names version 3's weights again.
    b.lose(4, 6)
    assert [b.lag(3, 7), b.lag(3, 8), b.lag(2, 7), b.lag(7, 8)] == [0, 1, 1, 1]
    b.add(traj("g", 0, 0.0, versions=(3,)), now=0)
    b.add(traj("g", 1, 1.0, versions=(5,)), now=0)
    b.add(traj("g", 2, 1.0, versions=(7,)), now=0)
    b.num_samples = 3
    [g] = b.take_ready(now=0, policy_version=8)
    assert [t.sample for t in g.trajectories] == [0, 2], "the lost version's sample is stale"


def test_what_a_checkpoint_keeps_restores_closed_groups_failures_and_lost_versions():
    b = GroupBuffer(num_samples=2)
    b.add(traj("done", 0, 0.0), now=0)
    b.add(traj("done", 1, 1.0), now=0)
    b.add(traj("ready", 0, 0.0), now=0)
    b.add(traj("ready", 1, 1.0), now=0)
    taken = b.take_ready(now=0, policy_version=0)
    assert [g.group for g in taken] == ["done", "ready"]
    b.sample_failed("open", 1, now=0)
    b.lose(2, 3)
    # "ready" was taken for a step that has not run: a restart must take it again.
    saved = b.saved({"ready"})
    assert saved == {
        "closed_groups": ["done"],
        "failed_samples": {"open": [1]},
        "lost_versions": [[2, 3]],
    }
    again = GroupBuffer(num_samples=2)
    again.restore(saved["closed_groups"], saved["failed_samples"], saved["lost_versions"], now=0)
    again.add(traj("done", 0, 0.0), now=0)
    assert again.dropped["late"] == 1
    again.add(traj("open", 0, 0.0), now=0)
    again.add(traj("ready", 0, 0.0), now=0)
    again.add(traj("ready", 1, 1.0), now=0)
    ready = again.take_ready(now=0, policy_version=0)
    assert [g.group for g in ready] == ["ready"]
    assert again.dropped["incomplete"] == 1, "open completes without its failed sample"
    assert again.lost == [(2, 3)]


def test_the_group_sampled_by_the_oldest_policy_trains_first(tmp_path):
    # Group b (sampled by version 1) came before group c (version 0, its slow session last):
    # trained in arrival order, c would be stale (lag 2) after b's step; oldest first, both
    # train, one step each.
    def add(trainer, group: str, version: int) -> None:
        for i, ids in enumerate(([5, 6, 7], [8, 9])):
            choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
            sample = trajectory(f"{group}-{i}", f"j/{group}", i, [1, 2, 3], choice, i, version)
            trainer.add(parse(sample))

    trainer = tiny_trainer(tmp_path, 2, {"maxStaleness": 1}, learningRate=1e-3)
    add(trainer, "a", 0)
    assert trainer.run_once() is not None
    assert trainer.state.policy_version == 1
    add(trainer, "b", 1)
    add(trainer, "c", 0)
    while trainer.run_once() is not None:
        pass
    assert trainer.state.policy_version == 3, trainer.buffer.dropped
    assert trainer.buffer.dropped["stale"] == 0
