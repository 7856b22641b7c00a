"""Readings for scripts/device/multi_gpu.py: nvidia-smi's NVLink counters, the daemon's scrape,
check's and watch's documents, the PCI functions in sysfs. Pure functions over text and JSON
(standard library and prometheus_client, which sparkdiag needs anyway), so they are tested here.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

KIB = 1024
_GPU_LINE = re.compile(r"^GPU\s+(\d+):", re.MULTILINE)
# `nvidia-smi nvlink -gt d`: "Link 3: Data Tx: 1234 KiB" (one line per link and direction)
_LINK_LINE = re.compile(r"Link\s+(\d+):\s*(?:Data\s+)?(Tx|Rx)\s*:?\s*(\d+)\s*KiB", re.IGNORECASE)


def parse_nvlink_throughput(text: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi nvlink -gt d`` as {gpu index: {"tx": bytes, "rx": bytes, "links": n}}: the
    payload counters summed over the GPU's links, KiB turned into bytes. A GPU whose links print
    N/A (no NVLink) is left out."""
    out: dict[str, dict[str, Any]] = {}
    headers = list(_GPU_LINE.finditer(text))
    for i, header in enumerate(headers):
        block = text[header.end() : headers[i + 1].start() if i + 1 < len(headers) else len(text)]
        totals = {"tx": 0, "rx": 0}
        links = set()
        for link, direction, kib in _LINK_LINE.findall(block):
            totals[direction.lower()] += int(kib) * KIB
            links.add(int(link))
        if links:
            out[header.group(1)] = {**totals, "links": len(links)}
    return out


def render_nvlink_throughput(per_gpu: dict[int, dict[int, tuple[int, int]]]) -> str:
    """The text ``nvidia-smi nvlink -gt d`` prints, from {gpu: {link: (tx KiB, rx KiB)}}: the dry
    run's stand-in for nvidia-smi (the same parser then reads it)."""
    lines = []
    for gpu, links in sorted(per_gpu.items()):
        lines.append(f"GPU {gpu}: NVIDIA H200 (UUID: dry-run-{gpu})")
        for link, (tx, rx) in sorted(links.items()):
            lines += [f"\t Link {link}: Data Tx: {tx} KiB", f"\t Link {link}: Data Rx: {rx} KiB"]
    return "\n".join(lines) + "\n"


def _samples(metrics: str, name: str) -> Iterable[tuple[dict[str, str], float]]:
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name:
                yield sample.labels, sample.value


def nvlink_from_metrics(metrics: str) -> dict[str, dict[str, Any]]:
    """``sparkdiag_gpu_nvlink_data_bytes_total`` summed per GPU and direction, with the links
    seen and the links up (``sparkdiag_gpu_nvlink_up``)."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"tx": 0.0, "rx": 0.0, "links": 0})
    links: dict[str, set[str]] = defaultdict(set)
    for labels, value in _samples(metrics, "sparkdiag_gpu_nvlink_data_bytes_total"):
        out[labels["gpu"]][labels["direction"]] += value
        links[labels["gpu"]].add(labels["link"])
    for gpu, seen in links.items():
        out[gpu]["links"] = len(seen)
    for labels, value in _samples(metrics, "sparkdiag_gpu_nvlink_up"):
        out[labels["gpu"]]["up"] = out[labels["gpu"]].get("up", 0) + int(value == 1)
    return dict(out)


def compare_nvlink(
    smi_before: dict[str, dict[str, Any]],
    smi_after: dict[str, dict[str, Any]],
    daemon_before: dict[str, dict[str, Any]],
    daemon_after: dict[str, dict[str, Any]],
    expected_tx: float | None,
    tolerance: float = 0.01,
) -> list[dict[str, Any]]:
    """Per GPU and direction: the bytes nvidia-smi counted between its two reads against those
    the daemon exported between its two scrapes (the same NVML counters, read at the same quiet
    moments: they must agree within ``tolerance``), and tx against what the job's all-reduces
    should have sent (``expected_tx``: ring all-reduce, 2 (N-1) / N of the payload per rank)."""
    rows = []
    for gpu in sorted(set(smi_after) | set(daemon_after), key=int):
        for direction in ("tx", "rx"):
            smi = _delta(smi_before, smi_after, gpu, direction)
            daemon = _delta(daemon_before, daemon_after, gpu, direction)
            ratio = daemon / smi if smi and daemon is not None else None
            agree = (
                smi is not None
                and daemon is not None
                and abs(daemon - smi) <= tolerance * max(abs(smi), 1 << 20)
            )
            rows.append(
                {
                    "gpu": gpu,
                    "direction": direction,
                    "nvidia_smi_bytes": smi,
                    "daemon_bytes": daemon,
                    "daemon_over_smi": ratio,
                    "agree": agree,
                    "over_expected": (smi / expected_tx) if smi and expected_tx else None,
                }
            )
    return rows


def _delta(before: dict[str, Any], after: dict[str, Any], gpu: str, key: str) -> float | None:
    if gpu not in before or gpu not in after:
        return None
    return float(after[gpu][key]) - float(before[gpu][key])


def series_per_gpu(metrics: str) -> dict[str, Any]:
    """For every family with a ``gpu`` label, the GPUs it has samples for; the families that
    leave a GPU out (per-process series are left out of the comparison: a GPU without a process
    rightly has none)."""
    by_family: dict[str, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            gpu = sample.labels.get("gpu")
            if gpu is not None:
                by_family[family.name].add(gpu)
                count[gpu] += 1
    gpus = sorted(set().union(*by_family.values()), key=int) if by_family else []
    partial = {
        name: sorted(set(gpus) - seen, key=int)
        for name, seen in sorted(by_family.items())
        if seen != set(gpus) and "process" not in name
    }
    return {"gpus": gpus, "families": len(by_family), "series": dict(count), "missing": partial}


def value(metrics: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` whose labels include ``labels``."""
    return [
        (found, v)
        for found, v in _samples(metrics, name)
        if all(found.get(k) == want for k, want in labels.items())
    ]


