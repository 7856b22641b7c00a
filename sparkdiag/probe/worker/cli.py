"""The worker's entry: parse the arguments (``contract.parse_args``), open the device, run the
mode asked for (a suite's cycle, ``suite.run_suite``, or a soak, ``soak.run_soak``) and print
the one JSON document on standard output, whatever happened.

This is the room that imports torch (in :func:`_run`); the others get it as ``info.torch``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import stat
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from sparkdiag.probe.worker.contract import UsageError, parse_args
from sparkdiag.probe.worker.dtypes import SLEEP_CLOCK_HZ, DeviceInfo, torch_version_tuple
from sparkdiag.probe.worker.log import jsonable, log
from sparkdiag.probe.worker.nvml import BusyState, Nvml
from sparkdiag.probe.worker.output import empty_document, software_identity
from sparkdiag.probe.worker.soak import StopRequest, run_soak, stop_on_signals
from sparkdiag.probe.worker.storage import run_storage_read
from sparkdiag.probe.worker.suite import run_suite

ASSUMED_L2_BYTES = 60 * 1024 * 1024  # H200; used where torch does not say


class TorchUnavailable(Exception):
    """torch cannot be imported by this interpreter."""


def _bare_uuid(text: str) -> str:
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _truncate(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def max_sm_clock_hz(props: Any, nvml: Nvml | None) -> float:
    """The GPU's highest SM clock in Hz (torch's clock_rate, else NVML), else SLEEP_CLOCK_HZ."""
    khz = getattr(props, "clock_rate", None)
    if isinstance(khz, (int, float)) and khz > 0:
        return float(khz) * 1e3
    mhz = nvml.max_sm_clock_mhz() if nvml is not None else None
    return float(mhz) * 1e6 if mhz else SLEEP_CLOCK_HZ


def _now() -> float:
    return time.time()


def run(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """One cycle of the suite, or a soak; fills ``doc``."""
    if args.soak_seconds is None:
        _run(args, doc, None)
        return
    stop = StopRequest()
    with stop_on_signals(stop):  # from the start: a Ctrl-C during torch's import counts too
        _run(args, doc, stop)


def _run(args: argparse.Namespace, doc: dict[str, Any], stop: StopRequest | None) -> None:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA index == NVML index
    try:
        import torch
    except ImportError as exc:
        raise TorchUnavailable(f"cannot import torch: {exc}") from exc

    doc["software"]["torch"] = str(torch.__version__)
    doc["software"]["cuda"] = torch.version.cuda
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        device = "cuda:0"
    doc["software"]["device"] = device
    is_cuda = device.startswith("cuda")
    if not is_cuda and device != "cpu":
        raise UsageError(f"--device must be cuda[:N] or cpu, not {device!r}")
    small = args.small or not is_cuda
    if not is_cuda and args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    doc["suite"] = args.suite if stop is None else "soak"
    doc["config"] = {
        "suite": args.suite,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "iters": args.iters,
        "budget_seconds": args.budget_seconds,
        "probe_when": args.probe_when,
        "busy_utilization": args.busy_utilization,
        "small": small,
        "dtypes": args.dtype,
        "warmup_ms": args.warmup_ms,
        "spinup_ms": args.spinup_ms,
        "kind_weights": args.kind_weights,
        "order": args.order,
        "budget_fraction": args.budget_fraction,
        "min_iters": args.min_iters,
        "min_batch_ms": args.min_batch_ms,
        "graphs": args.graphs,
        "max_iters": args.max_iters,
        "launch_us": args.launch_us,
        "max_prequeue_ms": args.max_prequeue_ms,
        "transfers": args.transfers,
        "transfer_small_copies": args.transfer_small_copies,
        "transfer_large_copies": args.transfer_large_copies,
        "soak_seconds": args.soak_seconds,
        "window_seconds": args.window_seconds,
    }
    cuda_index = 0
    if is_cuda:
        try:
            cuda_index = torch.device(device).index or 0
        except Exception as exc:
            raise UsageError(f"bad --device {device!r}: {exc}") from exc
        if not torch.cuda.is_available() or cuda_index >= torch.cuda.device_count():
            doc["status"] = "unsupported"
            doc["reason"] = (
                f"{device} is not available to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda}, devices: "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})"
            )
            return

    nvml = Nvml.open(cuda_index) if is_cuda else None
    busy = BusyState(nvml, set(args.exclude_pid) | {os.getpid()}, args.busy_utilization)
    busy.self_pids.add(os.getpid())
    doc["busy"]["nvml"] = nvml is not None
    try:
        why = busy.check_before_context()
        doc["busy"]["other_pids"] = busy.other_pids
        doc["busy"]["utilization"] = busy.utilization
        doc["software"] = software_identity(torch, None, device, nvml)
        if why and args.probe_when == "idle":
            doc["status"], doc["reason"] = "skipped_busy", why
            return

        torch.manual_seed(args.seed)
        capability: tuple[int, int] | None = None
        sm_count, l2, clock_hz = 0, ASSUMED_L2_BYTES, SLEEP_CLOCK_HZ
        if is_cuda:
            before = (nvml.compute_pids() if nvml else None) or set()
            torch.cuda.set_device(cuda_index)
            torch.zeros(1, device=device)  # creates the context
            props = torch.cuda.get_device_properties(cuda_index)
            capability = (int(props.major), int(props.minor))
            sm_count = int(props.multi_processor_count)
            l2 = int(getattr(props, "L2_cache_size", 0) or ASSUMED_L2_BYTES)
            clock_hz = max_sm_clock_hz(props, nvml)
            if nvml is not None:
                uuid = getattr(props, "uuid", None)
                want = None if uuid is None else _bare_uuid(str(uuid))
                have = _bare_uuid(nvml.uuid() or "")
                if want and have and want != have:
                    log(f"NVML device {have} is not {want}; rebinding by UUID")
                    nvml.rebind("GPU-" + want)
                    before = set()
                busy.adopt_own_context(before)
        info = DeviceInfo(
            torch=torch,
            device=device,
            is_cuda=is_cuda,
            capability=capability,
            sm_count=sm_count,
            l2_bytes=l2,
            torch_version=torch_version_tuple(str(torch.__version__)),
            max_clock_hz=clock_hz,
        )
        if args.storage_read is not None:
            run_storage_read(info, args, nvml, doc)
            return
        if stop is not None:
            run_soak(info, args, nvml, doc, small, stop)
            doc["software"] = software_identity(torch, info, device, nvml)
            return
        run_suite(info, args, nvml, busy, doc, small)
    finally:
        if nvml is not None:
            nvml.shutdown()


def watch_parent(period: float = 0.5) -> threading.Thread:
    """End this worker (SIGTERM to itself) once the process that started it is gone.

    The runner starts a worker in its own session and kills its process group at the timeout;
    should the process that started it die first (sparkdiag killed with SIGKILL), nothing would
    enforce the timeout any more. A soak then stops as on Ctrl-C (the GPU left idle); any
    other run ends at once. Two signs (the first seen at once, the second every ``period``):

    * the reader of standard output is gone: the runner reads the document through a pipe
      that only it holds, and a pipe whose reader has closed polls as an error however early
      that happened, before this runs too. (A starter killed while the worker's interpreter
      was still starting left it reading PID 1 as its parent: it never noticed, and soaked on.)
    * the parent changed, for a starter that reads no pipe: the parent is read here, once the
      worker runs, so a starter that died before is not seen. Parentless from the start
      (PID 1's child), it is not watched.

    The line saying so is written before the signal, and a failure to write it is ignored:
    standard error is the dead starter's pipe too (its BrokenPipeError once ended this watch
    before the signal, and the worker went on).
    """
    parent = os.getppid()
    output = _output_pipe()
    poller = select.poll()  # with nothing registered, its poll sleeps the period
    if output is not None:
        poller.register(output, 0)  # POLLERR and POLLHUP are reported unasked

    def gone() -> str | None:
        for fd, events in poller.poll(period * 1000):
            if events & (select.POLLERR | select.POLLHUP):
                return "the reader of its output is gone"
            if events & select.POLLNVAL:  # not ours any more: not watched
                poller.unregister(fd)
        if parent > 1 and os.getppid() != parent:
            return f"parent {parent} is gone"
        return None

    def loop() -> None:
        while output is not None or parent > 1:
            why = gone()
            if why is not None:
                with contextlib.suppress(OSError):
                    log(f"{why}: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=loop, name="parent-watch", daemon=True)
    thread.start()
    return thread


def _output_pipe() -> int | None:
    """A descriptor of standard output of its own (main() moves descriptor 1), where that is
    a pipe or a socket, whose reader can go; None where it is not (a file, a terminal)."""
    try:
        fd = os.dup(1)
    except OSError:  # closed
        return None
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return fd
    os.close(fd)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    started = _now()
    watch_parent()
    # Keep stdout for the one JSON document: anything else that writes to
    # file descriptor 1 (torch, CUDA libraries, print) lands on stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    doc = empty_document(started)
    code = 0
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        doc["status"] = "ok"
        run(args, doc)
    except UsageError as exc:
        doc["status"], doc["reason"], code = "error", f"usage: {exc}", 2
    except TorchUnavailable as exc:
        doc["status"], doc["reason"], code = "error", str(exc), 1
    except Exception:
        doc["status"] = "error"
        doc["reason"] = "worker crashed: " + _truncate(traceback.format_exc(), 8000)
        code = 1
    doc["finished_at"] = _now()
    text = json.dumps(jsonable(doc), allow_nan=False, sort_keys=False) + "\n"
    data = text.encode("utf-8")
    while data:
        written = os.write(out_fd, data)
        data = data[written:]
    os.close(out_fd)
    return code
