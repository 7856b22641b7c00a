"""The fixture backend: replays NVML answers recorded by ``sparkdiag record-fixture``.

A fixture is a JSON document (format ``sparkdiag-nvml-fixture/1``)::

    {
      "format": "sparkdiag-nvml-fixture/1",
      "description": "what this fixture shows",
      "base": "h200-idle.json",            # optional: start from another fixture (relative path)
      "nvml": {"error": "LIBRARY_NOT_FOUND"},  # optional: NVML unavailable altogether
      "driver_version": "580.159.04",
      "host": {"memory_total": 135089500160, "why": "where the figure comes from"},
      "devices": [
        {"answers": {"name": "NVIDIA H200", "clock/1": 1980, "fan": {"error": "NOT_SUPPORTED"}},
         "why": {"clock/1": "where an answer written by hand comes from"}},
        {"from": 0, "set": {"uuid": "GPU-..."}, "why": {"uuid": "a second device"}}
      ],
      "script": [
        {"poll": 5, "gpu": 0, "set": {"clock_event_reasons": 32}, "why": {...}},
        {"poll": [3, 10], "gpu": 0, "ramp": {"memory_temperature": [60, 95]}},
        {"poll": 8, "gpu": 0, "event": {"type": 8, "data": 79}},
        {"poll": 20, "gpu": 0, "lost": true},
        {"poll": 25, "nvml": {"error": "DRIVER_NOT_LOADED"}},
        {"poll": 30, "nvml": "up"}
      ]
    }

Answers are keyed as :func:`sparkdiag.sources.nvml.api.answer_key` builds them; an answer of
``{"error": NAME}`` raises that NVML error; a query with no answer is NOT_SUPPORTED. Derived
devices (``from``) copy a device of the base and ``set`` answers over it, with a ``why`` per
change so that each difference from the recording is documented in the file. ``why`` (on a
device, a script step or ``host``) is documentation only: the loader ignores it, and a fixture
written by hand from public reports (``gb10-idle.json``) gives one for every answer.

Scripted steps take effect at the poll they name (the first poll is 1; an ``nvml`` step may name 0,
nvmlInit itself, before the first poll) and stay in effect; a ramp
moves linearly from its first value at the first poll to its last at the last poll, then holds
(integer ramps round half up).
An event is delivered once, at its poll. ``lost`` makes every query fail with GPU_IS_LOST.
A step of ``nvml`` (it names no ``gpu``: it is the driver's, not a device's) makes NVML as a whole
answer an error from its poll on: ``{"error": NAME}`` fails every call (nvmlInit, the driver
version, the device count, every query and the events) with it, as a process sees it when the
driver is unloaded (DRIVER_NOT_LOADED) or upgraded under it (LIB_RM_VERSION_MISMATCH); ``"up"``
answers again from its poll (a driver loaded again). The latest ``nvml`` step in effect holds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkdiag import safeload
from sparkdiag.errors import UsageError
from sparkdiag.sources.nvml.api import (
    ERROR_CODES,
    GPU_IS_LOST,
    NOT_SUPPORTED,
    NvmlCallError,
    NvmlEvent,
    NvmlUnavailable,
    answer_key,
    error_code,
)
from sparkdiag.sources.nvml.queries import CATALOGUE, answer_keys, answer_shape_error

FORMAT = "sparkdiag-nvml-fixture/1"
MAX_FIXTURE_BYTES = 16 * 1024 * 1024  # recorded 8-GPU fixtures are ~100 KB
_MAX_BASE_DEPTH = 8


class FixtureError(UsageError, ValueError):
    """A fixture file cannot be used; the message names the file and what is wrong."""

    flag = "--nvml-fixture"


VALID_KEYS = answer_keys()


def _read_json(path: Path) -> dict[str, Any]:
    with safeload.reading(path, FixtureError, "NVML fixture"):
        doc = safeload.load_json(path, MAX_FIXTURE_BYTES)
    if not isinstance(doc, dict):
        raise FixtureError(f"NVML fixture {path} must hold a JSON object, not {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise FixtureError(f"NVML fixture {path} has format {fmt!r}; expected {FORMAT!r}")
    return doc


def _check_keys(path: Path, where: str, answers: Mapping[str, Any], values: bool = True) -> None:
    """Every key names a catalogue query; every value (with ``values``) is an NVML error or an
    answer of the query's declared shape."""
    unknown = sorted(set(answers) - VALID_KEYS)
    if unknown:
        shown = ", ".join(k[:40] for k in unknown[:5])
        raise FixtureError(f"NVML fixture {path}: {where} names unknown answer key(s) {shown}")
    for key, value in answers.items():
        if _is_error(value):
            if error_code(str(value["error"])) is None:
                raise FixtureError(
                    f"NVML fixture {path}: {where}.{key} has unknown NVML error "
                    f"{str(value['error'])[:40]!r}; use a name such as NOT_SUPPORTED or "
                    "GPU_IS_LOST, or ERROR_<code>"
                )
            continue
        why = answer_shape_error(key.split("/", 1)[0], value) if values else None
        if why is not None:
            raise FixtureError(f"NVML fixture {path}: {where}.{key}: {why}")


