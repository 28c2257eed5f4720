import math

import pytest

from floe_trainer.advantages import group_advantages, uniform


def test_mean_std_matches_hand_computed_values():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1 (up to eps).
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], "MeanStd")
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)


def test_mean_only_has_no_std_scaling():
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "MeanOnly") == pytest.approx(
        [0.75, -0.25, -0.25, -0.25]
    )


def test_leave_one_out_uses_the_other_samples_mean():
    # r0 = 1, others 0,0,0 -> 1 - 0 = 1; r1 = 0, others 1,0,0 -> 0 - 1/3.
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], "LeaveOneOut")
    assert adv == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert group_advantages([0.7], "LeaveOneOut") == [0.0]


def test_advantages_sum_to_zero_within_a_group():
    for est in ("MeanStd", "MeanOnly", "LeaveOneOut"):
        assert math.fsum(group_advantages([0.2, 0.9, 0.4, 0.4, 1.0], est)) == pytest.approx(
            0.0, abs=1e-9
        )


def test_uniform_groups_and_unknown_estimators():
    assert uniform([1.0, 1.0, 1.0])
    assert not uniform([1.0, 0.0])
    assert not uniform([])
    with pytest.raises(ValueError):
        group_advantages([1.0], "Nope")


def test_the_overlong_penalty_grows_through_the_buffer_to_its_factor_at_the_cap():
    from floe_trainer.advantages import overlong_penalty

    # Cap 100, buffer 20: none up to 80, linear to the factor at 100, never past it.
    assert [overlong_penalty(n, 100, 20, 0.5) for n in (0, 80, 90, 100, 140)] == [
        0.0,
        0.0,
        0.25,
        0.5,
        0.5,
    ]
    assert overlong_penalty(100, 100, None, 1.0) == 0.0, "no buffer: off"
    assert overlong_penalty(100, None, 20, 1.0) == 0.0, "no cap to measure against"
