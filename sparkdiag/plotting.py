"""matplotlib, an optional extra (``pip install matplotlib``), for the PNGs that ``watch``
and ``soak`` write: whether it is there, the one message when it is not, and a headless pyplot."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from sparkdiag.errors import UsageError

INSTALL_HINT = "pip install matplotlib (from a checkout: pip install -e '.[plot]')"


class PlotUnavailable(UsageError, RuntimeError):
    """matplotlib is not installed; the message names the flag and says how to add it."""


def available() -> bool:
    """True when matplotlib can be imported (nothing is imported here)."""
    return importlib.util.find_spec("matplotlib") is not None


def missing_message(flag: str = "--plot") -> str:
    """The one line a command prints when ``flag`` needs matplotlib and it is missing."""
    return f"{flag} needs matplotlib, which is not installed: {INSTALL_HINT}"


def require(flag: str = "--plot") -> None:
    """Raise PlotUnavailable (a usage error) when matplotlib is missing: a command asked for
    ``flag`` refuses it before any work starts."""
    if not available():
        raise PlotUnavailable(missing_message(flag))


def is_folder(target: str | Path) -> bool:
    """``--plot`` names a directory: an existing one, or one given with a trailing slash (which
    the command creates, one level only, where its parent exists)."""
    return Path(target).is_dir() or str(target).endswith("/")


def pyplot(flag: str = "--plot") -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed); PlotUnavailable without it."""
    require(flag)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def twin_legend(left: Any, right: Any, loc: str = "upper right") -> None:
    """One legend for an axis and its twin (``ax.twinx()``), on the left axis."""
    h1, l1 = left.get_legend_handles_labels()
    h2, l2 = right.get_legend_handles_labels()
    if h1 or h2:
        left.legend(h1 + h2, l1 + l2, fontsize=7, loc=loc)
