"""What a probe cycle asks the worker to do, and the one place its command line is built.

The daemon's scheduler, ``probe``, ``bench``, ``check``, ``compare`` (and ``soak``) describe their
run as a :class:`WorkerRequest`; :meth:`WorkerRequest.argv` turns it into the worker's flags,
each field written by the worker's own declaration of the flag (``worker.FLAGS``), which
``worker.parse_args`` reads back (a test holds the two in step). A field left at None is left
out, so the worker's own default applies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from sparkdiag.probe.worker.contract import FLAGS


@dataclass(frozen=True)
class WorkerRequest:
    device: str | None = None  # cuda:N or cpu; None: the worker picks cuda:0 or cpu
    suite: str | None = None  # default, hot, check (worker.SUITES); None: default
    dtypes: tuple[str, ...] = ()  # () = the suite's dtypes
    shapes: tuple[str, ...] = ()  # MxNxK; () = the suite sized to the GPU
    small: bool = False
    probe_when: str | None = None  # idle, always; None: the suite's
    busy_utilization: float | None = None
    budget_seconds: float | None = None
    iters: int | None = None
    warmup: int | None = None
    bandwidth: bool | None = None  # None: the suite's
    transfers: bool | None = None  # None: the suite's
    soak_seconds: float | None = None  # a soak instead of a suite (worker/soak.py)
    window_seconds: float | None = None
    progress: bool = False
    exclude_pids: tuple[int, ...] = ()
    # the storage mode (worker/storage.py): the path into the GPU of `sparkdiag storage --gpu`
    storage_read: str | None = None
    storage_size: int | None = None
    storage_block: int | None = None
    storage_threads: int | None = None
    storage_seconds: float | None = None
    storage_gds: bool | None = None

    def argv(self) -> list[str]:
        """The worker's command-line arguments for this request: each field is the worker flag
        of the same name (``worker.FLAGS``: ``dtypes`` is ``--dtype``, given once per value)."""
        by_field = {flag.field: flag for flag in FLAGS}
        return [arg for f in fields(self) for arg in by_field[f.name].argv(getattr(self, f.name))]

    def on_device(self, device: str) -> WorkerRequest:
        return replace(self, device=device)


DEFAULT_REQUEST = WorkerRequest()
