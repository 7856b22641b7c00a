"""Container against native: the same probe on both sides, alternately, and the gap between them.

By role: :mod:`.model` (sides, cycles, rows, built from worker documents), :mod:`.causes` (why a
side failed, why the sides differ), :mod:`.rounds` (the alternating loop), :mod:`.container_probe`
(the daemon's container probe, diagnosed the same way) and :mod:`.report` (table, failure text,
JSON). The container side runs through :mod:`sparkdiag.probe.container`; the click command is
:mod:`sparkdiag.commands.compare`.
"""

from sparkdiag.compare.causes import diagnose, explain
from sparkdiag.compare.container_probe import container_cycle
from sparkdiag.compare.model import Comparison, Failure, Row
from sparkdiag.compare.rounds import compare
from sparkdiag.probe.container import container_command

__all__ = [
    "Comparison",
    "Failure",
    "Row",
    "compare",
    "container_command",
    "container_cycle",
    "diagnose",
    "explain",
]
