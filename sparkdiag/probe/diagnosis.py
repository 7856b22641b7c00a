"""Why a worker run, native or in a container, could not be used, and what to do about it.

:func:`diagnose` classifies a cycle that cannot be used (runtime missing, image missing, no GPU
inside, no torch inside, hang, output that is not the worker's JSON, ...); the daemon's container
probe (:class:`sparkdiag.probe.launchers.ContainerLauncher`) and ``sparkdiag compare`` share it,
so both say the same thing about a failing container. Why two measured sides differ is
:mod:`sparkdiag.compare.causes`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sparkdiag.probe.container import guards
from sparkdiag.probe.document import WorkerDocument
from sparkdiag.probe.runner import ProbeCycle

Role = Literal["native", "container"]
FailureKind = Literal[
    "runtime_missing",  # the container runtime binary (or native interpreter) does not exist
    "runtime_unusable",  # it cannot run containers (daemon down, permissions, no GPU hook)
    "image_missing",
    "no_interpreter",  # the image has no such Python
    "no_gpu",
    "no_torch",
    "timeout",
    "not_json",
    "busy",
    "error",
]


@dataclass(frozen=True)
class Failure:
    """Why a side could not be measured, and what to do about it."""

    side: Role
    kind: FailureKind
    message: str
    detail: str | None  # the runner's own one-line reason
    label: str  # the cycle that failed
    stderr_tail: str


_DOCKER_LIKE = ("docker", "podman", "nerdctl")

_IMAGE_MISSING = re.compile(
    r"pull access denied|manifest unknown|no such image|repository does not exist|"
    r"image not known|failed to resolve reference|name unknown|could not open image|"
    r"requested access to the resource is denied|unable to find image.*\n?.*(?:not found|denied)|"
    # podman when the pull itself fails (no registry reachable): the image is not here
    r"initializing source docker://",
    re.I,
)
_IMAGE_NAME = (
    re.compile(r"unable to find image '([^']+)'", re.I),
    re.compile(r"pull access denied for ([^\s,]+)", re.I),
    re.compile(r"manifest for (\S+) not found", re.I),
    re.compile(r"no such image: (\S+)", re.I),
    re.compile(r"Error: (\S+): image not known", re.I),
    re.compile(r"could not open image (\S+?):", re.I),
    re.compile(r"initializing source docker://(\S+?): ", re.I),
)
_PULLING = re.compile(r"unable to find image|pulling from|pulling fs layer|trying to pull", re.I)
_NO_TORCH = re.compile(r"No module named '?torch'?|cannot import torch", re.I)
_DAEMON = re.compile(
    r"cannot connect to the docker daemon|is the docker daemon running|"
    r"permission denied while trying to connect|cannot connect to podman",
    re.I,
)
_NO_GPU_HOOK = re.compile(
    r"could not select device driver|unresolvable CDI devices|nvidia-container-cli", re.I
)
_NO_INTERPRETER = (
    re.compile(r'exec: "([^"]+)": executable file not found', re.I),
    re.compile(r"executable file `([^`]+)` not found", re.I),
    re.compile(r"([^\s:]+): (?:command )?not found", re.I),
)
_TTY = re.compile(r"the input device is not a TTY", re.I)
_FIRST_BYTES = re.compile(r"first bytes: (.*)\)\s*$", re.S)


def missing_runtime(cmd: Sequence[str]) -> Failure | None:
    """Fail before any cycle when the runtime binary cannot be found or run."""
    binary = cmd[0]
    if shutil.which(binary) is not None:
        return None
    path = Path(binary)
    if os.sep in binary and path.exists():
        why = f"container runtime {binary!r} is not an executable file"
    elif os.sep in binary:
        why = f"container runtime {binary!r} does not exist"
    else:
        why = f"container runtime {binary!r} not found on PATH"
    return Failure(
        side="container",
        kind="runtime_missing",
        message=why + " (install it, or give its full path)",
        detail=None,
        label="before the first cycle",
        stderr_tail="",
    )


# Above any GPU's figure by far (the densest dtype of the fastest GPU is some 10 PFLOPS, HBM some
# 8 TB/s): a figure past these was not measured by the worker.
MAX_TFLOPS = 1e5
MAX_COPY_BYTES_PER_SECOND = 1e14


def impossible_figure(doc: WorkerDocument) -> str | None:
    """The first figure of a measured ("ok") kernel or copy that no measurement gives: not a
    number, not finite (NaN, Infinity), zero or negative, or past any GPU's; None when all are
    possible. The parser drops such a figure (the row reads n/a), which let a document that
    claimed -5 or NaN TFLOPS pass as measured, its other rows judged, and 1e30 TFLOPS through
    as a 10^30 speed-up."""
    checks: list[tuple[str, Any, float, str]] = []
    results = doc.raw.get("results")
    for item in results if isinstance(results, list) else []:
        if isinstance(item, Mapping) and item.get("status") == "ok":
            what = f"{item.get('dtype')} {item.get('shape')}"
            for key in ("delivered", "peak"):
                checks.append((f"{what} {key}", item.get(key), MAX_TFLOPS, "TFLOPS"))
    copy = doc.raw.get("bandwidth")
    if isinstance(copy, Mapping) and copy.get("status") == "ok":
        for key in ("delivered", "peak"):
            checks.append((f"bandwidth {key}", copy.get(key), MAX_COPY_BYTES_PER_SECOND, "B/s"))
    for what, value, ceiling, unit in checks:
        if value is None:  # not measured: n/a, as the worker says it
            continue
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number) or not 0 < number <= ceiling:
            shown = repr(value)[:40]
            return f"{what} {shown}" + (f" {unit}" if number is not None else "")
    return None


def _usable(cycle: ProbeCycle) -> bool:
    """A document with at least one measured figure (kernel-level errors stay in the rows)."""
    doc = cycle.document
    if doc is None or cycle.result in ("timeout", "skipped_busy"):
        return False
    copied = doc.bandwidth is not None and doc.bandwidth.delivered is not None
    return copied or any(r.delivered is not None for r in doc.results)


def diagnose(
    side: Role,
    cycle: ProbeCycle,
    command: Sequence[str],
    timeout: float,
    label: str = "",
    native_doc: WorkerDocument | None = None,
) -> Failure | None:
    """Classify a cycle that cannot be used; None when it can (for the container, only when
    it ran on the kind of device native ran on)."""
    doc = cycle.document
    stderr = cycle.stderr_tail
    runtime = Path(command[0]).name if command else "?"
    where = "inside the container" if side == "container" else f"of native {command[0]!r}"

    def failed(kind: FailureKind, message: str) -> Failure:
        return Failure(side, kind, message, cycle.reason, label, stderr)

    if cycle.result == "timeout":
        message = f"{side} did not answer within {timeout:g} s; killed with its process group"
        if cycle.returncode is None and cycle.worker_pid is not None:
            # still there after SIGKILL (the runner's reason says so): not "killed"
            message = f"{side} did not answer within {timeout:g} s, and {cycle.reason}"
        if side == "container":
            if _PULLING.search(stderr):
                message += (
                    f"; {runtime} was still pulling the image: pull it first"
                    f" ({_pull_hint(runtime, _image_name(stderr, command))})"
                    " or raise --probe.timeout"
                )
            if guards(command):
                message += f" and the container stopped ({runtime} kill)"
            elif runtime in _DOCKER_LIKE:
                message += (
                    f" (the engine may keep the container running: check '{runtime} ps'"
                    " and run with --rm)"
                )
        return failed("timeout", message)

    start_failed = cycle.returncode is None or (
        cycle.returncode == 127 and "cannot start worker" in stderr
    )
    if start_failed:
        text = f"{cycle.reason or ''} {stderr}"
        what = "container runtime" if side == "container" else "native interpreter"
        if "Errno 2" in text or "No such file" in text:
            return failed("runtime_missing", f"{what} {command[0]!r} not found on PATH")
        if "Errno 13" in text or "Permission denied" in text:
            return failed("runtime_missing", f"{what} {command[0]!r} is not executable")
        return failed("runtime_missing", f"cannot start the {side} command: {cycle.reason}")

    if cycle.result == "skipped_busy":
        return failed(
            "busy",
            f"the GPU was busy during the {side} cycle ({cycle.reason}); stop the other job, "
            "or pass --probe.when always to measure anyway",
        )

    doc_reason = (doc.reason or "") if doc else ""
    if _NO_TORCH.search(doc_reason) or (doc is None and _NO_TORCH.search(stderr)):
        if side == "container":
            return failed(
                "no_torch",
                "the interpreter inside the container has no torch; use an image with PyTorch, "
                "e.g. an NGC PyTorch image (nvcr.io/nvidia/pytorch:<yy.mm>-py3)",
            )
        return failed(
            "no_torch",
            f"the native interpreter {' '.join(command)!r} has no torch: pass --native-python "
            "with the Python of the install to compare (for instance a virtual environment's)",
        )

    if side == "container" and doc is None:
        if _DAEMON.search(stderr):
            return failed(
                "runtime_unusable",
                f"{runtime} cannot reach its daemon: start it, or add your user to its group "
                f"({_error_excerpt(stderr)})",
            )
        if _NO_GPU_HOOK.search(stderr):
            return failed(
                "runtime_unusable",
                f"{runtime} cannot hand a GPU to the container: install and configure the NVIDIA "
                "Container Toolkit (nvidia-ctk runtime configure) and restart the engine "
                f"({_error_excerpt(stderr)})",
            )
        if _IMAGE_MISSING.search(stderr):
            image = _image_name(stderr, command)
            return failed(
                "image_missing",
                f"image not found: {image or '(see below)'} ({_pull_hint(runtime, image)})",
            )
        if _TTY.search(stderr):
            return failed(
                "error",
                "the container command asks for a terminal (-t/--tty): drop it, sparkdiag "
                "sends the worker through a pipe (keep -i)",
            )
        interpreter = _missing_interpreter(stderr, cycle.returncode)
        if interpreter is not None:
            return failed(
                "no_interpreter",
                f"no interpreter {interpreter!r} inside the container: end the command with the "
                "image's Python (python3, python or a full path) and '-'",
            )

    if doc is not None and side == "container":
        no_gpu = _no_gpu(doc, native_doc, runtime)
        if no_gpu is not None:
            return failed("no_gpu", no_gpu)

    impossible = impossible_figure(doc) if doc is not None else None
    if impossible is not None:
        return failed(
            "not_json",
            f"{side} printed a worker document with an impossible figure ({impossible}): not "
            f"a measurement of sparkdiag's worker; check what {command[0]!r} runs and that "
            "nothing rewrites its output",
        )
    if _usable(cycle):
        return None

    if doc is None:
        if cycle.returncode == 0:
            shown = _FIRST_BYTES.search(cycle.reason or "")
            if shown is None:
                hint = ""
                if side == "container" and runtime in _DOCKER_LIKE and not _interactive(command):
                    hint = f": {runtime} needs -i to pass standard input into the container"
                return failed("not_json", f"{side} printed nothing on standard output{hint}")
            return failed(
                "not_json",
                f"{side} printed something that is not sparkdiag's worker JSON: "
                f"first bytes {shown.group(1)}",
            )
        return failed("error", f"{side} failed {where}: {cycle.reason}")
    if doc_reason.startswith("usage:"):
        return failed("error", f"the worker rejected its arguments: {doc_reason}")
    return failed("error", f"{side} measured nothing: {cycle.reason or doc_reason}")


def _no_gpu(doc: WorkerDocument, native_doc: WorkerDocument | None, runtime: str) -> str | None:
    """The container's worker had no GPU where the native one had one."""
    native_device = (native_doc.software.device if native_doc else None) or ""
    software = doc.software
    device = software.device or ""
    reason = doc.reason or ""
    unavailable = doc.status == "unsupported" and "not available" in reason
    if not (unavailable or (native_device.startswith("cuda") and device == "cpu")):
        return None
    if software.torch and software.cuda is None and unavailable:
        return (
            f"the torch inside the container ({software.torch}) is a CPU-only build: use "
            "a CUDA build of PyTorch, e.g. an NGC PyTorch image"
        )
    return (
        "no GPU inside the container: "
        + _gpu_hint(runtime)
        + (f" (worker: {reason})" if reason else "")
    )


