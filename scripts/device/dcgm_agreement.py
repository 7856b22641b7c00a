#!/usr/bin/env python3
"""On the lent GPU: sparkdiag's dcgm-exporter compatible series beside ``nvidia-smi``.

Starts ``python3 -m sparkdiag serve --compat.dcgm`` from this checkout (no probe, polls every
0.5 s), lets it settle 2 s and poll twice (GPM answers from the second poll), then in each of
``--rounds`` rounds scrapes /metrics, runs ``nvidia-smi --query-gpu=...`` once for every GPU
and scrapes again. A value agrees when it is within the tolerance of either scrape, so that a
clock that moved during nvidia-smi's tens of milliseconds is not a false failure. Judged, as in
the first agreement round: temperatures within 2 °C, clocks and power within 5 %, the identity
labels (UUID, modelName, pci_bus_id, DCGM_FI_DRIVER_VERSION) exactly; a field nvidia-smi prints
as N/A must be absent, and one it prints must be there. Utilization and framebuffer memory are
shown beside nvidia-smi's, not judged. ``python3 -m sparkdiag dump --compat.dcgm`` runs once too
(the one-shot command takes the option as well) and its output is kept.

Usage (on the device, from the checkout; nothing to install)::

    python3 scripts/device/dcgm_agreement.py                 # 3 rounds, results under $OUT
    python3 scripts/device/dcgm_agreement.py --rounds 5 --out /tmp/res

Writes ``OUT/dcgm_agreement.tgz`` holding agreement.md (the table, also printed),
agreement.json, scrape-first.prom and scrape-last.prom, dump.prom, nvidia-smi.csv and serve.log.
Exit status 0 when every judged row agrees, 1 when one does not, 2 when it cannot run.

For tests: ``--sparkdiag-arg`` (repeatable) goes to serve and dump (``--nvml-fixture FILE``),
``--nvidia-smi`` names the program to run; ``--serve-arg`` (repeatable) goes to serve only;
``--settle 0`` scrapes as soon as serve has polled twice (with ``--poll-interval 0.1`` given to
serve, a tenth of a second after it is healthy).
"""

from __future__ import annotations

import argparse
import csv
import http.client
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.common import stop  # noqa: E402
from sparkdiag.exporter.dcgm import FIELDS, XID_ERRORS  # noqa: E402

SETTLE_SECONDS = 2.0  # after the daemon is healthy (its first poll): the poller's next, GPM in
SETTLE_POLLS = 2  # and at least until /healthz says poll 2 (GPM answers from the second)
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Row:
    smi: str  # nvidia-smi --query-gpu field
    dcgm: str  # DCGM field (a metric), or the label for identity rows
    kind: str  # "label" (exact), "abs", "rel"
    tolerance: float
    judged: bool


ROWS = (
    Row("uuid", "UUID", "label", 0, True),
    Row("name", "modelName", "label", 0, True),
    Row("pci.bus_id", "pci_bus_id", "label", 0, True),
    Row("driver_version", "DCGM_FI_DRIVER_VERSION", "label", 0, True),
    Row("temperature.gpu", "DCGM_FI_DEV_GPU_TEMP", "abs", 2.0, True),
    Row("temperature.memory", "DCGM_FI_DEV_MEMORY_TEMP", "abs", 2.0, True),
    Row("clocks.sm", "DCGM_FI_DEV_SM_CLOCK", "rel", 0.05, True),
    Row("clocks.mem", "DCGM_FI_DEV_MEM_CLOCK", "rel", 0.05, True),
    Row("power.draw", "DCGM_FI_DEV_POWER_USAGE", "rel", 0.05, True),
    Row("utilization.gpu", "DCGM_FI_DEV_GPU_UTIL", "abs", 10.0, False),
    Row("utilization.memory", "DCGM_FI_DEV_MEM_COPY_UTIL", "abs", 10.0, False),
    Row("utilization.encoder", "DCGM_FI_DEV_ENC_UTIL", "abs", 10.0, False),
    Row("utilization.decoder", "DCGM_FI_DEV_DEC_UTIL", "abs", 10.0, False),
    Row("memory.used", "DCGM_FI_DEV_FB_USED", "rel", 0.05, False),
    Row("memory.free", "DCGM_FI_DEV_FB_FREE", "rel", 0.05, False),
)
SMI_FIELDS = ("index", *(row.smi for row in ROWS))
NOT_A_VALUE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", ""}

