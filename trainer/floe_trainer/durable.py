"""Writes that survive a crash or a power loss whole or not at all: written beside their
place under a hidden temporary name, synced, renamed into place, and the directory synced
(a rename lives in the directory: without that sync a power loss may undo it, and the old
file, or none, comes back). The trainer's acknowledged trajectories, its pushed-version
record, its checkpoints and the weights vLLM loads all go through here."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def temporary(final: Path) -> Path:
    """Where ``final`` is written before it is renamed into place: hidden, in its directory
    (a rename is atomic only within one file system)."""
    return final.parent / f".{final.name}.tmp"


def sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some file systems (network, FUSE) refuse to sync a directory: nothing more to do.
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _moved_aside(final: Path) -> Path:
    return final.parent / f".{final.name}.old"


def _sync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def publish(tmp: Path, final: Path) -> None:
    """Rename the written ``tmp`` (a file, or a directory of files) to ``final``, synced
    first and its directory after. A directory ``final`` already there is replaced: moved
    aside before the rename and removed after it, so a crash in between leaves the old one
    (as ``.NAME.old``, which the next write puts back or removes), never a half-written
    one."""
    if tmp.is_dir():
        for parent, _dirs, files in os.walk(tmp):
            for name in files:
                _sync_file(Path(parent, name))
            sync_dir(Path(parent))
    else:
        _sync_file(tmp)
    old = None
    if final.is_dir():
        old = _moved_aside(final)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    sync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_bytes(final: Path, data: bytes) -> None:
    """``data`` at ``final``, durably (see the module)."""
    write_with(final, lambda tmp: tmp.write_bytes(data))


def write_with(final: Path, write: Callable[[Path], None]) -> Path:
    """``write`` fills ``final``'s temporary path (a file, or a directory it makes), which is
    then published durably: a reader sees the whole of it or the old one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    # A crash between the two renames of an earlier write left the old one aside: back in
    # place, so that a write failing now leaves it there.
    old = _moved_aside(final)
    if old.is_dir():
        if final.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, final)
    tmp = temporary(final)
    if tmp.is_dir():
        shutil.rmtree(tmp)
    else:
        tmp.unlink(missing_ok=True)
    write(tmp)
    publish(tmp, final)
    return final


def strict_json(value) -> str:
    """``value`` as JSON that every reader takes: a non-finite float (Python's ``NaN`` and
    ``Infinity``, which ``json.dumps`` writes and serde_json, Go's and browsers' parsers
    refuse) becomes ``null``. One NaN in a step's row made every later ``/v1/status`` unreadable
    to the operator and ``floe run``, and it was kept in each checkpoint's ``state.json``."""

    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(value), allow_nan=False)
