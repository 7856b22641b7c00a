"""Data flows down only: no module imports from a layer above its own.

The layers, bottom first, as docs/architecture.md draws them. Every import of a sparkdiag module
(at module level or inside a function) is read from the source with :mod:`ast`; an import from a
higher layer fails the test with the file and line. A new top-level module or package has to be
given its layer here, so the picture cannot drift from the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sparkdiag"

# Bottom first. Names in one layer may import each other (and anything lower).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        # the package's face (__version__) and modules that import nothing above the stdlib and
        # their libraries: settings, the snapshot types, state files, plotting, signals, work
        # waited for at most a deadline
        "__init__ errors config jsonvalues statedir plotting sdnotify lifecycle snapshot kubernetes"
        " terminal safeload safeyaml filewatch"
        " assets descriptors bounded",
        "sources platforms",  # the only code that touches hardware or the OS
        "telemetry probe",  # the poller; the probe worker and how it runs
        # what the commands and the daemon are made of
        "flags baseline soak watch compare peers link native storage",
        "scheduling check",
        "exporter",  # collectors
        "web",  # the HTTP server that serves the collectors
        "daemon",
        "commands",
        "cli",
        "entry __main__",
    )
)
LAYER_OF = {name: index for index, names in enumerate(LAYERS) for name in names}


def _top(module: str) -> str:
    """The top-level name under ``sparkdiag`` (``sparkdiag`` itself is ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, imported sparkdiag module) for every import in the file, relative ones resolved."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sparkdiag":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "sparkdiag":
                continue
            if base == "sparkdiag":  # from sparkdiag import x: x is a module or the face
                for alias in node.names:
                    child = root / alias.name
                    is_module = child.is_dir() or child.with_suffix(".py").exists()
                    yield node.lineno, f"sparkdiag.{alias.name}" if is_module else base
            else:
                yield node.lineno, base


def climbs(root: Path) -> list[str]:
    """Every import in the package at ``root`` that reaches a higher layer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        here = _top(_module_name(path, root))
        for line, imported in _imports(path, root):
            there = _top(imported)
            if LAYER_OF.get(there, -1) > LAYER_OF.get(here, len(LAYERS)):
                rel = path.relative_to(root.parent)
                found.append(f"{rel}:{line} imports {imported} (layer {there} above {here})")
    return found


def test_every_top_level_name_has_a_layer() -> None:
    tops = {_top(_module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py")}
    missing = sorted(tops - LAYER_OF.keys())
    assert not missing, f"give these a layer in tests/test_layers.py LAYERS: {missing}"


def test_no_import_climbs_to_a_higher_layer() -> None:
    found = climbs(PACKAGE)
    assert not found, "\n".join(found)


def test_a_climb_is_found_at_module_level_in_a_function_and_relative(tmp_path: Path) -> None:
    root = tmp_path / "sparkdiag"
    (root / "sources").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "daemon.py").write_text("")
    (root / "sources" / "__init__.py").write_text("")
    (root / "sources" / "a.py").write_text("from sparkdiag.daemon import serve\n")
    (root / "sources" / "b.py").write_text("def f():\n    from ..daemon import serve\n")
    (root / "sources" / "c.py").write_text("from sparkdiag import snapshot, daemon\n")
    (root / "sources" / "d.py").write_text("from sparkdiag.snapshot import Snapshot\n")
    assert [line.split(" ")[0] for line in climbs(root)] == [
        "sparkdiag/sources/a.py:1",
        "sparkdiag/sources/b.py:2",
        "sparkdiag/sources/c.py:1",
    ]


MAX_LINES = 700  # issue 34: a module a maintainer can hold in mind


def test_no_hand_written_module_is_over_700_lines() -> None:
    """The bound issue 34 set, held here: on 2026-12-05 learning_kernels took baseline/store.py
    to 702 lines, and nothing said so until the house was drawn again."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