def _is_error(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"error"}


def load_fixture(path: Path, _depth: int = 0) -> dict[str, Any]:
    """Load a fixture, resolving ``base`` and derived devices; returns a normalised document."""
    if _depth > _MAX_BASE_DEPTH:
        raise FixtureError(f"NVML fixture {path}: 'base' chain is too deep (a loop?)")
    doc = _read_json(path)
    base: dict[str, Any] = {}
    if "base" in doc:
        if not isinstance(doc["base"], str):
            raise FixtureError(f"NVML fixture {path}: 'base' must be a relative file name")
        try:
            base = load_fixture(path.parent / doc["base"], _depth + 1)
        except FixtureError as exc:
            raise FixtureError(f"NVML fixture {path}: base {doc['base'][:80]!r}: {exc}") from None

    host = doc.get("host", {})
    if not isinstance(host, dict) or not all(
        (k == "memory_total" and isinstance(v, int) and not isinstance(v, bool) and v > 0)
        or (k == "why" and isinstance(v, str))
        for k, v in host.items()
    ):
        raise FixtureError(
            f"NVML fixture {path}: 'host' must be an object like {{\"memory_total\": BYTES}}"
        )
    driver = doc.get("driver_version", base.get("driver_version", ""))
    if not isinstance(driver, str):
        raise FixtureError(f"NVML fixture {path}: 'driver_version' must be a string")
    nvml = doc.get("nvml", base.get("nvml"))
    if nvml is not None and not (isinstance(nvml, dict) and isinstance(nvml.get("error"), str)):
        raise FixtureError(f"NVML fixture {path}: 'nvml' must be {{\"error\": NAME}}")
    merged: dict[str, Any] = {
        "driver_version": driver,
        "host": {**base.get("host", {}), **host},
        "nvml": nvml,
        "script": list(base.get("script", [])),
    }
    base_devices: list[dict[str, Any]] = base.get("devices", [])
    raw_devices = doc.get("devices", None)
    # doc and base were parsed for this call alone, so their objects are taken, not copied; a
    # base device named by "from" is copied, as two devices may name it
    if raw_devices is None:
        devices = base_devices
    else:
        if not isinstance(raw_devices, list):
            raise FixtureError(f"NVML fixture {path}: 'devices' must be a list")
        devices = []
        for n, dev in enumerate(raw_devices):
            if not isinstance(dev, dict):
                raise FixtureError(f"NVML fixture {path}: devices[{n}] must be an object")
            if "from" in dev:
                src = dev["from"]
                if not isinstance(src, int) or not 0 <= src < len(base_devices):
                    raise FixtureError(
                        f"NVML fixture {path}: devices[{n}].from={src!r} is not a device of the "
                        f"base ({len(base_devices)} devices)"
                    )
                answers = copy.deepcopy(base_devices[src]["answers"])
            else:
                answers = dev.get("answers")
                if not isinstance(answers, dict):
                    raise FixtureError(
                        f"NVML fixture {path}: devices[{n}] needs 'answers' or 'from'"
                    )
            overrides = dev.get("set", {})
            if not isinstance(overrides, dict):
                raise FixtureError(f"NVML fixture {path}: devices[{n}].set must be an object")
            _check_keys(path, f"devices[{n}]", {**answers, **overrides})
            answers.update(overrides)
            devices.append({"answers": answers})
    merged["devices"] = devices

    script = doc.get("script", [])
    if not isinstance(script, list):
        raise FixtureError(f"NVML fixture {path}: 'script' must be a list")
    for n, step in enumerate(script):
        merged["script"].append(_check_step(path, n, step, len(devices)))
    return merged


