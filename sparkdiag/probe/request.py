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
    soak_seconds: float | None = None  # a soak instead of a suite (see worker.py)
    window_seconds: float | None = None
    progress: bool = False
    exclude_pids: tuple[int, ...] = ()

    def argv(self) -> list[str]:
        """The worker's command-line arguments for this request."""
        args: list[str] = []
        if self.device is not None:
            args += ["--device", self.device]
        if self.suite is not None:
            args += ["--suite", self.suite]
        for dtype in self.dtypes:
            args += ["--dtype", dtype]
        for shape in self.shapes:
            args += ["--shape", shape]
        if self.small:
            args.append("--small")
        if self.probe_when is not None:
            args += ["--probe-when", self.probe_when]
        numbers = (
            ("--busy-utilization", self.busy_utilization),
            ("--budget-seconds", self.budget_seconds),
            ("--iters", self.iters),
            ("--warmup", self.warmup),
            ("--soak-seconds", self.soak_seconds),
            ("--window-seconds", self.window_seconds),
        )
        for flag, value in numbers:
            if value is not None:
                args += [flag, f"{value:g}"]
        for flag, on in (("bandwidth", self.bandwidth), ("transfers", self.transfers)):
            if on is not None:
                args.append(f"--{flag}" if on else f"--no-{flag}")
        if self.progress:
            args.append("--progress")
        for pid in self.exclude_pids:
            args += ["--exclude-pid", str(pid)]
        return args

    def on_device(self, device: str) -> WorkerRequest:
        return replace(self, device=device)


DEFAULT_REQUEST = WorkerRequest()
