"""Variables that differ per rank (the rank table) and our own never key a generation of the
warm pool (issue 30): a learnt module that reads RANK at import is imported by each rank
itself, after its environment is set, while the rest of the generation stays warm. Real
zygotes, real ranks through `mlcluster run`; played packages on PYTHONPATH, learnt from the
script's imports."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap

import pytest
from helpers import process_gone, run_cli, wait_for

from jupyterlab_mlcluster.jobs import warm

VARIABLE = "MLC_RANKVARS_SETTING"
# Reads the rank table at import, as lightning_fabric's rank_zero does.
RANK_READER = textwrap.dedent(
    """
    import os
    PID = os.getpid()
    RANK = os.environ.get("RANK")
    LOCAL_RANK = os.environ["LOCAL_RANK"] if "LOCAL_RANK" in os.environ else None
    WORLD_SIZE = os.getenv("WORLD_SIZE")
    """
)
# Reads our own variables, and one of the user's, at import.
PLAIN = textwrap.dedent(
    f"""
    import os
    PID = os.getpid()
    POOL = os.environ.get("MLCLUSTER_WARM_POOL_DIR")
    NVML = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    SETTING = os.environ.get({VARIABLE!r})
    """
)
SCRIPT = textwrap.dedent(
    """
    import sys
    PRELOADED = set(sys.modules)
    import json, os
    import rankreader, rankplain
    print(json.dumps({
        "rank": os.environ["RANK"],
        "reader": [rankreader.RANK, rankreader.LOCAL_RANK, rankreader.WORLD_SIZE],
        "reader_in_rank": rankreader.PID == os.getpid() and "rankreader" not in PRELOADED,
        "plain_preloaded": rankplain.PID != os.getpid() and "rankplain" in PRELOADED,
        "setting": rankplain.SETTING,
    }))
    """
)


@pytest.fixture
def workdir(store_dir, tmp_path, monkeypatch):
    """The played packages on PYTHONPATH, a pool directory of this test's own, the script."""
    played = tmp_path / "played"
    for name, source in (("rankreader", RANK_READER), ("rankplain", PLAIN)):
        (played / name).mkdir(parents=True)
        (played / name / "__init__.py").write_text(source)
    extended = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*extended, str(played)]))
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    directory = tempfile.mkdtemp(prefix="pool-")  # (a unix socket's path must be short)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL_DIR", directory)
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    where = tmp_path / "work"
    where.mkdir()
    (where / "train.py").write_text(SCRIPT)
    yield where
    from jupyterlab_mlcluster.jobs.service import JobService

    config = JobService().config
    pids = [g["pid"] for g in warm.pool_status(config)["generations"]]
    warm.stop(config)
    for pid in pids:
        wait_for(lambda pid=pid: process_gone(pid), timeout=15)
    shutil.rmtree(directory, ignore_errors=True)


def run(workdir, *env: str) -> tuple[dict[int, dict], str]:
    """Two ranks of the script (`env`: --env NAME=VALUE): what each saw, and the output."""
    options = [arg for item in env for arg in ("--env", item)]
    proc = run_cli("run", "--workers", "2", *options, "train.py", cwd=workdir, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    seen = {}
    for line in proc.stdout.splitlines():
        _, _, text = line.partition("] ")
        if text.startswith("{"):
            data = json.loads(text)
            seen[int(data["rank"])] = data
    assert sorted(seen) == [0, 1], output
    return seen, output


def test_a_module_reading_the_rank_table_is_imported_by_each_rank(workdir):
    # The pool's first generation learns both packages from the script; rankreader reads
    # RANK at import, so each rank imports it itself: the job still starts warm.
    seen, output = run(workdir, "PYTORCH_NVML_BASED_CUDA_CHECK=1")
    assert "started cold" not in output, output
    for rank in (0, 1):
        assert seen[rank]["reader"] == [str(rank), str(rank), "2"], seen[rank]
        assert seen[rank]["reader_in_rank"], seen[rank]
        assert seen[rank]["plain_preloaded"], seen[rank]  # the rest of the generation: warm
    from jupyterlab_mlcluster.jobs.service import JobService

    refused = warm.pool_status(JobService().config)["refused"]
    assert "reads" in refused["rankreader"] and "RANK" in refused["rankreader"], refused

    # Next time too, from the same generation.
    again, output = run(workdir, "PYTORCH_NVML_BASED_CUDA_CHECK=1")
    assert "started cold" not in output and again[1]["plain_preloaded"], output
    assert again[1]["reader"] == ["1", "1", "2"]

    # A variable of the user's that rankplain reads at import still keys a generation, and the
    # notice names it alone: never the rank table nor our own variables.
    other, output = run(workdir, f"{VARIABLE}=mine", "PYTORCH_NVML_BASED_CUDA_CHECK=1")
    assert other[0]["setting"] == "mine" and not other[0]["plain_preloaded"]
    (notice,) = [line for line in output.splitlines() if "started cold" in line]
    assert f"{VARIABLE}='mine' (the warm pool's: unset)" in notice, notice
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MLCLUSTER_", "PYTORCH_NVML"):
        assert f"{name}=" not in notice.replace(f"{VARIABLE}=", ""), notice
