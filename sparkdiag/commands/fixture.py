"""``sparkdiag record-fixture``: every NVML answer sparkdiag uses, recorded for replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sparkdiag.commands.common import check_output_path, is_stdout
from sparkdiag.errors import SparkdiagError
from sparkdiag.flags import path_type, settings_from, settings_options


@click.command("record-fixture")
@click.argument("output", type=path_type())
@click.option(
    "--description", default="", help="What the machine was doing (idle, under load ...)."
)
@settings_options("record-fixture")
def record_fixture(output: Path, description: str, **given: Any) -> None:
    """Record every NVML answer sparkdiag uses, errors included, into OUTPUT (JSON), or to
    standard output for -.

    Run it on a real GPU; replay the file with --nvml-fixture on any machine. OUTPUT is replaced
    whole (a new file, then a rename: never half a file); its folder must exist, and an OUTPUT
    that is a link is replaced where it points.

    Exit status: 0 recorded; 2 a bad flag or fixture, or an OUTPUT that cannot be a fixture (a
    folder, a device, a pipe; a missing folder); 3 NVML is unavailable or OUTPUT cannot be
    written.
    """
    from sparkdiag.sources.nvml.api import NvmlUnavailable
    from sparkdiag.sources.nvml.backends import make_backend
    from sparkdiag.sources.nvml.record import record, write_atomic

    settings = settings_from("record-fixture", given)
    if not is_stdout(output):
        whole = "a fixture replaces its file whole; give a file name, or - for standard output"
        check_output_path(output, "OUTPUT", replaced=whole)  # before NVML is asked anything
        output = output.resolve() if output.is_symlink() else output
    backend = make_backend(settings.nvml_fixture)
    try:
        doc = record(backend, description)
    except NvmlUnavailable as exc:
        raise SparkdiagError(f"cannot record: NVML is unavailable here ({exc})") from None
    n = len(doc["devices"])
    said = f"recorded {n} GPU{'s' if n != 1 else ''} (driver {doc['driver_version']})"
    if is_stdout(output):
        click.echo(json.dumps(doc, indent=1))
        click.echo(said, err=True)
        return
    try:
        write_atomic(output, doc)
    except OSError as exc:
        raise SparkdiagError(f"cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"{said} to {output}")
