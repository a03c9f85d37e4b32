"""Longest files first: the order test files are handed to xdist's workers.

`scripts/test.sh` runs files in parallel (`--dist loadfile`): a file is one unit of work, given
to whichever worker is free, in collection order. In name order a long file that comes last
keeps one worker busy while the other idles; handing out the longest files first (the
longest-processing-time rule) ends both workers close together. The costs are seconds per
file from a full run (`tests/file_costs.json`, made by `python tests/balance.py LOG` from a run
with `--durations=0`); a file not listed counts as a short one. Only the order changes: which
tests run, and the order within a file, stay as they are.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("file_costs.json")
UNLISTED = 5.0  # seconds: a new or short file


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    costs = json.loads(COSTS.read_text()) if COSTS.exists() else {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(file_of(item.nodeid), index)
    # sorted() is stable: a file's tests keep their order, and ties keep name order.
    items.sort(
        key=lambda item: (
            -costs.get(file_of(item.nodeid), UNLISTED),
            first_seen[file_of(item.nodeid)],
        )
    )


DURATION = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")


def costs_from_log(text: str) -> dict[str, float]:
    """Seconds per file, summed from pytest's `--durations` lines."""
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = DURATION.match(line)
        if match:
            totals[file_of(match.group(2))] += float(match.group(1))
    return {name: round(seconds, 1) for name, seconds in sorted(totals.items())}


if __name__ == "__main__":
    costs = costs_from_log(Path(sys.argv[1]).read_text(errors="replace"))
    COSTS.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"{len(costs)} files, {sum(costs.values()):.0f} s in all -> {COSTS}")
