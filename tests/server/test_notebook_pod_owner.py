"""Jobs submitted inside a notebook pod (its kernels, `mlcluster run` in its terminal) belong
to the notebook's owner, the identity a header-trusting server scopes its job routes by, and
not to the image's Unix user (`jovyan` for everyone).

The pod's environment is the one the notebook-controller builds for alice's Notebook
(`$MLCLUSTER_USER` from `spec.owner`); a real kernel and a real CLI process run in it against
a server trusting the `kubeflow-userid` header. Alice sees both jobs; mallory sees neither.
Without the variable (before the fix) the jobs were the Unix user's and alice saw none.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyterlab_mlcluster.jobs.owner import USER_ENV
from notebook_controller.config import ControllerConfig
from notebook_controller.objects import notebook_resource, statefulset

from .test_attacks import Caller
from .test_kernel_and_rest import in_kernel

ALICE = "alice@example.com"
MALLORY = "mallory@example.com"


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterApp": {"trust_identity_header": True}}


def notebook_pod_env() -> dict[str, str]:
    """What the controller puts in the Jupyter container of alice's notebook pod."""
    notebook = notebook_resource("nb1", "team-alice", ALICE)
    notebook["metadata"]["uid"] = "uid-1"  # as the API server gives it
    sts = statefulset(notebook, ControllerConfig())
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


async def cli_run(name: str, script: Path) -> None:
    script.write_text("print('from the terminal')\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jupyterlab_mlcluster.cli",
        "run",
        "--name",
        name,
        str(script),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (out, err)


async def test_jobs_from_a_notebook_pods_kernel_and_cli_belong_to_its_owner(
    jp_fetch, jp_ws_fetch, mlc, monkeypatch, tmp_path
) -> None:
    alice, mallory = Caller(jp_fetch, jp_ws_fetch, ALICE), Caller(jp_fetch, jp_ws_fetch, MALLORY)
    pod_env = notebook_pod_env()
    assert pod_env[USER_ENV] == ALICE
    for key, value in pod_env.items():
        monkeypatch.setenv(key, value)

    ((_, reply),) = await in_kernel("%%distributed --name from-kernel\nprint('from a cell')")
    assert reply["status"] == "ok", reply
    await cli_run("from-cli", tmp_path / "train.py")

    status, page = await alice.call("GET", "jobs")
    assert status == 200
    jobs = {job["name"]: job for job in page["jobs"]}
    assert set(jobs) == {"from-kernel", "from-cli"}, page
    assert {job["owner"] for job in jobs.values()} == {ALICE}
    assert jobs["from-kernel"]["origin"]["kind"] == "kernel"
    for job in jobs.values():
        assert (await alice.call("GET", "jobs", job["id"], "logs"))[0] == 200
        # Another user: neither listed nor reachable.
        assert (await mallory.call("GET", "jobs", job["id"]))[0] == 404
    assert (await mallory.call("GET", "jobs"))[1]["jobs"] == []

    # The same pod without the variable: the job is the Unix user's, and alice sees nothing
    # of it (what every kernel job in a notebook pod did before).
    monkeypatch.delenv(USER_ENV)
    ((_, reply),) = await in_kernel("%%distributed --name anonymous\nprint('x')")
    assert reply["status"] == "ok", reply
    names = {job["name"] for job in (await alice.call("GET", "jobs"))[1]["jobs"]}
    assert names == {"from-kernel", "from-cli"}
    (job,) = mlc.service.store.find_jobs("anonymous")
    assert job.owner == getpass.getuser() != ALICE


def test_the_owner_variable_is_read_as_given(monkeypatch) -> None:
    from jupyterlab_mlcluster.jobs.owner import current_user

    monkeypatch.setenv(USER_ENV, "  bob  ")
    assert current_user() == "bob"
    monkeypatch.setenv(USER_ENV, "")
    assert current_user() == getpass.getuser()
    assert os.environ.get(USER_ENV) == ""
