"""``sparkdiag fleet``: every GPU a Prometheus scrapes, ranked by its ratio to its peers.

Asks the Prometheus through its HTTP API only (sparkdiag/peers/fleet.py says what it reads);
keeps nothing of its own. Registered in :mod:`sparkdiag.cli`.
"""

from __future__ import annotations

import json
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.errors import Exit, SparkdiagError
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.peers.fleet import FleetView, GpuRow, fleet_view
from sparkdiag.peers.httpget import shown_url
from sparkdiag.peers.promapi import PrometheusClient, connection
from sparkdiag.peers.ranking import FAIL_BELOW, MIN_FLEET_GROUP, WARN_BELOW

STATUS = {
    "outlier": "OUTLIER",
    "warn": "warn",
    "ok": "ok",
    "too_small": "not judged",
    "bad_data": "BAD DATA",
}
FORMAT = "sparkdiag-fleet/1"


def _tf(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


HEADER = (
    "ratio",
    "score",
    "status",
    "instance",
    "gpu",
    "kernel",
    "TFLOPS",
    "group",
    "GPUs",
    "alert",
)


def _row(row: GpuRow) -> list[str]:
    """The row of one GPU (its uuid goes on a line under it)."""
    score = "-" if row.score is None else f"{row.score:+.1f}"
    ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
    return [
        ratio,
        score,
        STATUS[row.status],
        row.instance,
        row.gpu,
        f"{row.dtype} {row.shape}",
        _tf(row.tflops),
        _tf(row.group_median),
        str(row.group_gpus),
        row.alert or "-",
    ]


def render(view: FleetView, width: int | None = None) -> str:
    """The text report within ``width`` columns (the terminal's by default): groups, every GPU
    ranked, the outliers and what to do."""
    width = terminal.width() if width is None else width

    def para(text: str, indent: str = "", hanging: str | None = None) -> list[str]:
        return terminal.wrap(text, width, indent, hanging)

    lines = para(
        f"sparkdiag fleet: {view.prometheus} ({len(view.gpus)} GPU(s) in {len(view.groups)} "
        f"peer group(s); {len(view.outliers)} outlier(s), {len(view.warnings)} warning(s)"
        + (f", {len(view.bad_data)} with bad data" if view.bad_data else "")
        + ")",
        "",
        "    ",
    )
    if view.source == "computed":
        lines += para(
            "(sparkdiag's recording rules are not loaded there: computed from the raw series "
            "with the same expressions; load prometheus/sparkdiag-rules.yml for the alert)",
            "  ",
        )
    # wrapped as every other line (found in a review: at 40 columns it ran past the edge)
    lines += ["", *para("Peer groups (model, probe software, context):")]
    for group in view.groups:
        judged = "" if group.judged else f"  too small to judge (fewer than {MIN_FLEET_GROUP})"
        lines += para(
            f"{group.model}  torch {group.torch or '?'}  CUDA {group.cuda or '?'}  driver "
            f"{group.driver or '?'}  {group.context}: {group.gpus} GPU(s){judged}",
            "  ",
            "      ",
        )
    lines.append("")
    lines += para(
        "GPUs, slowest first (each GPU's worst compute-bound kernel: its hour median over its "
        f"group's median; outlier at or below {FAIL_BELOW}, warning at or below {WARN_BELOW}):"
    )
    lines += terminal.table(
        HEADER,
        [_row(row) for row in view.gpus],
        width,
        right={0, 1, 4, 6, 7, 8},
        indent="  ",
        under=("uuid", [row.uuid for row in view.gpus]),
        key=3,
    )
    lines += ["", "Outliers:"]
    for r in view.outliers:
        lines += para(
            f"{r.instance} GPU {r.gpu} ({r.uuid}): {1 - (r.ratio or 0):.1%} below its "
            f"{r.group_gpus} "
            f"peers at {r.dtype} {r.shape} ({r.kernels_below} of {r.kernels} kernels 7 % or more "
            f"below){'; ' + 'SparkdiagGpuSlowerThanPeers ' + r.alert if r.alert else ''}",
            "  ",
            "    ",
        )
    if not view.outliers:
        lines.append("  none")
    lines += ["", "What to do:"]
    for action in view.actions:
        lines += para(action, "  - ")
    return "\n".join(lines) + "\n"


@click.command("fleet")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document instead (on a failure too: its error and exit status).",
)
@settings_options("fleet", config_file=True)
def fleet(as_json: bool, config: Any, **given: Any) -> Exit:
    """Rank every GPU that a Prometheus scrapes by its throughput against its peers.

    Peers: the GPUs of one model, probe software (torch, CUDA, driver) and context. Reads the
    recording rules of prometheus/sparkdiag-rules.yml (or, where that Prometheus does not load
    them, sends the same expressions) through the HTTP API, and prints the peer groups, every
    GPU ranked by the ratio of its worst compute-bound kernel to its group's median, the
    outliers (7 % below in a group of at least 4 GPUs) with their instance and uuid, and what to
    do. TLS and basic auth as promtool takes them.

    \b
    Exit status:
      0  no GPU 3.5 % or more below its peers (or no group large enough to judge)
      1  an outlier or a warning, or bad data (a ratio that Prometheus holds as
         NaN, infinite, 0 or below; a group size that is no count of GPUs)
      2  a bad flag or file
      3  Prometheus unreachable, refusing the query, or holding no sparkdiag
         series
    """
    url = given.get("prometheus_url")
    try:
        settings = settings_from("fleet", given, config)
        url = settings.prometheus_url
        conn = connection(
            settings.prometheus_url,
            settings.prometheus_timeout,
            http_config=settings.http_config_file,
            ca_file=settings.prometheus_ca_file,
            cert_file=settings.prometheus_cert_file,
            key_file=settings.prometheus_key_file,
            insecure_skip_verify=settings.prometheus_insecure_skip_verify,
            username=settings.prometheus_username,
            password_file=settings.prometheus_password_file,
            # a password, token or HTTP config file that others may read: one line each
            say=lambda line: click.echo(terminal.safe(line), err=True),
        )
        view = fleet_view(PrometheusClient(conn))
    except SparkdiagError as exc:
        if as_json:  # a document on standard output whatever happened; the line on stderr too
            failed = {
                "format": FORMAT,
                # never a user or password: everything from '//' to the last '@' goes
                "prometheus": shown_url(url) if url else url,
                "error": exc.line(),
                "exit_status": int(exc.exit_code),
            }
            click.echo(json.dumps(failed, indent=1))
        raise
    bad = view.bad_data or view.bad_groups  # a bad group size hid its outliers: never "ok"
    status = Exit.ATTENTION if view.outliers or view.warnings or bad else Exit.OK
    if as_json:
        doc = {"format": FORMAT, **view.as_json(), "exit_status": int(status)}
        click.echo(json.dumps(doc, indent=1, allow_nan=False))  # NaN is no JSON: never written
    else:
        click.echo(render(view), nl=False)
    return status
