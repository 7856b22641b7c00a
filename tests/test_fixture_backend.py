"""The NVML fixture backend: loading and its errors, scripted replay, and record-fixture."""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkdiag.sources.nvml.api import (
    EVENT_XID_CRITICAL,
    GPU_IS_LOST,
    NOT_SUPPORTED,
    NvmlCallError,
    NvmlEvent,
    NvmlUnavailable,
)
from sparkdiag.sources.nvml.fixture import VALID_KEYS, FixtureBackend, FixtureError, load_fixture
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.sources.nvml.queries import QUERIES
from sparkdiag.sources.nvml.record import record, write_atomic

ALL_FIXTURES = [
    "h200-idle",
    "h200-load",
    "h200-idle-2026-11-29",
    "h200-load-2026-11-29",
    "h200-scripted",
    "h200-driver-gone",
    "h200-driver-upgraded",
    "h200-x8",
    "h200-x2-complete",
    "gb10-idle",
    "gb10-memtotal",
    "gb10-load",
    "gb10-slow-state",
    "gb10-power-safety",
]


def _answer(backend: Any, index: int, query: str, arg: int | None) -> tuple[str, Any]:
    """("ok", value) or ("error", NVML code): what one query gives, comparable across backends."""
    try:
        return ("ok", backend.query(index, query, arg))
    except NvmlCallError as exc:
        return ("error", exc.code)


def _all_answers(backend: Any) -> dict[tuple[int, str, int | None], tuple[str, Any]]:
    return {
        (index, query.name, arg): _answer(backend, index, query.name, arg)
        for index in range(backend.device_count())
        for query in QUERIES
        for arg in query.arguments()
    }


def _advance_to(backend: FixtureBackend, poll: int) -> None:
    while backend.poll < poll:
        backend.advance()


# ---- loading errors ---------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(FixtureError, match=r"cannot read NVML fixture .*missing\.json"):
        FixtureBackend(missing)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{\n "format": "sparkdiag-nvml-fixture/1",\n "devices": [,]\n}\n')
    with pytest.raises(FixtureError, match=r"broken\.json: not valid JSON: .* at line 3$"):
        FixtureBackend(path)


def test_wrong_format(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"format": "sparkdiag-nvml-fixture/2", "devices": []})
    with pytest.raises(
        FixtureError,
        match=r"has format 'sparkdiag-nvml-fixture/2'; expected 'sparkdiag-nvml-fixture/1'",
    ):
        FixtureBackend(path)


def test_missing_format(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"format": None, "devices": []})
    with pytest.raises(FixtureError, match=r"has format None; expected"):
        FixtureBackend(path)


def test_not_an_object(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture([{"format": "sparkdiag-nvml-fixture/1"}])
    with pytest.raises(FixtureError, match=r"must hold a JSON object, not list"):
        FixtureBackend(path)


def test_unknown_answer_key_in_set(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-idle", devices=[{"from": 0, "set": {"fan_speed": 40, "clock/9": 1}}]
    )
    with pytest.raises(
        FixtureError, match=r"devices\[0\] names unknown answer key\(s\) clock/9, fan_speed$"
    ):
        FixtureBackend(path)


def test_devices_from_one_base_device_are_each_their_own(
    derive_fixture: Callable[..., Path],
) -> None:
    """The base's answers are copied for each device that names them ("from"), so one device's
    "set" is not the other's; the loader takes the rest of what it parsed without copying."""
    path = derive_fixture(
        "h200-idle",
        devices=[{"from": 0, "set": {"temperature/0": 50}}, {"from": 0}],
    )
    devices = load_fixture(path)["devices"]
    assert [d["answers"]["temperature/0"] for d in devices] == [50, 36]
    assert devices[0]["answers"] is not devices[1]["answers"]
    shared = [
        key
        for key, value in devices[0]["answers"].items()
        if isinstance(value, (dict, list)) and value is devices[1]["answers"][key]
    ]
    assert shared == []


def test_unknown_answer_key_in_answers(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"devices": [{"answers": {"name": "x", "temprature/0": 40}}]})
    with pytest.raises(
        FixtureError, match=r"devices\[0\] names unknown answer key\(s\) temprature"
    ):
        FixtureBackend(path)