def _check_step(path: Path, n: int, step: Any, ndev: int) -> dict[str, Any]:
    where = f"NVML fixture {path}: script[{n}]"
    if not isinstance(step, dict):
        raise FixtureError(f"{where} must be an object")
    poll = step.get("poll")
    if isinstance(poll, bool):
        poll = None  # JSON's true is not poll 1, nor false poll 0
    if "nvml" in step and poll == 0:  # the driver's state at nvmlInit, before the first poll
        first, last = 0, 0
    elif isinstance(poll, int) and poll >= 1:
        first, last = poll, poll
    elif (
        isinstance(poll, list)
        and len(poll) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) for p in poll)
        and 1 <= poll[0] <= poll[1]
    ):
        first, last = poll
    else:
        raise FixtureError(
            f"{where}: 'poll' must be a poll number >= 1 or [first, last] (0, nvmlInit, for an "
            "'nvml' step only)"
        )
    actions = [k for k in ("set", "ramp", "event", "lost", "nvml") if k in step]
    if len(actions) != 1:
        raise FixtureError(f"{where} needs exactly one of set, ramp, event, lost, nvml")
    if "nvml" in step:
        nvml = step["nvml"]
        if "gpu" in step:
            raise FixtureError(f"{where}: an 'nvml' step is the driver's: it names no 'gpu'")
        if nvml != "up" and not (
            isinstance(nvml, dict)
            and set(nvml) == {"error"}
            and isinstance(nvml["error"], str)
            and error_code(nvml["error"]) is not None
        ):
            raise FixtureError(
                f'{where}: \'nvml\' must be "up" or {{"error": NAME}} with an NVML error '
                "name such as LIB_RM_VERSION_MISMATCH"
            )
        return {**step, "first": first, "last": last}
    gpu = step.get("gpu")
    if not isinstance(gpu, int) or not 0 <= gpu < ndev:
        raise FixtureError(f"{where}: 'gpu' must be a device index below {ndev}")
    if "set" in step:
        if not isinstance(step["set"], dict):
            raise FixtureError(f"{where}: 'set' must be an object")
        _check_keys(path, f"script[{n}].set", step["set"])
    if "ramp" in step:
        ramp = step["ramp"]
        if not isinstance(ramp, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
            for v in ramp.values()
        ):
            raise FixtureError(f"{where}: 'ramp' maps answer keys to [from, to] numbers")
        _check_keys(path, f"script[{n}].ramp", ramp, values=False)
        for key in ramp:
            if CATALOGUE[key.split("/", 1)[0]].shape != "number":
                raise FixtureError(f"{where}: 'ramp' of {key}, which is not a number")
    if "event" in step:
        event = step["event"]
        if not (
            isinstance(event, dict)
            and isinstance(event.get("type"), int)
            and isinstance(event.get("data", 0), int)
            and isinstance(event.get("timestamp", 0.0), (int, float))
        ):
            raise FixtureError(f"{where}: 'event' needs an integer 'type' (and 'data')")
    return {**step, "first": first, "last": last}


