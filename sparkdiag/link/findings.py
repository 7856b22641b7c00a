"""What one rule of the ConnectX-7 / NCCL lint found (:mod:`sparkdiag.link.lint`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """code: the rule (``mtu``); subject: what it is about (``enp1s0f1np1``, ``NCCL_IB_HCA``);
    finding: what was read, one line; figure: the public figure behind it, with its source;
    fix: what to do."""

    code: str
    subject: str
    finding: str
    figure: str
    fix: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
