"""How many examples a property-based (hypothesis) test tries: every one it asks for in a full
run (CI's ``./scripts/test`` runs all the tests), a quarter of them (at least 25) in a run that
leaves the slow kinds out (``pytest -m "not slow"``, the quick subset of the README's "Tests"),
where they cost about 20 s of the 2-core machine's time. tests/conftest.py sets :data:`quick`
before any test module is imported (and so before the decorators read it)."""

from __future__ import annotations

QUICK_SHARE = 4
QUICK_FLOOR = 25
quick = False


def examples(n: int) -> int:
    """``max_examples`` for a test that asks for ``n``: ``n``, or its quick share."""
    if not quick:
        return n
    return max(min(n, QUICK_FLOOR), n // QUICK_SHARE)