def test_unknown_answer_key_in_script_set(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture("h200-idle", script=[{"poll": 1, "gpu": 0, "set": {"clock_reasons": 32}}])
    with pytest.raises(FixtureError, match=r"script\[0\]\.set names unknown answer key"):
        FixtureBackend(path)


@pytest.mark.parametrize(
    "poll", [0, -1, "5", [5, 3], [1], [1, 2, 3], None, 1.5, True, False, [True, 2]]
)
def test_bad_poll(derive_fixture: Callable[..., Path], poll: Any) -> None:
    path = derive_fixture("h200-idle", script=[{"poll": poll, "gpu": 0, "lost": True}])
    with pytest.raises(FixtureError, match=r"script\[0\]: 'poll' must be a poll number >= 1"):
        FixtureBackend(path)


@pytest.mark.parametrize("poll", [False, -1, [0, 2]])
def test_bad_poll_of_an_nvml_step(derive_fixture: Callable[..., Path], poll: Any) -> None:
    """An nvml step may name poll 0 (nvmlInit); JSON's false is not 0."""
    step = {"poll": poll, "nvml": {"error": "DRIVER_NOT_LOADED"}}
    with pytest.raises(FixtureError, match=r"'poll' must be a poll number >= 1"):
        FixtureBackend(derive_fixture("h200-idle", script=[step]))


def test_an_nvml_step_at_poll_0_answers_nvmlinit(derive_fixture: Callable[..., Path]) -> None:
    step = {"poll": 0, "nvml": {"error": "DRIVER_NOT_LOADED"}}
    backend = FixtureBackend(derive_fixture("h200-idle", script=[step]))
    with pytest.raises(NvmlUnavailable, match="DRIVER_NOT_LOADED"):
        backend.init()


@pytest.mark.parametrize("gpu", [1, -1, None, "0"])
def test_gpu_out_of_range(derive_fixture: Callable[..., Path], gpu: Any) -> None:
    path = derive_fixture("h200-idle", script=[{"poll": 1, "gpu": gpu, "lost": True}])
    with pytest.raises(FixtureError, match=r"'gpu' must be a device index below 1$"):
        FixtureBackend(path)


@pytest.mark.parametrize(
    "step",
    [
        {"set": {"pstate": 2}, "lost": True},
        {"ramp": {"temperature/0": [40, 80]}, "event": {"type": 8, "data": 79}},
        {},
        {"lost": True, "nvml": "up"},
    ],
    ids=["set+lost", "ramp+event", "none", "lost+nvml"],
)
def test_step_needs_exactly_one_action(
    derive_fixture: Callable[..., Path], step: dict[str, Any]
) -> None:
    path = derive_fixture("h200-idle", script=[{"poll": 1, "gpu": 0, **step}])
    with pytest.raises(FixtureError, match=r"needs exactly one of set, ramp, event, lost"):
        FixtureBackend(path)


def test_bad_ramp(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-idle", script=[{"poll": [1, 3], "gpu": 0, "ramp": {"temperature/0": [40]}}]
    )
    with pytest.raises(FixtureError, match=r"'ramp' maps answer keys to \[from, to\] numbers"):
        FixtureBackend(path)


def test_event_needs_integer_type(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-idle", script=[{"poll": 1, "gpu": 0, "event": {"type": "xid", "data": 79}}]
    )
    with pytest.raises(FixtureError, match=r"'event' needs an integer 'type'"):
        FixtureBackend(path)


def test_from_index_out_of_range(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture("h200-idle", devices=[{"from": 0}, {"from": 1}])
    with pytest.raises(
        FixtureError, match=r"devices\[1\]\.from=1 is not a device of the base \(1 devices\)"
    ):
        FixtureBackend(path)


def test_from_without_base(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"devices": [{"from": 0}]})
    with pytest.raises(FixtureError, match=r"devices\[0\]\.from=0 is not a device of the base"):
        FixtureBackend(path)


def test_device_without_answers(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"devices": [{"set": {"name": "x"}}]})
    with pytest.raises(FixtureError, match=r"devices\[0\] needs 'answers' or 'from'"):
        FixtureBackend(path)


def test_base_loop(tmp_path: Path, write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"base": "self.json"}, name="self.json")
    with pytest.raises(FixtureError, match=r"self\.json: 'base' chain is too deep \(a loop\?\)"):
        FixtureBackend(path)


