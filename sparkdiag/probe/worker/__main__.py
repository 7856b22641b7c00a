"""``python3 sparkdiag/probe/worker ARGS``: the probe worker, assembled from the rooms beside this
file (``probe/script.py``) and run as one script, by any Python that has torch; sparkdiag itself
need not be importable there (``probe.python`` may name another interpreter)."""

from __future__ import annotations

import importlib.util
import linecache
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def script() -> str:
    """The assembled worker, by ``probe/script.py`` loaded from its path (not as sparkdiag's)."""
    spec = importlib.util.spec_from_file_location(
        "sparkdiag_probe_script", HERE.parent / "script.py"
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE.parent / 'script.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    text: str = module.assemble(HERE)
    return text


def main() -> None:
    source = script()
    name = f"<sparkdiag probe worker {HERE}>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
        del sys.path[0]  # run as a directory: its rooms are not modules of the script
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    exec(compile(source, name, "exec"), module.__dict__)


if __name__ == "__main__":
    main()
