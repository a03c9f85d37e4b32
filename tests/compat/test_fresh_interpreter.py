"""Ranks behave like fresh interpreters: one probe script, unchanged, under torchrun and under
`mlcluster run` with cold and warm ranks; everything it can observe must agree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli

SCRIPTS = Path(__file__).parent / "scripts"
WORKERS = 2
# Values that name one run (ports, ids, the error file's directory): compared by shape.
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
# Documented in the README: rank 0 hosts the TCPStore (torchrun's agent hosts it).
DIFFERENT_ON_PURPOSE = {"TORCHELASTIC_USE_AGENT_STORE"}


def copy_probe(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name in ("probe_fresh.py", "probe_sibling.py"):
        shutil.copy(SCRIPTS / name, where / name)
    (where / "out").mkdir()
    return where


def run_torchrun(workdir: Path, tag: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={WORKERS}",
            "probe_fresh.py",
            "out",
            tag,
        ],
        cwd=workdir,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def observed(workdir: Path, tag: str) -> dict[int, dict]:
    seen = {}
    for rank in range(WORKERS):
        stem = workdir / "out" / f"{tag}-{rank}"
        data = json.loads(stem.with_suffix(".json").read_text())
        # What the interpreter's shutdown did: atexit, a non-daemon thread, an unclosed file.
        data["shutdown"] = {
            kind: (stem.parent / f"{stem.name}.{kind}").read_text()
            if (stem.parent / f"{stem.name}.{kind}").exists()
            else None
            for kind in ("atexit", "thread", "unclosed")
        }
        data["argv"] = data["argv"][1:2]  # argv[0] compared as argv0; the tag differs
        seen[rank] = data
    return seen


@pytest.fixture(scope="module")
def torchrun_probe(tmp_path_factory):
    workdir = copy_probe(tmp_path_factory.mktemp("torchrun"))
    ok = run_torchrun(workdir, "ok")
    assert ok.returncode == 0, ok.stderr
    failing = run_torchrun(workdir, "fail", PROBE_EXIT="3")
    return workdir, observed(workdir, "ok"), failing.returncode, observed(workdir, "fail")


def normalise(seen: dict, workdir: Path) -> dict:
    seen = json.loads(json.dumps(seen).replace(str(workdir), "<dir>"))
    for key in PER_RUN | DIFFERENT_ON_PURPOSE:
        seen["env"].pop(key)
    return seen


def check_per_run_values(seen: dict[int, dict]) -> None:
    envs = [seen[r]["env"] for r in range(WORKERS)]
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    assert len({e["TORCHELASTIC_RUN_ID"] for e in envs}) == 1
    files = [e["TORCHELASTIC_ERROR_FILE"] for e in envs]
    assert len(set(files)) == WORKERS and all(f.endswith(".json") for f in files)


def test_a_rank_is_a_fresh_interpreter(torchrun_probe, pool_mode, store_dir, tmp_path):
    """argv, sys.path (the script's directory first, a sibling module imports), __main__,
    signal dispositions, threads, the rank environment, and shutdown: atexit ran, the
    non-daemon thread was joined, the unclosed file kept its data."""
    reference_dir, reference, _, _ = torchrun_probe
    workdir = copy_probe(tmp_path / "w")
    proc = run_cli("run", "--workers", str(WORKERS), "probe_fresh.py", "out", "ok", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    ours = observed(workdir, "ok")
    check_per_run_values(ours)
    check_per_run_values(reference)
    for rank in range(WORKERS):
        assert normalise(ours[rank], workdir) == normalise(reference[rank], reference_dir)
        assert ours[rank]["shutdown"] == {"atexit": "ran", "thread": "joined", "unclosed": "kept"}
        # The error file is the job's own: a `@record` failure lands in the job's error.
        assert ours[rank]["env"]["TORCHELASTIC_ERROR_FILE"].startswith(str(store_dir))


def test_a_failing_exit_status_is_torchruns(torchrun_probe, pool_mode, service, tmp_path):
    """sys.exit(3) on every rank: torchrun exits 1, so does `mlcluster run`; the rank's own
    status is kept in the job, and the interpreter's shutdown still ran."""
    _, _, torchrun_status, torchrun_seen = torchrun_probe
    workdir = copy_probe(tmp_path / "w")
    proc = run_cli(
        "run",
        "--workers",
        str(WORKERS),
        "probe_fresh.py",
        "out",
        "fail",
        cwd=workdir,
        env={**os.environ, "PROBE_EXIT": "3"},
    )
    assert torchrun_status == proc.returncode == 1, proc.stderr
    record = service.store.list_jobs()[0][0]
    assert record.state == "failed" and "exit status 3" in record.error
    ours = observed(workdir, "fail")
    failed = record.failed_rank
    # The same as torchrun's rank that failed first (it exited on its own; torchrun stops
    # the others, which may lose their unclosed file: which rank that is varies with load).
    theirs = [torchrun_seen[rank]["shutdown"] for rank in range(WORKERS)]
    assert ours[failed]["shutdown"] in theirs
    assert ours[failed]["shutdown"] == {"atexit": "ran", "thread": "joined", "unclosed": "kept"}


PERSISTENT_WORKERS = """
import os, torch
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=2,
    persistent_workers=True,
)


def total(loader):  # a function makes the namespace a reference cycle, as in most scripts
    return sum(batch[0].sum().item() for batch in loader)


print(total(loader))
print("pgid", os.getpgid(0))
"""


def test_persistent_dataloader_workers_end_with_their_rank(service, pool_mode):
    """DataLoader workers still alive when the code ends are stopped by the rank's shutdown
    (multiprocessing's atexit handler), as in a fresh interpreter: none outlives the job, and
    the job does not wait out the supervisor's output drain for their pipes."""
    import psutil

    from jupyterlab_mlcluster.backends.local.gang import DRAIN_TIMEOUT
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    record = service.submit(
        JobSpec.from_options({"workers": 2}), Payload(source=PERSISTENT_WORKERS)
    )
    record = service.wait(record.id, timeout=120)
    assert record.state == "succeeded", record.error
    lines = [line["line"] for line in service.logs(record.id)[0]]
    assert lines.count("120.0") == 2
    groups = {int(line.split()[1]) for line in lines if line.startswith("pgid")}
    left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) in groups]
    assert left == []  # no worker of either rank's process group outlived the job
    last_rank = max(rank.finished for rank in record.ranks)
    assert record.finished - last_rank < DRAIN_TIMEOUT


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_a_cell_sees_the_notebooks_directory_and_a_neutral_argv(service, pool_mode, tmp_path):
    """A cell runs with the kernel's sys.path ('' first: a module next to the notebook
    imports, whatever the pool's own directory) and `python -c`'s argv."""
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    (tmp_path / "utils.py").write_text("WHERE = 'next to the notebook'\n")
    code = "import sys, utils\nprint(utils.WHERE, sys.argv, sys.path[0] == '', '/' in sys.path)"
    payload = Payload(source=code, cwd=str(tmp_path), sys_path=["", *sys.path[1:]])
    record = service.submit(JobSpec.from_options({"workers": 2}), payload, cwd=str(tmp_path))
    record = service.wait(record.id, timeout=120)
    assert record.state == "succeeded", record.error
    lines = [line["line"] for line in service.logs(record.id)[0]]
    assert lines == ["next to the notebook ['-c'] True False"] * 2