def test_base_loop_through_two_files(write_fixture: Callable[..., Path]) -> None:
    write_fixture({"base": "b.json"}, name="a.json")
    path = write_fixture({"base": "a.json"}, name="b.json")
    with pytest.raises(FixtureError, match=r"too deep \(a loop\?\)"):
        FixtureBackend(path)


def test_missing_base_names_the_base(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"base": "nowhere.json"})
    with pytest.raises(FixtureError, match=r"cannot read NVML fixture .*nowhere\.json"):
        FixtureBackend(path)


def test_fixture_error_is_a_value_error() -> None:
    assert issubclass(FixtureError, ValueError)


# ---- loading and answering --------------------------------------------------------------------


def test_base_resolves_relative_to_the_fixture_directory(
    nvml_fixture: Callable[[str], Path],
) -> None:
    doc = load_fixture(nvml_fixture("gb10-slow-state"))  # gb10-slow-state -> gb10-idle
    assert doc["driver_version"] == "580.126.09"
    assert doc["host"]["memory_total"] == 127600748 * 1024
    (device,) = doc["devices"]
    assert device["answers"]["name"] == "NVIDIA GB10"
    assert device["answers"]["energy_mj"] == 1843000  # kept from gb10-idle
    (step,) = doc["script"]
    assert step["set"]["clock/1"] == 650
    doc = load_fixture(nvml_fixture("gb10-memtotal"))
    assert doc["devices"][0]["answers"]["memory_info"]["total"] == 127600748 * 1024


def test_query_answers_and_errors(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("gb10-idle"))
    backend.init()
    assert backend.device_count() == 1
    assert backend.driver_version() == "580.126.09"
    assert backend.host_memory_total() == 127600748 * 1024
    assert backend.query(0, "clock", 1) == 2418
    assert backend.query(0, "name") == "NVIDIA GB10"
    with pytest.raises(NvmlCallError) as info:
        backend.query(0, "power_limit_mw")
    assert (info.value.code, info.value.name) == (NOT_SUPPORTED, "NOT_SUPPORTED")
    assert str(info.value) == "NVML_ERROR_NOT_SUPPORTED (3)"
    with pytest.raises(NvmlCallError) as info:
        backend.query(1, "name")
    assert info.value.name == "INVALID_ARGUMENT"
    with pytest.raises(KeyError, match="fan"):
        backend.query(0, "fan")


def test_no_nvml_init_raises(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("no-nvml"))
    with pytest.raises(NvmlUnavailable, match="NVML_ERROR_LIBRARY_NOT_FOUND"):
        backend.init()
    assert backend.device_count() == 0


