"""Others' code, unchanged, under `mlcluster run --workers 2` and a `%%distributed --workers 2`
cell, compared with `torchrun --standalone --nproc-per-node 2` on the same script.

Each script prints `RESULT {json}` per rank (what it computed: losses, weights, sums) or, for
accelerate's own test script, its section headings; the three launchers must agree. One
torchrun run per script (the reference), one kernel for every cell.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli, start_kernel
from kernel_session import KernelSession

pytestmark = pytest.mark.compat
SCRIPTS = Path(__file__).parent / "scripts"
WORKERS = 2


def accelerate_test_script() -> Path:
    from accelerate.test_utils import scripts

    return Path(scripts.__file__).parent / "test_script.py"


CASES = {
    "accelerate": accelerate_test_script,
    # transformers' Trainer, Lightning's DDP Trainer, torch.compile and DataLoader workers in
    # one script: their imports (~9 s of CPU a process here) are paid once per launcher.
    "frameworks": lambda: SCRIPTS / "frameworks.py",
}
# Every case runs as a cell too (accelerate's test script adds ~2 s there: warm ranks).
CELL_CASES = set(CASES)
_DECODER = json.JSONDecoder()


def summary(lines: list[str]) -> dict:
    """What a run computed: RESULT records by case and rank, and accelerate's section headings
    (torchrun's output interleaves the ranks' lines, even within a line: parsed as a stream)."""
    results: dict[str, dict] = {}
    headings: set[str] = set()
    for line in lines:
        text = re.sub(r"^\[rank \d+\] ", "", line)
        for match in re.finditer(r"RESULT ", text):
            record, _ = _DECODER.raw_decode(text, match.end())
            results[f"{record.get('case', '')}:{record['rank']}"] = record
        headings.update(re.findall(r"\*\*([^*]+)\*\*", text))
        headings.update(re.findall(r"Distributed environment: \S+|Num processes: \d+", text))
    return {"results": results, "headings": sorted(headings)}


@pytest.fixture(scope="module")
def compat_store(tmp_path_factory):
    """One job store for the module's CLI runs and its kernel."""
    root = tmp_path_factory.mktemp("compat")
    env = {
        **os.environ,
        "MLCLUSTER_STORE_DIR": str(root / "store"),
        "JUPYTER_CONFIG_DIR": str(root / "jupyter-config"),
        "HF_HUB_OFFLINE": "1",  # nothing is downloaded: tiny models come from configs
        # What `accelerate launch --cpu` sets: without it accelerate runs each process of a
        # CPU-only machine on its own (DistributedType.NO), under torchrun too.
        "ACCELERATE_USE_CPU": "1",
        "HF_OUT": str(root / "hf-out"),
        "LT_OUT": str(root / "lt-out"),
    }
    return root, env