class FixtureBackend:
    """Replays a fixture through the :class:`NvmlBackend` interface."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc = load_fixture(path)
        self.poll = 0
        self._events_delivered_at = -1
        self._current: list[dict[str, Any]] = []
        self._lost: set[int] = set()
        self._nvml_error: int | None = None
        self._rebuild()

    def _rebuild(self) -> None:
        current = [dict(dev["answers"]) for dev in self.doc["devices"]]
        lost: set[int] = set()
        nvml_error: int | None = None
        for step in self.doc["script"]:
            if step["first"] > self.poll:
                continue
            if "nvml" in step:
                nvml = step["nvml"]
                nvml_error = None if nvml == "up" else error_code(nvml["error"])
                continue
            answers = current[step["gpu"]]
            if "set" in step:
                answers.update(step["set"])
            elif "ramp" in step:
                span = step["last"] - step["first"]
                frac = 1.0 if span == 0 else min((self.poll - step["first"]) / span, 1.0)
                for key, (start, end) in step["ramp"].items():
                    value = start + (end - start) * frac
                    floats = isinstance(start, float) or isinstance(end, float)
                    answers[key] = value if floats else math.floor(value + 0.5)
            elif step.get("lost"):
                lost.add(step["gpu"])
        self._current = current
        self._lost = lost
        self._nvml_error = nvml_error

    def _answer_nvml(self) -> None:
        """Raise the error a scripted ``nvml`` step makes every call answer, if one holds."""
        if self._nvml_error is not None:
            raise NvmlCallError(self._nvml_error)

    # -- NvmlBackend ---------------------------------------------------------------------------
    def init(self) -> None:
        nvml = self.doc.get("nvml")
        if isinstance(nvml, dict) and nvml.get("error"):
            raise NvmlUnavailable(
                f"nvmlInit failed: NVML_ERROR_{nvml['error']} (fixture {self.path})",
                error_code(nvml["error"]),
            )
        if self._nvml_error is not None:
            error = NvmlCallError(self._nvml_error)
            raise NvmlUnavailable(f"nvmlInit failed: {error}", error.code)

    def shutdown(self) -> None:
        return None

    def driver_version(self) -> str:
        self._answer_nvml()
        return str(self.doc["driver_version"])

    def device_count(self) -> int:
        self._answer_nvml()
        return len(self._current)

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        if query not in CATALOGUE:
            raise KeyError(f"unknown NVML query {query!r}")
        self._answer_nvml()
        if not 0 <= index < len(self._current):
            raise NvmlCallError(ERROR_CODES["INVALID_ARGUMENT"])
        if index in self._lost:
            raise NvmlCallError(GPU_IS_LOST)
        key = answer_key(query, arg)
        if key not in self._current[index]:
            raise NvmlCallError(NOT_SUPPORTED)
        value = self._current[index][key]
        if _is_error(value):
            code = error_code(str(value["error"]))
            raise NvmlCallError(ERROR_CODES["UNKNOWN"] if code is None else code)
        return value

    def poll_events(self) -> list[NvmlEvent]:
        """The events scripted for the current poll, once: a second call in a poll gets none."""
        self._answer_nvml()
        if self._events_delivered_at == self.poll:
            return []
        self._events_delivered_at = self.poll
        events = []
        for step in self.doc["script"]:
            if "event" in step and step["first"] == self.poll:
                ev = step["event"]
                events.append(
                    NvmlEvent(
                        gpu=step["gpu"],
                        event_type=int(ev["type"]),
                        data=int(ev.get("data", 0)),
                        timestamp=float(ev.get("timestamp", 0.0)) or _now(),
                    )
                )
        return events

    def advance(self) -> None:
        self.poll += 1
        self._rebuild()

    def host_memory_total(self) -> int | None:
        total = self.doc["host"].get("memory_total")
        return None if total is None else int(total)


def _now() -> float:
    import time

    return time.time()
