"""Container against native: the same probe on both sides, alternately, and the gap between them.

By role: :mod:`.model` (sides, cycles, rows, built from worker documents), :mod:`.diagnosis` (why a
side failed, why the sides differ), :mod:`.run` (the alternating loop, and the one way a worker
runs inside a container, shared with the daemon's container probe), :mod:`.report` (table, failure
text, JSON) and :mod:`.command` (the click command).
"""

from sparkdiag.probe.compare.diagnosis import diagnose, explain
from sparkdiag.probe.compare.model import (
    EXIT_FAILED,
    EXIT_GAP,
    EXIT_OK,
    EXIT_USAGE,
    Comparison,
    Failure,
    Row,
)
from sparkdiag.probe.compare.run import compare, container_command, container_cycle

__all__ = [
    "EXIT_FAILED",
    "EXIT_GAP",
    "EXIT_OK",
    "EXIT_USAGE",
    "Comparison",
    "Failure",
    "Row",
    "compare",
    "container_command",
    "container_cycle",
    "diagnose",
    "explain",
]