def check_rows(doc: dict[str, Any], names: Iterable[str]) -> list[dict[str, Any]]:
    wanted = set(names)
    return [
        {k: row.get(k) for k in ("name", "status", "gpu", "finding", "data")}
        for row in doc.get("checks", [])
        if row.get("name") in wanted
    ]


def check_per_gpu(doc: dict[str, Any], gpus: int) -> dict[str, Any]:
    """Which per-GPU rows of a check document cover every GPU (a row name given for one GPU
    is expected for each), and the statuses counted."""
    by_name: dict[str, set[str]] = defaultdict(set)
    statuses: dict[str, int] = defaultdict(int)
    for row in doc.get("checks", []):
        statuses[row.get("status", "?")] += 1
        if row.get("gpu") is not None:
            by_name[row["name"]].add(str(row["gpu"]))
    every = {str(i) for i in range(gpus)}
    return {
        "per_gpu_rows": sorted(by_name),
        "not_on_every_gpu": {
            n: sorted(every - s, key=int) for n, s in by_name.items() if s != every
        },
        "statuses": dict(statuses),
        "exit_code": doc.get("exit_code"),
    }


def watch_summary(
    doc: dict[str, Any], ranks: dict[int, dict[str, Any]], rank: int
) -> dict[str, Any]:
    """What ``sparkdiag watch --json`` said, and whether it names ``rank`` (by its pid, its GPU
    or the word rank with its number) and the collective (``all_reduce``)."""
    text = repr({k: doc.get(k) for k in ("headline", "causes", "notes")})  # what it concludes
    me = ranks.get(rank, {})
    pid = me.get("pid")
    named = sorted(
        r
        for r, info in ranks.items()
        if info.get("pid") is not None and re.search(rf"\b{info['pid']}\b", text)
    )
    causes = [
        {
            "name": c.get("name"),
            "share": c.get("share"),
            "evidence": list(c.get("evidence", []))[:3],
        }
        for c in doc.get("causes", [])
    ]
    return {
        "headline": doc.get("headline"),
        "causes": causes,
        "stack_sampler": doc.get("stack_sampler"),
        "diagnosed_gpus": doc.get("diagnosed_gpus"),
        "names_collective": "all_reduce" in text or "collective" in text,
        "names_rank_pid": pid is not None and re.search(rf"\b{pid}\b", text) is not None,
        "names_rank_word": re.search(rf"\brank {rank}\b", text, re.IGNORECASE) is not None,
        "ranks_named_by_pid": named,
    }


# -- sysfs: the PCI functions, as a fake tree a fixture can be made of ------------------------

PCI_FILES = (
    "vendor",
    "device",
    "class",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
)


def capture_pci(sysfs: Path, dest: Path) -> list[dict[str, str]]:
    """Every PCI function under ``sysfs/bus/pci/devices`` with the files sparkdiag's PCIe source
    reads, copied into ``dest`` in the layout of tests/fixtures/sysfs/h200-x8 (devices under
    devices/pci0000:00, links from bus/pci/devices, a driver link to bus/pci/drivers/NAME);
    returns one row per function (the table pci.tsv holds)."""
    rows = []
    base = sysfs / "bus" / "pci" / "devices"
    for entry in sorted(base.iterdir()) if base.is_dir() else []:
        row = {"address": entry.name}
        for name in PCI_FILES:
            try:
                row[name] = (entry / name).read_text(encoding="ascii").strip()
            except OSError:
                continue
        try:
            row["driver"] = os.path.basename(os.readlink(entry / "driver"))
        except OSError:
            row["driver"] = ""
        rows.append(row)
        home = dest / "devices" / "pci0000:00" / entry.name
        home.mkdir(parents=True, exist_ok=True)
        for name in PCI_FILES:
            if name in row:
                (home / name).write_text(row[name] + "\n", encoding="ascii")
        link = dest / "bus" / "pci" / "devices" / entry.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(f"../../../devices/pci0000:00/{entry.name}")
        if row["driver"]:
            (dest / "bus" / "pci" / "drivers" / row["driver"]).mkdir(parents=True, exist_ok=True)
            driver = home / "driver"
            if not driver.is_symlink():
                driver.symlink_to(f"../../../bus/pci/drivers/{row['driver']}")
    return rows


def pci_table(rows: list[dict[str, str]]) -> str:
    cols = (
        "address",
        "vendor",
        "device",
        "class",
        "driver",
        "current_link_speed",
        "current_link_width",
        "max_link_speed",
        "max_link_width",
    )
    lines = ["\t".join(cols)]
    lines += ["\t".join(row.get(c, "") for c in cols) for row in rows]
    return "\n".join(lines) + "\n"
