"""docs/check.md's table of every check, from the catalogue (sparkdiag/check/catalog.py).

    PYTHONPATH=$PWD .venv/bin/python scripts/check_docs.py           # exit 1 when it is stale
    PYTHONPATH=$PWD .venv/bin/python scripts/check_docs.py --write   # regenerate the table

Only the section between the generated-section markers is rewritten; the prose around it is
the page's own. tests/test_check_docs.py runs the same comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "check.md"


def main() -> int:
    from sparkdiag.check.docs import splice

    page = PAGE.read_text()
    fresh = splice(page)
    if "--write" in sys.argv[1:]:
        PAGE.write_text(fresh)
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    if fresh != page:
        print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/check_docs.py --write")
        return 1
    print(f"{PAGE.relative_to(ROOT)} lists every check of the catalogue")
    return 0


if __name__ == "__main__":
    sys.exit(main())
