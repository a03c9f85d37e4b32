"""The warm pool: ranks forked from a CUDA-clean zygote that already imported torch."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
from helpers import process_gone, wait_for

from jupyterlab_mlcluster.jobs import warm as warm_pool
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload


def run(service, code: str, workers: int = 2) -> dict[int, list[str]]:
    record = service.submit(JobSpec.from_options({"workers": workers}), Payload(source=code))
    record = service.wait(record.id, timeout=120)
    assert record.state == JobState.SUCCEEDED, record.error
    out: dict[int, list[str]] = {}
    for line in service.logs(record.id)[0]:
        out.setdefault(line["rank"], []).append(line["line"])
    return out


@pytest.fixture
def warm(monkeypatch):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")


@pytest.mark.slow
def test_ranks_come_warm_and_cold(store_dir, monkeypatch):
    from jupyterlab_mlcluster.jobs.service import JobService

    code = "import sys\nprint('torch' in sys.modules)"
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    # A generation left by an earlier test of the session that preloads less (the kill -9
    # tests pin ["json"]) would serve this job while torch's is built: start from none.
    warm_pool.stop(JobService().config)
    assert run(JobService(), code) == {0: ["True"], 1: ["True"]}
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    assert run(JobService(), code) == {0: ["False"], 1: ["False"]}


def test_zygote_is_cuda_clean_and_ranks_can_use_cuda(service, warm):
    run(service, "pass", workers=1)  # makes sure the zygote is up
    status = warm_pool.status(service.config)
    assert status is not None and "torch" in status["modules"]
    assert status["cuda_initialized"] is False  # asked of the zygote process itself
    assert status["threads"] == 1
    code = textwrap.dedent(
        """
        import torch
        inherited = torch.cuda.is_initialized()   # the fork carries the parent's flag
        available = torch.cuda.is_available()     # must not raise in a forked rank
        if available:
            torch.zeros(1, device="cuda")         # and CUDA must initialise
        print(inherited, available, torch.cuda.is_initialized() == available)
        """
    )
    out = run(service, code)
    for rank in (0, 1):
        inherited, available, consistent = out[rank][0].split()
        assert inherited == "False" and consistent == "True"


def test_forked_ranks_get_their_own_seeds_and_threads(service, warm):
    code = textwrap.dedent(
        """
        import random, torch, numpy, os
        print(random.random(), numpy.random.rand(), torch.rand(1).item(), torch.get_num_threads())
        """
    )
    out = run(service, code, workers=3)
    draws = [out[r][0].split() for r in range(3)]
    for column in range(3):
        assert len({d[column] for d in draws}) == 3, "forked ranks share a random state"
    assert {d[3] for d in draws} == {"1"}  # OMP_NUM_THREADS=1 applied after the fork


def test_warm_ranks_skip_only_the_inherited_torch_teardown(service, warm, tmp_path):
    """torch.library's exit-time finalizers from the zygote's import are skipped in a warm rank
    (costly over shared pages, nothing outside the process sees them); a finalizer or Library
    the rank's own code makes still runs at exit, as in a fresh interpreter."""
    marker = tmp_path / "finalized"
    code = textwrap.dedent(
        f"""
        import os, weakref, torch, torch.library
        registry = weakref.finalize._registry.values()
        inherited = [i for i in registry if i.func.__name__ == "_del_library"]
        lib = torch.library.Library("mlc_rank_" + os.environ["RANK"], "DEF")
        mine = [i for i in weakref.finalize._registry.values() if i.func.__name__ == "_del_library"
                and i not in inherited]
        class Thing: pass
        thing = Thing()
        weakref.finalize(thing, os.mkdir, {str(marker)!r} + os.environ["RANK"])  # at exit
        print(len(inherited) > 0, any(i.atexit for i in inherited), [i.atexit for i in mine])
        """
    )
    out = run(service, code)
    for rank in (0, 1):
        assert out[rank] == ["True False [True]"]
        assert (tmp_path / f"finalized{rank}").exists()  # the rank's own finalizer ran at exit


