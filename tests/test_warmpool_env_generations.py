"""Generations keyed by a job's values: a job whose ranks' environment differs from every
running generation's in a variable its preloaded modules read at import, or one the
interpreter reads at start, starts cold, and a generation started with the job's values is
prepared in the background; the next job with them is served warm by it, and jobs with the
pool's values keep theirs. Real zygotes, real ranks; a played package on PYTHONPATH reads a
variable at import (as huggingface_hub reads HF_HOME)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from helpers import process_gone, run_cli, wait_for

from jupyterlab_mlcluster.jobs import warm
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.runtime.payload import Payload

VARIABLE = "MLC_ENVGEN_SETTING"
READER = f"import os\nPID = os.getpid()\nAT_IMPORT = os.environ.get({VARIABLE!r})\n"

# What the rank saw: the variable's value when envreader was imported, whether envreader was
# imported by another process (the zygote: a warm rank), the zygote, and a str's hash.
PROBE = textwrap.dedent(
    """
    import json, os, psutil, envreader
    print(json.dumps({
        "at_import": envreader.AT_IMPORT,
        "warm": envreader.PID != os.getpid(),
        "zygote": psutil.Process(os.getppid()).ppid(),
        "hash": hash("mlcluster"),
    }))
    """
)


@pytest.fixture
def pool(store_dir, tmp_path, monkeypatch):
    """A pool directory of this test's own, the played package on PYTHONPATH and preloaded,
    at most one env-keyed generation; every zygote stopped at the end."""
    played = tmp_path / "played"
    (played / "envreader").mkdir(parents=True)
    (played / "envreader" / "__init__.py").write_text(READER)
    extended = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*extended, str(played)]))
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    directory = tempfile.mkdtemp(prefix="pool-")  # (a unix socket's path must be short)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL_DIR", directory)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    settings = {"warm_pool_modules": ["envreader"], "warm_pool_max_env_generations": 1}
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": settings})
    )
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    yield service
    pids = [g["pid"] for g in warm.pool_status(service.config)["generations"]]
    warm.stop(service.config)
    for pid in pids:
        wait_for(lambda pid=pid: process_gone(pid), timeout=15)
    shutil.rmtree(directory, ignore_errors=True)


def run(service, env: dict[str, str] | None = None) -> tuple[dict, list[str], float]:
    """One rank of PROBE with `env` as the job's --env: what it saw, its 'started cold'
    lines, and the seconds from submit to the job's end."""
    options: dict = {"workers": 1}
    if env:
        options["env"] = [f"{name}={value}" for name, value in env.items()]
    began = time.monotonic()
    record = service.submit(JobSpec.from_options(options), Payload(source=PROBE))
    record = service.wait(record.id, timeout=120)
    took = time.monotonic() - began
    assert record.state == JobState.SUCCEEDED, record.error
    lines = [item["line"] for item in service.logs(record.id)[0]]
    seen = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    return seen, [line for line in lines if "started cold" in line], took


def keyed(service, overlay: dict) -> list[dict]:
    return [
        g for g in warm.pool_status(service.config)["generations"] if g.get("overlay") == overlay
    ]


def test_a_variable_read_at_import_gets_a_generation_of_its_own(pool):
    default, notes, _ = run(pool)
    assert default["warm"] and default["at_import"] is None and notes == []

    # Its value differs from what the pool's envreader imported with: cold, said once, and
    # a generation with it is prepared.
    first, notes, cold_seconds = run(pool, {VARIABLE: "played"})
    assert not first["warm"] and first["at_import"] == "played"
    (note,) = notes
    assert f"{VARIABLE}='played' (the warm pool's: unset)" in note
    assert "a generation of the warm pool with its values is being prepared" in note
    wait_for(lambda: keyed(pool, {VARIABLE: "played"}), timeout=60, message="the new generation")
    (generation,) = keyed(pool, {VARIABLE: "played"})

    # The next job with the same value: warm, served by the new generation, and its
    # envreader saw the job's value, as a fresh interpreter would.
    second, notes, warm_seconds = run(pool, {VARIABLE: "played"})
    assert second["warm"] and second["at_import"] == "played" and notes == []
    assert second["zygote"] == generation["pid"]
    print(f"second job with the value: cold {cold_seconds:.2f} s, warm {warm_seconds:.2f} s")

    # A job with the pool's own values keeps its generation.
    again, notes, _ = run(pool)
    assert again["warm"] and again["at_import"] is None and notes == []
    assert again["zygote"] == default["zygote"] != generation["pid"]


def test_a_start_up_variable_gets_a_generation_of_its_own(pool):
    fresh = subprocess.run(
        [sys.executable, "-c", "print(hash('mlcluster'))"],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    seeded = int(fresh.stdout)
    default, _, _ = run(pool)
    assert default["warm"] and default["hash"] != seeded  # (odds of equal: 2**-64)

    first, (note,), _ = run(pool, {"PYTHONHASHSEED": "0"})
    assert not first["warm"] and first["hash"] == seeded
    assert "PYTHONHASHSEED='0' (the warm pool's: unset)" in note
    assert "being prepared" in note
    wait_for(lambda: keyed(pool, {"PYTHONHASHSEED": "0"}), timeout=60, message="generation")

    second, notes, _ = run(pool, {"PYTHONHASHSEED": "0"})
    assert second["warm"] and second["hash"] == seeded and notes == []
    again, notes, _ = run(pool)
    assert again["warm"] and again["zygote"] == default["zygote"] and notes == []


def test_env_keyed_generations_are_capped(pool):
    """warm_pool_max_env_generations (1 here): a job with yet other values starts cold and
    says why no generation is prepared for it; none is built."""
    run(pool)
    run(pool, {VARIABLE: "one"})
    wait_for(lambda: keyed(pool, {VARIABLE: "one"}), timeout=60, message="the new generation")

    other, (note,), _ = run(pool, {VARIABLE: "two"})
    assert not other["warm"] and other["at_import"] == "two"
    assert "no generation is prepared for its values" in note
    assert "warm_pool_max_env_generations = 1" in note
    # (the build, had one started, would have been started before the submit returned)
    assert not warm.client._build_underway()
    overlays = [g["overlay"] for g in warm.pool_status(pool.config)["generations"]]
    assert sorted(overlays, key=len) == [{}, {VARIABLE: "one"}]
    # `mlcluster pool status` names what a generation is keyed by, never the values.
    (generation,) = keyed(pool, {VARIABLE: "one"})
    out = run_cli("pool", "status").stdout
    assert f"generation pid {generation['pid']} keyed by {VARIABLE}: " in out, out
    assert f"{VARIABLE}=" not in out and "'one'" not in out
    # The generation that exists still serves its values.
    served, notes, _ = run(pool, {VARIABLE: "one"})
    assert served["warm"] and served["at_import"] == "one" and notes == []


def test_the_first_job_of_a_pool_prepares_its_values_too(pool):
    """No pool running yet: the first generation starts with the submitter's environment;
    a first job with its own --env value is served cold from it while its own is prepared."""
    first, (note,), _ = run(pool, {VARIABLE: "first"})
    assert not first["warm"] and first["at_import"] == "first"
    assert "being prepared" in note
    wait_for(lambda: keyed(pool, {VARIABLE: "first"}), timeout=60, message="the new generation")
    second, notes, _ = run(pool, {VARIABLE: "first"})
    assert second["warm"] and second["at_import"] == "first" and notes == []
