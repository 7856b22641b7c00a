"""The ``sparkdiag`` entry point: installs the daemon's signal handlers before anything slow.

``sparkdiag serve`` must answer SIGTERM cleanly from its first instant (systemd may stop it while
it starts); importing the command line and its dependencies takes a few hundred milliseconds, so
the handlers (:mod:`sparkdiag.lifecycle`, standard library only) go in before those imports. Every
other command gets SIGINT and SIGTERM from the command group, around the command it runs.
"""

from __future__ import annotations

import sys


def main() -> None:
    if "serve" in sys.argv[1:2]:
        from sparkdiag.lifecycle import LIFECYCLE

        LIFECYCLE.install(daemon=True)
    from sparkdiag.cli import main as cli_main

    cli_main()
