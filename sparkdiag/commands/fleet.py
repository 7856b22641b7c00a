"""``sparkdiag fleet``: every GPU a Prometheus scrapes, ranked by its ratio to its peers.

Asks the Prometheus through its HTTP API only (sparkdiag/peers/fleet.py says what it reads);
keeps nothing of its own. Registered in :mod:`sparkdiag.cli`.
"""

from __future__ import annotations

import json
from typing import Any

import click

from sparkdiag.errors import Exit
from sparkdiag.flags import settings_from, settings_options
from sparkdiag.peers.compare import FAIL_BELOW, MIN_FLEET_GROUP, WARN_BELOW
from sparkdiag.peers.fleet import FleetView, GpuRow, fleet_view
from sparkdiag.peers.promapi import PrometheusClient, connection

STATUS = {"outlier": "OUTLIER", "warn": "warn", "ok": "ok", "too_small": "not judged"}


def _tf(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def _row(row: GpuRow) -> str:
    score = "-" if row.score is None else f"{row.score:+.1f}"
    kernel = f"{row.dtype} {row.shape}"
    return (
        f"  {row.ratio:6.3f} {score:>6}  {STATUS[row.status]:<10} {row.instance:<24} "
        f"{row.gpu:>3}  {row.uuid:<40} {kernel:<20} {_tf(row.tflops):>6} {_tf(row.group_median):>6}"
        f" {row.group_gpus:>4}  {row.alert or '-'}"
    )


def render(view: FleetView) -> str:
    """The text report: groups, every GPU ranked, the outliers and what to do."""
    lines = [
        f"sparkdiag fleet: {view.prometheus} ({len(view.gpus)} GPU(s) in {len(view.groups)} "
        f"peer group(s); {len(view.outliers)} outlier(s), {len(view.warnings)} warning(s))",
    ]
    if view.source == "computed":
        lines.append(
            "  (sparkdiag's recording rules are not loaded there: computed from the raw series "
            "with the same expressions; load prometheus/sparkdiag-rules.yml for the alert)"
        )
    lines += ["", "Peer groups (model, probe software, context):"]
    for group in view.groups:
        judged = "" if group.judged else f"  too small to judge (fewer than {MIN_FLEET_GROUP})"
        lines.append(
            f"  {group.model}  torch {group.torch or '?'}  CUDA {group.cuda or '?'}  driver "
            f"{group.driver or '?'}  {group.context}: {group.gpus} GPU(s){judged}"
        )
    lines += [
        "",
        "GPUs, slowest first (each GPU's worst compute-bound kernel: its hour median over its "
        f"group's median; outlier at or below {FAIL_BELOW}, warning at or below {WARN_BELOW}):",
        f"  {'ratio':>6} {'score':>6}  {'status':<10} {'instance':<24} {'gpu':>3}  {'uuid':<40} "
        f"{'kernel':<20} {'TFLOPS':>6} {'group':>6} {'GPUs':>4}  alert",
    ]
    lines += [_row(row) for row in view.gpus]
    lines += ["", "Outliers:"]
    lines += [
        f"  {r.instance} GPU {r.gpu} ({r.uuid}): {1 - r.ratio:.1%} below its {r.group_gpus} "
        f"peers at {r.dtype} {r.shape} ({r.kernels_below} of {r.kernels} kernels 7 % or more "
        f"below){'; ' + 'SparkdiagGpuSlowerThanPeers ' + r.alert if r.alert else ''}"
        for r in view.outliers
    ] or ["  none"]
    lines += ["", "What to do:"]
    lines += [f"  - {action}" for action in view.actions]
    return "\n".join(lines) + "\n"


@click.command("fleet")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@settings_options("fleet", config_file=True)
@click.pass_context
def fleet(ctx: click.Context, /, as_json: bool, config: Any, **given: Any) -> None:
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
      1  an outlier or a warning
      2  a bad flag or file
      3  Prometheus unreachable, refusing the query, or holding no sparkdiag series
    """
    settings = settings_from("fleet", given, config)
    conn = connection(
        settings.prometheus_url,
        settings.prometheus_timeout,
        http_config=settings.http_config_file,
        ca_file=settings.prometheus_ca_file,
        cert_file=settings.prometheus_cert_file,
        key_file=settings.prometheus_key_file,
        insecure_skip_verify=settings.prometheus_insecure_skip_verify or None,
        username=settings.prometheus_username,
        password_file=settings.prometheus_password_file,
    )
    view = fleet_view(PrometheusClient(conn))
    if as_json:
        click.echo(json.dumps(view.as_json(), indent=1))
    else:
        click.echo(render(view), nl=False)
    ctx.exit(Exit.ATTENTION if view.outliers or view.warnings else Exit.OK)
