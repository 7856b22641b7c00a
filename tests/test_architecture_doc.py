"""docs/architecture.md stays true: every path and name it gives in backticks exists.

The page is where a newcomer starts, and it drifted (issue 34 found seven paths that no longer
existed and a function given the wrong arguments). Each backticked span is read as what it looks
like and looked up:

* a path (``sources/nvml/queries.py``, ``probe/worker/``): a file or folder of the repository or of
  ``sparkdiag/``; a bare file name (``poller.py``) a file of the package its table row is about,
  else of ``sparkdiag/`` or ``tests/fixtures/``;
* ``PATH: NAME``: NAME is defined in that file (``def``, ``class``, an assignment or a field);
* a dotted name (``config.OPTIONS``, ``Poller.poll_once()``, ``runner.worker_source``): a module
  of sparkdiag (by its last part, ``runner`` for ``sparkdiag.probe.runner``) or a class, and
  the attribute on it;
* a capitalised or ``snake_case`` name (``CycleRecord``, ``check_gpu_indices``): defined in
  sparkdiag (an alert name in the rules);
* a call written with its arguments (``each_gpu(name, check)``): those are the function's
  parameters, in order.

Commands, flags, metric and label names, plain words and code with spaces in it are text, not
looked up. README.md's and docs/development.md's repository paths are held to the same rule.
The layer list is held to tests/test_layers.py.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.test_layers import LAYERS

PACKAGE = ROOT / "sparkdiag"
DOC = ROOT / "docs" / "architecture.md"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FILE = re.compile(r"^[\w.*/-]+\.(py|md|json|yml|yaml|toml|txt|sh)$")
PLACEHOLDER = re.compile(r"(?<![A-Za-z])(NAME|ROOM|MODE|DIR|KIND)(?![a-z])|[*…$]|^_[a-z]")


def spans(text: str) -> Iterator[tuple[str, str]]:
    """(span, the table row's package or "") for every backticked span of ``text``."""
    for line in text.splitlines():
        first = re.match(r"\| `(sparkdiag/[\w/]+/)`", line)
        package = first.group(1) if first else ""
        for span in re.findall(r"`([^`\n]+)`", line):
            yield span, package


@functools.cache
def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


@functools.cache
def _test_support() -> dict[Path, str]:
    support = ROOT / "tests" / "support"
    return {p: p.read_text(encoding="utf-8") for p in support.rglob("*.py")}


def _defines(text: str, name: str) -> bool:
    return bool(
        re.search(rf"^\s*(async\s+def|def|class)\s+{name}\b", text, re.M)
        or re.search(rf"^\s*{name}\s*(:[^=\n]*)?=", text, re.M)
        or re.search(rf"^\s+{name}\s*:", text, re.M)  # a dataclass field
        or re.search(rf"^\s*{name}\s*,?\s*$", text, re.M)  # a name in an import list
    )


def _defined_anywhere(name: str) -> bool:
    texts = [*_sources().values(), *_test_support().values()]
    if any(_defines(text, name) for text in texts):
        return True
    rules = (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text(encoding="utf-8")
    return f"alert: {name}\n" in rules


def _find_path(path: str, package: str) -> list[Path]:
    """Where ``path`` (relative) is: under the row's package for a bare name, else the repo or
    sparkdiag/; bare names also anywhere in sparkdiag/ and tests/fixtures/."""
    clean = path.rstrip("/")
    bases = [ROOT, PACKAGE, *([ROOT / package] if package else [])]
    found = [base / clean for base in bases if (base / clean).exists()]
    if found or "/" in clean:
        return found
    roots = [ROOT / package] if package else [PACKAGE, ROOT / "tests" / "fixtures"]
    return [p for root in roots for p in root.rglob(clean)] or list(PACKAGE.rglob(clean))


def _module_or_class(name: str) -> list[object]:
    """Modules of sparkdiag whose last part is ``name``, and classes of that name."""
    found: list[object] = []
    for path, text in _sources().items():
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if dotted.rsplit(".", 1)[-1] == name or dotted == f"sparkdiag.{name}":
            found.append(importlib.import_module(dotted))
        elif re.search(rf"^(class|def) {name}\b", text, re.M):
            found.append(getattr(importlib.import_module(dotted), name))
    return found


def _has(owner: object, attr: str) -> bool:
    if hasattr(owner, attr):
        return True
    fields = getattr(owner, "__dataclass_fields__", {})
    annotations = getattr(owner, "__annotations__", {})
    return attr in fields or attr in annotations


def _parameters_match(owner: object, call: str) -> str:
    """'' when ``call``'s written arguments are ``owner``'s parameters, else why not."""
    written = [a.strip() for a in call[call.index("(") + 1 : call.rindex(")")].split(",")]
    written = [a for a in written if a]
    if not callable(owner) or (written and written[-1] == "..."):
        return ""
    params = [p for p in inspect.signature(owner).parameters.values() if p.name != "self"]
    names = [p.name for p in params]
    required = [p.name for p in params if p.default is p.empty and p.kind != p.VAR_KEYWORD]
    if not written or (names[: len(written)] == written and len(written) >= len(required)):
        return ""
    return f"its parameters are ({', '.join(names)})"


def _dotted(span: str) -> str:
    """'' when ``a.b.c`` (or ``a.b(...)``) resolves, else why not."""
    call = span if "(" in span else ""
    words = span.split("(")[0].split(".")
    owners: list[object] = []
    for module in (".".join(words[:n]) for n in range(len(words), 0, -1)):
        try:
            owners = [importlib.import_module(f"sparkdiag.{module}")]
        except ImportError:
            continue
        words = words[len(module.split(".")) :]
        break
    else:
        owners, words = _module_or_class(words[0]), words[1:]
        if not owners and words:  # the standard library's or a dependency's: sys.exit
            with contextlib.suppress(ImportError):
                owners = [importlib.import_module(span.split(".")[0])]
    for owner in owners:
        target: object = owner
        for word in words:
            if not _has(target, word):
                break
            target = getattr(target, word, None)
        else:
            return _parameters_match(target, call) if call else ""
    return "no such module, class or attribute"


def problem(span: str, package: str) -> str:
    """Why ``span`` does not exist ('' when it does, or is not a path or a name)."""
    if span.startswith(("-", "/", "sparkdiag ", "sparkdiag_")) or PLACEHOLDER.search(span):
        return ""
    path, _, names = span.partition(": ")
    if FILE.match(path) or path.endswith("/"):
        found = _find_path(path, package)
        if not found and path.endswith(".json") and "/" not in path:  # a state file's name
            found = [p for p, text in _sources().items() if f'"{path}"' in text]
        if not found:
            return "no such file or folder"
        name = IDENT.match(names)
        if names and name and not names.endswith(".json"):
            texts = [p.read_text(encoding="utf-8") for p in found if p.is_file()]
            if not any(_defines(text, name.group()) for text in texts):
                return f"{name.group()} is not defined there"
            if "(" in names and "." not in names.split("(")[0]:
                return _dotted(f"{_module_of(found[0])}.{names}")
        return ""
    if " " in span.split("(")[0] or not IDENT.match(span):
        if re.fullmatch(r"\w+ = (\w+\(.*\))", span):  # check_x = each_gpu(name, check)
            return _dotted(span.split(" = ")[1])
        return ""
    if re.fullmatch(r"[\w.]+(\(.*\))?", span) and "." in span.split("(")[0]:
        return _dotted(span)
    word = span.split("(")[0]
    if re.fullmatch(r"[A-Z_][A-Za-z0-9_]*|_?[a-z0-9]+(_[a-z0-9]+)+", word) and word != "None":
        return "" if _defined_anywhere(word) else "not defined in sparkdiag"
    return ""


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def test_every_path_and_name_the_architecture_page_gives_exists() -> None:
    wrong = [
        f"`{span}`: {why}"
        for span, package in spans(DOC.read_text(encoding="utf-8"))
        if (why := problem(span, package))
    ]
    assert wrong == []


@pytest.mark.parametrize("page", ["README.md", "docs/development.md"])
def test_the_repository_paths_of_the_readme_and_the_development_page_exist(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    paths = {
        span
        for span, _ in spans(text)
        if "/" in span
        and " " not in span
        and not span.startswith(("/", "http", ".venv", "~"))
        and (FILE.match(span) or span.endswith("/"))
        and not PLACEHOLDER.search(span)
    }
    assert sorted(p for p in paths if not _find_path(p, "")) == []


def test_the_layer_list_is_the_one_tests_hold() -> None:
    """The page's list, bottom first (``N  name, name/, ...   what they are``, names going on
    on the next line), is tests/test_layers.py's LAYERS."""
    block = DOC.read_text(encoding="utf-8").split("Bottom first:\n\n", 1)[1].split("\n\n")[0]
    layers: list[set[str]] = []
    for line in block.splitlines():
        names = re.split(r"\s{3,}", line.strip(), maxsplit=1)[0]
        if names.split()[0].isdigit():
            layers.append(set())
            names = names.split(maxsplit=1)[1]
        layers[-1] |= {name.strip().rstrip("/") for name in names.split(",") if name.strip()}
    assert layers == [set(names) - {"__init__"} for names in LAYERS]


def test_the_checker_finds_what_drifted() -> None:
    """What issue 34 found, seen by the checks above."""
    assert problem("probe/baseline.py", "") == "no such file or folder"
    assert problem("compare/diagnosis.py", "") == "no such file or folder"
    assert problem("sources/nvml/queries.py: QUERY_TABLE", "") == "QUERY_TABLE is not defined there"
    assert problem("check_x = each_gpu(name, fn, doc)", "") == "its parameters are (name, check)"
    assert problem("sources.backends.make_backend", "") == "no such module, class or attribute"
    assert problem("check/soak_check.py", "") == "no such file or folder"
    assert problem("Poller.poll_twice()", "") == "no such module, class or attribute"
    assert problem("store_health.py", "sparkdiag/scheduling/") == "no such file or folder"
    assert problem("CycleRecords", "") == "not defined in sparkdiag"
    assert problem("check_x = each_gpu(name, check)", "") == ""
    assert problem("flags.settings_options(command)", "") == ""
