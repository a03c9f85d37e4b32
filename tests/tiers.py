"""The fast tier: which tests are pure or unit tests, found from what each test asks for.

A test is a `unit` test when every fixture it uses (directly or through other fixtures) is one
of `CHEAP_FIXTURES` (pytest's own, a temporary directory, the per-test store path) and it is not
marked `slow`, `browser` or `compat`, nor given a timeout of its own. Anything that starts a
system (a Jupyter server, a kernel, the Kubernetes emulator, a Slurm cluster, a browser, a
JobService) is a fixture outside that set, so a new test is classified by what it uses, with no
list to keep. `scripts/test.sh --fast` runs `-m unit` with a per-test timeout of a few seconds:
a unit test that starts processes by hand trips it, and belongs behind a fixture or a `slow`
mark. CI runs every test, unit or not.
"""

from __future__ import annotations

import pytest

# Fixtures that start nothing: pytest's own, the session's warm-pool directory (a path, autouse),
# and the per-test store directory (an environment variable and a path).
CHEAP_FIXTURES = frozenset(
    {
        "request",
        "tmp_path",
        "tmp_path_factory",
        "tmpdir",
        "tmpdir_factory",
        "monkeypatch",
        "capsys",
        "capfd",
        "capsysbinary",
        "capfdbinary",
        "caplog",
        "recwarn",
        "record_property",
        "event_loop_policy",
        "warm_pool_dir",
        "store_dir",
    }
)
SYSTEM_MARKERS = frozenset({"slow", "browser", "compat", "timeout"})


def is_unit(item: pytest.Item) -> bool:
    """Whether `item` uses only cheap fixtures and carries no mark that says it is heavy."""
    # Parametrized arguments appear among the fixture names; they are values, not fixtures.
    callspec = getattr(item, "callspec", None)
    params = set(callspec.params) if callspec is not None else set()
    fixtures = set(getattr(item, "fixturenames", ())) - params
    if not fixtures <= CHEAP_FIXTURES:
        return False
    return not any(mark.name in SYSTEM_MARKERS for mark in item.iter_markers())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "unit: set by tests/tiers.py on tests that use only cheap fixtures (the fast tier: "
        "scripts/test.sh --fast, or -m unit)",
    )


# Before `-m` deselects by mark (pytest's own hook); the conftests' marks added later
# (tests/browser/conftest.py) go to tests whose fixtures already rule them out.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.unit)
