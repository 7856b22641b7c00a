"""Container against native: the same probe on both sides, alternately, and the gap between them.

By role: :mod:`.model` (sides, cycles, rows, built from worker documents), :mod:`.causes` (why the
sides differ), :mod:`.rounds` (the alternating loop) and :mod:`.report` (table, failure text,
JSON). The container side runs through :mod:`sparkdiag.probe.container`, and why a side could not
be measured is :mod:`sparkdiag.probe.diagnosis`, shared with the daemon's container probe
(:class:`sparkdiag.probe.launchers.ContainerLauncher`); the click command is
:mod:`sparkdiag.commands.compare`.

Like :mod:`sparkdiag.probe`, the package imports none of them itself: ``check`` reads
:mod:`.model` alone.
"""
