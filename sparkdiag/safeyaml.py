"""The YAML half of :mod:`sparkdiag.safeload`: PyYAML's safe loader with its nesting,
aliases, integers and floats bounded. A module of its own, imported by its callers when they read
a YAML file, so that PyYAML is imported only then (the daemon without a web config never reads
one: docs/daemon-cost.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from sparkdiag.safeload import MAX_DEPTH, MAX_DIGITS, LoadError, read_file, text


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, its nesting counted as it composes (the composer is the only part
    of PyYAML that recurses), aliases refused (an alias chain of merge keys recurses too, and
    no file sparkdiag reads needs one), integers and floats bounded as :func:`parse_json`
    bounds them."""

    max_depth = MAX_DEPTH
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise LoadError(f"line {mark.line + 1}: aliases (*name) are not read here")
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise LoadError(f"nested too deeply (more than {self.max_depth} levels)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _yaml_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    literal = str(node.value).replace("_", "")
    if len(literal.lstrip("+-").lstrip("0")) > MAX_DIGITS:
        raise LoadError(
            f"line {node.start_mark.line + 1}: an integer of more than {MAX_DIGITS} digits"
        )
    return loader.construct_yaml_int(node)


def _yaml_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_float(node)
    if not math.isfinite(value):
        raise LoadError(
            f"line {node.start_mark.line + 1}: {str(node.value)[:40]} is not a finite number"
        )
    return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


def parse_yaml(source: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """A YAML document (safe types only), bounded as :func:`parse_json` is; LoadError (with the
    parser's first line) otherwise."""
    if isinstance(source, bytes):
        source = text(source)
    loader = None
    try:
        loader = _BoundedLoader(source)  # its reader refuses control characters at once
        loader.max_depth = max_depth
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise LoadError("not valid YAML: " + _said(exc)) from None
    except RecursionError:
        raise LoadError(f"nested too deeply (more than {max_depth} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()


def _said(exc: yaml.YAMLError) -> str:
    """The parser's complaint and where, without the excerpt of the offending line PyYAML puts
    in its message: that line may be a password or a bcrypt hash (a web config's users)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())[:300]  # the reader's: a character code and a position
    parts = []
    for said, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark)):
        if said:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            parts.append(" ".join(said.split())[:200] + where)
    return " ".join(parts) or "cannot be parsed"


def load_yaml(path: Path, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`sparkdiag.safeload.read_file` then :func:`parse_yaml`."""
    return parse_yaml(read_file(path, limit), max_depth)


def parse_shipped(source: str) -> Any:
    """A YAML document sparkdiag ships itself (its alert rules), which needs none of
    :func:`parse_yaml`'s bounds: read by libyaml's C parser where PyYAML was built with it. The
    67 kB rules file took 0.02 s that way and 0.19 s in PyYAML's own Python (the same document),
    at every run of ``fleet`` and ``assets kubernetes``."""
    return yaml.load(source, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
