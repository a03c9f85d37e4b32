"""The warm pool learns what to preload: generations, the CUDA/thread check, memory.

Played packages on PYTHONPATH stand in for a notebook's imports (transformers itself is
for bench/bench_start.py: it takes seconds to import)."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import tempfile
import textwrap
import threading

import pytest
from helpers import process_gone, run_cli, wait_for

from jupyterlab_mlcluster.jobs import warm
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.warm import preload
from jupyterlab_mlcluster.runtime.payload import Payload

PACKAGES = {
    # a plain package: records the process that imported it
    "warmprobe": "import os\nPID = os.getpid()\n",
    # a slow one, to see the old generation serve while the new one builds
    "slowprobe": "import time\ntime.sleep(3)\n",
    # one more the kernel imports later
    "lateprobe": "",
    # marks torch's CUDA as initialised, as a module touching the GPU at import would
    "cudamarker": "import torch\ntorch.cuda._initialized = True\n",
    # starts a thread at import: forking past it is unsafe
    "threadstarter": (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='ticker', daemon=True).start()\n"
    ),
}

PROBE = textwrap.dedent(
    """
    import os, sys, psutil
    loaded = [m for m in ("warmprobe", "slowprobe", "gateprobe", "cudamarker", "threadstarter") if m in sys.modules]
    zygote = psutil.Process(os.getppid()).ppid()   # rank -> supervisor -> zygote
    import warmprobe
    print(",".join(loaded) or "-", zygote, warmprobe.PID != os.getpid())
    """
)


@pytest.fixture
def pool(store_dir, tmp_path, monkeypatch):
    """A pool directory of this test's own, played packages on PYTHONPATH, no pinned
    modules (so each generation builds in a moment); every zygote stopped at the end."""
    played = tmp_path / "played"
    for name, source in PACKAGES.items():
        (played / name).mkdir(parents=True)
        (played / name / "__init__.py").write_text(source)
    extended = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*extended, str(played)]))
    monkeypatch.syspath_prepend(str(played))  # as in the kernel, which imported them
    # (a unix socket's path must be short: not under pytest's deep tmp_path)
    directory = tempfile.mkdtemp(prefix="pool-")
    monkeypatch.setenv("MLCLUSTER_WARM_POOL_DIR", directory)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"warm_pool_modules": []}})
    )
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    yield service
    pids = [g["pid"] for g in warm.pool_status(service.config)["generations"]]
    warm.stop(service.config)
    for pid in pids:
        wait_for(lambda pid=pid: process_gone(pid), timeout=15)
    shutil.rmtree(directory, ignore_errors=True)


def run(service, learned: list[str], source: str = PROBE) -> tuple[str, int, bool]:
    """One rank of PROBE, submitted as a kernel would with `learned` imported."""
    record = service.submit(
        JobSpec.from_options({"workers": 1}),
        Payload(source=source),
        preload=preload.candidates(learned),
    )
    record = service.wait(record.id, timeout=120)
    assert record.state == JobState.SUCCEEDED, record.error
    loaded, zygote, elsewhere = service.logs(record.id)[0][-1]["line"].split()
    return loaded, int(zygote), elsewhere == "True"


def test_unsafe_packages_are_refused_and_the_rest_preloaded(pool):
    loaded, zygote, elsewhere = run(pool, ["warmprobe", "cudamarker", "threadstarter", "json"])
    # inside the rank, before its code ran: imported, and by another process (the zygote)
    assert loaded == "warmprobe" and elsewhere
    refused = warm.refused_modules()
    assert refused["cudamarker"] == "it initialised CUDA on import"
    assert refused["threadstarter"].startswith("it started a thread (ticker)")
    status = warm.status(pool.config)  # asked of the zygote process itself
    assert status["pid"] == zygote and status["modules"] == ["warmprobe"]
    assert status["cuda_initialized"] is False and status["threads"] == 1
    # a refused package is never asked for again
    assert warm.requested_modules(pool.config, ["warmprobe", "cudamarker"]) == ["warmprobe"]


def test_old_generation_serves_while_the_new_one_builds(pool):
    _, first, _ = run(pool, ["warmprobe"])
    # the kernel imported one more package: the job is not kept waiting for it ...
    loaded, served_by, _ = run(pool, ["warmprobe", "slowprobe"])
    assert loaded == "warmprobe" and served_by == first
    # ... the next one starts from the new generation, and the old one retires
    wait_for(lambda: len(warm.pool_status(pool.config)["generations"]) == 2, timeout=60)
    loaded, served_by, _ = run(pool, ["warmprobe", "slowprobe"])
    assert loaded == "warmprobe,slowprobe" and served_by != first
    wait_for(lambda: process_gone(first), timeout=15, message="the superseded generation to go")

    report = warm.pool_status(pool.config)
    (generation,) = report["generations"]
    assert generation["pid"] == served_by
    assert 0 < generation["uss_bytes"] <= generation["pss_bytes"] <= generation["rss_bytes"]
    out = run_cli("pool", "status").stdout
    assert re.search(rf"generation pid {served_by}: .*\d+ MiB PSS", out), out
    assert "slowprobe" in out

    # over the memory bound: the pool learns no more (and says so), the old one serves on
    pool.config.warm_pool_max_memory = 1
    with pytest.warns(RuntimeWarning, match="not learning more modules"):
        path = warm.serving_generation(pool.config, ["warmprobe", "slowprobe", "lateprobe"])
    assert warm.request(path, {"op": "ping"})["pid"] == served_by
    assert [g["pid"] for g in warm.pool_status(pool.config)["generations"]] == [served_by]


# Its import waits (up to 5 minutes) for a file the test writes: a build held open.
GATED = "import os, time\n_end = time.monotonic() + 300\nwhile not os.path.exists({gate!r}) and time.monotonic() < _end:\n    time.sleep(0.02)\n"


def test_a_job_waits_only_for_a_build_that_has_what_its_code_imports(pool, tmp_path, monkeypatch):
    """The kernel learned gateprobe and its generation is being built, held open by the test:
    a cell that does not import it starts at once on the ready generation; one that does
    waits for that generation (rather than start from the nearest one, whose every rank
    would import it at once on the cores the build is using) and starts from it."""
    gate = tmp_path / "gate"
    (tmp_path / "played" / "gateprobe").mkdir()
    (tmp_path / "played" / "gateprobe" / "__init__.py").write_text(GATED.format(gate=str(gate)))
    importlib.invalidate_caches()
    # A build held open is waited for as long as the test holds it, not given up on.
    monkeypatch.setattr(warm.serving, "START_TIMEOUT", 600.0)
    _, first, _ = run(pool, ["warmprobe"])
    learned = preload.candidates(["warmprobe", "gateprobe"])
    assert learned == ["warmprobe", "gateprobe"]
    assert warm.learn_ahead(pool.config, learned)  # the build starts, and blocks on the gate

    results: dict[str, tuple[str, int, bool]] = {}
    free = threading.Thread(target=lambda: results.update(free=run(pool, learned)))
    free.start()
    free.join(timeout=90)
    assert not free.is_alive(), "a cell not importing gateprobe waited for its build"
    assert results["free"][:2] == ("warmprobe", first)
    assert warm.client._build_underway()  # (the gate is still shut: nothing could finish it)

    gated = threading.Thread(
        target=lambda: results.update(gated=run(pool, learned, PROBE + "import gateprobe\n"))
    )
    gated.start()
    wait_for(lambda: pool.list()[1] == 3, timeout=60, message="the gated cell's submit")
    assert gated.is_alive()
    gate.write_text("")
    gated.join(timeout=120)
    assert not gated.is_alive()
    loaded, served_by, _ = results["gated"]
    assert loaded == "warmprobe,gateprobe" and served_by != first


def test_the_next_cell_goes_straight_to_the_generation_that_served_it(pool, monkeypatch):
    """A submitter remembers which generation covered its wish: the same wish is sent there
    without asking every generation again; once that one is gone, it chooses afresh."""
    _, first, _ = run(pool, ["warmprobe"])

    def asked(*_args, **_kwargs):
        raise AssertionError("every generation was asked again for the same wish")

    with monkeypatch.context() as patched:
        patched.setattr(warm.serving, "_generations", asked)
        loaded, served_by, _ = run(pool, ["warmprobe"])
    assert loaded == "warmprobe" and served_by == first
    warm.stop(pool.config)
    wait_for(lambda: process_gone(first), timeout=15, message="the stopped generation to go")
    loaded, served_by, _ = run(pool, ["warmprobe"])  # still warm, from a new generation
    assert loaded == "warmprobe" and served_by != first


def test_a_kernels_new_import_is_learned_at_its_next_cell(tmp_path, monkeypatch):
    (tmp_path / "newcomer").mkdir()
    (tmp_path / "newcomer" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # an installed package's place
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "newcomer", raising=False)
    assert "newcomer" not in preload.kernel_modules()
    import newcomer  # noqa: F401 - the kernel imports it between two cells

    assert "newcomer" in preload.kernel_modules()


def test_what_a_jobs_own_code_imports_is_read_never_run(tmp_path):
    """What decides whether a job waits for a build: every import statement of its code,
    wherever it is; None (so it waits, as before) where that cannot be known."""
    source = textwrap.dedent(
        """
        import a.b, c as see
        from d import e
        from n import *
        from . import local
        from .x import y
        def f():
            import g
            from h.i import j
        class K:
            try:
                import m
            except ImportError:
                pass
        raise SystemExit("never run")
        """
    )
    assert sorted(preload.code_imports(source)) == sorted(
        ["a.b", "c", "d", "d.e", "n", "g", "h.i", "h.i.j", "m"]
    )
    assert preload.code_imports("") == []
    for unknowable in (
        "%time import torch",  # an IPython magic: ast cannot parse it
        "!pip install x\nimport torch",
        "import importlib\nmod = importlib.import_module('transformers')",
        "__import__('transformers')",
        "exec('import transformers')",
        "def (",
    ):
        assert preload.code_imports(unknowable) is None, unknowable
    script = tmp_path / "train.py"
    script.write_text("import numpy\n")
    assert preload.payload_imports("script", "", str(script)) == ["numpy"]
    assert preload.payload_imports("script", "", str(tmp_path / "missing.py")) is None
    assert preload.payload_imports("code", "import torch.nn", "<cell>") == ["torch.nn"]
    assert preload.payload_imports("callable", "", "") is None
    assert preload.payload_imports("module", "", "json") is not None


def test_what_a_kernel_or_script_may_teach_the_pool(tmp_path):
    import sys

    import torch  # noqa: F401 - imported, as a notebook would

    learned = preload.kernel_modules()
    tops = {name.partition(".")[0] for name in learned}
    assert "torch" in tops and "torch.nn" in learned
    # the standard library, kernel machinery and the package itself are never proposed
    assert not tops & {"os", "json", "IPython", "jupyterlab_mlcluster", "pytest"} - {"pytest"}
    assert not tops & set(sys.stdlib_module_names)
    # a module next to the notebook is not an installed package
    (tmp_path / "utils.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert preload.candidates(["utils", "numpy"]) == ["numpy"]
    finally:
        sys.path.remove(str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, numpy as np
            from torch import nn
            from . import sibling
            try:
                import tomllib
            except ImportError:
                pass
            def main():
                import psutil   # not at the top: not learned
            """
        )
    )
    assert preload.script_imports(str(script)) == ["os", "numpy", "torch", "tomllib"]
    assert preload.script_modules(str(script)) == ["numpy", "torch"]
    (tmp_path / "broken.py").write_text("import (\n")
    assert preload.script_modules(str(tmp_path / "broken.py")) == []


