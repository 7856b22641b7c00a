"""What scripts/device/watch_jobs.py makes of its runs: one row per job (the truth from the
job's own throughput against watch's verdict, share, named line and co-tenant), the text table,
the expectations a replay test reads back (``watch_expected.json``), and the archive."""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path
from typing import Any

SHARE_WITHIN = 0.10  # issue 28: every share within 0.10 of the truth
EXPECTED_FILE = "watch_expected.json"


def _site(diagnosis: dict[str, Any], cause: str) -> dict[str, Any] | None:
    for c in diagnosis.get("causes", ()):
        if c["name"] == cause and c.get("sites"):
            site: dict[str, Any] = c["sites"][0]
            return site
    return None


def row(
    name: str,
    expected: str,
    pairs: list[tuple[Any, Any]],
    diagnosis: Any,
    error: str,
    clean_alone: bool,
    line: tuple[str, int] | None = None,
    neighbour: int | None = None,
) -> dict[str, Any]:
    """One job's line: the last diagnosis, the share of the expected cause (else of the first),
    and over the pairs (alone, watched) that both gave a result: for a job whose alone run left
    its defect out the truth, 1 - watched/alone (median); for the others the overhead, the
    same figure for the same job. ``line``: (file name, line) the expected cause must name
    first; ``neighbour``: the co-tenant's pid, which it must name."""
    entry: dict[str, Any] = {"job": name, "expected": expected, "error": error}
    if diagnosis is not None:
        causes = {c["name"]: c for c in diagnosis["causes"]}
        entry["diagnosis"] = diagnosis["verdict"]
        entry["causes"] = {k: round(c["share"], 3) for k, c in causes.items()}
        chosen = causes.get(expected) or (diagnosis["causes"] or [None])[0]
        entry["lost_share"] = chosen["share"] if chosen else 0.0
        entry["share_is_lost_time"] = bool(chosen["lost"]) if chosen and "lost" in chosen else True
        entry["verdict_ok"] = diagnosis["verdict"] == expected
        site = _site(diagnosis, expected)
        if site is not None:
            entry["site"] = f"{site['file']}:{site['line']}"
            entry["site_text"] = site.get("text", "")
        if line is not None:
            entry["line_expected"] = f"{line[0]}:{line[1]}"
            entry["line_ok"] = site is not None and (
                Path(site["file"]).name == line[0] and site["line"] == line[1]
            )
        if neighbour is not None:
            tenants = causes.get("co-tenant", {}).get("tenants", [])
            entry["tenant_ok"] = any(t["pid"] == neighbour for t in tenants)
    done = [(a, w) for a, w in pairs if a and w]
    if done:
        entry["alone_per_second"] = statistics.median(a["per_second"] for a, _ in done)
        entry["watched_per_second"] = statistics.median(w["per_second"] for _, w in done)
        entry["unit"] = done[0][0]["unit"]
        ratios = [1.0 - w["per_second"] / a["per_second"] for a, w in done]
        if clean_alone:
            entry["truths"] = ratios
            entry["truth"] = statistics.median(ratios)
        else:
            entry["truth"] = 0.0 if expected == "healthy" else None
            entry["overheads"] = ratios
            entry["overhead"] = statistics.median(ratios)
    elif expected == "healthy":
        entry["truth"] = 0.0
    if entry.get("truth") is not None and "lost_share" in entry:
        entry["share_minus_truth"] = entry["lost_share"] - entry["truth"]
        if entry["truth"] > 0 and entry.get("share_is_lost_time", True):
            entry["share_ok"] = abs(entry["share_minus_truth"]) <= SHARE_WITHIN
    return entry


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'job':<20} {'truth':>6} {'expected':<19} {'diagnosis':<19} {'share':>6} "
            f"{'overhead':>9}  line / notes")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        lost = f"{r['lost_share'] * 100:.0f} %" if "lost_share" in r else "-"
        if "lost_share" in r and not r.get("share_is_lost_time", True):
            lost += "*"
        truth = f"{r['truth'] * 100:.0f} %" if r.get("truth") is not None else "-"
        over = f"{r['overhead'] * 100:+.1f} %" if "overhead" in r else "-"
        notes = [r["error"]] if r["error"] else []
        if "site" in r:
            mark = {True: " ok", False: " WRONG"}.get(r.get("line_ok"), "")  # type: ignore[arg-type]
            notes.append(f"{r['site']}{mark}")
        if "tenant_ok" in r:
            notes.append("neighbour named" if r["tenant_ok"] else "neighbour NOT named")
        if r.get("verdict_ok") is False:
            notes.append("verdict WRONG")
        if r.get("share_ok") is False:
            notes.append(f"share off by {r['share_minus_truth'] * 100:+.0f} points")
        if len(r.get("causes", {})) > 1:
            notes.append("also " + ", ".join(f"{k} {v * 100:.0f} %" for k, v in r["causes"].items()
                                             if k != r.get("diagnosis")))  # fmt: skip
        if "alone_per_second" in r:
            notes.append(f"{r['alone_per_second']:.0f} {r['unit']}/s alone, "
                         f"{r['watched_per_second']:.0f} watched")  # fmt: skip
        lines.append(
            f"{r['job']:<20} {truth:>6} {r['expected']:<19} {r.get('diagnosis', 'failed'):<19} "
            f"{lost:>6} {over:>9}  {'; '.join(notes)}"
        )
    checks = {
        "verdict": [r["verdict_ok"] for r in rows if "verdict_ok" in r],
        "line": [r["line_ok"] for r in rows if "line_ok" in r],
        "share": [r["share_ok"] for r in rows if "share_ok" in r],
        "neighbour": [r["tenant_ok"] for r in rows if "tenant_ok" in r],
    }
    lines.append(
        "right: "
        + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in checks.items() if v)
        + f" (share within {SHARE_WITHIN:.2f} of the truth)"
    )
    lines.append(
        "truth: 1 - watched/alone throughput, the alone run without the defect (healthy jobs: 0);"
        " share: the expected cause's (* a share of the time with that finding, not lost time)"
    )
    return "\n".join(lines) + "\n"


def expectations(rows: list[dict[str, Any]], out: Path, truth: bool = True) -> None:
    """``watch_expected.json``: for each job watched, what its recording must replay to (the
    test in tests/test_watch_device_recordings.py reads it back). Without ``truth`` (a dry run
    on a scripted NVML fixture, whose GPU is not the job's) no share is expected."""
    entries = []
    for r in rows:
        if "diagnosis" not in r or not (out / f"{r['job']}.recording.json").is_file():
            continue
        entry: dict[str, Any] = {
            "job": r["job"],
            "recording": f"{r['job']}.recording.json",
            "verdict": r["expected"],
            "truth": r.get("truth") if truth else None,
            "share_within": SHARE_WITHIN,
        }
        if "line_expected" in r:
            file, line = r["line_expected"].rsplit(":", 1)
            entry["line"] = {"file": file, "line": int(line)}
        if "tenant_ok" in r:
            entry["co_tenant"] = True
        entries.append(entry)
    doc = {"schema": "sparkdiag-watch-expected/1", "jobs": entries}
    (out / EXPECTED_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def pack(out: Path, archive: Path | None) -> None:
    """Everything under ``out`` into ``archive`` (tar, gzip), written whole or not at all."""
    if archive is None:
        return
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(out.iterdir()):
            if path.resolve() not in (archive.resolve(), partial.resolve()):
                tar.add(path, arcname=path.name)
    partial.replace(archive)
