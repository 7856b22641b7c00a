"""What the benchmarks and the device scripts share (standard library only, so that a script
copied to the lent GPU machine runs with nothing installed but sparkdiag's own dependencies).

Import it as ``benchmarks.common`` with the repository root on ``sys.path`` (each script puts
it there)."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

# nvidia-smi --query-gpu fields the scrape benchmarks time against sparkdiag's own scrape
SMI_FIELDS = (
    "temperature.gpu,temperature.memory,clocks.sm,clocks.mem,clocks.gr,clocks.video,"
    "clocks.max.sm,clocks.max.mem,clocks_event_reasons.active,power.draw,enforced.power.limit,"
    "utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,"
    "ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,pstate"
)


def stop(proc: subprocess.Popen[Any], seconds: float = 10) -> None:
    """Stop a child that still runs as systemd would: SIGTERM, then SIGKILL after ``seconds``;
    reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
