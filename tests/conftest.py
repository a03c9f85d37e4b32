"""Shared fixtures: an isolated job store per test, and checks that nothing is left running."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from helpers import FUZZ, assert_no_job_processes
from hypothesis import settings

# The suite drives the engine as a front end does: it fills the backend registry
# (jobs/backend.py) for every JobService a test makes.
import jupyterlab_mlcluster.backends  # noqa: F401

# Hypothesis (and schemathesis on top of it): derandomised, so a run is repeatable, unless
# MLCLUSTER_FUZZ=1 asks to explore. No example database: nothing carried between runs.
settings.register_profile("mlcluster-ci", derandomize=True, database=None, deadline=None)
settings.register_profile("mlcluster-fuzz", derandomize=False, database=None, deadline=None)
settings.load_profile("mlcluster-fuzz" if FUZZ else "mlcluster-ci")

REPO = Path(__file__).resolve().parent.parent

# The fast tier: tests/tiers.py marks the tests that use only cheap fixtures `unit`; tests/balance.py
# hands the longest test files to xdist first.
pytest_plugins = ["tiers", "balance"]


@pytest.fixture(scope="session", autouse=True)
def warm_pool_dir(tmp_path_factory):
    """Zygotes of this test session live here (not in a developer's pool) and are stopped
    at the end."""
    path = tmp_path_factory.mktemp("warm-pool")
    path.chmod(0o700)  # the pool uses only a directory nobody else may enter
    old = os.environ.get("MLCLUSTER_WARM_POOL_DIR")
    os.environ["MLCLUSTER_WARM_POOL_DIR"] = str(path)
    yield path
    _stop_zygotes(path)
    if old is None:
        os.environ.pop("MLCLUSTER_WARM_POOL_DIR", None)
    else:
        os.environ["MLCLUSTER_WARM_POOL_DIR"] = old


def _stop_zygotes(path: Path) -> None:
    """Stop every zygote of this session's pool: those serving (asked to stop), and those
    still importing (a background build a test's kernel or service started late: killed by
    the pid file the build wrote). Again until the pool stays empty for a second, so a
    build that started while we stopped the others is not left behind."""
    from jupyterlab_mlcluster.jobs import warm
    from jupyterlab_mlcluster.jobs.warm.client import building_pid

    quiet_since = time.monotonic()
    deadline = quiet_since + 30
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 1.0:
        found = []
        for sock in path.glob("zygote-*.sock"):
            try:
                info = warm.request(sock, {"op": "ping"}, timeout=2)
                warm.request(sock, {"op": "stop"}, timeout=2)
                found.append(psutil.Process(info["pid"]))
            except Exception:  # noqa: BLE001 - already gone
                pass
        for pid_file in path.glob("zygote-*.pid"):
            pid = building_pid(path, pid_file.name[len("zygote-") : -len(".pid")])
            try:
                if pid is not None:
                    proc = psutil.Process(pid)
                    proc.kill()
                    found.append(proc)
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=10)
        if found:
            quiet_since = time.monotonic()
        time.sleep(0.1)


@pytest.fixture(params=["warm", "cold"])
def pool_mode(request, monkeypatch):
    """Run a test with ranks from the warm pool and with cold interpreters."""
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1" if request.param == "warm" else "0")
    return request.param


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """A fresh job store for this test; every process started from here inherits it."""
    path = tmp_path / "store"
    monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(path))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
    return path


@pytest.fixture
def service(store_dir):
    from jupyterlab_mlcluster.jobs.service import JobService

    svc = JobService()
    yield svc
    # Nothing of any job may outlive the test.
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)
    assert_no_job_processes(svc)
