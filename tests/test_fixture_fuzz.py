"""Property-based tests of the NVML fixture loader: any JSON either loads and replays without an
exception, or is refused with one FixtureError naming the file and the key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdiag.sources.nvml.fixture import FixtureBackend, FixtureError
from sparkdiag.sources.nvml.gpu import GpuSource
from tests.support import NVML
from tests.support.fuzz import examples

BASE: dict[str, Any] = json.loads((NVML / "h200-idle.json").read_text())
ANSWER_KEYS = sorted(BASE["devices"][0]["answers"])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def _replay(path: Path) -> None:
    """Load, start and poll a few times: everything but FixtureError is a bug."""
    source = GpuSource(FixtureBackend(path))
    source.start()
    for _ in range(3):
        source.backend.advance()
        source.read()
        source.events()
    source.stop()


def _load_or_refuse(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` and replay it: it loads, or FixtureError names the file."""
    path.write_text(json.dumps(doc, allow_nan=True))
    try:
        _replay(path)
    except FixtureError as exc:
        assert str(path) in str(exc)


@given(st.dictionaries(st.sampled_from(ANSWER_KEYS), json_values, min_size=1, max_size=4))
@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_any_answers_load_or_are_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(BASE))
    doc["devices"][0]["answers"].update(changes)
    _load_or_refuse(tmp_path / "f.json", doc)


top_keys = st.sampled_from(["host", "driver_version", "nvml", "devices", "script", "base"])


@given(st.dictionaries(top_keys, json_values, min_size=1, max_size=3))
@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_any_top_level_values_load_or_are_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(BASE))
    doc.update(changes)
    _load_or_refuse(tmp_path / "f.json", doc)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"host": 5}, "'host' must be an object"),
        ({"host": {"memory_total": "lots"}}, "'host' must be an object"),
        ({"driver_version": 580}, "'driver_version' must be a string"),
    ],
)
def test_wrong_typed_top_level_values_name_the_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({**BASE, **change}))
    with pytest.raises(FixtureError, match=message):
        FixtureBackend(path)


def test_an_oversized_or_deeply_nested_fixture_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FixtureError, match="nested too deeply"):
        FixtureBackend(deep)
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(17 * 1024 * 1024)
    with pytest.raises(FixtureError, match="larger than 16 MiB"):
        FixtureBackend(big)


def test_every_reader_is_bounded(tmp_path: Path) -> None:
    """A "file" under a fake root that never ends (/dev/zero) or never starts (a FIFO: opening
    it waited for a writer forever, the bad-input review) is refused at once; a large one costs
    a bounded read."""
    from sparkdiag.probe.launchers import FixtureLauncher
    from sparkdiag.sources.files import FileTooLarge, read_limited
    from sparkdiag.sources.host.procfs import process_names
    from sparkdiag.sources.host.sysfs import PcieSource

    with pytest.raises(FileTooLarge, match="not a regular file \\(a character device\\)"):
        read_limited(Path("/dev/zero"), 4096)
    (tmp_path / "big").write_bytes(b"x" * 5000)
    with pytest.raises(FileTooLarge, match="larger than 4 KiB"):
        read_limited(tmp_path / "big", 4096)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileTooLarge, match="not a regular file \\(a FIFO\\)"):
        read_limited(tmp_path / "fifo", 4096)
    with pytest.raises(ValueError, match="not a regular file \\(a FIFO\\)"):
        FixtureLauncher(tmp_path / "fifo")
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    (proc / "comm").symlink_to("/dev/zero")
    assert process_names(tmp_path, [42]) == {}
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:01:00.0"
    device.mkdir(parents=True)
    for name in ("current_link_speed", "max_link_speed", "current_link_width"):
        (device / name).symlink_to("/dev/zero")
    (device / "class").symlink_to(tmp_path / "fifo")
    (link,) = PcieSource(tmp_path / "sys").read()
    assert (link.current_speed_tps, link.max_speed_tps, link.current_width) == (None, None, None)
    with pytest.raises(ValueError, match="not a regular file"):
        FixtureLauncher(Path("/dev/zero"))
