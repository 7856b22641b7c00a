"""The narrow NVML interface the GPU source is written against.

Two backends implement it: :class:`sparkdiag.sources.nvml.driver.PynvmlBackend` (the real
library) and :class:`sparkdiag.sources.nvml.fixture.FixtureBackend` (recorded answers replayed
from JSON). The interface is a fixed catalogue of *queries*
(:data:`sparkdiag.sources.nvml.queries.CATALOGUE`), each mapping to one NVML call and returning a
plain JSON value, so that a recorder can store every answer (errors included) and a fixture can
replay it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# NVML return codes (nvml.h), kept here so that no module but sources/nvml/driver.py imports pynvml.
ERROR_NAMES: Mapping[int, str] = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    999: "UNKNOWN",
}
ERROR_CODES: Mapping[str, int] = {name: code for code, name in ERROR_NAMES.items()}


def error_code(name: str) -> int | None:
    """The code of an error name as :class:`NvmlCallError` writes it (``NOT_SUPPORTED``, or
    ``ERROR_42`` for a code without a name); None when the name is neither."""
    if name in ERROR_CODES:
        return ERROR_CODES[name]
    if name.startswith("ERROR_") and name[6:].isdigit():
        return int(name[6:])
    return None


UNINITIALIZED = 1
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
# Errors after which the device no longer answers: it is reported down (sparkdiag_gpu_up 0).
LOST_CODES = frozenset({GPU_IS_LOST, 16, 28, 999})
# Errors that mean "this value is not available here": the field is None, the sample left out.
UNAVAILABLE_CODES = frozenset({NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, 21, 26})
DRIVER_NOT_LOADED = 9
LIB_RM_VERSION_MISMATCH = 18
# Errors that mean NVML itself no longer answers this process, whatever device or value is asked:
# the whole source is down (sparkdiag_nvml_up 0, no GPU series), not one GPU or one value. From
# nvml.h:
# - UNINITIALIZED (1), "NVML was not first initialized with nvmlInit()": this process's NVML
#   session is gone (shut down under it); nvmlInit starts it again.
# - DRIVER_NOT_LOADED (9), "NVIDIA driver is not loaded": the kernel module was unloaded, or
#   crashed, under the running process; nvmlInit works again once it is loaded.
# - LIB_RM_VERSION_MISMATCH (18), "RM detects a driver/library version mismatch": the driver was
#   upgraded under the running process, whose loaded libnvidia-ml no longer matches the kernel
#   module. nvmlInit in the same process fails the same way (the old library stays loaded):
#   sparkdiag has to be restarted.
# Not in it: LIBRARY_NOT_FOUND (12) comes from nvmlInit alone (NvmlUnavailable); GPU_IS_LOST,
# RESET_REQUIRED, GPU_NOT_FOUND and UNKNOWN are one device's (LOST_CODES); IRQ_ISSUE (11),
# TIMEOUT (10), OPERATING_SYSTEM (17), MEMORY (20), INSUFFICIENT_RESOURCES (23) and
# ARGUMENT_VERSION_MISMATCH (25) are one call's or one device's, not the driver's.
DRIVER_GONE_CODES = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH})


def error_text(code: int) -> str:
    """An NVML return code as the messages give it: ``NVML_ERROR_DRIVER_NOT_LOADED (9)``."""
    return f"NVML_ERROR_{ERROR_NAMES.get(code, f'ERROR_{code}')} ({code})"


class NvmlCallError(Exception):
    """One NVML call failed with an NVML return code."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        self.name = ERROR_NAMES.get(code, f"ERROR_{code}")
        super().__init__(message or error_text(code))


class NvmlUnavailable(Exception):
    """NVML cannot be used at all: library missing, driver not loaded, no permission.

    ``code``: the NVML return code nvmlInit answered, where it answered one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NvmlEvent:
    """One event read from the NVML event set (``nvmlEventSetWait``)."""

    gpu: int  # NVML index
    event_type: int  # nvmlEventType* bitmask
    data: int  # the XID number for XID-critical events
    timestamp: float  # unix seconds when sparkdiag read it


EVENT_XID_CRITICAL = 0x8

# Hopper and Blackwell GPUs have 18 NVLinks each; a link NVML does not report is NOT_SUPPORTED.
NVLINK_LINKS: tuple[int, ...] = tuple(range(18))
# NVML error code the real backend raises for a delta query's first call (nothing to compare with
# yet): neither unsupported nor lost, so the GPU source asks again at the next poll.
NOT_READY = 27


def answer_key(query: str, arg: int | None) -> str:
    """The key a query's answer is stored under in a fixture: ``"clock/1"`` or ``"name"``."""
    return query if arg is None else f"{query}/{arg}"


class NvmlBackend(Protocol):
    """What the GPU source needs from NVML. Every method may raise :class:`NvmlCallError`."""

    def init(self) -> None:
        """Initialise; raise :class:`NvmlUnavailable` when NVML cannot be used at all."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        """Answer one catalogue query for the device at ``index``."""

    def poll_events(self) -> list[NvmlEvent]:
        """Return the events that arrived since the last call, without blocking."""

    def advance(self) -> None:
        """Called once at the start of each poll (fixtures step their script; hardware: no-op)."""

    def host_memory_total(self) -> int | None:
        """Host MemTotal in bytes, to tell unified memory from dedicated."""
