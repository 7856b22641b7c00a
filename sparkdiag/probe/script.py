"""The probe worker as one script, assembled from the rooms of ``probe/worker/``.

The worker runs in a fresh interpreter that has torch and need not have sparkdiag: natively as
``python3 sparkdiag/probe/worker ARGS`` (its ``__main__.py`` assembles the script and runs it),
or fed on standard input to ``python3 - ARGS`` inside a container (``runner.worker_source``).
Its rooms are ordinary modules: mypy, ruff and the tests read them one by one, and sparkdiag
imports the contract (``worker/contract.py``) like any module. The script is their bodies in one
namespace, made here each time it is needed:

- the docstring of ``worker/__init__.py``;
- the rooms' standard-library imports, merged, at the top;
- each room's body without its docstring and imports, every room after those it imports from
  (ties by name);
- ``sys.exit(main())`` under ``if __name__ == "__main__"``.

So that the one namespace means what the modules mean, :func:`assemble` refuses
(:class:`AssemblyError`) a room that imports from sparkdiag in any form but ``from
sparkdiag.probe.worker.ROOM import NAME`` at module level (no ``as``; NAME defined in ROOM),
imports anything but the standard library at module level (torch and pynvml are imported inside
functions), or binds a name that another room binds too.

Why assembled at run time and not a generated file kept in the tree: a second copy of ~3,000
lines would be one more thing to keep equal (and every reader and tool would see the code
twice); assembling the worker takes 0.09 s here, and 7 ms again in the same process while no
room has changed (each room is parsed once for its text), beside the seconds the worker spends
importing torch. tests/test_probe_worker_script.py holds the assembled text self-contained and
running.

This module imports the standard library only: ``worker/__main__.py`` loads it by its path.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOMS = Path(__file__).resolve().with_name("worker")
PACKAGE = "sparkdiag.probe.worker"
ENTRY = "main"  # the function the script ends by calling, defined by one room
# Python 3.9 (a probe.python venv of an older image may be one) has no list: the rule is then
# not checked where the worker starts, only in sparkdiag's own tests (3.11+).
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
RULE = "# " + "-" * 74


class AssemblyError(Exception):
    """A room that would not run in the one namespace as it runs as a module."""


@dataclass(frozen=True)
class Room:
    """One module of the worker package, read for the script.

    body: its source without its docstring and module-level imports
    imports: its standard-library imports, as the lines that make them (one name a line)
    needs: (room, name) for each name it imports from another room
    defines: the names it binds at module level itself
    """

    name: str
    body: str
    imports: frozenset[tuple[str, str, str | None]]  # (module, name or "", as)
    needs: frozenset[tuple[str, str]]
    defines: frozenset[str]

    @property
    def bound(self) -> dict[str, tuple[str, str, str | None]]:
        """Names its standard-library imports bind, with the import that binds each."""
        out = {}
        for module, name, alias in self.imports:
            out[alias or name or module.split(".")[0]] = (module, name, alias)
        return out


def rooms(folder: Path = ROOMS) -> list[Room]:
    """The rooms of ``folder`` (every ``*.py`` but ``__init__`` and ``__main__``), each after
    the rooms it imports from."""
    found = {
        room.name: room
        for room in (read_room(path) for path in sorted(folder.glob("*.py")))
        if not room.name.startswith("__")
    }
    return _in_import_order(found)


def read_room(path: Path) -> Room:
    """One room, checked against the rules in this module's docstring."""
    return _read_room(path, path.read_text(encoding="utf-8"))


# A room is a function of its path and its text: the daemon assembles the worker for each
# container probe, compare for each container round, and an unchanged room is not parsed again
# (assembling the 14 rooms took 0.14 s here).
@functools.lru_cache(maxsize=128)
def _read_room(path: Path, text: str) -> Room:
    name = path.stem
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        raise AssemblyError(f"{path}: {exc}") from None
    dropped: list[tuple[int, int]] = []
    imports: set[tuple[str, str, str | None]] = set()
    needs: set[tuple[str, str]] = set()
    defines: set[str] = set()
    for index, node in enumerate(tree.body):
        span = (node.lineno, node.end_lineno or node.lineno)
        if index == 0 and _is_docstring(node):
            dropped.append(span)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "__future__":
                dropped.append(span)
            elif node.module.startswith(PACKAGE + "."):
                needs.update(_sibling_names(path, node))
                dropped.append(span)
            else:
                _stdlib(path, node, node.module)
                imports.update((node.module, a.name, a.asname) for a in node.names)
                dropped.append(span)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                _stdlib(path, node, alias.name)
                imports.add((alias.name, "", alias.asname))
            dropped.append(span)
        elif isinstance(node, ast.ImportFrom):
            raise AssemblyError(f"{path}:{node.lineno}: a relative import; name the room in full")
        else:
            defines.update(_bound_names(node))
    nested = []
    for inner in _nested_statements(tree.body):
        if isinstance(inner, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in inner.names] if isinstance(inner, ast.Import) else []
            module = inner.module if isinstance(inner, ast.ImportFrom) else None
            if any(n.split(".")[0] == "sparkdiag" for n in [*names, module or ""]):
                nested.append(inner.lineno)
    if nested:  # the first in the file
        raise AssemblyError(f"{path}:{min(nested)}: imports sparkdiag inside a function")
    return Room(
        name, _without(text, dropped), frozenset(imports), frozenset(needs), frozenset(defines)
    )


def _nested_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements inside ``body``'s statements (function and class bodies, branches,
    handlers, cases), at any depth: an import is a statement, and no expression holds one, so
    the expressions, most of a module's nodes, are not walked."""
    todo = [node for stmt in body for node in _inner(stmt)]
    while todo:
        stmt = todo.pop()
        yield stmt
        todo.extend(_inner(stmt))


