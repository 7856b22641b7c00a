"""The command layer: one module per ``sparkdiag`` command (registered in :mod:`sparkdiag.cli`),
thin: each parses its flags, calls into the packages below and renders the result."""
