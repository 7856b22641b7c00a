"""NVIDIA GPUs through NVML: the one NVML interface (``api.py``), its real backend (``driver.py``,
the only importer of pynvml) and the recorded fixture that replays it (``fixture.py``, recorded by
``record.py``), picked by ``backends.py``; every query declared once (``queries.py``, with the
stateful calls in ``calls.py``); the GPU source that turns the answers into snapshots (``gpu.py``,
``activity.py``); NVIDIA's XID catalogue (``xid.py``), for the XID events NVML and the kernel log
report.
"""
