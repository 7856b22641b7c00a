"""Container against native: the same probe on both sides, alternately, and the gap between them.

By role: :mod:`.model` (sides, cycles, rows, built from worker documents), :mod:`.causes` (why the
sides differ), :mod:`.rounds` (the alternating loop) and :mod:`.report` (table, failure text,
JSON). The container side runs through :mod:`sparkdiag.probe.container`, and why a side could not
be measured is :mod:`sparkdiag.probe.diagnosis`, shared with the daemon's container probe
(:class:`sparkdiag.probe.launchers.ContainerLauncher`); the click command is
:mod:`sparkdiag.commands.compare`.
"""

from sparkdiag.compare.causes import explain
from sparkdiag.compare.model import Comparison, Row
from sparkdiag.compare.rounds import compare
from sparkdiag.probe.container import container_command
from sparkdiag.probe.diagnosis import Failure, diagnose
from sparkdiag.probe.launchers import container_cycle

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