def test_a_cell_teaches_the_pool_what_its_kernel_imported(pool):
    """The real path: a kernel imports a package, its %%distributed cell's rank has it
    already (the first cell waits for the generation: no older one to serve it)."""
    from helpers import start_kernel
    from kernel_session import KernelSession, rank_texts

    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        kernel = KernelSession(km, kc)
        _, reply = kernel.execute("import warmprobe, threadstarter")
        assert reply["status"] == "ok", reply
        msgs, reply = kernel.execute("%%distributed --workers 1\n" + PROBE)
        assert reply["status"] == "ok", reply
        loaded, zygote, elsewhere = rank_texts(msgs)[0].removeprefix("[rank 0] ").split()
        assert loaded == "warmprobe" and elsewhere == "True"
        # the thread-starting package was refused; the kernel says so, in one line, once
        assert "threadstarter" in warm.refused_modules()
        notes = []
        for _ in range(2):
            msgs, reply = kernel.execute("%%distributed --workers 1 --quiet\npass")
            assert reply["status"] == "ok", reply
            notes += [
                line
                for m in msgs
                if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"
                for line in m["content"]["text"].splitlines()
                if "threadstarter" in line
            ]
        assert notes == [
            "warm pool: threadstarter is not preloaded: it started a thread (ticker) on import"
        ]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert [g["pid"] for g in warm.pool_status(pool.config)["generations"]] == [int(zygote)]


