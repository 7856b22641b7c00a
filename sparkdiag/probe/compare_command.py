"""``sparkdiag compare``: the same probe natively and in a container, and the gap between them.

The click command object :data:`compare` is registered on the main group in ``cli.py``. It can
also be run on its own: ``python -m sparkdiag.probe.compare_command --help``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import click

from sparkdiag.probe import compare as cmp
from sparkdiag.probe.worker import ALL_DTYPES, UsageError, parse_shape


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


def _dtypes(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[str]:
    out: list[str] = []
    for item in values:
        for name in item.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name == "all":
                out.extend(d for d in ALL_DTYPES if d not in out)
            elif name in ALL_DTYPES:
                if name not in out:
                    out.append(name)
            else:
                raise click.BadParameter(f"unknown dtype {name!r} (known: {', '.join(ALL_DTYPES)})")
    return out


def _shapes(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[str]:
    out = []
    for value in values:
        try:
            m, n, k = parse_shape(value)
        except UsageError as exc:
            raise click.BadParameter(str(exc)) from None
        out.append(f"{m}x{n}x{k}")
    return out


def _device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    if value == "cpu" or value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise click.BadParameter(f"{value!r}: expected cpu, cuda or cuda:N")


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
            raise click.UsageError(f"cannot split the container command: {exc}") from None
    if not words or words == ["-"]:
        raise click.UsageError(
            "give the container command after --container (or after --), for example:\n"
            "  sparkdiag compare --container docker run -i --rm --gpus all IMAGE python3 -"
        )
    return words


def worker_args(
    dtypes: Sequence[str],
    shapes: Sequence[str],
    small: bool,
    device: str | None,
    budget_seconds: float | None,
    iters: int | None,
    bandwidth: bool,
    probe_when: str,
) -> list[str]:
    """The worker's flags, the same for both sides."""
    args: list[str] = []
    for dtype in dtypes:
        args += ["--dtype", dtype]
    for shape in shapes:
        args += ["--shape", shape]
    if small:
        args.append("--small")
    if device:
        args += ["--device", device]
    if budget_seconds is not None:
        args += ["--budget-seconds", f"{budget_seconds:g}"]
    if iters is not None:
        args += ["--iters", str(iters)]
    if not bandwidth:
        args.append("--no-bandwidth")
    args += ["--probe-when", probe_when]
    return args


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143), so the running side's process group is killed with us."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