def _inner(node: ast.AST) -> Iterator[ast.stmt]:
    """The statements directly inside ``node`` (through an except handler or a match case)."""
    for _, value in ast.iter_fields(node):
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.stmt):
                    yield item
                elif isinstance(item, _HOLDERS):
                    yield from _inner(item)


# what holds statements without being one; Python 3.9 (a probe.python of an older image, which
# runs this module by its path) has no match statement
_HOLDERS = (ast.ExceptHandler, *((ast.match_case,) if hasattr(ast, "match_case") else ()))


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _sibling_names(path: Path, node: ast.ImportFrom) -> set[tuple[str, str]]:
    room = (node.module or "")[len(PACKAGE) + 1 :]
    if "." in room or any(a.asname for a in node.names) or any(a.name == "*" for a in node.names):
        raise AssemblyError(
            f"{path}:{node.lineno}: import rooms' names as 'from {PACKAGE}.ROOM import NAME'"
        )
    return {(room, a.name) for a in node.names}


def _stdlib(path: Path, node: ast.stmt, module: str) -> None:
    top = module.split(".")[0]
    if top == "sparkdiag":
        raise AssemblyError(f"{path}:{node.lineno}: import rooms' names, not {module}")
    if STDLIB and top not in STDLIB:
        raise AssemblyError(
            f"{path}:{node.lineno}: {module} is not in the standard library: import it inside "
            "the function that needs it"
        )


_OWN_SCOPE = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a module-level statement binds (not those inside its functions and classes)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    names: set[str] = set()
    todo: list[ast.AST] = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Store):
            names.add(current.id)
        for child in ast.iter_child_nodes(current):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
            elif not isinstance(child, _OWN_SCOPE):
                todo.append(child)
    return names


def _without(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the lines of ``spans`` (1-based, inclusive), stripped of blank ends."""
    gone = {line for first, last in spans for line in range(first, last + 1)}
    kept = [line for number, line in enumerate(text.splitlines(), 1) if number not in gone]
    return "\n".join(kept).strip("\n")


def _in_import_order(found: dict[str, Room]) -> list[Room]:
    """Every room after the rooms it imports from; ties by name. AssemblyError on a name a room
    imports that its room does not define, on a circle, and on a name bound twice."""
    for room in found.values():
        for source, name in sorted(room.needs):
            if source not in found:
                raise AssemblyError(f"{room.name}.py imports from {source!r}, which is no room")
            if name not in found[source].defines:
                raise AssemblyError(
                    f"{room.name}.py imports {name} from {source}.py, which does not define it"
                )
    ordered: list[Room] = []
    placed: set[str] = set()
    while len(ordered) < len(found):
        ready = sorted(
            name
            for name, room in found.items()
            if name not in placed and {source for source, _ in room.needs} <= placed
        )
        if not ready:
            left = sorted(set(found) - placed)
            raise AssemblyError(f"rooms that import each other in a circle: {', '.join(left)}")
        ordered.append(found[ready[0]])
        placed.add(ready[0])
    _check_bindings(ordered)
    return ordered


def _check_bindings(ordered: list[Room]) -> None:
    """A name bound by two rooms (two definitions, or a definition and an import, or two
    different imports) would be one name in the script: AssemblyError."""
    owner: dict[str, tuple[str, str, object]] = {}  # name -> (room, "def" or "import", what)
    for room in ordered:
        binds: list[tuple[str, str, object]] = [(n, "def", room.name) for n in sorted(room.defines)]
        binds += [(name, "import", how) for name, how in sorted(room.bound.items())]
        for name, kind, what in binds:
            before = owner.get(name)
            if before is not None and (kind == "def" or before[1:] != (kind, what)):
                raise AssemblyError(
                    f"{name!r} is bound in {before[0]}.py and in {room.name}.py: the script is "
                    "one namespace, so each name may be bound by one room only"
                )
            owner[name] = (room.name, kind, what)


def _import_lines(imports: set[tuple[str, str, str | None]]) -> list[str]:
    plain = sorted(
        f"import {module}" + (f" as {alias}" if alias else "")
        for module, name, alias in imports
        if not name
    )
    by_module: dict[str, list[str]] = {}
    for module, name, alias in imports:
        if name:
            by_module.setdefault(module, []).append(name + (f" as {alias}" if alias else ""))
    froms = [
        f"from {module} import {', '.join(sorted(names))}"
        for module, names in sorted(by_module.items())
    ]
    return plain + froms


def assemble(folder: Path = ROOMS) -> str:
    """The worker as one self-contained script, from the package at ``folder``."""
    init = (folder / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(init)
    if not tree.body or not _is_docstring(tree.body[0]):
        raise AssemblyError(f"{folder / '__init__.py'}: the script's docstring is missing")
    docstring = ast.get_source_segment(init, tree.body[0]) or ""
    ordered = rooms(folder)
    if not any(ENTRY in room.defines for room in ordered):
        raise AssemblyError(f"no room of {folder} defines {ENTRY}()")
    imports = {item for room in ordered for item in room.imports} | {("sys", "", None)}
    head = [
        docstring,
        "",
        f"# Assembled by sparkdiag/probe/script.py from the rooms of {folder.name}/: "
        + ", ".join(room.name for room in ordered)
        + ".",
        "from __future__ import annotations",
        "",
        *_import_lines(imports),
    ]
    parts = ["\n".join(head)]
    parts += [f"{RULE}\n# {room.name}.py\n\n\n{room.body}" for room in ordered]
    parts.append(f'if __name__ == "__main__":\n    sys.exit({ENTRY}())')
    return "\n\n\n".join(parts) + "\n"