@pytest.fixture(scope="module")
def kernel(compat_store):
    root, env = compat_store
    km, kc = start_kernel(kernel_name="python3", env=env, cwd=str(root))
    try:
        yield KernelSession(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_torchrun(script: Path, env: dict, cwd: Path) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={WORKERS}",
            str(script),
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def run_mlcluster(script: Path, env: dict, cwd: Path) -> tuple[int, list[str]]:
    proc = run_cli("run", "--workers", str(WORKERS), str(script), env=env, cwd=cwd, timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def run_cell(kernel: KernelSession, script: Path, store: Path) -> tuple[int, list[str], str]:
    """The script's source as the body of a cell; its output read back from the job's logs."""
    return run_cell_source(kernel, script.read_text(), store)


def run_cell_source(kernel: KernelSession, source: str, store: Path) -> tuple[int, list[str], str]:
    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    _, reply = kernel.execute(f"%%distributed --workers {WORKERS}\n{source}", timeout=300)
    jobs = JobStore(store)
    newest = max(jobs.list_jobs()[0], key=lambda r: r.created)
    lines, cursor = [], None
    while True:
        chunk, cursor = jobs.read_logs(newest.id, None, cursor)
        if not chunk:
            break
        lines += [line["line"] for line in chunk]
    return (0 if reply["status"] == "ok" else 1), lines, reply.get("evalue", "")


@pytest.mark.parametrize("case", list(CASES))
def test_same_results_as_torchrun(case, compat_store, kernel):
    root, env = compat_store
    script = CASES[case]()
    status, lines = run_torchrun(script, env, root)
    assert status == 0, "\n".join(lines[-30:])
    reference = summary(lines)
    if case == "frameworks":  # 4 parts x 2 ranks
        assert len(reference["results"]) == 4 * WORKERS, reference
    else:
        assert "Num processes: 2" in reference["headings"], reference
        assert "Distributed environment: DistributedType.MULTI_CPU" in reference["headings"]

    status, lines = run_mlcluster(script, env, root)
    assert status == 0, "\n".join(lines[-30:])
    assert summary(lines) == reference
    if case == "frameworks":
        assert_series_from_frameworks(root / "store")

    if case in CELL_CASES:
        status, lines, error = run_cell(kernel, script, root / "store")
        assert status == 0, error
        assert summary(lines) == reference


def assert_series_from_frameworks(store: Path) -> None:
    """What the Trainer callback, the Lightning logger and a SummaryWriter logged (issue 35)
    is the job's series: each rank's Trainer loss at steps 1..4 (32 samples, 2 ranks of 4),
    Lightning's loss at its steps, rank 0's TensorBoard scalars at theirs."""
    from jupyterlab_mlcluster.jobs.storage.series import read_series
    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    jobs = JobStore(store)
    newest = max(jobs.list_jobs()[0], key=lambda r: r.created)
    logged = read_series(
        jobs.job_dir(newest.id), ["loss", "learning_rate", "lightning_loss", "tb/loss"]
    )
    got = {(s["name"], s["rank"]): s["steps"] for s in logged["series"]}
    assert got[("loss", 0)] == got[("loss", 1)] == [1, 2, 3, 4], got
    assert got[("learning_rate", 0)] == [1, 2, 3, 4]
    assert got[("lightning_loss", 0)] and got[("lightning_loss", 1)], got
    assert got[("tb/loss", 0)] == [0, 1, 2] and ("tb/loss", 1) not in got


def test_record_failure_is_the_jobs_error(compat_store, kernel):
    """`@record` writes the root cause into TORCHELASTIC_ERROR_FILE, then the script exits 1
    itself: torchrun reports that root cause and exits 1; so do `mlcluster run` and the cell."""
    root, env = compat_store
    script = SCRIPTS / "record_failure.py"
    status, lines = run_torchrun(script, env, root)
    assert status == 1
    assert any("RuntimeError: rank 1 lost its batch" in line for line in lines)

    proc = run_cli("run", "--workers", str(WORKERS), str(script), env=env, cwd=root)
    assert proc.returncode == 1
    assert "rank 1 failed: RuntimeError: rank 1 lost its batch" in proc.stderr
    assert 'raise RuntimeError("rank 1 lost its batch")' in proc.stderr  # @record's traceback
    assert "frozen runpy" not in proc.stderr

    status, _, error = run_cell(kernel, script, root / "store")
    assert status == 1 and "rank 1 failed: RuntimeError: rank 1 lost its batch" in error


def test_a_cell_imports_a_module_next_to_the_notebook(compat_store, kernel):
    """The kernel's working directory is the notebook's: `import nb_helpers` works there, and
    on every rank; a cell's argv is `python -c`'s (argparse in a cell sees no arguments)."""
    root, _ = compat_store
    (root / "nb_helpers.py").write_text("WHERE = 'beside the notebook'\n")
    cell = "import sys, nb_helpers\nprint('RESULT', nb_helpers.WHERE, sys.argv)"
    status, lines, error = run_cell_source(kernel, cell, root / "store")
    assert status == 0, error
    assert sorted(lines) == ["RESULT beside the notebook ['-c']"] * WORKERS
