from collections import Counter

from floe_trainer.metrics import Metrics


def test_dropped_is_a_counter_family_with_the_batchers_tallies():
    m = Metrics()
    text = m.render().decode()
    assert "# TYPE floe_trainer_dropped_total counter" in text
    # Every reason exists before its first drop (Prometheus sees the first one as an increase).
    assert 'floe_trainer_dropped_total{reason="stale"} 0.0' in text
    assert 'floe_trainer_dropped_total{reason="zero_advantage"} 0.0' in text
    m.dropped(Counter({"stale": 3, "zero_advantage": 2}))
    text = m.render().decode()
    assert 'floe_trainer_dropped_total{reason="stale"} 3.0' in text
    assert 'floe_trainer_dropped_total{reason="zero_advantage"} 2.0' in text
    m.groups_trained.inc(4)
    assert "floe_trainer_groups_trained_total 4.0" in m.render().decode()
