"""On a real GPU: sparkdiag's readings against ``nvidia-smi --query-gpu`` on the same machine.

Marked ``gpu``: CI has no GPU and skips it; run it on the lent H200 with ``pytest -m gpu``.
Tolerances (from the telemetry issue): temperatures within 2 °C, clocks and power within 5 %,
PCIe generation, width and the clock event reasons bitmask exactly. NVML is read just before
and just after nvidia-smi (which takes tens of milliseconds), and a value passes when it agrees
with either reading, so that a clock that moved during the query is not a false failure.

Set ``SPARKDIAG_COMPARE_OUT`` to a file to append the comparison table to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkdiag.snapshot import GpuSample
from sparkdiag.sources.nvml.driver import PynvmlBackend
from sparkdiag.sources.nvml.gpu import GpuSource

pytestmark = pytest.mark.gpu

# nvidia-smi field -> (how to read it from a sample, tolerance kind)
FIELDS = {
    "temperature.gpu": (lambda g: g.temperature_celsius.get("gpu"), ("abs", 2.0)),
    "temperature.memory": (lambda g: g.temperature_celsius.get("memory"), ("abs", 2.0)),
    "clocks.sm": (lambda g: _mhz(g.clock_hertz.get("sm")), ("rel", 0.05)),
    "clocks.mem": (lambda g: _mhz(g.clock_hertz.get("memory")), ("rel", 0.05)),
    "clocks.gr": (lambda g: _mhz(g.clock_hertz.get("graphics")), ("rel", 0.05)),
    "clocks.max.sm": (lambda g: _mhz(g.clock_max_hertz.get("sm")), ("rel", 0.05)),
    "clocks.applications.graphics": (
        lambda g: _mhz(g.clock_applications_hertz.get("graphics")),
        ("exact", 0),
    ),
    "clocks.default_applications.graphics": (
        lambda g: _mhz(g.clock_default_applications_hertz.get("graphics")),
        ("exact", 0),
    ),
    "power.draw": (lambda g: g.power_watts, ("rel", 0.05)),
    "enforced.power.limit": (lambda g: g.power_limit_watts, ("rel", 0.05)),
    "pcie.link.gen.current": (lambda g: g.pcie_generation.get("current"), ("exact", 0)),
    "pcie.link.gen.max": (lambda g: g.pcie_generation.get("max"), ("exact", 0)),
    "pcie.link.width.current": (lambda g: g.pcie_width.get("current"), ("exact", 0)),
    "pcie.link.width.max": (lambda g: g.pcie_width.get("max"), ("exact", 0)),
    "clocks_event_reasons.active": (lambda g: g.clock_event_reasons, ("exact", 0)),
    "utilization.gpu": (lambda g: _pct(g.utilization_ratio.get("gpu")), ("abs", 10.0)),
    "pstate": (lambda g: g.performance_state, ("exact", 0)),
}


def _mhz(hz: float | None) -> float | None:
    return None if hz is None else hz / 1e6


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100


def _smi_value(text: str) -> float | None:
    text = text.strip()
    if text in ("[N/A]", "N/A", "[Not Supported]", "Not Supported", ""):
        return None
    if text.startswith("P") and text[1:].isdigit():
        return float(text[1:])
    if text.startswith("0x"):
        return float(int(text, 16))
    return float(text.split()[0])


def _nvidia_smi(index: int) -> dict[str, float | None]:
    out = subprocess.run(
        [
            "nvidia-smi",
            f"--id={index}",
            f"--query-gpu={','.join(FIELDS)}",
            "--format=csv,noheader,nounits",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    return dict(zip(FIELDS, (_smi_value(v) for v in out.split(",")), strict=True))


def _agrees(kind: str, tol: float, smi: float, ours: float) -> bool:
    if kind == "exact":
        return smi == ours
    if kind == "abs":
        return abs(smi - ours) <= tol
    return abs(smi - ours) <= tol * max(abs(smi), 1e-9)


@pytest.fixture(scope="module")
def source() -> Iterator[GpuSource]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not found")
    src = GpuSource(PynvmlBackend())
    if not src.start() or not src.identities:
        pytest.skip(f"no NVML GPU here ({src.unavailable_reason})")
    yield src
    src.stop()


_LOAD = """
import torch, time, sys
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("loading", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


@pytest.fixture(params=["idle", "load"])
def condition(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "idle":
        yield "idle"
        return
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", _LOAD, "60"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(8)  # let clocks and power settle under load
    try:
        yield "load"
    finally:
        proc.kill()
        proc.wait()


def test_readings_agree_with_nvidia_smi(source: GpuSource, condition: str) -> None:
    rows = []
    failures = []
    for identity in source.identities:
        before: GpuSample = source.read()[identity.index]
        smi = _nvidia_smi(identity.index)
        after: GpuSample = source.read()[identity.index]
        for field, (get, (kind, tol)) in FIELDS.items():
            smi_value = smi[field]
            ours = [get(before), get(after)]
            if smi_value is None:
                verdict = "both N/A" if ours == [None, None] else "smi N/A"
                if ours != [None, None]:
                    failures.append(f"GPU {identity.index} {field}: nvidia-smi N/A, ours {ours}")
            elif None in ours:
                verdict = "MISSING"
                failures.append(f"GPU {identity.index} {field}: nvidia-smi {smi_value}, ours None")
            else:
                ok = any(_agrees(kind, tol, smi_value, float(v)) for v in ours if v is not None)
                verdict = "ok" if ok else "DIFFERS"
                if not ok:
                    failures.append(
                        f"GPU {identity.index} {field}: nvidia-smi {smi_value}, ours {ours}"
                    )
            rows.append((condition, identity.index, field, smi_value, ours, kind, tol, verdict))
    table = "\n".join(
        f"| {c} | {i} | {f} | {s} | {o[0]} / {o[1]} | {k} {t:g} | {v} |"
        for c, i, f, s, o, k, t, v in rows
    )
    out = os.environ.get("SPARKDIAG_COMPARE_OUT")
    if out:
        path = Path(out)
        header = (
            ""
            if path.exists()
            else (
                "| condition | GPU | field | nvidia-smi | sparkdiag before / after | tolerance | "
                "verdict |\n|---|---|---|---|---|---|---|\n"
            )
        )
        with path.open("a", encoding="utf-8") as fh:
            fh.write(header + table + "\n")
    print(table)
    assert not failures, "\n".join(failures)
