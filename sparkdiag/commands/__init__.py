"""The command layer: one module per ``sparkdiag`` command (registered in :mod:`sparkdiag.cli`),
thin: each parses its flags, calls into the packages below and renders the result. Two modules
are shared, not commands: :mod:`.common` (logging, the GPUs ``--gpu`` names) and
:mod:`.probe_table` (the probe's table and JSON figures)."""
