"""``sparkdiag record-fixture``: every NVML answer sparkdiag uses, recorded for replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sparkdiag.errors import SparkdiagError
from sparkdiag.flags import settings_from, settings_options


@click.command("record-fixture")
@click.argument("output", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.option(
    "--description", default="", help="What the machine was doing (idle, under load ...)."
)
@settings_options("record-fixture")
def record_fixture(output: Path, description: str, **given: Any) -> None:
    """Record every NVML answer sparkdiag uses, errors included, into OUTPUT (JSON).

    Run it on a real GPU; replay the file with --nvml-fixture on any machine.

    Exit status: 0 recorded; 2 a bad flag or fixture; 3 NVML is unavailable or OUTPUT cannot
    be written.
    """
    from sparkdiag.sources.nvml.api import NvmlUnavailable
    from sparkdiag.sources.nvml.backends import make_backend
    from sparkdiag.sources.nvml.record import record, write_atomic

    backend = make_backend(settings_from("record-fixture", given).nvml_fixture)
    try:
        doc = record(backend, description)
    except NvmlUnavailable as exc:
        raise SparkdiagError(f"cannot record: NVML is unavailable here ({exc})") from None
    try:
        write_atomic(output, doc)
    except OSError as exc:
        raise SparkdiagError(f"cannot write {output}: {exc.strerror or exc}") from None
    n = len(doc["devices"])
    click.echo(
        f"recorded {n} GPU{'s' if n != 1 else ''} (driver {doc['driver_version']}) to {output}"
    )
