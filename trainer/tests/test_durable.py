"""Durable writes (``floe_trainer.durable``): whole or absent after a crash, and the rename
itself synced through its directory, so a power loss cannot bring the old file back (the
pushed-version record going back would let a restarted trainer reuse a version label)."""

import math
import os
from pathlib import Path

import pytest

from floe_trainer import durable
from floe_trainer.trainer import read_pushed_version, record_pushed_version


@pytest.fixture
def synced(monkeypatch):
    """The paths ``os.fsync`` was called on, in order."""
    paths: list[Path] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def test_a_file_is_synced_then_renamed_then_its_directory_synced(tmp_path, synced):
    final = tmp_path / "records" / "pushed-version"
    durable.write_bytes(final, b"7")
    assert final.read_bytes() == b"7"
    assert sorted(p.name for p in final.parent.iterdir()) == ["pushed-version"]
    # The file's data under its temporary name, then the directory holding the rename.
    assert synced == [durable.temporary(final), final.parent]
    durable.write_bytes(final, b"8")
    assert final.read_bytes() == b"8"


def test_a_directory_replaces_the_old_one_whole_with_every_file_synced(tmp_path, synced):
    final = tmp_path / "adapter"
    final.mkdir()
    (final / "stale.bin").write_bytes(b"old")

    def write(tmp: Path) -> None:
        (tmp / "nested").mkdir(parents=True)
        (tmp / "adapter_config.json").write_text("{}")
        (tmp / "nested" / "weights.bin").write_bytes(b"new")

    durable.write_with(final, write)
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == [
        "adapter_config.json",
        "nested",
        "nested/weights.bin",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"], "nothing left beside it"
    tmp = durable.temporary(final)
    assert {tmp / "adapter_config.json", tmp / "nested" / "weights.bin"} <= set(synced)
    assert synced[-1] == tmp_path, "the rename is synced last"


def test_a_write_that_fails_leaves_the_old_contents(tmp_path):
    final = tmp_path / "model.safetensors"
    durable.write_bytes(final, b"v1")

    def fails(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        durable.write_with(final, fails)
    assert final.read_bytes() == b"v1"
    # The next write goes over the remains.
    durable.write_with(final, lambda tmp: tmp.write_bytes(b"v2"))
    assert final.read_bytes() == b"v2"
    assert not durable.temporary(final).exists()


def test_an_old_directory_left_aside_by_a_crash_is_put_back_first(tmp_path):
    final = tmp_path / "adapter"
    aside = tmp_path / ".adapter.old"
    aside.mkdir()
    (aside / "weights.bin").write_bytes(b"old")

    def fails(tmp: Path) -> None:
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        durable.write_with(final, fails)
    assert (final / "weights.bin").read_bytes() == b"old", "the old one is back in place"
    assert not aside.exists()


def test_the_pushed_version_record_is_written_durably(tmp_path, synced):
    record_pushed_version(tmp_path, 3)
    assert read_pushed_version(tmp_path) == 3
    assert synced[-1] == tmp_path, "its rename is synced through the directory"
    record_pushed_version(tmp_path, 2)
    assert read_pushed_version(tmp_path) == 3, "never goes back"


def test_strict_json_writes_null_for_what_no_json_reader_takes():
    import json

    from floe_trainer.durable import strict_json

    row = {"loss": float("nan"), "steps": [{"kl": float("inf"), "n": 2}], "t": (1.5, -math.inf)}
    text = strict_json(row)
    assert json.loads(text) == {"loss": None, "steps": [{"kl": None, "n": 2}], "t": [1.5, None]}
    assert "NaN" not in text and "Infinity" not in text
