"""``sparkdiag check``: the one-shot preflight before a benchmark.

:mod:`~sparkdiag.check.model` (results and context), :mod:`~sparkdiag.check.gather` (one poll,
the probe, host readings), :mod:`~sparkdiag.check.catalog` (the list of checks),
:mod:`~sparkdiag.check.report` (table, JSON, exit code), :mod:`~sparkdiag.commands.check` (the
click command).
"""
