"""The ConnectX-7 rows: ``cx7-config`` (the lint of :mod:`sparkdiag.link.lint`, one row per
finding, on any machine with a ConnectX-7) and ``link-peer`` (a short ``sparkdiag link test``
against ``--peer``, which runs ``sparkdiag link serve``)."""

from __future__ import annotations

from sparkdiag.check.model import CheckContext, CheckResult, Status
from sparkdiag.link.lint import lint


def check_cx7_config(ctx: CheckContext) -> list[CheckResult]:
    """The ConnectX-7 setup, as ``sparkdiag link lint`` reads it: MTU, NCCL_IB_HCA and
    NCCL_SOCKET_IFNAME, CmaTotal and the NCCL libraries; each finding warns with its fix, no
    ConnectX-7 skips."""
    name = "cx7-config"
    readings = ctx.fabric
    if readings is None:
        return [CheckResult(name, "skip", "the network interfaces could not be read")]
    if not readings.functions:
        return [CheckResult(name, "skip", "no ConnectX-7 (PCI 15b3:1021) on this machine")]
    findings = lint(readings)
    if not findings:
        cabled = [i.name for f in readings.functions for i in f.interfaces if i.up]
        mtus = sorted({i.mtu for f in readings.functions for i in f.interfaces if i.up and i.mtu})
        return [
            CheckResult(
                name,
                "pass",
                f"{len(readings.functions)} ConnectX-7 functions, {len(cabled)} with a carrier"
                + (f" (MTU {', '.join(map(str, mtus))})" if mtus else "")
                + f"; NCCL settings and {len(readings.libraries)} NCCL library(ies) consistent",
                data=readings.as_json(),
            )
        ]
    return [
        CheckResult(
            name,
            "warn",
            finding.finding,
            f"{finding.fix} (why: {finding.figure})",
            data=finding.as_json(),
        )
        for finding in findings
    ]


def check_link_peer(ctx: CheckContext) -> list[CheckResult]:
    """A short ``sparkdiag link test`` to ``--peer`` (not with ``--quick``): each path fit
    passes, degraded or unrated warns, failed or unreachable fails."""
    name = "link-peer"
    if ctx.peer_error is not None:
        return [
            CheckResult(
                name,
                "fail",
                ctx.peer_error,
                "start 'sparkdiag link serve' on the peer, then run check --peer again",
            )
        ]
    report = ctx.peer_link
    if report is None:
        why = "--quick: the link test is not run" if ctx.quick else "no --peer given"
        return [CheckResult(name, "skip", f"not measured: {why}")]
    status: dict[str, Status] = {
        "fit": "pass",
        "unrated": "warn",
        "degraded": "warn",
        "failed": "fail",
    }
    results = []
    for path in report.paths:
        where = f"{path.local.interface or path.local.address} -> {path.peer.address or '?'}"
        action = path.action
        if path.cause:
            action = f"likely cause: {path.cause}; {action}"
        if path.verdict != "fit":
            action += "; 'sparkdiag link test' measures longer and with iperf3/ib_write_bw"
        results.append(
            CheckResult(
                name,
                status[path.verdict],
                f"{where}: {path.finding}",
                action.strip("; "),
                data=path.as_json(),
            )
        )
    return results
