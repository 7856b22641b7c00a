"""``sparkdiag link test PEER``: the measuring side.

1. A control connection to PEER (the name or address given, and nothing else), on which both
   sides prove they hold the link secret (:mod:`sparkdiag.link.auth`), and its hello: the
   peer's session token, its ConnectX-7 interfaces and addresses, its tools and its lint.
2. The paths: each ConnectX-7 interface of this machine that has a carrier, paired with the
   peer's address on the same network (the interface of the same name first: two Sparks name
   theirs alike); ``--interface`` picks interfaces; where this machine has no ConnectX-7, or with
   ``--address-only``, the one path is the route to PEER itself. Traffic only ever goes to PEER
   or to an address the peer reported for itself on a network of this machine's interface, and
   bulk data to the latter only after it answered a ping with the session's token: the same
   ``link serve`` process.
3. Per path: the latency (TCP round trips), the throughput in each direction over N parallel
   TCP streams (stdlib sockets, counted by the receiver), then ``iperf3`` and ``ib_write_bw``
   where both machines have them; the verdict (:mod:`sparkdiag.link.verdict`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sparkdiag.jsonvalues import as_map, as_str
from sparkdiag.link import tools
from sparkdiag.link.lint import lint
from sparkdiag.link.measure import TCP, PathMeasure, ToolChoice
from sparkdiag.link.model import LinkReport, PathResult, Throughput
from sparkdiag.link.paths import Plan, plan_paths, select_interfaces
from sparkdiag.link.readings import read_fabric
from sparkdiag.link.session import Control, LinkError, Options, open_control
from sparkdiag.link.verdict import judge
from sparkdiag.link.wire import ProtocolError
from sparkdiag.sources.host.netif import interface_addresses

__all__ = ["LinkError", "Options", "measure_link"]


def measure_link(
    peer: str,
    options: Options,
    sysfs: Path,
    rootfs: Path,
    environ: Mapping[str, str],
    progress: Callable[[str], None] = lambda line: None,
) -> LinkReport:
    """Measure every path to ``peer`` (see the module). Raises UsageError (exit 2) for a peer
    name or interface that does not exist, LinkError (exit 3) when the peer cannot be
    measured at all."""
    started = time.monotonic()
    readings = read_fabric(sysfs, rootfs, environ)
    selection = select_interfaces(options, readings)
    control = open_control(peer, options.port, options.connect_timeout, options.secret)
    try:
        addresses = interface_addresses()
        plans = plan_paths(control, selection, readings, addresses, sysfs)
        if all(p.failed for p in plans):
            raise LinkError("; ".join(p.failed or "" for p in plans))
        chosen = ToolChoice(tools.installed(), as_map(control.hello.get("tools")))
        try:
            paths = [_measure(control, plan, options, chosen, started, progress) for plan in plans]
        except (OSError, TimeoutError, ProtocolError, ConnectionError) as exc:
            raise LinkError(
                f"{peer}: the session with its 'link serve' broke off during the test ({exc})"
            ) from None
        with contextlib.suppress(OSError, TimeoutError, ProtocolError, ConnectionError):
            control.ask({"op": "bye"}, timeout=5.0)
    finally:
        control.sock.close()
    peer_lint = control.hello.get("lint")
    return LinkReport(
        peer=peer,
        port=options.port,
        paths=tuple(paths),
        seconds=time.monotonic() - started,
        peer_host=as_str(control.hello.get("host")),
        peer_version=as_str(control.hello.get("version")),
        tools=chosen.status,
        lint_local=tuple(f.as_json() for f in lint(readings)),
        lint_peer=tuple(as_map(f) for f in peer_lint) if isinstance(peer_lint, list) else (),
        notes=tuple(f"{name}: no carrier, not measured" for name in selection.left_out),
    )


def _measure(
    control: Control,
    plan: Plan,
    options: Options,
    chosen: ToolChoice,
    started: float,
    progress: Callable[[str], None],
) -> PathResult:
    if plan.failed:
        return PathResult(plan.local, plan.peer, "failed", plan.failed)
    label = f"{plan.local.interface or plan.local.address} -> {plan.peer_address}"
    path = PathMeasure(control, plan, options)
    progress(f"{label}: latency")
    latency, failed = path.ping()
    if failed:
        return PathResult(plan.local, plan.peer, "failed", failed)
    measured: list[Throughput] = []
    notes: list[str] = []
    offered: list[tuple[str, Callable[[str], Throughput]]] = [
        (tools.IPERF3, path.iperf3),
        (tools.IB_WRITE_BW, path.ib_write_bw),
    ]
    methods = [(TCP, path.tcp), *((t, m) for t, m in offered if chosen.usable(t, plan, options))]
    for name, method in methods:
        for direction in options.directions:
            elapsed = time.monotonic() - started
            if options.budget is not None and elapsed + options.seconds > options.budget:
                notes.append(f"{name} {direction} not run: the {options.budget:g} s bound")
                continue
            progress(f"{label}: {name} {direction.replace('-', ' ')}, {options.seconds:g} s")
            measured.append(method(direction))
    peer_lint = control.hello.get("lint")
    verdict, finding, cause, action = judge(
        plan.local,
        plan.peer,
        measured,
        [as_map(f) for f in peer_lint] if isinstance(peer_lint, list) else [],
    )
    return PathResult(
        plan.local,
        plan.peer,
        verdict,
        finding,
        action,
        cause,
        latency,
        tuple(measured),
        tuple(notes),
    )
