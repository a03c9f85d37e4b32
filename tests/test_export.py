"""Take a job away (issue 35, item 5): `mlcluster export JOB --as script` writes the cell as a
script with its pushed variables beside it, run.sh and requirements.txt, and the script runs
again under torchrun (two real processes, gloo). Bad input is refused and nothing is
written. (The sbatch export runs on the test Slurm: tests/slurm/test_slurm_export.py; the
Kubernetes ones against the schemas and the emulator: tests/kube/test_export_k8s.py.)"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from export_jobs import store_cell_job
from helpers import run_cli

from jupyterlab_mlcluster.export import ExportError, export_files, write_export
from jupyterlab_mlcluster.jobs.model import JobState


def test_a_cell_exported_as_a_script_runs_again_under_torchrun(service, tmp_path):
    out = tmp_path / "out.txt"
    record = store_cell_job(service, env={"EXPORT_OUT": str(out)})
    target = tmp_path / "away"
    done = run_cli("export", record.id, "--as", "script", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(target)) == [
        "requirements.txt",
        "run.sh",
        "train_cell4.py",
        "variables.pkl",
    ]
    script = (target / "train_cell4.py").read_text()
    assert "train.ipynb, cell [4]" in script and "--push double,greeting,scale" in script
    assert f"torch=={torch.__version__}" in (target / "requirements.txt").read_text().split("\n")
    assert oct((target / "variables.pkl").stat().st_mode & 0o777) == "0o600"
    # run.sh: torchrun --standalone --nproc-per-node 2, with the job's --env.
    ran = subprocess.run(
        ["sh", str(target / "run.sh")],
        env={**os.environ, "PYTHON": sys.executable, "EXPORT_OUT": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert out.read_text() == "9 2 hihi"  # 3 x 1 + 3 x 2 over 2 ranks; the lambda came too


def test_bad_input_is_refused_and_nothing_is_written(service, tmp_path, monkeypatch):
    record = store_cell_job(service)
    target = tmp_path / "away"
    # An unknown target, an unknown job, another user's job: a clear error, no directory.
    done = run_cli("export", record.id, "--as", "docker", "-o", str(target))
    assert done.returncode == 2 and "invalid choice: 'docker'" in done.stderr
    with pytest.raises(ExportError, match="unknown export target 'docker'"):
        export_files(service, record.id, "docker")
    done = run_cli("export", "j0123456789", "--as", "script", "-o", str(target))
    assert done.returncode == 2 and "no job 'j0123456789'" in done.stderr, done.stderr
    theirs = store_cell_job(service, owner="mallory")
    done = run_cli("export", theirs.id, "--as", "script", "-o", str(target))
    assert done.returncode == 2 and f"no job '{theirs.id}'" in done.stderr, done.stderr
    assert not target.exists()
    # Pushed variables that cannot be loaded again (their module is gone): refused.
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "export_gone_mod.py").write_text(
        textwrap.dedent(
            """
            class Thing:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(module_dir))
    thing = importlib.import_module("export_gone_mod").Thing()
    gone = store_cell_job(service, push={"thing": thing}, source="print(thing)\n")
    (module_dir / "export_gone_mod.py").unlink()
    done = run_cli("export", gone.id, "--as", "script", "-o", str(target))
    assert done.returncode == 2, done.stderr
    assert f"job {gone.id}'s pushed variables cannot be saved" in done.stderr
    assert "export_gone_mod" in done.stderr
    assert not target.exists()
    # A directory that holds something already is left as it was.
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    with pytest.raises(ExportError, match="not an empty directory"):
        write_export(export_files(service, record.id, "script"), target)
    assert os.listdir(target) == ["mine.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".away.")]  # no staging left


def test_a_session_cell_exports_with_the_cells_that_ran_before_it(service, tmp_path):
    """A session's ranks kept what earlier cells defined: its export runs those first (the
    ones that succeeded, oldest first, each with its own pushed variables)."""
    out = tmp_path / "out.txt"
    session = store_cell_job(service, push={}, source="", origin={"session": "s"})
    in_session = {"session": "s", "session_job": session.id}

    def cell(n, source, state=JobState.SUCCEEDED, **push):
        return store_cell_job(
            service, push=push, source=source, state=state, origin={**in_session, "cell": n}
        )

    cell(2, "acc = base * 2\n", base=10)
    cell(3, "acc = -1\nraise RuntimeError('failed: its state never reached the ranks')\n",
         state=JobState.FAILED)  # fmt: skip
    cell(4, "acc += bump\n", bump=1)
    last = cell(5, "import os\nopen(os.environ['EXPORT_OUT'], 'w').write(str(acc))\n")
    target = tmp_path / "away"
    write_export(export_files(service, last.id, "script"), target)
    assert sorted(p.name for p in target.glob("variables*.pkl")) == sorted(
        [f"variables-{j.id}.pkl" for j in service.store.list_jobs(parent=session.id)[0]
         if j.origin["cell"] in (2, 4)]
    )  # fmt: skip
    script = (target / "train_cell4.py").read_text()
    sections = [line for line in script.splitlines() if line.startswith("# --- ")]
    assert [line.split(" (job")[0] for line in sections] == [
        f"# --- train.ipynb, cell [{n}]" for n in (2, 4, 5)
    ]
    ran = subprocess.run(
        [sys.executable, str(target / "train_cell4.py")],
        env={**os.environ, "EXPORT_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert out.read_text() == "21"


def test_a_script_exports_as_it_ran_not_as_it_was_edited_since(service, tmp_path):
    """A script job's ranks read the file when they start; its export is that text, kept at
    submit, not the file as it is when exported (it read the edited file)."""
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.provenance import SCRIPT_FILE
    from jupyterlab_mlcluster.runtime.payload import Payload

    path = tmp_path / "train.py"
    path.write_text("print('as it ran')\n")
    spec = JobSpec.from_options({"workers": 1})
    record = service.submit(spec, Payload(kind="script", filename=str(path)))
    assert service.wait(record.id, timeout=120).state == "succeeded"
    assert "as it ran" in [line["line"] for line in service.logs(record.id)[0]]
    path.write_text("print('edited since')\n")
    files = export_files(service, record.id, "script")
    (script,) = [text.decode() for name, text in files.items() if name.endswith(".py")]
    assert "print('as it ran')" in script and "edited since" not in script
    # A job whose text was not kept (an earlier version's) says so: nothing is guessed.
    (service.store.job_dir(record.id) / SCRIPT_FILE).unlink()
    with pytest.raises(ExportError, match="whose text was not kept when it was submitted"):
        export_files(service, record.id, "script")