def _gpu_hint(runtime: str) -> str:
    hints = {
        "docker": "add --gpus all (docker)",
        "nerdctl": "add --gpus all (nerdctl)",
        "podman": "add --device nvidia.com/gpu=all (podman, CDI)",
        "apptainer": "add --nv (apptainer)",
        "singularity": "add --nv (singularity)",
        "enroot": "start it with the NVIDIA hooks, e.g. --env NVIDIA_VISIBLE_DEVICES=all (enroot)",
    }
    return hints.get(
        runtime,
        "add --gpus all (docker) or --device nvidia.com/gpu=all (podman), --nv (apptainer)",
    )


def _pull_hint(runtime: str, image: str | None) -> str:
    name = image or "IMAGE"
    if runtime in ("apptainer", "singularity"):
        return f"{runtime} pull docker://{name}" if image else f"check the image path ({runtime})"
    if runtime == "enroot":
        return f"enroot import docker://{name} && enroot create"
    return f"{runtime if runtime in _DOCKER_LIKE else 'docker'} pull {name}"


def _image_name(stderr: str, command: Sequence[str]) -> str | None:
    """The image as the runtime named it; else the word before the interpreter in CMD."""
    for pattern in _IMAGE_NAME:
        found = pattern.search(stderr)
        if found:
            return found.group(1).rstrip(".:'\"")
    for i in range(len(command) - 1, 1, -1):
        if Path(command[i]).name.startswith("python"):
            before = command[i - 1]
            return None if before.startswith("-") else before
    return None


def _missing_interpreter(stderr: str, returncode: int | None) -> str | None:
    for pattern in _NO_INTERPRETER[:2]:
        found = pattern.search(stderr)
        if found:
            return found.group(1)
    if returncode == 127:
        found = _NO_INTERPRETER[2].search(stderr)
        if found:
            return found.group(1)
    return None


def _interactive(command: Sequence[str]) -> bool:
    for arg in command[1:]:
        if arg in ("-i", "--interactive", "--interactive=true"):
            return True
        if re.fullmatch(r"-[a-zA-Z]*i[a-zA-Z]*", arg):
            return True
    return False


def _error_excerpt(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no message"
