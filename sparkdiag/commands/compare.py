"""``sparkdiag compare``: the same probe natively and in a container, and the gap between them.

The click command object :data:`compare` is registered on the main group in ``cli.py``.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.commands.common import worker_request
from sparkdiag.compare import model, report
from sparkdiag.compare.rounds import compare as run_comparison
from sparkdiag.errors import UsageError
from sparkdiag.flags import settings_from, settings_options, worker_option, worker_options


def _fraction(ctx: click.Context, param: click.Parameter, value: Any) -> float:
    """0.15, or 15%: a fraction in [0, 1)."""
    if isinstance(value, float):
        return value
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a fraction such as 0.15 or a percentage such as 15%"
        ) from None
    if not 0.0 <= number < 1.0:
        raise click.BadParameter(
            f"{value!r} must lie in [0, 1) (a fraction: 0.15, or a percentage: 15%)"
        )
    return number


def container_argv(cmd: Sequence[str]) -> list[str]:
    """CMD as given: an argument list, or one quoted string split like a shell would (shlex).

    Nothing is ever run through a shell: a single argument holding whitespace is split with
    :func:`shlex.split` into words, and every word is then one argument of the command.
    """
    words = list(cmd)
    if len(words) == 1 and any(ch.isspace() for ch in words[0]):
        try:
            words = shlex.split(words[0])
        except ValueError as exc:
            raise UsageError(f"cannot split the container command: {exc}") from None
    if not words or words == ["-"] or not words[0].strip():  # "" is no program either
        raise UsageError(
            # one line, as every error is (cli.py shows a newline in an error as \x0a)
            "give the container command after --container (or after --), for example: "
            "sparkdiag compare --container docker run -i --rm --gpus all IMAGE python3 -"
        )
    return words


EPILOG = """\b
Exit status:
  0    every kernel measured on both sides is within --max-gap
  1    the worst gap exceeds --max-gap (the container is slower)
  2    usage error
  3    a side failed to run (runtime or image missing, no GPU or no torch
       inside, hang, output that is not the worker's JSON), a kernel failed
       on a side, the sides ran on different GPUs, or nothing was measured
       on both
  130  interrupted (Ctrl-C, SIGTERM, SIGHUP): the rounds measured before are
       reported
"""


@click.command(
    "compare",
    context_settings={
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
    epilog=EPILOG,
)
@click.option(
    "--container",
    "container_flag",
    is_flag=True,
    help="Everything after this flag is CMD, the container command (so put the other options "
    "before it). '--' works the same way.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=model.DEFAULT_ROUNDS,
    show_default=True,
    help="Measured rounds; each is one native and one container cycle.",
)
@click.option(
    "--warmup-rounds",
    type=click.IntRange(min=0),
    default=model.DEFAULT_WARMUP_ROUNDS,
    show_default=True,
    help="Unmeasured rounds first (a cold GPU runs fast for its first seconds).",
)
@click.option(
    "--max-gap",
    callback=_fraction,
    metavar="FRACTION",
    default=str(model.DEFAULT_MAX_GAP),
    show_default=True,
    help="Largest acceptable gap, as a fraction (0.15) or a percentage (15%).",
)
@worker_options(
    "--dtype",
    "--small",
    "--shape",
    "--device",
    "--budget-seconds",
    "--iters",
    shown={
        "--device": "the device the native side chose (cuda:0, or cpu without CUDA), given to "
        "the container too"
    },
)
@worker_option("--bandwidth", True, help="Also compare device memory copy bandwidth.")
@settings_options("compare")
@click.option(
    "--native-python",
    default=None,
    help="Native interpreter with torch, one string split like a shell would (no shell runs it) "
    "[default: this Python].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (for scripts).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="--container CMD...")
def compare(
    container_flag: bool,
    rounds: int,
    warmup_rounds: int,
    max_gap: float,
    dtypes: list[str],
    shapes: list[str],
    small: bool,
    device: str | None,
    budget_seconds: float | None,
    iters: int | None,
    bandwidth: bool,
    native_python: str | None,
    as_json: bool,
    cmd: tuple[str, ...],
    **given: Any,
) -> int:
    """Run the same GEMM probe natively and in a container, and say how large the gap is.

    CMD starts a Python interpreter inside the container that reads its script from standard
    input. sparkdiag sends its self-contained probe worker there, so nothing has to be
    installed in the image besides PyTorch. Native and container cycles alternate (after one
    warm-up round: native, container, native, container, ...), so drift cancels. For every
    dtype and shape it prints both figures, the ratio container/native with its spread over
    the rounds, and the software identity of each side (torch, CUDA, cuBLAS, driver), so a
    slower library can be told from a slower environment.

    CMD is an argument list, never a shell string: write it after --container (or after --),
    as the last thing on the line. One quoted string is also accepted and split into words like
    a shell would (shlex), without running a shell. The trailing '-' (Python's "read the
    script from standard input") is optional. Keep -i (docker, podman: it passes standard input
    through) and leave out -t.

    \b
    NGC PyTorch container against a native install on a DGX Spark:
      sparkdiag compare --native-python ~/venv/bin/python --dtype bf16,fp8 \\
          --container docker run -i --rm --gpus all --ipc=host \\
          nvcr.io/nvidia/pytorch:25.09-py3 python3 -
    Podman:    ... --container podman run -i --rm \\
                   --device nvidia.com/gpu=all IMAGE python3 -
    Apptainer: ... --container apptainer exec --nv pytorch.sif python3 -
    Enroot:    ... --container enroot start pytorch python3 -
    """
    settings = settings_from("compare", given)
    words = container_argv(cmd)
    try:
        native = shlex.split(native_python) if native_python else [sys.executable]
    except ValueError as exc:
        raise UsageError(f"cannot split it: {exc}", flag="--native-python") from None
    if not native:
        raise UsageError("an empty command", flag="--native-python")
    request = worker_request(
        settings,
        device,
        dtypes,
        shapes,
        small,
        budget_seconds=budget_seconds,
        iters=iters,
        bandwidth=bandwidth,
    )

    def progress(message: str) -> None:
        # wrapped to standard error's width, later lines indented (found in a review: at 40
        # columns they ran past the edge)
        said = f"sparkdiag compare: {message}"
        click.echo(terminal.fill(said, terminal.width(sys.stderr), hanging="    "), err=True)

    # Ctrl-C or SIGTERM: the side running is killed with its process group on the way out, the
    # rounds measured before are reported, and the command exits INTERRUPTED
    result = run_comparison(
        words,
        native=native,
        rounds=rounds,
        request=request,
        timeout=settings.probe_timeout,
        on_progress=progress,
        warmup_rounds=warmup_rounds,
    )
    code = result.exit_code(max_gap)
    if as_json:
        click.echo(json.dumps(report.to_dict(result, max_gap), indent=2, allow_nan=False))
    elif result.failed:
        click.echo(report.render_failure(result, terminal.width(sys.stderr)), err=True)
    else:
        click.echo(report.render(result, max_gap))
    if result.interrupted:
        pairs = len(result.rows[0].native) if result.rows else 0
        progress(
            f"interrupted ({result.interrupted}) after {pairs} of {result.rounds} measured "
            "round(s); the figures are those rounds'"
        )
    return code
