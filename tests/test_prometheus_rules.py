"""The shipped Prometheus rules: promtool validates them and runs their unit tests, and the alert
names, labels and annotations keep the contract in docs/metrics.md.

PyYAML is not a dependency, so the rule and test files are read with ``load_yaml_subset`` below:
a strict reader of the block-style YAML those files are written in (block mappings and
sequences, ``|``/``>`` block scalars, quoted and one-line plain scalars, ``[]`` and ``{}``). It
raises on anything else instead of guessing, and its reading of the rule file is checked against
promtool's own count of rules, so a layout it misreads fails the tests rather than passing them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, promtool

RULES = ROOT / "prometheus" / "sparkdiag-rules.yml"
RULE_TESTS = sorted((ROOT / "prometheus" / "tests").glob("*.yml"))
CONTRACT = ROOT / "docs" / "metrics.md"


# --------------------------------------------------------------------------- YAML subset reader


class YamlSubsetError(ValueError):
    """The text uses YAML this reader does not handle (or is not valid YAML)."""


_KEY = re.compile(r"^([A-Za-z0-9_.-]+):(?:[ ]+(.*))?$")
_BLOCK_SCALAR = re.compile(r"^([|>])([+-]?)$")


def _significant(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


class _Reader:
    def __init__(self, text: str) -> None:
        if "\t" in text:
            raise YamlSubsetError("tabs are not supported")
        self.lines = text.splitlines()
        self.pos = 0

    def error(self, message: str) -> YamlSubsetError:
        return YamlSubsetError(f"line {self.pos + 1}: {message}")

    def peek(self) -> tuple[int, str] | None:
        """(indent, content) of the next significant line, skipping blanks and comments."""
        while self.pos < len(self.lines) and not _significant(self.lines[self.pos]):
            self.pos += 1
        if self.pos == len(self.lines):
            return None
        line = self.lines[self.pos]
        return len(line) - len(line.lstrip(" ")), line.strip()

    def document(self) -> Any:
        head = self.peek()
        if head is None:
            return None
        value = self.block(head[0])
        if self.peek() is not None:
            raise self.error("unexpected content after the document")
        return value

    def block(self, indent: int) -> Any:
        head = self.peek()
        assert head is not None
        if head[1] == "-" or head[1].startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent)

    def sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while (head := self.peek()) is not None and head[0] == indent:
            content = head[1]
            if not (content == "-" or content.startswith("- ")):
                break
            rest = content[1:].strip()
            if not rest:
                self.pos += 1
                nxt = self.peek()
                if nxt is None or nxt[0] <= indent:
                    items.append(None)
                else:
                    items.append(self.block(nxt[0]))
            elif _KEY.match(rest):
                # "- key: value" starts a mapping whose keys sit two columns further in
                line = self.lines[self.pos]
                self.lines[self.pos] = line.replace("-", " ", 1)
                items.append(self.mapping(indent + 2))
            else:
                self.pos += 1
                items.append(self.inline(rest))
        return items

    def mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (head := self.peek()) is not None and head[0] == indent:
            if head[1].startswith("- ") or head[1] == "-":
                break
            match = _KEY.match(head[1])
            if match is None:
                raise self.error(f"expected 'key: value', got {head[1]!r}")
            key, rest = match.group(1), (match.group(2) or "").strip()
            if key in result:
                raise self.error(f"duplicate key {key!r}")
            self.pos += 1
            result[key] = self.value(rest, indent)
        if (head := self.peek()) is not None and head[0] > indent:
            raise self.error("unexpected indentation")
        return result

    def value(self, rest: str, indent: int) -> Any:
        if rest and not rest.startswith("#"):
            block = _BLOCK_SCALAR.match(rest)
            if block:
                return self.block_scalar(indent, folded=block.group(1) == ">", chomp=block.group(2))
            return self.inline(rest)
        nxt = self.peek()
        if nxt is None:
            return None
        if nxt[0] > indent:
            return self.block(nxt[0])
        if nxt[0] == indent and (nxt[1] == "-" or nxt[1].startswith("- ")):
            return self.sequence(indent)  # a sequence may sit at its key's indentation
        return None

    def block_scalar(self, indent: int, folded: bool, chomp: str) -> str:
        body: list[str] = []
        block_indent: int | None = None
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.strip():
                current = len(line) - len(line.lstrip(" "))
                if current <= indent:
                    break
                if block_indent is None:
                    block_indent = current
                elif current < block_indent:
                    raise self.error("block scalar line indented less than its first line")
                if folded and current > block_indent:
                    raise self.error("more-indented lines in a folded scalar are not supported")
                body.append(line[block_indent:])
            else:
                body.append("")
            self.pos += 1
        while body and not body[-1]:
            body.pop()
        if folded:
            text = ""
            for i, line in enumerate(body):
                if i and line and body[i - 1]:
                    text += " "
                text += line if line else "\n"
        else:
            text = "\n".join(body)
        return text if chomp == "-" or not text else text + "\n"

    def inline(self, text: str) -> Any:
        if text == "[]":
            return []
        if text == "{}":
            return {}
        if text[0] == "'":
            if len(text) < 2 or not text.endswith("'"):
                raise self.error(f"unterminated single-quoted scalar {text!r}")
            inner = text[1:-1]
            if re.search(r"(?<!')'(?!')", inner.replace("''", "")):
                raise self.error(f"stray quote in {text!r}")
            return inner.replace("''", "'")
        if text[0] == '"':
            if len(text) < 2 or not text.endswith('"') or "\\" in text:
                raise self.error(f"unsupported double-quoted scalar {text!r}")
            return text[1:-1]
        if text[0] in "[]{}&*!|>%@`,?":
            raise self.error(f"unsupported scalar {text!r}")
        text = re.split(r"\s#", text, maxsplit=1)[0].rstrip()
        if ": " in text or text.endswith(":"):
            raise self.error(f"ambiguous plain scalar {text!r}: quote it")
        return text


def load_yaml_subset(text: str) -> Any:
    """Parse the block-style YAML subset described in the module docstring.

    Scalars stay strings (``for: 5m`` -> ``"5m"``, ``gpu: "3"`` -> ``"3"``).
    """
    return _Reader(text).document()


# --------------------------------------------------------------------------- helpers


def rule_groups() -> list[dict[str, Any]]:
    document = load_yaml_subset(RULES.read_text(encoding="utf-8"))
    assert isinstance(document, dict) and isinstance(document.get("groups"), list)
    groups: list[dict[str, Any]] = document["groups"]
    return groups


def all_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in all_rules() if "alert" in rule]


def contract_alert_names() -> list[str]:
    """Alert names from the table under '## Alert names' in docs/metrics.md."""
    text = CONTRACT.read_text(encoding="utf-8")
    section = text.split("## Alert names", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^\|\s*`(Sparkdiag\w+)`\s*\|", section, flags=re.MULTILINE)
    assert names, "no alert names found in docs/metrics.md"
    return names


# Go's collector at GOGC 400 rather than its 100 unless the environment says otherwise: a fifth
# less CPU for promtool's unit tests here (16 -> 13 s for the ten files, probe.yml 4.4 -> 3.5 s),
# at most about 120 MB held where 65 MB were
GO_ENV = {**os.environ, "GOGC": os.environ.get("GOGC", "400")}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=GO_ENV,
    )


# --------------------------------------------------------------------------- promtool


@pytest.mark.promtool
def test_promtool_check_rules() -> None:
    result = run("check", "rules", "--lint=all", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"SUCCESS: (\d+) rules found", result.stdout)
    assert found, result.stdout
    # the YAML subset reader sees the same rules promtool sees
    assert int(found.group(1)) == len(all_rules())


@pytest.mark.promtool
@pytest.mark.parametrize(
    "path", RULE_TESTS or [None], ids=[path.name for path in RULE_TESTS] or ["none"]
)
def test_promtool_test_rules(path: Path | None) -> None:
    """Each file of prometheus/tests/, one promtool a file: promtool tests the files of one
    run one after the other on one core (21 s of CPU for the ten files here), and a test a file
    lets pytest-xdist's workers share them (a pool of one promtool a CPU inside one test
    competed with the other worker)."""
    assert path is not None, "no promtool unit tests under prometheus/tests/"
    result = run("test", "rules", str(path.relative_to(ROOT)))
    assert result.returncode == 0, f"{path}:\n{result.stdout}{result.stderr}"


# --------------------------------------------------------------------------- contract


def test_every_contract_alert_appears_and_a_name_has_one_rule_per_severity() -> None:
    """A contract alert is shipped; a name used by several rules (SparkdiagXidError: one per
    XID tier) gives each rule its own severity, so that no two rules of a name overlap."""
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    for name in contract_alert_names():
        assert name in names, f"{name} is not shipped"
    pairs = [(rule["alert"], rule["labels"]["severity"]) for rule in rules]
    assert len(pairs) == len(set(pairs)), "two rules share an alert name and a severity"


def test_extra_alerts_and_recordings_are_prefixed() -> None:
    contract = set(contract_alert_names())
    for rule in all_rules():
        if "alert" in rule:
            assert rule["alert"] in contract or rule["alert"].startswith("Sparkdiag"), rule
        else:
            assert rule["record"].startswith("sparkdiag:"), rule


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(r, id=f"{r['alert']}-{r.get('labels', {}).get('severity')}")
        for r in alert_rules()
    ],
)
def test_alert_has_severity_for_and_annotations(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert rule.get("labels", {}).get("severity") in {"warning", "critical"}
    assert re.fullmatch(r"\d+[smh]", rule.get("for") or ""), f"{name} needs a 'for'"
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description"):
        assert isinstance(annotations.get(key), str) and annotations[key].strip(), key
    # the alert says where: every alert names the node
    assert "$labels.instance" in annotations["summary"] + annotations["description"]


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        document = load_yaml_subset(path.read_text(encoding="utf-8"))
        assert document["rule_files"] == ["../sparkdiag-rules.yml"], path
        for case in document["tests"]:
            for check in case.get("alert_rule_test") or []:
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    for rule in alert_rules():
        assert rule["alert"] in fires, f"no unit test where {rule['alert']} fires"
        assert rule["alert"] in quiet, f"no unit test where {rule['alert']} stays quiet"


def test_the_alert_table_of_prometheus_readme_holds_every_rule_with_its_severity_and_for() -> None:
    """prometheus/README.md's table is what a reader sees of the rules: a row a rule (a name
    with two rules has a row for each), with the rule's severity and ``for``. (The
    ThermalInt4Degradation row once said 10m and named series the rule no longer read.)"""
    readme = (ROOT / "prometheus" / "README.md").read_text(encoding="utf-8")
    rows = []
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        named = re.match(r"`(Sparkdiag\w+)`", cells[0]) if line.startswith("| `") else None
        if named and len(cells) >= 5:
            rows.append((named.group(1), cells[2], cells[3]))
    rules = [(r["alert"], r["labels"]["severity"], r["for"]) for r in alert_rules()]
    assert sorted(rows) == sorted(rules)


# --------------------------------------------------------------------------- the reader itself


def test_yaml_subset_reader() -> None:
    text = """\
# comment
groups:
  - name: g   # trailing comment
    rules:
      - alert: A
        expr: |
          up == 0
          # a PromQL comment stays
        labels:
          severity: warning
        annotations:
          description: >-
            one
            two

            three
  - name: 'it''s'
    rules: []
items:
- "3"
- x
"""
    assert load_yaml_subset(text) == {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "A",
                        "expr": "up == 0\n# a PromQL comment stays\n",
                        "labels": {"severity": "warning"},
                        "annotations": {"description": "one two\nthree"},
                    }
                ],
            },
            {"name": "it's", "rules": []},
        ],
        "items": ["3", "x"],
    }


@pytest.mark.parametrize(
    "text",
    [
        "a: b: c\n",  # ambiguous plain scalar
        "a: {b: c}\n",  # flow mapping
        "a: b\n  c: d\n",  # continuation line
        "a: 1\na: 2\n",  # duplicate key
        "a: 'open\n",  # unterminated quote
    ],
)
def test_yaml_subset_reader_rejects_what_it_does_not_handle(text: str) -> None:
    with pytest.raises(YamlSubsetError):
        load_yaml_subset(text)
