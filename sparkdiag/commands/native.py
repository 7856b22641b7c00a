"""``sparkdiag native``: does the installed CUDA software run natively on this machine's GPUs?

A command of its own rather than a ``check`` option: its first run on an environment with
torch, its nvidia-* wheels and vLLM reads the headers of gigabytes of libraries (later runs
use the cache), it takes an environment to look at (``--python``: an interpreter, a venv, a
site-packages or an unpacked image) and a GPU that need not be here (``--capability``), and it
lists every library. ``check`` has the same verdicts as its ``native-code`` row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.errors import Exit, UsageError
from sparkdiag.flags import path_option, settings_from, settings_options
from sparkdiag.native.compat import parse_capability
from sparkdiag.native.lint import Gpu, lint
from sparkdiag.native.render import NativeReport, text
from sparkdiag.native.watch import cache_path, environment
from sparkdiag.sources.software.cuda_libraries import ScanCache, scan
from sparkdiag.sources.software.pyenv import (
    NotAnEnvironment,
    PythonEnvironment,
    resolve,
    torch_build,
)
from sparkdiag.statedir import StateDirError, ensure_state_directory
from sparkdiag.telemetry.build import build_poller

EXIT = {"pass": Exit.OK, "warn": Exit.ATTENTION, "fail": Exit.FAILED, "not-judged": Exit.ATTENTION}


def _capabilities(values: tuple[str, ...]) -> list[Gpu]:
    gpus = []
    for value in values:
        capability = parse_capability(value)
        if capability is None:
            raise UsageError(
                f"--capability {value!r}: expected MAJOR.MINOR, e.g. 12.1", flag="--capability"
            )
        gpus.append(Gpu("", "", f"compute capability {value.strip()}", capability))
    return gpus


def _machine_gpus(settings: Any) -> list[Gpu]:
    poller = build_poller(settings)
    try:
        snap = poller.poll_once()
    finally:
        poller.gpu.stop()
    gpus = []
    for sample in snap.gpus:
        capability = parse_capability(sample.identity.cuda_capability)
        if sample.up and capability is not None:
            identity = sample.identity
            gpus.append(Gpu(str(identity.index), identity.uuid, identity.name, capability))
    return gpus


@click.command("native")
@path_option(
    "--python",
    "python",
    metavar="PATH",
    help="The environment to look at: an interpreter, a virtual environment, a site-packages "
    "directory or an unpacked root (a container image's). Default: the probe worker's "
    "interpreter (--probe.python), or the Pythons under --path.rootfs when it is not /.",
)
@click.option(
    "--capability",
    multiple=True,
    metavar="X.Y",
    help="Judge for a GPU of this compute capability (12.1 for GB10, 9.0 for H100/H200) "
    "instead of the GPUs here; NVML is not asked. Repeatable.",
)
@click.option("--all", "show_all", is_flag=True, help="List every library, native ones too.")
@click.option(
    "--no-torch",
    is_flag=True,
    help="Do not import torch (in a subprocess) to read torch.cuda.get_arch_list().",
)
@click.option("--no-cache", is_flag=True, help="Read every library again (no scan cache).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@settings_options("native")
def native(
    python: Path | None,
    capability: tuple[str, ...],
    show_all: bool,
    no_torch: bool,
    no_cache: bool,
    as_json: bool,
    **given: Any,
) -> Exit:
    """Whether every shared library with GPU code in the probe worker's Python runs natively
    on each GPU: SASS for the GPU (native), only PTX the driver compiles at the first start
    (ptx-jit), or nothing it can load (none); arch-specific targets (sm_90a, sm_121a) told
    from family (sm_120f) and plain ones. Read from each library's embedded fat binaries
    (what 'cuobjdump --list-elf --list-ptx' lists), without the CUDA toolkit; each library is
    named with the package that ships it and what to install instead. Also torch's
    get_arch_list() against each GPU. See docs/native.md.

    Without --capability and without a GPU here (a build machine preparing an image), it
    lists every library with GPU code and its targets, judges none, and says how to judge:
    --capability 9.0 for an H100/H200, 12.1 for a DGX Spark (GB10).

    \b
    Exit status:
      0  every library runs natively
      1  a library runs only through PTX JIT, or lacks the arch-specific
         code for this GPU that it builds for others; a library or folder
         could not be read (it is named); or nothing was judged: no GPU here
         and no --capability (the libraries are listed), or the environment
         has no package directory (nothing was looked at)
      2  bad flag, or --python is not a Python environment
      3  a library has no code this GPU can load
    """
    settings = settings_from("native", given)
    gpus = _capabilities(capability) if capability else _machine_gpus(settings)
    try:
        env: PythonEnvironment = (
            resolve(python)
            if python is not None
            else environment(settings.rootfs, settings.probe_python)
        )
    except NotAnEnvironment as exc:  # named by --python, or else by --probe.python
        raise UsageError(
            str(exc), flag="--python" if python is not None else "--probe.python"
        ) from None
    cached = None if no_cache else cache_path(settings.state_dir)
    if cached is not None:
        try:  # the cache spares the next run the reads; without a state directory, no cache
            ensure_state_directory(cached.parent)
        except StateDirError:
            cached = None
    cache = ScanCache(cached)
    found = scan(env, cache)
    build, note = None, "--no-torch"
    if not no_torch and env.python is not None:
        answer = torch_build(env.python)
        build, note = (answer, "") if not isinstance(answer, str) else (None, answer)
    elif env.python is None:
        note = "no interpreter to ask (a package directory or a root)"
    report = NativeReport(found, tuple(gpus), tuple(lint(found, gpus)), build, note)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        click.echo(text(report, terminal.width(), show_all), nl=False)
    return EXIT[report.status]
