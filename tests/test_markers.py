"""The slow kinds of tests/conftest.py are registered markers (pyproject.toml), and a test of
each kind is also ``slow``, so that ``pytest -m "not slow"`` leaves every one of them out."""

from __future__ import annotations

import tomllib

import pytest

from tests.conftest import SLOW_KINDS
from tests.support import ROOT


def _registered() -> set[str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {line.split(":", 1)[0] for line in doc["tool"]["pytest"]["ini_options"]["markers"]}


def test_every_slow_kind_is_a_registered_marker() -> None:
    assert {"slow", *SLOW_KINDS} <= _registered()


@pytest.mark.network
def test_a_test_of_a_slow_kind_is_also_slow(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("slow") is not None