Scrape = dict[str, dict[str, tuple[dict[str, str], float]]]  # metric -> gpu -> (labels, value)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--sparkdiag-arg", action="append", default=[], help="for serve and dump")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs sparkdiag")
    p.add_argument("--serve-arg", action="append", default=[], help="for serve only")
    p.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                   help=f"seconds to let serve poll before the first scrape, and at least until "
                        f"its poll {SETTLE_POLLS} (default {SETTLE_SECONDS:g})")  # fmt: skip
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- readings


def parse_scrape(text: str) -> Scrape:
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("DCGM_"):
            continue
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels.get("gpu", "")] = (
                dict(sample.labels),
                float(sample.value),
            )
    return out


def smi_value(text: str) -> str | None:
    text = text.strip()
    return None if text in NOT_A_VALUE else text


def run_smi(program: str) -> tuple[str, dict[str, dict[str, str | None]]]:
    """nvidia-smi's CSV and {index: {field: text or None}}."""
    cmd = [program, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    rows: dict[str, dict[str, str | None]] = {}
    for record in csv.reader(io.StringIO(text)):
        if not record:
            continue
        values = dict(zip(SMI_FIELDS, (smi_value(v) for v in record), strict=True))
        rows[str(values["index"])] = values
    return text, rows


def ours(scrape: Scrape, row: Row, gpu: str) -> str | float | None:
    if row.kind == "label":
        found = scrape.get("DCGM_FI_DEV_GPU_TEMP", {}).get(gpu)
        return None if found is None else found[0].get(row.dcgm)
    found = scrape.get(row.dcgm, {}).get(gpu)
    return None if found is None else found[1]


def agrees(row: Row, smi: str, value: str | float) -> bool:
    if row.kind == "label":
        return smi == value
    reference, got = float(smi.split()[0]), float(value)
    if row.kind == "abs":
        return abs(reference - got) <= row.tolerance
    return abs(reference - got) <= row.tolerance * max(abs(reference), 1e-9)


def judge(row: Row, smi: str | None, readings: list[str | float | None]) -> str:
    present = [v for v in readings if v is not None]
    if smi is None:
        return "both N/A" if not present else "smi N/A"
    if len(present) < len(readings):
        return "MISSING"
    return "ok" if any(agrees(row, smi, v) for v in present) else "DIFFERS"


GOOD = {"ok", "both N/A"}


# ---------------------------------------------------------------------------- the daemon


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8")
    finally:
        conn.close()


def environment() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def start_serve(opts: argparse.Namespace, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [
        opts.python, "-m", "sparkdiag", "serve", "--listen", f"127.0.0.1:{port}",
        "--compat.dcgm", "--no-probe.enabled", "--poll-interval", "0.5",
        "--state-dir", str(work / "state"), *opts.sparkdiag_arg, *opts.serve_arg,
    ]  # fmt: skip
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=environment(), stdout=log, stderr=log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sparkdiag serve exited {proc.returncode}; see serve.log")
        try:
            if get(port, "/healthz")[0] == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"sparkdiag serve not healthy within {START_TIMEOUT:.0f} s")


def settle(port: int, seconds: float) -> None:
    """``seconds``, and then until serve's /healthz says it made poll ``SETTLE_POLLS``."""
    time.sleep(seconds)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        match = re.search(r"poll (\d+)", get(port, "/healthz")[1])
        if match and int(match.group(1)) >= SETTLE_POLLS:
            return
        time.sleep(0.05)
    raise SystemExit(f"sparkdiag serve did not poll {SETTLE_POLLS} times in {START_TIMEOUT:.0f} s")


# ---------------------------------------------------------------------------- the run


def measure(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    proc, port = start_serve(opts, work)
    try:
        settle(port, opts.settle)
        texts = [get(port, "/metrics")[1]]
        rounds = []
        for _ in range(opts.rounds):
            csv_text, smi = run_smi(opts.nvidia_smi)
            texts.append(get(port, "/metrics")[1])
            rounds.append((parse_scrape(texts[-2]), smi, parse_scrape(texts[-1]), csv_text))
    finally:
        stop(proc)
    (work / "scrape-first.prom").write_text(texts[0])
    (work / "scrape-last.prom").write_text(texts[-1])
    (work / "nvidia-smi.csv").write_text("".join(r[3] for r in rounds))
    dump = subprocess.run(
        [opts.python, "-m", "sparkdiag", "dump", "--compat.dcgm", *opts.sparkdiag_arg],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    (work / "dump.prom").write_text(dump.stdout + dump.stderr)

    table = []
    for index, (before, smi, after, _) in enumerate(rounds):
        for gpu, values in sorted(smi.items()):
            for row in ROWS:
                readings = [ours(before, row, gpu), ours(after, row, gpu)]
                verdict = judge(row, values[row.smi], readings)
                table.append(
                    {
                        "round": index + 1,
                        "gpu": gpu,
                        "nvidia_smi": row.smi,
                        "dcgm": row.dcgm,
                        "smi": values[row.smi],
                        "ours": readings,
                        "tolerance": f"{row.kind} {row.tolerance:g}",
                        "verdict": verdict if row.judged else f"shown ({verdict})",
                        "judged": row.judged,
                    }
                )
    last = parse_scrape(texts[-1])
    exported = sorted(last)
    dump_has = sorted(parse_scrape(dump.stdout)) if dump.returncode == 0 else []
    return {
        "rows": table,
        "exported": exported,
        "left_out": sorted(({f.name for f in FIELDS} | {XID_ERRORS}) - set(exported)),
        "dump_returncode": dump.returncode,
        "dump_exported": dump_has,
        "failures": [r for r in table if r["judged"] and r["verdict"] not in GOOD],
    }


def render(result: dict[str, Any]) -> str:
    def shown(value: Any) -> str:
        return "N/A" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    lines = [
        "| round | GPU | nvidia-smi | DCGM field | nvidia-smi | sparkdiag before / after "
        "| tolerance | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ours_text = " / ".join(shown(v) for v in r["ours"])
        lines.append(
            f"| {r['round']} | {r['gpu']} | {r['nvidia_smi']} | {r['dcgm']} | {shown(r['smi'])} "
            f"| {ours_text} | {r['tolerance']} | {r['verdict']} |"
        )
    judged = [r for r in result["rows"] if r["judged"]]
    lines += [
        "",
        f"judged rows agreeing: {len(judged) - len(result['failures'])} of {len(judged)}",
        f"DCGM fields exported by serve: {', '.join(result['exported'])}",
        f"left out (not supported here, or no XID yet): {', '.join(result['left_out'])}",
        f"dump --compat.dcgm: exit {result['dump_returncode']}, "
        f"{len(result['dump_exported'])} DCGM fields (one poll; GPM answers from the second, so "
        "its PROF fields are absent on a real GPU)",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dcgm-agreement-") as tmp:
        work = Path(tmp)
        try:
            result = measure(opts, work)
        except (SystemExit, OSError, subprocess.SubprocessError) as exc:
            (work / "error.txt").write_text(f"{exc!r}\n")
            print(f"dcgm_agreement: cannot run: {exc}", file=sys.stderr)
            status = 2
        else:
            text = render(result)
            print(text, end="")
            (work / "agreement.md").write_text(text)
            (work / "agreement.json").write_text(json.dumps(result, indent=1))
            status = 1 if result["failures"] else 0
        with tarfile.open(opts.out / "dcgm_agreement.tgz", "w:gz") as tar:
            for path in sorted(work.iterdir()):
                if path.is_file():
                    tar.add(path, arcname=path.name)
    print(f"dcgm_agreement rc={status}; {opts.out / 'dcgm_agreement.tgz'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
