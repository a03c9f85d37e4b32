"""docs/SECURITY.md names the test that plays each attacker: every one must exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_named_in_the_security_table_exists():
    doc = (ROOT / "docs" / "SECURITY.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", doc))
    assert len(named) >= 20
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    assert named - defined == set()
