"""``sparkdiag link``: two machines over ConnectX-7 (``serve``, ``test``, ``lint``); see
:mod:`sparkdiag.link` and docs/link.md."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import click

from sparkdiag import terminal
from sparkdiag.config import ConfigError, parse_listen
from sparkdiag.errors import Exit, UsageError
from sparkdiag.flags import FiniteRange, settings_from, settings_options
from sparkdiag.lifecycle import LIFECYCLE
from sparkdiag.link import auth
from sparkdiag.link.client import Options, measure_link
from sparkdiag.link.lint import lint as run_lint
from sparkdiag.link.model import DIRECTIONS
from sparkdiag.link.readings import CudaOnce, read_fabric
from sparkdiag.link.render import lint_text, report_text
from sparkdiag.link.server import LinkServer, link_addresses, listen_socket
from sparkdiag.link.session import peer_and_port
from sparkdiag.link.wire import MAX_SECONDS, MAX_STREAMS, PORT
from sparkdiag.sources.host.netif import interface_addresses


def _settings(given: dict[str, Any]) -> Any:
    return settings_from("link", given)


@click.group("link")
def link() -> None:
    """Two machines over ConnectX-7 (two DGX Sparks, or any pair): measure the link, lint the
    NCCL and RDMA setup.

    \b
      sparkdiag link serve      on one machine: the listening side (TCP port
                                10943 on its ConnectX-7 addresses); it makes
                                the link secret
      sparkdiag link test PEER  on the other, with the secret copied there:
                                measure every ConnectX-7 path to PEER
      sparkdiag link lint       this machine's MTU, NCCL_IB_HCA and
                                NCCL_SOCKET_IFNAME, CmaTotal and NCCL
                                libraries, each finding with its fix

    'sparkdiag check --peer PEER' runs a short 'link test' as one of its rows.

    Exit status (each subcommand's --help says more): 0 fit / no finding; 1 degraded / lint
    findings; 2 a usage error; 3 the link test failed (unreachable, refused, no carrier), or
    link serve cannot start (its port in use).
    """


def secret_path(settings: Any) -> Path:
    path: Path | None = settings.link_secret_file
    return auth.default_path() if path is None else path


def _say(line: str) -> None:
    """A line on standard error, its bytes escaped (a path is the user's, its bytes not ours)."""
    click.echo(terminal.safe(line), err=True)


def _listeners(
    listen: str | None, settings: Any, cuda: CudaOnce | None = None
) -> tuple[list[socket.socket], str]:
    """The listening sockets: where ``--listen`` says, else on every address of this machine's
    ConnectX-7 interfaces (UsageError when they have none); and where, in words. ``cuda``
    keeps the CUDA attributes read for them, for the server's sessions."""
    if listen is not None:
        try:
            host, port = parse_listen(listen, "--listen")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        return [listen_socket(host, port)], listen
    try:
        readings = read_fabric(settings.sysfs, settings.rootfs, dict(os.environ), cuda=cuda)
    except FileNotFoundError as exc:
        raise UsageError(str(exc), flag="--path.sysfs") from None
    found = link_addresses(readings, interface_addresses())
    if not found:
        cx7 = ", ".join(i.name for f in readings.functions for i in f.interfaces)
        why = (
            f"the ConnectX-7 interfaces ({cx7}) have no IP address to listen on: give the one "
            "of the link an address (netplan, or ip addr add ADDR/24 dev IF), or"
            if cx7
            else "this machine has no ConnectX-7 interface to listen on:"
        )
        raise UsageError(
            f"{why} give --listen ADDRESS:PORT, the address the peer reaches this machine at "
            f"(':{PORT}' listens on every address)",
            flag="--listen",
        )
    socks: list[socket.socket] = []
    try:
        for address in found:
            socks.append(listen_socket(address, PORT))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks, ", ".join(f"[{a}]:{PORT}" if ":" in a else f"{a}:{PORT}" for a in found)


@link.command("serve")
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help=f"Address and port to listen on (not given: port {PORT} on each address of this "
    "machine's ConnectX-7 interfaces); ':PORT' listens on every address.",
)
@click.option("--once", is_flag=True, help="Exit after one measuring session.")
@settings_options("link")
def serve(listen: str | None, once: bool, **given: Any) -> Exit:
    """The listening side of 'sparkdiag link test': answer one measuring machine at a time.

    Only a machine that holds the same link secret is answered: the file
    ~/.config/sparkdiag/link.secret (or --link.secret-file), which this command makes where
    none is; copy it to the measuring machine (scp, mode 0600). Before that proof nothing is
    measured or told. Rotating the secret needs no restart: write the new file on every
    machine (beside the old one, then mv it over); the file is looked at every second, and a
    changed one applies from the next session (a session under way goes on). A changed file
    that cannot be used (gone, a link to nothing, open to others, empty or too short) leaves
    the last good secret in use; that is said once, with the fix, and again when the file is
    usable.

    It listens on the addresses of this machine's ConnectX-7 interfaces
    (or --listen), counts what arrives, sends back on the connections that ask (at most 64
    streams for 60 s), and starts 'iperf3 -s' or 'ib_write_bw' for the measuring side when
    they are installed, within bounds on connections, tests, tools and time (docs/link.md).

    \b
    Exit status:
      0  stopped with Ctrl-C or SIGTERM between sessions, or --once done
      2  bad flag (a --listen host that does not exist too); no ConnectX-7
         address and no --listen; a secret file that its group or others
         can read or write, or that another user owns, or a link to nothing
         (a refused start makes no secret file)
      3  cannot start: the port cannot be had (in use, or not allowed)
      130 stopped during a session
    """
    settings = _settings(given)
    path = secret_path(settings)
    say = _say
    cuda = CudaOnce()  # read once for every session (and for the listening addresses)

    # where to listen first: a start refused there (no ConnectX-7 address, the port in use)
    # leaves no secret behind
    socks, where = _listeners(listen, settings, cuda)
    try:
        if auth.make_secret(path):
            shown = terminal.safe(str(path))  # a path is the user's, its bytes are not ours
            click.echo(
                f"sparkdiag link serve: made a new link secret in {shown}; copy it to the "
                f"measuring machine, to the same place (scp {shown} PEER:{shown}), mode 0600",
                err=True,
            )
        secret = auth.LiveSecret(path, say)  # read now, and again when the file changes
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    # from here Ctrl-C and SIGTERM end the accept loop (within its 0.2 s), whenever they come
    stop = LIFECYCLE.stop_on_signal()
    server = LinkServer(
        socks,
        settings.sysfs,
        settings.rootfs,
        dict(os.environ),
        secret,
        say=say,
        once=once,
        cuda=cuda,
    )
    click.echo(
        terminal.safe(f"sparkdiag link serve: listening on {where} (TCP); Ctrl-C stops"), err=True
    )
    try:
        server.serve(stop)
    finally:
        busy = server.busy
        server.close()
    return Exit.INTERRUPTED if stop.is_set() and busy else Exit.OK


@link.command("test")
@click.argument("peer")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=PORT,
    show_default=True,
    help="The port the peer's 'link serve' listens on; PEER may give it instead (HOST:PORT).",
)
@click.option(
    "--duration",
    "seconds",
    type=FiniteRange(0.5, MAX_SECONDS),
    default=3.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds of each throughput measurement (each method, each direction, each path).",
)
@click.option(
    "--streams",
    type=click.IntRange(1, MAX_STREAMS),
    default=8,
    show_default=True,
    help="Parallel TCP streams.",
)
@click.option(
    "--direction",
    type=click.Choice(["both", *DIRECTIONS]),
    default="both",
    show_default=True,
    help="to-peer: this machine sends; from-peer: the peer sends. An endpoint can be degraded "
    "in one direction only.",
)
@click.option(
    "--interface",
    "interfaces",
    multiple=True,
    metavar="IF",
    help="Measure over this interface only (repeatable); any interface, not only ConnectX-7.",
)
@click.option(
    "--address-only",
    is_flag=True,
    help="Measure only the route to PEER itself, not each ConnectX-7 interface.",
)
@click.option("--no-tools", is_flag=True, help="Do not run iperf3 or ib_write_bw.")
@click.option(
    "--connect-timeout",
    type=FiniteRange(0.1, 60),
    default=3.0,
    show_default=True,
    metavar="SECONDS",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@settings_options("link")
def test(
    peer: str,
    port: int,
    seconds: float,
    streams: int,
    direction: str,
    interfaces: tuple[str, ...],
    address_only: bool,
    no_tools: bool,
    connect_timeout: float,
    as_json: bool,
    **given: Any,
) -> int:
    """Measure the link to PEER (HOST or HOST:PORT), which runs 'sparkdiag link serve'.

    This machine needs the link secret that 'link serve' made on PEER, at the same place
    (~/.config/sparkdiag/link.secret, or --link.secret-file), mode 0600.

    Over each ConnectX-7 interface of this machine that has a carrier (paired with the peer's
    address on the same network), or over --interface, or the route to PEER where this machine
    has no ConnectX-7 (or with --address-only): the TCP round-trip latency, the throughput of
    --streams parallel TCP streams in each direction, then iperf3 (TCP) and ib_write_bw (RDMA)
    where both machines have them. Each path is judged against its ceiling, the rate the
    interfaces negotiated (/sys/class/net/IF/speed) or the PCIe link behind them if lower:
    fit at half of it or more, else degraded, with the likely cause (from both machines'
    lint) and what to do. Traffic goes to PEER and to addresses PEER reports for itself on
    this machine's networks, only after they answer as the same 'link serve'.

    \b
    Exit status:
      0  fit: every path reached half of its ceiling
      1  degraded (or a path whose rate neither end knows)
      2  bad input: a bad flag, a PEER name that does not resolve, an
         --interface that does not exist, no link secret here (or one that
         its group or others can read or write, or another user owns)
      3  failed: the peer unreachable, refusing the port, not running 'link
         serve' or busy, holding another link secret; no carrier on the
         interfaces; nothing measured
      130 interrupted
    """
    # PEER as check --peer takes it: HOST:PORT was looked up as a host name and refused (found
    # in a review); the port it gives is --port's, and both given must agree
    peer, peer_port = peer_and_port(peer, "PEER")
    if peer_port is not None:
        source = click.get_current_context().get_parameter_source("port")
        if source is not click.core.ParameterSource.DEFAULT and peer_port != port:
            raise UsageError(
                f"PEER gives port {peer_port} and --port {port}: give the port once",
                flag="--port",
            )
        port = peer_port
    settings = _settings(given)
    options = Options(
        port=port,
        seconds=seconds,
        streams=streams,
        directions=DIRECTIONS if direction == "both" else (direction,),
        interfaces=interfaces,
        address_only=address_only,
        use_tools=not no_tools,
        connect_timeout=connect_timeout,
        secret=auth.read_secret(secret_path(settings), say=_say),
    )
    show = sys.stderr.isatty()
    try:
        report = measure_link(
            peer,
            options,
            settings.sysfs,
            settings.rootfs,
            dict(os.environ),
            progress=lambda line: click.echo(line, err=True) if show else None,
        )
    except FileNotFoundError as exc:
        raise UsageError(str(exc), flag="--path.sysfs") from None
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2, allow_nan=False))
    else:
        click.echo(report_text(report), nl=False)
    return report.exit_code


