"""Jobs from a notebook without --name are named after the notebook and the cell's number
(issue 35, item 4: not `cell`, `cell`, `cell`), and a session's cells name their session's
job as their parent. A real kernel, told its notebook as jupyter_server tells it."""

from __future__ import annotations

import os

import pytest
from helpers import assert_no_job_processes, start_kernel
from kernel_session import KernelSession

from jupyterlab_mlcluster.jobs.grouping import TOP_LEVEL


@pytest.fixture
def notebook_kernel(store_dir):
    env = {**os.environ, "JPY_SESSION_NAME": "/home/alice/work/Train Model.ipynb"}
    km, kc = start_kernel(kernel_name="python3", env=env)
    try:
        yield KernelSession(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_cells_are_named_after_the_notebook_and_listed_under_their_session(
    notebook_kernel, service
):
    kernel = notebook_kernel
    kernel.execute("x = 1")  # In [1]
    _, reply = kernel.execute("%%distributed --workers 1\n1 + 1")  # In [2]
    assert reply["status"] == "ok", reply
    (plain,) = service.store.list_jobs()[0]
    assert plain.name == "train-model-cell2" and plain.origin["cell"] == 2
    for _ in range(2):  # In [3], In [4]
        _, reply = kernel.execute("%%distributed --session g --workers 1\ny = 2")
        assert reply["status"] == "ok", reply
    _, reply = kernel.execute("%distributed_session stop g")
    assert reply["status"] == "ok", reply
    top, _ = service.store.list_jobs(parent=TOP_LEVEL)
    session = next(r for r in top if r.origin.get("session") == "g")
    assert session.name == "g" and {r.id for r in top} == {plain.id, session.id}
    cells, total = service.store.list_jobs(parent=session.id)
    assert total == 2 and [c.name for c in cells] == ["train-model-cell4", "train-model-cell3"]
    assert all(c.to_json()["parent"] == session.id for c in cells)
    assert_no_job_processes(service)
