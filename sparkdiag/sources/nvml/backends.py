"""Which NVML backend a command uses: the recorded fixture when one is given, else the driver.

Every command that reads GPUs (serve, dump, check, probe, record-fixture) selects its backend
here, so ``--nvml-fixture`` means the same thing everywhere.
"""

from __future__ import annotations

from pathlib import Path

from sparkdiag.sources.nvml.api import NvmlBackend
from sparkdiag.sources.nvml.driver import PynvmlBackend
from sparkdiag.sources.nvml.fixture import FixtureBackend


def make_backend(nvml_fixture: Path | None) -> NvmlBackend:
    """The fixture backend for ``nvml_fixture`` (raises FixtureError), else real NVML.

    Real NVML is loaded lazily (at ``init``), so this never fails on a machine without a GPU.
    """
    if nvml_fixture is not None:
        return FixtureBackend(nvml_fixture)
    return PynvmlBackend()
