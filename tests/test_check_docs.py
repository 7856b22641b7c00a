"""docs/check.md lists every row of the check catalogue, generated from it (issue 32: the page
the README calls the one for "every check" named none of the 32 rows)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkdiag.check import catalog, docs
from sparkdiag.check.model import CheckContext, CheckResult
from tests.support import ROOT

PAGE = ROOT / "docs" / "check.md"


def test_the_page_is_the_catalogue() -> None:
    page = PAGE.read_text()
    assert docs.splice(page) == page, "docs/check.md is stale: python scripts/check_docs.py --write"
    listed = [line.split("`")[1] for line in page.splitlines() if line.startswith("| `")]
    assert listed == [name for name, _ in catalog.CHECKS]
    assert len(listed) >= 32


def test_every_check_says_what_it_checks() -> None:
    for name, check in catalog.CHECKS:
        assert len(docs.description(check).split()) >= 3, name  # "Persistence mode on."
        # the kind is the module the check's own code is in (each_gpu keeps it)
        module = ROOT / "sparkdiag" / "check" / f"{docs.kind(check)}_checks.py"
        assert module.exists(), (name, module)
        assert f'"{name}"' in module.read_text(), (name, module)


def test_a_row_added_to_the_catalogue_appears_by_regenerating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other branches add rows (storage, native software, memory): the integrator regenerates."""

    def check_storage(ctx: CheckContext) -> list[CheckResult]:
        """Each NVMe drive reads at its link's speed; a slower one | warns."""
        return []

    monkeypatch.setattr(catalog, "CHECKS", (*catalog.CHECKS, ("storage", check_storage)))
    page = PAGE.read_text()
    fresh = docs.splice(page)
    assert fresh != page  # the committed page is now stale: the test above would fail
    row = next(line for line in fresh.splitlines() if line.startswith("| `storage` "))
    assert row == (
        "| `storage` | test_check_docs | no | Each NVMe drive reads at its link's speed; a "
        "slower one \\| warns. |"
    )
    assert fresh.count(docs.BEGIN) == fresh.count(docs.END) == 1


def test_the_script_says_the_page_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lists every check" in done.stdout
