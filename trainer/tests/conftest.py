"""``@pytest.mark.full``: a test whose capability CI already proves through another, cheaper
or wider test (named in its reason). It runs with ``FLOE_TEST_FULL=1`` (``FLOE_TEST_FULL=1
scripts/test.sh`` runs the whole suite so), and is skipped otherwise, saying where the proof
is. The default suite must fit CI's time on a slow 2-core machine (docs/testing.md)."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "full(reason): only with FLOE_TEST_FULL=1; the reason names what covers it in CI",
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FLOE_TEST_FULL"):
        return
    for item in items:
        mark = item.get_closest_marker("full")
        if mark is not None:
            reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
            item.add_marker(pytest.mark.skip(reason=f"FLOE_TEST_FULL=1 only; in CI: {reason}"))