@link.command("lint")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of text.")
@click.option(
    "--peer",
    metavar="HOST",
    default=None,
    help="Also check that the route to HOST leaves through a ConnectX-7 interface.",
)
@settings_options("link")
def lint(as_json: bool, peer: str | None, **given: Any) -> Exit:
    """Lint this machine's ConnectX-7 and NCCL setup.

    MTU of the ConnectX-7 interfaces that have a carrier; NCCL_IB_HCA and NCCL_SOCKET_IFNAME
    (environment, $NCCL_CONF_FILE or ~/.nccl.conf, /etc/nccl.conf: NCCL's own order) against
    the devices present, and on a GB10 machine whether both PCIe halves of a cabled port are
    named; CmaTotal against CmaFree in /proc/meminfo; every libnccl.so the probe's Python can
    see (pip's and the system's); the interface NCCL's sockets take against the ConnectX-7's
    (NCCL_SOCKET_IFNAME, a management, 10GbE or Wi-Fi port up beside them, the route to
    --peer); GPUDirect RDMA: whether this GPU supports it at all (the CUDA device attributes;
    on GB10 it does not, by design, and a failing nvidia-peermem is expected there), settings
    that force it (NCCL_NET_GDR_LEVEL, NCCL_NET_GDR_READ, NCCL_DMABUF_ENABLE,
    NCCL_GDRCOPY_ENABLE), and whether it is in use where it can be (nvidia_peermem, dma-buf).
    Each finding comes with the public figure behind it and the fix.

    \b
    Exit status:
      0  no finding
      1  at least one finding
      2  bad flag, or --path.sysfs is not a directory
    """
    settings = _settings(given)
    try:
        readings = read_fabric(settings.sysfs, settings.rootfs, dict(os.environ), peer=peer)
    except FileNotFoundError as exc:
        raise UsageError(str(exc), flag="--path.sysfs") from None
    findings = run_lint(readings)
    if as_json:
        doc = {
            "format": "sparkdiag-link-lint/1",
            "findings": [f.as_json() for f in findings],
            "readings": readings.as_json(),
        }
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        click.echo(lint_text(readings, findings), nl=False)
    return Exit.ATTENTION if findings else Exit.OK
