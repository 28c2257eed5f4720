"""Trajectories into GRPO groups (pure: time and the policy version are passed in).

A group is the ``numSamples`` sessions of one task in one job. It is ready when all of them
arrived, or when ``min_fraction`` of them arrived and ``grace_seconds`` passed since the first.
Ready groups whose rewards are all equal are dropped (zero advantage: nothing to learn).
Trajectories sampled more than ``max_staleness`` policy versions ago are dropped (their samples
still count towards the group being complete: none is sent again). Untrainable
trajectories (infrastructure failures) never join a group — never as reward 0. With
``mask_overlong`` (``grpo.overlong: Mask``, DAPO's overlong filtering), a session with a call cut
at its token cap keeps its reward in its group's baseline and trains no token; a group
of such sessions only is dropped (``overlong``). With ``penalty`` (``grpo.overlongPenalty``,
DAPO's soft overlong punishment) a session's advantage is of its reward less its penalty; the
reward itself stays what it earned, and under ``MeanStd`` it decides whether a group is uniform
(penalties alone never make a group of passes teach: see ``_uniform``). Every drop is counted
by reason. What a restarted trainer must not forget (groups closed, samples failed, versions
lost) is saved with each checkpoint ([`GroupBuffer.saved`]).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .advantages import group_advantages, uniform
from .wire import Trajectory


@dataclass
class Group:
    group: str
    trajectories: list[Trajectory]
    advantages: list[float]
    # Per trajectory: its loss is masked (an overlong session under ``mask_overlong``); its
    # reward is still in the advantages' baseline. Empty: none is.
    masked: list[bool] = field(default_factory=list)
    # Per trajectory: the overlong penalty its advantage was taken with. Empty: none.
    penalties: list[float] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.reward or 0.0 for t in self.trajectories]


@dataclass
class _Pending:
    # When its first trajectory arrived (the grace runs from then); ``None`` while it holds only
    # samples that failed for good: a ruling that came first is no sample to be taken with.
    first_arrival: float | None = None
    by_sample: dict[int, Trajectory] = field(default_factory=dict)
    # Samples that arrived and were dropped as stale: no session will send them again, so
    # they count towards the group being complete (or it would wait for them forever).
    stale_samples: set[int] = field(default_factory=set)
    # Samples whose session failed for good (``sample_failed``): they will not come either.
    failed_samples: set[int] = field(default_factory=set)


class GroupBuffer:
    def __init__(
        self,
        num_samples: int,
        min_fraction: float = 1.0,
        grace_seconds: float = 300.0,
        max_staleness: int = 1,
        estimator: str = "MeanStd",
        mask_overlong: bool = False,
        penalty: Callable[[Trajectory], float] | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.mask_overlong = mask_overlong
        self.penalty = penalty
        self.min_fraction = min_fraction
        self.grace_seconds = grace_seconds
        self.max_staleness = max_staleness
        self.estimator = estimator
        self.pending: dict[str, _Pending] = {}
        # Groups taken (for training, or dropped whole): a sample of one arriving later is
        # ``late``, never a new group of stragglers trained against their own baseline.
        self.closed: set[str] = set()
        self.dropped: Counter[str] = Counter()
        # Groups dropped whole (``zero_advantage``, ``incomplete`` and ``overlong`` count groups;
        # the other reasons count trajectories).
        self.groups_dropped = 0
        # Every sample reported failed, by group: a checkpoint keeps those of groups it does
        # not close (a restarted trainer is not told again).
        self.failures: dict[str, set[int]] = {}
        # Policy versions whose weights are gone (``lose``): inclusive ranges.
        self.lost: list[tuple[int, int]] = []

    def add(self, t: Trajectory, now: float) -> None:
        if not t.trainable or t.reward is None:
            self.dropped["untrainable"] += 1
            return
        if t.group in self.closed:
            self.dropped["late"] += 1
            return
        p = self.pending.setdefault(t.group, _Pending())
        if p.first_arrival is None:
            p.first_arrival = now
        if t.sample in p.by_sample:
            # A second trainable trajectory for one sample (a retry after a lost reply): one
            # sample, one vote.
            self.dropped["duplicate_sample"] += 1
            return
        p.by_sample[t.sample] = t

    def arrived(self, group: str, sample: int) -> bool:
        """Whether ``group`` needs nothing more of ``sample``: it was taken (trained or
        dropped), or the sample is in it."""
        p = self.pending.get(group)
        return group in self.closed or (p is not None and sample in p.by_sample)

    def sample_failed(self, group: str, sample: int, now: float) -> None:
        """A sample that will never arrive: its session failed by infrastructure past its
        retries. Its group is complete without it (with ``minGroupFraction: 1`` it would
        otherwise wait until the job's end and be dropped as stale). A sample its group needs
        nothing more of (it arrived, say from an attempt whose report was lost) changes
        nothing, and a checkpoint does not keep it: restored before the replay, it would count
        as failed a sample that arrives."""
        if self.arrived(group, sample):
            return
        self.failures.setdefault(group, set()).add(sample)
        p = self.pending.setdefault(group, _Pending())
        if sample not in p.failed_samples:
            p.failed_samples.add(sample)
            self.dropped["failed"] += 1

    def saved(self, open_groups: set[str]) -> dict:
        """What a checkpoint keeps: ``open_groups`` were taken but not trained yet (a restart
        takes them again from the trajectories it replays), so they are not closed there."""
        closed = self.closed - open_groups
        return {
            "closed_groups": sorted(closed),
            "failed_samples": {g: sorted(s) for g, s in self.failures.items() if g not in closed},
            "lost_versions": [list(r) for r in self.lost],
        }

    def restore(
        self, closed: list[str], failed: dict[str, list[int]], lost: list[list[int]], now: float
    ) -> None:
        """A checkpoint's [`saved`], into a new buffer (before any trajectory is replayed)."""
        self.closed |= set(closed)
        for first, last in lost:
            self.lose(first, last)
        for group, samples in failed.items():
            for sample in samples:
                self.sample_failed(group, sample, now)

    def lose(self, first: int, last: int) -> None:
        """Versions ``first..=last`` named weights that are gone, and ``last + 1`` names those
        of ``first - 1`` again: a trainer resumed from a checkpoint older than what vLLM
        served. A sample of a lost version is stale whatever its age."""
        if first <= last:
            self.lost.append((first, last))

    def lag(self, sampled_by: int, version: int) -> int:
        """How many updates the weights of ``version`` are past those of ``sampled_by``: the
        labels between them, less each lost run crossed and the label that went back."""
        skipped = sum(last - first + 2 for first, last in self.lost if sampled_by <= last < version)
        return version - sampled_by - skipped

    def _stale(self, t: Trajectory, version: int) -> bool:
        """Sampled by weights too far behind ``version``'s, or by weights that are gone."""
        if not t.policy_versions:
            return False
        if any(lo <= v <= hi for v in t.policy_versions for lo, hi in self.lost):
            return True
        if max(t.policy_versions) > version:
            return True  # weights this trainer never had (another trainer's push)
        return self.lag(min(t.policy_versions), version) > self.max_staleness

    def take_ready(self, now: float, policy_version: int, leftovers: bool = False) -> list[Group]:
        """Remove and return the groups ready to train on, oldest first. ``leftovers``: no
        more trajectories are coming (the job's sessions are done), so every pending group
        is taken as it is; one that cannot teach anything is counted (``incomplete`` when
        fewer than two samples arrived)."""
        out: list[Group] = []
        need = self.needed()
        for gid in sorted(self.pending, key=self._first_arrival):
            p = self.pending[gid]
            fresh = {s: t for s, t in p.by_sample.items() if not self._stale(t, policy_version)}
            stale = len(p.by_sample) - len(fresh)
            if stale:
                self.dropped["stale"] += stale
                p.stale_samples |= p.by_sample.keys() - fresh.keys()
                p.by_sample = fresh
            gone = (p.stale_samples | p.failed_samples) - fresh.keys()
            complete = len(fresh) + len(gone) >= self.num_samples
            waited = p.first_arrival is not None and now - p.first_arrival >= self.grace_seconds
            enough = len(fresh) >= need and waited
            if not (complete or enough or leftovers):
                continue
            del self.pending[gid]
            self.closed.add(gid)
            trajs = [fresh[s] for s in sorted(fresh)]
            if len(trajs) < 2:
                short = (leftovers and not complete) or bool(p.stale_samples | p.failed_samples)
                self.dropped["incomplete" if short else "zero_advantage"] += 1
                self.groups_dropped += 1
                continue
            if self._uniform(trajs):
                self.dropped["zero_advantage"] += 1
                self.groups_dropped += 1
                continue
            self._keep(out, gid, trajs)
        return out

    def needed(self) -> int:
        """The samples a group is taken with once its grace is over: ``min_fraction`` of
        ``num_samples``, rounded up, but not past a float's error (``0.56 * 25`` is
        ``14.000000000000002``, which is 14, not 15)."""
        return max(1, math.ceil(self.min_fraction * self.num_samples - 1e-9))

    def _first_arrival(self, group: str) -> float:
        first = self.pending[group].first_arrival
        return math.inf if first is None else first

    @staticmethod
    def oldest_first(groups: list[Group]) -> list[Group]:
        """``groups`` by the oldest policy version that sampled any of their sessions, the
        order they were taken in among equals: the group nearest to going stale trains first.
        (Taken in arrival order, a group sampled earlier whose slowest session came last, or
        groups replayed after a restart in the order of their files, trained after fresher
        ones and could go stale waiting.) Groups of unversioned sessions never go stale: last."""

        def oldest(g: Group) -> float:
            versions = [min(t.policy_versions) for t in g.trajectories if t.policy_versions]
            return min(versions, default=float("inf"))

        return sorted(groups, key=oldest)

    def _keep(self, out: list[Group], gid: str, trajs: list[Trajectory]) -> None:
        """A group that can teach something (two or more samples, rewards differing), unless
        every one of its sessions is masked (``overlong``: no token would train)."""
        masked = [self.mask_overlong and t.overlong_turns > 0 for t in trajs]
        if all(masked):
            self.dropped["overlong"] += 1
            self.groups_dropped += 1
            return
        penalties = [self.penalty(t) for t in trajs] if self.penalty else []
        rewards = self._shaped(trajs)
        advantages = group_advantages(rewards, self.estimator)
        out.append(Group(gid, trajs, advantages, masked, penalties))

    def _shaped(self, trajs: list[Trajectory]) -> list[float]:
        """The rewards the advantages are of: each less its overlong penalty, if any."""
        penalty = self.penalty or (lambda _: 0.0)
        return [(t.reward or 0.0) - penalty(t) for t in trajs]

    def _uniform(self, trajs: list[Trajectory]) -> bool:
        """The group teaches nothing. Under ``MeanStd`` that is decided on the rewards the
        sessions earned, as DAPO's dynamic sampling filters on accuracy: a group whose sessions
        all passed differs only by overlong penalties, and dividing by their tiny std would
        make one session a token or two into the buffer a full failure (16 passes, one 0.03
        into it: advantage -3.9, as one real failure among 16). Under ``MeanOnly`` and
        ``LeaveOneOut`` the penalised rewards decide: their advantages keep the penalty's own
        scale, so passes of different lengths train towards the shorter, gently."""
        if self.estimator == "MeanStd":
            return uniform([t.reward or 0.0 for t in trajs])
        return uniform(self._shaped(trajs))

    def still_fresh(self, groups: list[Group], policy_version: int) -> list[Group]:
        """Groups taken earlier, checked again as their step starts (steps may have run since,
        moving the policy on): stale samples are dropped and counted, the rest keep a group of
        their own only while they can still teach something (two or more, rewards differing),
        with advantages of the samples that are left."""
        out: list[Group] = []
        for g in groups:
            fresh = [t for t in g.trajectories if not self._stale(t, policy_version)]
            if len(fresh) == len(g.trajectories):
                out.append(g)
                continue
            self.dropped["stale"] += len(g.trajectories) - len(fresh)
            if len(fresh) < 2 or self._uniform(fresh):
                self.dropped["incomplete" if len(fresh) < 2 else "zero_advantage"] += 1
                self.groups_dropped += 1
                continue
            self._keep(out, g.group, fresh)
        return out
