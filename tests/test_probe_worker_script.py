"""The probe worker as the one script it travels as (sparkdiag/probe/script.py assembles it).

The rooms of sparkdiag/probe/worker/ are modules; a probe cycle runs them as one script, fed to
``python3 -`` in a container or run as ``python3 sparkdiag/probe/worker``. These tests hold the
assembled script to what the rooms are: every room's code in it, only the standard library
imported at its top, running where sparkdiag cannot be imported; and the assembler to its
rules, so that a room that would run differently in one namespace is refused, not shipped.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sparkdiag.probe import script
from sparkdiag.probe.runner import worker_path, worker_source
from sparkdiag.probe.script import AssemblyError, assemble, rooms
from sparkdiag.probe.worker import contract

ROOT = Path(__file__).resolve().parents[1]


def _bare_python(
    args: list[str], cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """This interpreter with the standard library only (-I: no PYTHONPATH, no user site, no
    script folder on the path; -S: no site-packages), in an empty folder with no environment:
    neither sparkdiag nor torch can be imported there."""
    return subprocess.run(
        [sys.executable, "-I", "-S", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        timeout=120,
    )


def _exec_script(text: str) -> ModuleType:
    module = ModuleType("sparkdiag_probe_worker_script")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(text, "<worker script>", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


# -- the script the package makes -------------------------------------------------------------


def test_the_script_holds_every_room_and_defines_what_they_define() -> None:
    text = worker_source()
    assert text == assemble()
    found = rooms()
    assert {room.name for room in found} == {
        p.stem for p in worker_path().glob("*.py") if not p.name.startswith("__")
    }
    for room in found:
        assert room.body in text, f"{room.name}.py is not in the script whole"
    namespace = _exec_script(text)  # module level runs: every name defined before it is used
    defined = {name for room in found for name in room.defines}
    assert defined <= set(vars(namespace)), sorted(defined - set(vars(namespace)))
    assert namespace.SCHEMA == contract.SCHEMA
    assert [vars(f) for f in namespace.FLAGS] == [vars(f) for f in contract.FLAGS]
    assert tuple(namespace.DTYPE_KERNELS) == contract.ALL_DTYPES


def test_the_script_imports_only_the_standard_library_at_its_top() -> None:
    tree = ast.parse(worker_source())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top
    everywhere: set[str] = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Import):
            everywhere.update(a.name.split(".")[0] for a in sub.names)
        elif isinstance(sub, ast.ImportFrom) and sub.module:
            everywhere.add(sub.module.split(".")[0])
    # only inside functions; kvikio only in the storage mode's GPUDirect stage (worker/storage.py)
    assert everywhere - top == {"torch", "pynvml", "kvikio"}
    assert "sparkdiag" not in everywhere


def test_the_script_runs_where_sparkdiag_cannot_be_imported(tmp_path: Path) -> None:
    """Fed on stdin and run as the package's folder, by a Python with nothing but its standard
    library, it prints the worker's help and, for a bad argument, its one document (neither
    needs torch; a whole CPU run of the script fed on stdin: test_probe_worker.py)."""
    assert _bare_python(["-c", "import sparkdiag"], tmp_path).returncode == 1  # the test can fail
    text = worker_source()
    piped = _bare_python(["-", "--help"], tmp_path, stdin=text)
    folder = _bare_python([str(worker_path()), "--help"], tmp_path)
    assert piped.returncode == folder.returncode == 0, piped.stderr + folder.stderr
    assert piped.stderr == folder.stderr  # the worker keeps stdout for its document
    assert contract.DESCRIPTION in piped.stderr and "--soak-seconds" in piped.stderr
    for run in (
        _bare_python(["-", "--iters", "0"], tmp_path, stdin=text),
        _bare_python([str(worker_path()), "--iters", "0"], tmp_path),
    ):
        assert run.returncode == 2, run.stderr
        doc = json.loads(run.stdout)
        assert doc["schema"] == contract.SCHEMA and doc["status"] == "error"
        assert doc["reason"] == "usage: --iters must be at least 1"


def test_importing_the_contract_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import sparkdiag.probe.worker.contract, sparkdiag.probe.document, sparkdiag.flags\n"
        "import sparkdiag.daemon\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pynvml')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] in ("[]", "['pynvml']")  # the daemon reads NVML itself
    assert "torch" not in done.stdout


# -- the assembler's rules --------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "worker"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""A worker."""\n')
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


P = script.PACKAGE


def test_rooms_come_after_those_they_import_from(tmp_path: Path) -> None:
    folder = _package(
        tmp_path,
        {
            "a_entry.py": f"import sys\nfrom {P}.b_base import LIMIT, twice\n\n"
            "def main() -> int:\n    print(twice(LIMIT))\n    return 0\n",
            "b_base.py": '"""Base."""\nimport math\nLIMIT = 4\n\ndef twice(x):\n'
            "    return math.prod([2, x])\n",
        },
    )
    assert [room.name for room in rooms(folder)] == ["b_base", "a_entry"]
    text = assemble(folder)
    assert text.index("LIMIT = 4") < text.index("def main()")
    assert text.count("import math") == 1 and "sparkdiag" not in text.split("\n", 3)[-1]
    ran = subprocess.run([sys.executable, "-"], input=text, capture_output=True, text=True)
    assert ran.stdout == "8\n" and ran.returncode == 0


