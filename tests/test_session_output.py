"""A session's output and its end, through real sessions (a supervisor and rank processes,
warm and cold, gloo) driven by the Python side the magic uses (jobs/sessions.py), issue 30:

- a cell's output ends with the cell: a partial line (`print('x', end='')`, or what was
  printed just before an interrupt) is that cell's last line, never the start of the next
  cell's output (4);
- stopping a session whose ranks hold a gloo process group ends every rank cleanly, and
  each rank's state says how it really ended: one that aborts on its way out failed (5).
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs import sessions
from jupyterlab_mlcluster.runtime.payload import Payload

ABORTS = ("terminate called", "EnforceNotMet", "Bad file descriptor", "Fatal Python error")


@pytest.fixture
def svc(tmp_path, store_dir, request):
    # Generous: a cold rank that imported torch takes seconds to finalize on a busy machine.
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps(
            {"MLClusterConfig": {"kill_grace_period": 60.0, "session_interrupt_grace": 30.0}}
        )
    )
    return request.getfixturevalue("service")


def _submit(service, source: str, name: str = "s"):
    record, _ = sessions.submit_cell(
        service,
        name,
        {"workers": 2},
        Payload(kind="code", source=source, cwd=os.getcwd()),
        origin={"kind": "python"},
    )
    return record


def _cell(service, source: str, name: str = "s"):
    return service.wait(_submit(service, source, name).id, timeout=300)


def _lines(service, job_id: str) -> dict[int, list[str]]:
    by_rank: dict[int, list[str]] = {0: [], 1: []}
    for line in service.logs(job_id)[0]:
        if line["stream"] != "system":
            by_rank[line["rank"]].append(line["line"])
    return by_rank


def _holder(service, name: str = "s"):
    return service.store.get_job(service.store.session_rows(name=name)[0]["job_id"])


def test_a_partial_line_ends_with_its_cell(svc, pool_mode):
    first = _cell(svc, "import sys\nprint('x', end='')\nsys.stderr.write('e')\n")
    second = _cell(svc, "print('y')\n")
    assert first.state == "succeeded" and second.state == "succeeded"
    # (stdout's and stderr's last lines, in either order)
    assert {r: sorted(v) for r, v in _lines(svc, first.id).items()} == {
        0: ["e", "x"],
        1: ["e", "x"],
    }
    assert _lines(svc, second.id) == {0: ["y"], 1: ["y"]}  # before: ["xy"]
    sessions.stop_session(svc, None, "s")


def test_what_was_printed_before_an_interrupt_stays_in_the_interrupted_cell(svc, pool_mode):
    _cell(svc, "import time\n")
    cell = _submit(
        svc, "print('ready', flush=True)\nprint('z', end='', flush=True)\ntime.sleep(300)\n"
    )
    wait_for(lambda: all("ready" in lines for lines in _lines(svc, cell.id).values()), 120)
    svc.cancel(cell.id, wait=False)
    interrupted = svc.wait(cell.id, timeout=120)
    assert interrupted.state == "cancelled", (interrupted.state, interrupted.reason)
    for rank, lines in _lines(svc, cell.id).items():
        assert sorted(lines) == sorted(["ready", "z", f"KeyboardInterrupt (rank {rank})"]), lines
    after = _cell(svc, "print('y')\n")
    assert _lines(svc, after.id) == {0: ["y"], 1: ["y"]}  # before: ["zy"]
    sessions.stop_session(svc, None, "s")


def test_stopping_a_gloo_session_ends_every_rank_cleanly(svc, pool_mode):
    up = _cell(
        svc,
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item())\n",
    )
    assert up.state == "succeeded", up.error
    assert _lines(svc, up.id) == {0: ["sum 2.0"], 1: ["sum 2.0"]}
    sessions.stop_session(svc, None, "s")
    holder = _holder(svc)
    assert holder.state == "cancelled"
    every_line = [line["line"] for line in svc.logs(holder.id)[0]]
    assert not [line for line in every_line if any(a in line for a in ABORTS)], every_line
    assert [(r.state, r.exit_code) for r in holder.ranks] == [("succeeded", 0)] * 2, every_line


def test_a_rank_that_aborts_as_the_session_stops_has_failed(svc, pool_mode):
    """Before: every rank of a stopped session counted as succeeded, whatever its exit."""
    _cell(svc, "import atexit, os\nif os.environ['RANK'] == '1':\n    atexit.register(os.abort)\n")
    sessions.stop_session(svc, None, "s")
    holder = _holder(svc)
    assert [(r.state, r.exit_code) for r in holder.ranks] == [("succeeded", 0), ("failed", -6)]
    notes = [line["line"] for line in svc.logs(holder.id)[0] if line["stream"] == "system"]
    assert "[mlcluster] rank 1 was killed by SIGABRT while the session stopped" in notes
