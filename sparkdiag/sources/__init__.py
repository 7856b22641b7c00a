"""The only layer that touches hardware or the operating system, by library:

* ``nvml/``: NVIDIA GPUs through NVML (``pynvml`` only in ``nvml/driver.py``), or a recorded
  fixture in its place;
* ``host/``: the machine and its OS under ``--path.sysfs`` and ``--path.rootfs`` (``pyudev`` only
  in ``host/udev.py``);
* ``software/``: the installed Python packages, CUDA libraries and NCCL, read from their files;
* ``files.py``: the bounded reads all three use.

ruff's banned-api holds each library to its one module. Sources return frozen dataclasses (those
the poller snapshots are in :mod:`sparkdiag.snapshot`; the few only ``check`` needs are beside
their readers) or plain values; a value the hardware does not support is ``None``.
"""
