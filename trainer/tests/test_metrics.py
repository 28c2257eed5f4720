from collections import Counter
from pathlib import Path

from tiny import tiny_trainer

from floe_trainer.learn_demo import trajectory
from floe_trainer.metrics import INGEST_RESULTS, Metrics
from floe_trainer.wire import parse


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


def test_the_ingests_counts_are_a_counter_family_read_at_each_scrape(tmp_path):
    from floe_trainer.ingest import Ingest, Store

    m = Metrics()
    text = m.render().decode()
    # Every result exists before its first post, at 0.
    assert 'floe_trainer_ingest_total{result="invalid"} 0.0' in text
    assert 'floe_trainer_ingest_total{result="agent_fault_unscored"} 0.0' in text
    ingest = Ingest(Store(tmp_path), lambda t: None)
    m.watch_ingest(ingest.counts)
    assert ingest.handle(b"not json")[0] == 400
    assert ingest.handle(b'{"session": "s"}')[0] == 400
    text = m.render().decode()
    assert 'floe_trainer_ingest_total{result="invalid"} 2.0' in text
    # Every count the ingest keeps is exposed.
    assert set(ingest.counts) == set(INGEST_RESULTS)


def test_overlong_sessions_are_counted_as_received_and_per_step():
    from floe_trainer.step import StepStats

    m = Metrics()
    m.sampled(0.0, False, overlong=True)
    m.sampled(1.0, True)
    stats = StepStats(0.0, 0, 0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, overlong_sessions=1, sessions=4)
    m.step(stats, 0.5, 0.0, 1.0, 0.0)
    text = m.render().decode()
    assert "floe_trainer_sampled_overlong_sessions_total 1.0" in text
    assert "floe_trainer_sampled_sessions_total 2.0" in text
    assert "floe_trainer_overlong_fraction 0.25" in text


def test_the_sampled_reward_is_two_counters_that_only_grow():
    # A gauge read with delta() took a trainer's restart (back to 0) for a fall in reward.
    m = Metrics()
    for reward in (1.0, -0.5, 0.0, 0.25):
        m.sampled(reward, reward > 0)
    text = m.render().decode()
    assert "# TYPE floe_trainer_sampled_reward_positive_total counter" in text
    assert "floe_trainer_sampled_reward_positive_total 1.25" in text
    assert "floe_trainer_sampled_reward_negative_total 0.5" in text
    assert "floe_trainer_sampled_sessions_total 4.0" in text


def test_the_docs_list_every_metric_with_its_labels():
    """docs/trainer.md's Metrics section names every family the trainer exposes, with its
    labels, and nothing else."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text()
    section = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for quoted in section.split("`")[1::2]:
        if quoted.startswith("floe_trainer_"):
            name, _, labels = quoted.partition("{")
            documented[name] = {
                lb.split("=")[0].strip() for lb in labels.rstrip("}").split(",") if lb
            }
    m = Metrics()
    m.gpu.labels("0").set(1)  # on CPU the GPU gauge has no series: give it one to read
    exposed = {}
    for family in m.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        exposed[name] = {k for s in family.samples for k in s.labels if k != "le"}
    assert documented == exposed


def test_a_finished_trainer_says_so(tmp_path):
    # What the GPU-idle and stalled alerts leave alone: a train job's final held-out round
    # runs sessions after the trainer finished.
    trainer = tiny_trainer(tmp_path, 2, learningRate=1e-3)
    assert "floe_trainer_finished 0.0" in trainer.metrics.render().decode()
    for i, ids in enumerate(([5, 6, 7], [8, 9])):
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}
        trainer.add(parse(trajectory(f"s-{i}", "j/t", i, [1, 2, 3], choice, float(i), 0)))
    trainer.finish()
    while not trainer.finished:
        trainer.run_once()
    assert "floe_trainer_finished 1.0" in trainer.metrics.render().decode()
