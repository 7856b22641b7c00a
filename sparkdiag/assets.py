"""The ops files shipped inside the package (rules, dashboards, unit), for pip users."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from sparkdiag.config import default_config_text

# What is written, relative to the package's data folder; tests of the rules are not shipped out.
SHIPPED = ("prometheus/sparkdiag-rules.yml", "prometheus/README.md", "grafana", "systemd")


def _walk(node: Traversable, relative: Path) -> list[tuple[Path, Traversable]]:
    if node.is_file():
        return [(relative, node)]
    found: list[tuple[Path, Traversable]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        found += _walk(child, relative / child.name)
    return found


def shipped_files() -> list[tuple[Path, Traversable]]:
    data = files("sparkdiag") / "data"
    found: list[tuple[Path, Traversable]] = []
    for name in SHIPPED:
        node = data.joinpath(*name.split("/"))
        if node.is_file() or node.is_dir():
            found += _walk(node, Path(name))
    return found


def write_assets(target: Path, force: bool = False) -> list[Path]:
    """Write the shipped files (and a commented default config.toml) under ``target``.

    Refuses to overwrite an existing file unless ``force``; returns the paths written.
    """
    plan: list[tuple[Path, bytes]] = [(p, node.read_bytes()) for p, node in shipped_files()]
    plan.append((Path("config.toml"), default_config_text().encode()))
    existing = [target / p for p, _ in plan if (target / p).exists()]
    if existing and not force:
        shown = ", ".join(str(p) for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise FileExistsError(f"would overwrite {shown} (pass --force)")
    written = []
    for relative, content in plan:
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        written.append(path)
    return written
