"""The probe from a terminal: ``sparkdiag probe``, ``bench`` and ``baseline``, one module each."""
