"""The only layer that touches hardware or the operating system.

Each hardware library is imported in exactly one module here (ruff's banned-api enforces it):
``pynvml`` in ``nvml.py``, ``pyudev`` in ``udev.py``, ``psutil`` in ``host.py``.
Sources return frozen dataclasses (those the poller snapshots are in
:mod:`sparkdiag.snapshot`; the few only ``check`` needs are beside their readers) or plain
values; a value the hardware does not support is ``None``.
"""