def test_pool_is_replaced_when_the_environment_changes(service, warm, tmp_path, monkeypatch):
    run(service, "pass", workers=1)
    first = warm_pool.status(service.config)
    # imports may now resolve differently: add an entry, keeping the caller's PYTHONPATH (so
    # the checkout under test stays importable) and guaranteeing the value really changes.
    extended = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*extended, str(tmp_path)]))
    run(service, "pass", workers=1)
    second = warm_pool.status(service.config)
    assert second["pid"] != first["pid"] and second["fingerprint"] != first["fingerprint"]
    # the outdated zygote was asked to go
    wait_for(
        lambda: process_gone(first["pid"]),
        timeout=15,
    )


def test_zygote_notices_installed_packages_and_exits(store_dir, warm, tmp_path, monkeypatch):
    target = tmp_path / "extra-site"
    target.mkdir()
    # keeping the caller's entries, so the checkout under test stays the one imported
    extended = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*extended, str(target)]))
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    run(service, "pass", workers=1)
    before = warm_pool.status(service.config)
    (target / "newpkg").mkdir()  # what `pip install --target extra-site newpkg` does to the dir
    (target / "newpkg" / "__init__.py").write_text("VALUE = 42\n")
    wait_for(
        lambda: process_gone(before["pid"]),
        timeout=warm_pool.SELF_CHECK_INTERVAL + 10,
        message="the outdated zygote to exit",
    )
    out = run(service, "import newpkg, sys\nprint(newpkg.VALUE, 'torch' in sys.modules)", workers=1)
    assert out == {0: ["42 True"]}
    assert warm_pool.status(service.config)["pid"] != before["pid"]


def test_idle_zygote_exits(service, warm, tmp_path, monkeypatch):
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps(
            {"MLClusterConfig": {"warm_pool_idle_timeout": 2, "warm_pool_modules": ["json"]}}
        )
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config_dir))
    from jupyterlab_mlcluster.config import get_config

    config = get_config()
    assert config.warm_pool_idle_timeout == 2
    path = warm_pool.ensure_zygote(config)
    pid = warm_pool.request(path, {"op": "ping"})["pid"]
    wait_for(lambda: not path.exists(), timeout=15, message="idle zygote to exit")
    wait_for(
        lambda: process_gone(pid),
        timeout=5,
    )


def test_a_zygote_whose_socket_another_start_took_exits_and_leaves_that_one(
    service, warm, tmp_path
):
    """Two starts of one generation raced (seen in a CI run): the second put its socket
    where the first's was, and the first listened, unreachable, until its idle timeout
    (30 min), then removed the second's socket as it left."""
    import socket

    path = warm_pool.ensure_zygote(service.config, modules=["json"])
    pid = warm_pool.request(path, {"op": "ping"})["pid"]
    usurper = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = tmp_path / "usurper.sock"
    usurper.bind(str(tmp))
    os.replace(tmp, path)  # as a second zygote's start does
    try:
        wait_for(lambda: process_gone(pid), timeout=30, message="the unreachable zygote to exit")
        assert path.exists(), "the leaving zygote removed the other start's socket"
    finally:
        usurper.close()
        path.unlink(missing_ok=True)


def test_disabled_pool_starts_nothing(store_dir, monkeypatch, tmp_path):
    from jupyterlab_mlcluster.jobs.service import JobService

    pool = tmp_path / "empty-pool"
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    monkeypatch.setenv("MLCLUSTER_WARM_POOL_DIR", str(pool))
    assert run(JobService(), "import sys\nprint('torch' in sys.modules)", workers=1) == {
        0: ["False"]
    }
    assert not pool.exists() or not list(pool.iterdir())


def test_idle_pool_memory_is_reported(service, warm):
    run(service, "pass", workers=1)
    status = warm_pool.status(service.config)
    assert status["rss_bytes"] > 50 * 1024**2  # torch is in there
    assert status["uss_bytes"] is None or 0 < status["uss_bytes"] <= status["rss_bytes"]


def test_pool_command_reports_memory_and_cuda_state(store_dir, warm):
    from helpers import run_cli

    assert run_cli("pool", "start").returncode == 0
    out = run_cli("pool", "status").stdout
    assert (
        re.search(r"memory \d+ MiB PSS, \d+ MiB RSS", out)
        and "CUDA initialised: False" in out
        and "torch" in out
    )
    assert run_cli("pool", "stop").stdout.strip() == "stopped"
    assert "no warm pool is running" in run_cli("pool", "status").stdout
