"""tests/balance.py: the longest files are handed out first, a file's tests stay together."""

from __future__ import annotations

from types import SimpleNamespace

import balance


def test_costs_are_summed_per_file_from_durations_lines():
    log = (
        "=== slowest durations ===\n"
        "12.50s call     tests/a.py::test_one[x]\n"
        "2.00s setup    tests/a.py::test_one[x]\n"
        "0.50s teardown tests/b/c.py::test_two\n"
        "(5 durations < 0.005s hidden)\n"
    )
    assert balance.costs_from_log(log) == {"tests/a.py": 14.5, "tests/b/c.py": 0.5}


def test_longest_files_first_and_each_files_order_kept(tmp_path, monkeypatch):
    costs = tmp_path / "costs.json"
    costs.write_text('{"tests/long.py": 100, "tests/mid.py": 20}')
    monkeypatch.setattr(balance, "COSTS", costs)
    names = [
        "tests/a.py::t1",
        "tests/long.py::t1",
        "tests/mid.py::t1",
        "tests/a.py::t2",
        "tests/long.py::t2",
        "tests/z.py::t1",
    ]
    items = [SimpleNamespace(nodeid=n) for n in names]
    balance.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/long.py::t1",
        "tests/long.py::t2",
        "tests/mid.py::t1",
        "tests/a.py::t1",
        "tests/a.py::t2",
        "tests/z.py::t1",
    ]