def test_the_pool_learns_a_kernels_import_before_the_first_cell_that_uses_it(pool):
    """The kernel imports a package after the pool is running: the pool learns it right
    after that cell (not at the next %%distributed cell), so the first cell that uses it is
    served by a generation that has it, instead of importing it in every rank."""
    from helpers import start_kernel
    from kernel_session import KernelSession, rank_texts

    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        kernel = KernelSession(km, kc)
        kernel.execute("import warmprobe")
        msgs, reply = kernel.execute("%%distributed --workers 1\n" + PROBE)
        assert reply["status"] == "ok", reply
        # the pool is running: this generation
        first = int(rank_texts(msgs)[0].removeprefix("[rank 0] ").split()[1])
        _, reply = kernel.execute("import slowprobe")  # (3 s to import, here too)
        assert reply["status"] == "ok", reply

        def learned() -> bool:
            generations = warm.pool_status(pool.config)["generations"]
            return any("slowprobe" in (g.get("modules") or []) for g in generations)

        wait_for(learned, timeout=60, message="a generation with slowprobe, with no job asking")
        msgs, reply = kernel.execute("%%distributed --workers 1\n" + PROBE)
        assert reply["status"] == "ok", reply
        loaded, zygote, _ = rank_texts(msgs)[0].removeprefix("[rank 0] ").split()
        assert loaded == "warmprobe,slowprobe" and int(zygote) != first
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
