"""What a probe cycle asks the worker to do, and the one place its command line is built.

The daemon's scheduler, ``probe``, ``bench``, ``check``, ``compare`` (and ``soak``) describe their
run as a :class:`WorkerRequest`; :meth:`WorkerRequest.argv` turns it into the worker's flags
(``worker.parse_args`` reads them back: a test holds the two in step). A field left at None is
left out, so the worker's own default applies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class WorkerRequest:
    device: str | None = None  # cuda:N or cpu; None: the worker picks cuda:0 or cpu
    dtypes: tuple[str, ...] = ()  # () = every dtype
    shapes: tuple[str, ...] = ()  # MxNxK; () = the suite sized to the GPU
    small: bool = False
    probe_when: str = "idle"
    busy_utilization: float | None = None
    budget_seconds: float | None = None
    iters: int | None = None
    warmup: int | None = None
    bandwidth: bool = True
    progress: bool = False
    exclude_pids: tuple[int, ...] = ()

    def argv(self) -> list[str]:
        """The worker's command-line arguments for this request."""
        args: list[str] = []
        if self.device is not None:
            args += ["--device", self.device]
        for dtype in self.dtypes:
            args += ["--dtype", dtype]
        for shape in self.shapes:
            args += ["--shape", shape]
        if self.small:
            args.append("--small")
        args += ["--probe-when", self.probe_when]
        if self.busy_utilization is not None:
            args += ["--busy-utilization", f"{self.busy_utilization:g}"]
        if self.budget_seconds is not None:
            args += ["--budget-seconds", f"{self.budget_seconds:g}"]
        if self.iters is not None:
            args += ["--iters", str(self.iters)]
        if self.warmup is not None:
            args += ["--warmup", str(self.warmup)]
        if not self.bandwidth:
            args.append("--no-bandwidth")
        if self.progress:
            args.append("--progress")
        for pid in self.exclude_pids:
            args += ["--exclude-pid", str(pid)]
        return args

    def on_device(self, device: str) -> WorkerRequest:
        return replace(self, device=device)


DEFAULT_REQUEST = WorkerRequest()
