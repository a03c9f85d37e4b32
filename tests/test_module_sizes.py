"""No product module over 500 lines without a reason in its docstring (issue 24): a module
that grows past it is split along its seams, or says why it is one room."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 500
REASON = "Over 500 lines"


def test_every_module_over_500_lines_says_why_in_its_docstring():
    unexplained = []
    for package in ("jupyterlab_mlcluster", "notebook_controller"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if text.count("\n") > LIMIT:
                doc = ast.get_docstring(ast.parse(text)) or ""
                if REASON not in doc:
                    unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, (
        f"split these along their seams, or say why each is one room ('{REASON}: ...' "
        f"in its docstring): {', '.join(unexplained)}"
    )