def test_derived_devices_do_not_share_answers(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-x8"))
    assert backend.device_count() == 8
    uuids = [backend.query(i, "uuid") for i in range(8)]
    assert uuids == [f"GPU-979ad365-0b73-a0ac-74a2-3520b773d46{i}" for i in range(8)]
    # A mutable answer handed out for one device must not be the object of another.
    backend.query(0, "memory_info")["used"] = 1
    assert backend.query(1, "memory_info")["used"] == 0


# ---- scripted replay --------------------------------------------------------------------------


def test_float_ramp_interpolates_and_holds(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    assert backend.query(0, "memory_temperature") == 39.0  # poll 0: the recording
    expected = {1: 39.0, 2: 55.0, 4: 64.25, 6: 73.5, 10: 92.0, 11: 92.0}
    for poll, value in expected.items():
        _advance_to(backend, poll)
        assert backend.query(0, "memory_temperature") == pytest.approx(value, abs=1e-12), poll


def test_integer_ramp_rounds(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    # temperature/0 ramps 50 -> 84 over polls 2..10: 50 + 4.25 per poll.
    expected = {1: 36, 2: 50, 3: 54, 5: 63, 6: 67, 7: 71, 9: 80, 10: 84, 11: 84}
    for poll, value in expected.items():
        _advance_to(backend, poll)
        answer = backend.query(0, "temperature", 0)
        assert answer == value, poll
        assert isinstance(answer, int), poll


def test_set_takes_effect_at_its_poll_and_stays(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    widths = {}
    reasons = {}
    sm = {}
    for poll in range(1, 12):
        backend.advance()
        assert backend.poll == poll
        widths[poll] = backend.query(0, "pcie_width")
        reasons[poll] = backend.query(0, "clock_event_reasons")
        sm[poll] = backend.query(0, "clock", 1)
    assert widths == {p: 16 if p < 6 else 8 for p in range(1, 12)}
    assert reasons == {p: 1 if p < 8 else 32 for p in range(1, 12)}
    assert sm == {p: 345 if p < 8 else 1110 for p in range(1, 12)}
    assert backend.query(0, "pcie_max_width") == 16  # not touched by the script


def test_xid_event_delivered_once_at_poll_5(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    before = time.time()
    delivered: dict[int, list[NvmlEvent]] = {}
    for poll in range(1, 14):
        backend.advance()
        events = backend.poll_events()
        if events:
            delivered[poll] = events
    after = time.time()
    assert list(delivered) == [5]
    (event,) = delivered[5]
    assert (event.gpu, event.event_type, event.data) == (0, EVENT_XID_CRITICAL, 79)
    # No timestamp in the fixture: stamped when read.
    assert before <= event.timestamp <= after


def test_event_timestamp_from_fixture(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-idle",
        script=[{"poll": 2, "gpu": 0, "event": {"type": 8, "data": 48, "timestamp": 1700000000.5}}],
    )
    backend = FixtureBackend(path)
    _advance_to(backend, 2)
    assert backend.poll_events() == [
        NvmlEvent(gpu=0, event_type=8, data=48, timestamp=1700000000.5)
    ]


def test_xid_event_not_delivered_twice_within_a_poll(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    _advance_to(backend, 5)
    assert len(backend.poll_events()) == 1
    assert backend.poll_events() == []


def test_lost_at_poll_12(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-scripted"))
    _advance_to(backend, 11)
    assert backend.query(0, "uuid") == "GPU-979ad365-0b73-a0ac-74a2-3520b773d460"
    for poll in (12, 13, 20):
        _advance_to(backend, poll)
        for query, arg in (("uuid", None), ("temperature", 0), ("name", None)):
            with pytest.raises(NvmlCallError) as info:
                backend.query(0, query, arg)
            assert info.value.code == GPU_IS_LOST
            assert info.value.name == "GPU_IS_LOST"
    assert backend.device_count() == 1  # still enumerated, no longer answering


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"nvml": "down"}, r"'nvml' must be \"up\" or \{\"error\": NAME\}"),
        ({"nvml": {"error": "GONE"}}, r"'nvml' must be \"up\" or"),
        ({"nvml": {"error": 18}}, r"'nvml' must be \"up\" or"),
        ({"nvml": {"error": "UNINITIALIZED", "why": "x"}}, r"'nvml' must be \"up\" or"),
        ({"gpu": 0, "nvml": "up"}, r"an 'nvml' step is the driver's: it names no 'gpu'"),
    ],
    ids=["word", "unknown-name", "number", "extra-key", "with-gpu"],
)
def test_bad_nvml_step(
    derive_fixture: Callable[..., Path], step: dict[str, Any], message: str
) -> None:
    path = derive_fixture("h200-idle", script=[{"poll": 2, **step}])
    with pytest.raises(FixtureError, match=message):
        FixtureBackend(path)


def test_nvml_step_fails_every_call_until_up(nvml_fixture: Callable[[str], Path]) -> None:
    """h200-driver-gone: the module unloaded at poll 3 (DRIVER_NOT_LOADED for every call,
    nvmlInit included), loaded again at poll 8."""
    backend = FixtureBackend(nvml_fixture("h200-driver-gone"))
    _advance_to(backend, 2)
    assert backend.query(0, "name") == "NVIDIA H200"
    for poll in (3, 7):
        _advance_to(backend, poll)
        calls: list[Callable[[], Any]] = [
            backend.driver_version,
            backend.device_count,
            backend.poll_events,
            lambda: backend.query(0, "name"),
            lambda: backend.query(0, "temperature", 0),
        ]
        for call in calls:
            with pytest.raises(NvmlCallError) as info:
                call()
            assert info.value.name == "DRIVER_NOT_LOADED"
        with pytest.raises(NvmlUnavailable, match="DRIVER_NOT_LOADED") as down:
            backend.init()
        assert down.value.code == 9
    _advance_to(backend, 8)
    backend.init()
    assert backend.device_count() == 1
    assert backend.query(0, "name") == "NVIDIA H200"


def test_upgraded_driver_never_answers_again(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("h200-driver-upgraded"))
    _advance_to(backend, 2)
    assert backend.device_count() == 1
    _advance_to(backend, 100)
    with pytest.raises(NvmlCallError) as info:
        backend.query(0, "uuid")
    assert (info.value.code, info.value.name) == (18, "LIB_RM_VERSION_MISMATCH")


@pytest.mark.parametrize("name", ["h200-driver-gone", "h200-driver-upgraded"])
def test_driver_fixtures_say_why_for_every_step(
    nvml_fixture: Callable[[str], Path], name: str
) -> None:
    doc = _raw(nvml_fixture(name))
    assert doc["base"] == "h200-idle.json" and "devices" not in doc
    assert doc["script"] and all(step["why"].strip() for step in doc["script"])


def test_script_of_base_is_inherited(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture("h200-scripted", script=[{"poll": 3, "gpu": 0, "set": {"pstate": 2}}])
    backend = FixtureBackend(path)
    _advance_to(backend, 6)
    assert backend.query(0, "pstate") == 2
    assert backend.query(0, "pcie_width") == 8  # the base's own step, poll 6


# ---- record-fixture ---------------------------------------------------------------------------


def _no_wait(seconds: float) -> None:
    """The recorder's pause between priming the delta queries and reading them (0.5 s, for a
    real GPU; test_gpu_activity holds that it is taken): a fixture answers the same at once."""


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_record_round_trips(tmp_path: Path, nvml_fixture: Callable[[str], Path], name: str) -> None:
    source = FixtureBackend(nvml_fixture(name))
    doc = record(source, description=f"re-recorded {name}", sleep=_no_wait)
    target = tmp_path / "out" / "recorded.json"
    write_atomic(target, doc)

    replay = FixtureBackend(target)
    replay.init()
    assert replay.driver_version() == source.driver_version()
    assert replay.host_memory_total() == source.host_memory_total()
    assert replay.device_count() == source.device_count()
    assert _all_answers(replay) == _all_answers(source)

    saved = json.loads(target.read_text(encoding="utf-8"))
    assert saved["format"] == "sparkdiag-nvml-fixture/1"
    assert saved["description"] == f"re-recorded {name}"
    assert set(saved["recorded"]) == {"at", "by", "machine", "kernel"}
    # Every catalogue key is recorded for every device, answered or not.
    n_keys = len(VALID_KEYS)
    assert all(len(dev["answers"]) == n_keys for dev in saved["devices"])


def test_record_stores_errors_by_name(nvml_fixture: Callable[[str], Path]) -> None:
    doc = record(FixtureBackend(nvml_fixture("gb10-idle")), sleep=_no_wait)
    answers = doc["devices"][0]["answers"]
    assert answers["power_limit_mw"] == {"error": "NOT_SUPPORTED"}
    assert answers["memory_info"] == {"error": "NOT_SUPPORTED"}
    assert answers["temperature_threshold/1"] == {"error": "NOT_SUPPORTED"}
    assert answers["temperature_threshold/0"] == 105
    assert answers["cuda_capability"] == [12, 1]
    assert doc["driver_version"] == "580.126.09"
    assert doc["host"] == {"memory_total": 127600748 * 1024}
    assert answers["clock/2"] == answers["max_clock/2"] == {"error": "NOT_SUPPORTED"}
    assert answers["applications_clock/1"] == answers["default_applications_clock/1"] == 2418


def test_record_without_nvml_raises(nvml_fixture: Callable[[str], Path]) -> None:
    with pytest.raises(NvmlUnavailable):
        record(FixtureBackend(nvml_fixture("no-nvml")))


class _ErrorBackend(FixtureBackend):
    """Answers ``power_mw`` with an NVML code that ERROR_NAMES does not list (20, MEMORY)."""

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        if query == "power_mw":
            raise NvmlCallError(42)
        return super().query(index, query, arg)


def test_record_round_trips_an_unlisted_error_code(
    tmp_path: Path, nvml_fixture: Callable[[str], Path]
) -> None:
    doc = record(_ErrorBackend(nvml_fixture("h200-idle")), sleep=_no_wait)
    assert doc["devices"][0]["answers"]["power_mw"] == {"error": "ERROR_42"}
    target = tmp_path / "recorded.json"
    write_atomic(target, doc)
    # Replayed, the GPU must look as it did when recorded: up, with no power reading.
    source = GpuSource(FixtureBackend(target))
    assert source.start()
    (sample,) = source.read()
    assert sample.up is True
    assert sample.power_watts is None
    with pytest.raises(NvmlCallError) as info:
        FixtureBackend(target).query(0, "power_mw")
    assert info.value.code == 42


# ---- write_atomic -----------------------------------------------------------------------------


def test_write_atomic_writes_json_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "fixture.json"
    write_atomic(target, {"a": [1, 2], "b": "é"})
    assert json.loads(target.read_text(encoding="utf-8")) == {"a": [1, 2], "b": "é"}
    assert target.read_text(encoding="utf-8").endswith("}\n")
    assert sorted(p.name for p in target.parent.iterdir()) == ["fixture.json"]


def test_write_atomic_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "fixture.json"
    target.write_text("old\n")
    write_atomic(target, {"new": True})
    assert json.loads(target.read_text()) == {"new": True}
    assert [p.name for p in tmp_path.iterdir()] == ["fixture.json"]


def test_write_atomic_failure_keeps_the_target(tmp_path: Path) -> None:
    target = tmp_path / "fixture.json"
    target.write_text('{"old": 1}\n')
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_atomic(target, {"ok": 1, "bad": object()})
    assert target.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["fixture.json"]


def test_write_atomic_failure_without_target_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "fixture.json"
    with pytest.raises(TypeError):
        write_atomic(target, {"bad": {1, 2}})
    assert list(tmp_path.iterdir()) == []


def test_unknown_error_name_is_rejected(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture({"devices": [{"answers": {"name": "x", "power_mw": {"error": "NOPE"}}}]})
    with pytest.raises(FixtureError, match=r"devices\[0\]\.power_mw has unknown NVML error 'NOPE'"):
        FixtureBackend(path)


def test_single_poll_ramp_reaches_its_end_value(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture(
        {
            "devices": [{"answers": {"name": "x", "temperature/0": 40}}],
            "script": [{"poll": [3, 3], "gpu": 0, "ramp": {"temperature/0": [40, 90]}}],
        }
    )
    backend = FixtureBackend(path)
    _advance_to(backend, 3)
    assert backend.query(0, "temperature", 0) == 90


# ---- the GB10 fixtures: written from public reports, every answer sourced ---------------------

GB10_SCRIPTED = ("gb10-load", "gb10-slow-state", "gb10-power-safety")


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_gb10_idle_gives_a_source_for_every_answer(nvml_fixture: Callable[[str], Path]) -> None:
    doc = _raw(nvml_fixture("gb10-idle"))
    assert "base" not in doc  # not derived from the H200 recording any more
    (device,) = doc["devices"]
    assert set(device["why"]) == set(device["answers"]) == VALID_KEYS
    assert all(device["why"][key].strip() for key in device["why"])
    assert doc["host"]["why"]


def test_gb10_idle_answers_as_real_sparks_report(nvml_fixture: Callable[[str], Path]) -> None:
    backend = FixtureBackend(nvml_fixture("gb10-idle"))
    assert backend.driver_version() == "580.126.09"
    assert backend.host_memory_total() == 127600748 * 1024  # MemTotal 127600748 kB
    ask = lambda query, arg=None: _answer(backend, 0, query, arg)  # noqa: E731
    unsupported = ("error", NOT_SUPPORTED)
    assert ask("name") == ("ok", "NVIDIA GB10")
    assert ask("pci_bus_id") == ("ok", "0000000F:01:00.0")
    assert ask("cuda_capability") == ("ok", [12, 1])
    assert ask("clock", 2) == ask("max_clock", 2) == unsupported  # memory clock N/A
    assert ask("max_clock", 1) == ("ok", 3003)
    assert ask("applications_clock", 1) == ("ok", 2418)
    assert ask("memory_info") == ask("power_limit_mw") == ask("mig_mode") == unsupported
    assert ask("ecc_total", 0) == ask("ecc_total", 1) == unsupported
    assert ask("pstate") == ("ok", 8) and ask("power_mw") == ("ok", 3000)


@pytest.mark.parametrize("name", GB10_SCRIPTED)
def test_gb10_failure_fixtures_say_why_for_every_scripted_answer(
    nvml_fixture: Callable[[str], Path], name: str
) -> None:
    doc = _raw(nvml_fixture(name))
    assert doc["base"] == "gb10-idle.json"
    for step in doc["script"]:
        assert set(step["set"]) <= set(step["why"]), name
    backend = FixtureBackend(nvml_fixture(name))
    _advance_to(backend, 1)
    assert backend.query(0, "pstate") == 8  # poll 1: idle
    _advance_to(backend, 2)
    assert backend.query(0, "pstate") == 0  # from poll 2: under load
    assert backend.query(0, "utilization")["gpu"] == 100


APPLICATIONS_CLOCKS = {
    "applications_clock/0",
    "applications_clock/1",
    "default_applications_clock/0",
    "default_applications_clock/1",
}


def test_h200_answers_added_by_hand_say_so(nvml_fixture: Callable[[str], Path]) -> None:
    """The 2026-11-29 recordings predate the applications-clock queries: those answers were
    added by hand, and each says so in ``why``."""
    for name in ("h200-idle-2026-11-29", "h200-load-2026-11-29"):
        (device,) = _raw(nvml_fixture(name))["devices"]
        assert set(device["why"]) == APPLICATIONS_CLOCKS, name
        assert all(device["answers"][key] == 1980 for key in APPLICATIONS_CLOCKS)
        assert "by hand" in device["why"]["applications_clock/0"]


# ---- the rules a new NVML query meets (docs/architecture.md: How to add a metric) ------------
#
# 1. gb10-idle.json answers it, with its source in `why` (test_gb10_idle_gives_a_source_...).
# 2. h200-x2-complete.json answers it with a value on both GPUs, saying in `why` where the answer
#    comes from, so that the golden scrape h200-x2-complete shows its metric
#    (tests/test_metrics_doc.py holds every metric to a fixture that shows it).
# 3. A recording is never edited: a query declared after it was recorded is left out of it (it
#    replays NOT_SUPPORTED), and the complete fixture answers it; re-recording replaces it.
# Every other fixture replays NOT_SUPPORTED for the query unless its story needs an answer.

COMPLETE = "h200-x2-complete"


def _explained(device: dict[str, Any]) -> set[str]:
    """The keys a derived device sets that its ``why`` explains (a why key may be a glob)."""
    reasons = device.get("why", {})
    return {key for key in device.get("set", {}) if any(fnmatch.fnmatch(key, w) for w in reasons)}


def test_the_complete_fixture_answers_every_query_with_a_value(
    nvml_fixture: Callable[[str], Path],
) -> None:
    backend = FixtureBackend(nvml_fixture(COMPLETE))
    assert backend.device_count() == 2
    errors = [key for key, (kind, _) in _all_answers(backend).items() if kind == "error"]
    unanswered = sorted({query if arg is None else f"{query}/{arg}" for _, query, arg in errors})
    assert not unanswered, f"{COMPLETE}.json must answer {unanswered} with a value (and a why)"
    doc = _raw(nvml_fixture(COMPLETE))
    for device in doc["devices"]:
        assert set(device["set"]) == _explained(device), "every answer it adds says why"
    assert doc["script"] and all(step["why"].strip() for step in doc["script"])


def test_h200_recordings_are_not_edited_and_lack_only_what_the_complete_fixture_adds(
    nvml_fixture: Callable[[str], Path],
) -> None:
    """The 2026-12-01 recordings answer the whole catalogue of their day as recorded, nothing
    added by hand (they measured the applications clocks the older recordings had assumed,
    1980 MHz); a query declared since is left out of them and answered by the complete
    fixture, with its why."""
    added = set.intersection(*(_explained(d) for d in _raw(nvml_fixture(COMPLETE))["devices"]))
    for name in ("h200-idle", "h200-load"):
        doc = _raw(nvml_fixture(name))
        assert "base" not in doc and "script" not in doc, name
        assert doc["recorded"]["at"].startswith("2026-12-01"), name
        (device,) = doc["devices"]
        assert "why" not in device and "by hand" not in doc["description"], name
        lacking = VALID_KEYS - set(device["answers"])
        assert lacking <= added, (
            f"{name}.json lacks {sorted(lacking - added)}: answer them in {COMPLETE}.json, each "
            "with a why (a recording is not edited)"
        )
        assert all(device["answers"][key] == 1980 for key in APPLICATIONS_CLOCKS), name