EPILOG = """\b
Exit status:
  0  every kernel measured on both sides is within --max-gap
  1  the worst gap exceeds --max-gap (the container is slower)
  2  usage error
  3  a side failed to run (runtime or image missing, no GPU or no torch inside,
     hang, output that is not the worker's JSON), or nothing was measured on both
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
    default=cmp.DEFAULT_ROUNDS,
    show_default=True,
    help="Measured rounds; each is one native and one container cycle.",
)
@click.option(
    "--warmup-rounds",
    type=click.IntRange(min=0),
    default=cmp.DEFAULT_WARMUP_ROUNDS,
    show_default=True,
    help="Unmeasured rounds first (a cold GPU runs fast for its first seconds).",
)
@click.option(
    "--max-gap",
    callback=_fraction,
    metavar="FRACTION",
    default="0.15",
    show_default=True,
    help="Largest acceptable gap, as a fraction (0.15) or a percentage (15%).",
)
@click.option(
    "--dtype",
    "dtypes",
    multiple=True,
    callback=_dtypes,
    help=f"Dtype(s) to probe, repeatable or comma separated: {','.join(ALL_DTYPES)} "
    "[default: all].",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_shapes,
    help="MxNxK instead of the built-in shapes, repeatable.",
)
@click.option("--small", is_flag=True, help="Tiny shapes (CPU, smoke tests).")
@click.option(
    "--device",
    callback=_device,
    default=None,
    help="cuda:N or cpu on both sides [default: native's choice, cuda:0 when there is a GPU].",
)
@click.option(
    "--budget-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="GPU-busy time per cycle [worker default: 2].",
)
@click.option(
    "--iters",
    type=click.IntRange(min=1),
    default=None,
    help="Timed iterations per kernel [default: sized to the budget].",
)
@click.option(
    "--bandwidth/--no-bandwidth",
    default=True,
    show_default=True,
    help="Also compare device memory copy bandwidth.",
)
@click.option(
    "--probe-when",
    type=click.Choice(["idle", "always"]),
    default="idle",
    show_default=True,
    help="'idle' stops when another process uses the GPU.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=cmp.DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds per cycle; then the side's whole process group is killed.",
)
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
    probe_when: str,
    timeout: float,
    native_python: str | None,
    as_json: bool,
    cmd: tuple[str, ...],
) -> None:
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
    Podman:    ... --container podman run -i --rm --device nvidia.com/gpu=all IMAGE python3 -
    Apptainer: ... --container apptainer exec --nv pytorch.sif python3 -
    Enroot:    ... --container enroot start pytorch python3 -
    """
    words = container_argv(cmd)
    native = shlex.split(native_python) if native_python else [sys.executable]
    if not native:
        raise click.UsageError("--native-python is empty")
    args = worker_args(dtypes, shapes, small, device, budget_seconds, iters, bandwidth, probe_when)

    def progress(message: str) -> None:
        click.echo(f"sparkdiag compare: {message}", err=True)

    try:
        with _sigterm_as_exit():
            result = cmp.compare(
                words,
                native=native,
                rounds=rounds,
                worker_args=args,
                timeout=timeout,
                on_progress=progress,
                warmup_rounds=warmup_rounds,
            )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("sparkdiag compare: interrupted; the cycle in progress was stopped", err=True)
        sys.exit(130)

    code = result.exit_code(max_gap)
    if as_json:
        click.echo(json.dumps(result.to_dict(max_gap), indent=2, allow_nan=False))
    elif result.failed:
        click.echo(render_failure(result), err=True)
    else:
        click.echo(render(result, max_gap))
    sys.exit(code)


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(c).rjust(widths[i]) if i in right else str(c).ljust(widths[i])
            for i, c in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def render(result: cmp.Comparison, max_gap: float) -> str:
    """The human report: figures, software identities, conditions, worst gap and why."""
    out = [
        f"sparkdiag compare: {result.rounds} measured round(s) after {result.warmup_rounds} "
        "warm-up round(s), native and container alternately",
        f"native:    {shlex.join(result.native.command)}",
        f"container: {shlex.join(result.container.command)} -",
        "",
    ]
    rows = []
    notes = []
    for row in result.rows:
        spread = (
            f"{row.ratio_min:.3f}-{row.ratio_max:.3f}"
            if row.ratio_min is not None and row.ratio_max is not None
            else "n/a"
        )
        verdict = row.verdict(max_gap)
        if verdict == "slower":
            verdict = "SLOWER"
        if row.noisy(max_gap):
            verdict += " (noisy)"
        kind = row.kind + (f" beta={row.beta}" if row.beta else "")
        rows.append(
            [
                row.dtype,
                row.shape,
                kind,
                row.unit,
                _num(row.native_median),
                _num(row.container_median),
                "n/a" if row.ratio is None else f"{row.ratio:.3f}",
                spread,
                _pct(row.gap),
                verdict,
            ]
        )
        note = row.note()
        if note:
            notes.append(f"  {row.key}: {note}")
    header = ["dtype", "shape", "kind", "unit", "native", "container", "ratio", "spread", "gap"]
    out += _table([*header, "verdict"], rows, right={4, 5, 6, 8})
    if notes:
        out += ["", "notes:", *notes]

    differing = {d.component for d in result.differences}
    ident_rows = []
    for key in cmp.IDENTITY_KEYS:
        a, b = result.native.software.get(key), result.container.software.get(key)
        ident_rows.append([key, _shown(a), _shown(b), "*" if key in differing else ""])
    out += [""]
    out += _table(["software", "native", "container", ""], ident_rows, right=set())
    if differing:
        libs = [d.component for d in result.library_differences]
        line = "differ (*): " + ", ".join(d.component for d in result.differences)
        if libs:
            line += f"; different libraries ({', '.join(libs)}) can explain a gap by themselves"
        out.append(line)
    else:
        out.append("same software on both sides: a gap comes from the environment")

    n_cond, c_cond = result.native.conditions, result.container.conditions
    if any(v is not None for v in (*n_cond.values(), *c_cond.values())):

        def clock(value: Any) -> str:
            return "-" if value is None else f"{float(value) / 1e6:.0f} MHz"

        def temp(value: Any) -> str:
            return "-" if value is None else f"{float(value):.0f} °C"

        cond_rows = [
            [
                "max GPU temperature",
                temp(n_cond.get("max_gpu_temperature_celsius")),
                temp(c_cond.get("max_gpu_temperature_celsius")),
            ],
            [
                "mean SM clock",
                clock(n_cond.get("mean_sm_clock_hertz")),
                clock(c_cond.get("mean_sm_clock_hertz")),
            ],
            [
                "clock event reasons",
                _shown(n_cond.get("clock_event_reasons")),
                _shown(c_cond.get("clock_event_reasons")),
            ],
        ]
        out += [""]
        out += _table(["conditions", "native", "container"], cond_rows, right=set())

    out.append("")
    worst = result.worst_row
    verdict = result.verdict(max_gap)
    if worst is None:
        out.append("worst gap: n/a (no kernel measured on both sides)")
    elif verdict == "gap":
        out.append(
            f"worst gap: {_pct(result.worst_gap)} ({worst.key}) exceeds --max-gap "
            f"{max_gap * 100:g} %: the container is SLOWER"
        )
    else:
        out.append(
            f"worst gap: {_pct(result.worst_gap)} ({worst.key}) within --max-gap "
            f"{max_gap * 100:g} %: OK"
        )
    out.append(f"why: {result.diagnosis(max_gap)}")
    return "\n".join(out)


def render_failure(result: cmp.Comparison) -> str:
    """What failed, where, why, and what to do; the last lines of that side's stderr."""
    out = []
    for failure in result.failures:
        out.append(
            f"sparkdiag compare: the {failure.side} side failed ({failure.label}): "
            f"{failure.message}"
        )
        command = result.container.command if failure.side == "container" else None
        command = command or result.native.command
        suffix = " -" if failure.side == "container" else ""
        out.append(f"  command: {shlex.join(command)}{suffix}")
        if failure.detail:
            out.append(f"  runner: {failure.detail}")
        tail = [line for line in failure.stderr_tail.splitlines() if line.strip()][-8:]
        if tail:
            out.append("  last lines of its standard error:")
            out += [f"    | {line[:200]}" for line in tail]
    out.append("exit status 3: no comparison was made")
    return "\n".join(out)


if __name__ == "__main__":
    compare()
