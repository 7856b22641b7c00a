"""The node's name, as dcgm-exporter labels its series (``Hostname``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """``$NODE_NAME`` where it is set, else the host name (``hostname``); "" when neither is known.

    Kubernetes' downward API gives a pod its node's name in ``NODE_NAME`` (sparkdiag's DaemonSet
    sets it from ``spec.nodeName``, as dcgm-exporter's does): inside a pod the host name is the
    pod's, not the node's.
    """
    env = os.environ if environ is None else environ
    name = env.get("NODE_NAME", "").strip()
    if name:
        return name
    try:
        return socket.gethostname()
    except OSError:
        return ""