@pytest.mark.parametrize(
    ("files", "refusal"),
    [
        ({"a.py": "from .b import X\n", "b.py": "X = 1\n"}, "relative import"),
        ({"a.py": f"from {P}.b import X as Y\n", "b.py": "X = 1\n"}, "import rooms' names"),
        ({"a.py": f"from {P} import b\n", "b.py": "X = 1\n"}, "import rooms' names, not"),
        ({"a.py": f"from {P}.b import Y\n", "b.py": "X = 1\n"}, "which does not define it"),
        ({"a.py": f"from {P}.c import X\n"}, "which is no room"),
        ({"a.py": "import torch\n"}, "not in the standard library"),
        ({"a.py": f"def f():\n    from {P}.b import X\n", "b.py": "X = 1\n"}, "inside a function"),
        # deeper, through each kind of statement that holds statements
        ({"a.py": "class C:\n    def f(self):\n        import sparkdiag\n"}, "a.py:3: imports"),
        ({"a.py": "try:\n    pass\nexcept OSError:\n    import sparkdiag.x\n"}, "a.py:4: "),
        ({"a.py": "try:\n    pass\nfinally:\n    import sparkdiag\n"}, "a.py:4: imports"),
        ({"a.py": "if 1:\n    pass\nelse:\n    from sparkdiag import y\n"}, "a.py:4: imports"),
        ({"a.py": "for i in ():\n    with open(i):\n        import os, sparkdiag\n"}, "a.py:3"),
        (
            {"a.py": "match 1:\n    case 1:\n        while 1:\n            import sparkdiag\n"},
            "a.py:4: imports",
        ),
        ({"a.py": "X = 1\n", "b.py": "X = 2\n"}, "'X' is bound in a.py and in b.py"),
        ({"a.py": "def log():\n    pass\n", "b.py": "from math import log\n"}, "'log' is bound"),
        ({"a.py": "from os import path\n", "b.py": "from sys import path\n"}, "'path' is bound"),
        (
            {"a.py": f"from {P}.b import X\nY = 1\n", "b.py": f"from {P}.a import Y\nX = 1\n"},
            "in a circle: a, b",
        ),
        ({"a.py": "X = 1\n"}, "defines main()"),
    ],
)
def test_a_room_the_one_namespace_would_change_is_refused(
    tmp_path: Path, files: dict[str, str], refusal: str
) -> None:
    if "main()" not in refusal:
        files = {**files, "z_entry.py": "def main():\n    return 0\n"}
    with pytest.raises(AssemblyError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        assemble(_package(tmp_path, files))


def _older_python() -> str | None:
    """A Python 3.9 or 3.10 that starts: on PATH, or one pyenv installed (its shims on PATH
    name versions that are not its global one, and fail)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for version in ("3.9", "3.10"):
        found = [shutil.which(f"python{version}")]
        found += [str(p) for p in sorted(pyenv.glob(f"{version}.*/bin/python{version}"))]
        for candidate in filter(None, found):
            if subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
                return candidate
    return None


def test_an_older_python_assembles_the_same_script(tmp_path: Path) -> None:
    """script.py runs by its path in whatever Python --probe.python names, 3.9 included (the
    worker's __main__.py): a name that Python lacks (ast.match_case is 3.10's) broke every
    assembly there (a review)."""
    older = _older_python()
    if older is None:
        pytest.skip("no Python 3.9 or 3.10 on PATH")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('s', {str(script.__file__)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['s'] = m\n"
        "spec.loader.exec_module(m)\n"
        "sys.stdout.write(m.assemble())\n"
    )
    done = subprocess.run([older, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == assemble()


def test_a_nested_import_is_named_by_its_first_line(tmp_path: Path) -> None:
    body = "def f():\n    import sparkdiag\n\n\ndef g():\n    import sparkdiag\n"
    folder = _package(tmp_path, {"a.py": body + "\n\ndef main():\n    return 0\n"})
    with pytest.raises(AssemblyError, match=r"a\.py:2: imports sparkdiag inside a function"):
        assemble(folder)


def test_a_room_changed_between_two_assemblies_is_read_again(tmp_path: Path) -> None:
    """Rooms are parsed once for their text (the daemon assembles the worker every cycle): a
    room edited in place, even to the same size, gives the new script, and a room that now
    breaks a rule is refused."""
    folder = _package(tmp_path, {"a.py": "X = 1\n\ndef main():\n    return X\n"})
    assert "X = 1" in assemble(folder)
    (folder / "a.py").write_text("X = 2\n\ndef main():\n    return X\n")
    assert "X = 2" in assemble(folder) and "X = 1" not in assemble(folder)
    (folder / "a.py").write_text("import torch\n\ndef main():\n    return 0\n")
    with pytest.raises(AssemblyError, match="not in the standard library"):
        assemble(folder)


def test_the_same_standard_import_in_two_rooms_is_one_import(tmp_path: Path) -> None:
    folder = _package(
        tmp_path,
        {
            "a.py": "import os\nfrom typing import Any\n",
            "b.py": "import os\nfrom typing import Any, NoReturn\n\ndef main():\n    return 0\n",
        },
    )
    text = assemble(folder)
    assert text.count("import os\n") == 1
    assert "from typing import Any, NoReturn\n" in text
