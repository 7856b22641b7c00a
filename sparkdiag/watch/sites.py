"""The lines and stacks of the job's code that took a cause's lost time, from the seconds the
diagnosis gave each stack (:class:`~sparkdiag.watch.findings.Ledger`): the evidence that names
them, and the top stacks ``--json`` lists."""

from __future__ import annotations

from collections.abc import Sequence

from sparkdiag.watch import stacks as st
from sparkdiag.watch.causes import Site, TopStack, pct
from sparkdiag.watch.model import Recording, StackFrame
from sparkdiag.watch.threads import Readings

TOP_SITES = 3
TOP_STACKS = 5
SITE_MIN = 0.02  # of the window: a line that took less is not named


def frame_name(frame: StackFrame, cwd: str = "", own: Sequence[str] = ()) -> str:
    """``function (file:line)``, the file as :func:`~.stacks.short_file` shortens it."""
    where = st.short_file(frame.file, cwd, own)
    line = f":{frame.line}" if frame.line else ""
    return f"{st.function_name(frame.function)} ({where}{line})"


def sites(
    rec: Recording, readings: Readings, spent: dict[int, float], length: float
) -> tuple[Site, ...]:
    """The lines that took the most of ``spent`` (stack index -> lost seconds), at most
    ``TOP_SITES``, each at least ``SITE_MIN`` of the window."""
    by_site: dict[tuple[int | None, int | None], float] = {}
    for stack, seconds in spent.items():
        reading = readings.stacks[stack]
        key = (reading.site, reading.via if reading.via != reading.site else None)
        by_site[key] = by_site.get(key, 0.0) + seconds
    out: list[Site] = []
    for (site, via), seconds in sorted(by_site.items(), key=lambda kv: -kv[1]):
        if site is None or seconds / length < SITE_MIN or len(out) >= TOP_SITES:
            continue
        f = rec.frames[site]
        out.append(
            Site(
                function=st.function_name(f.function),
                file=st.short_file(f.file, rec.cwd, readings.roots),
                line=f.line,
                text=f.text,
                share=seconds / length,
                via="" if via is None else frame_name(rec.frames[via], rec.cwd, readings.roots),
            )
        )
    return tuple(out)


def top_stacks(rec: Recording, spent: dict[int, float], length: float) -> tuple[TopStack, ...]:
    ranked = sorted(spent.items(), key=lambda kv: -kv[1])[:TOP_STACKS]
    own = st.own_roots(rec.cwd, rec.frames, rec.stacks)
    return tuple(
        TopStack(
            share=seconds / length,
            frames=tuple(frame_name(rec.frames[i], rec.cwd, own) for i in rec.stacks[stack]),
        )
        for stack, seconds in ranked
    )


def lines(found: tuple[Site, ...], doing: str) -> list[str]:
    """Evidence lines naming each site: ``doing`` says what the thread did there."""
    out = []
    for s in found:
        text = f": {s.text}" if s.text else ""
        via = f", in {s.via}" if s.via else ""
        out.append(f"{doing} at {s.file}:{s.line} ({s.function}{text}){via}: {pct(s.share)}")
    return out
