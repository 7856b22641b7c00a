"""NCCL's interface and HCA list syntax (``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``), as NCCL's
``matchIfList`` reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NcclList:
    """An NCCL interface or HCA list (``^=mlx5_0:1,mlx5_1``): ``exclude`` (``^``), ``exact``
    (``=``), entries of (name, port or None)."""

    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]

    def selects(self, name: str, port: int | None = None) -> bool:
        """Whether NCCL would use ``name`` (port ``port``), as its ``matchIfList`` decides."""
        return self.exclude != any(self.matches(entry, name, port) for entry in self.entries)

    def matches(self, entry: tuple[str, int | None], name: str, port: int | None) -> bool:
        want, want_port = entry
        hit = name == want if self.exact else name.startswith(want)
        return hit and (want_port is None or port is None or want_port == port)


def parse_nccl_list(value: str) -> NcclList:
    """``NCCL_IB_HCA``/``NCCL_SOCKET_IFNAME`` syntax: a leading ``^`` excludes, then a leading
    ``=`` asks for exact names; entries are comma separated, each ``name`` or ``name:port``."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries = []
    for part in text.split(","):
        name, _, port = part.strip().partition(":")
        if name:
            entries.append((name, int(port) if port.isdigit() else None))
    return NcclList(exclude, exact, tuple(entries))
