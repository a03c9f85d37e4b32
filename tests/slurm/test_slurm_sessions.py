"""Sessions on Slurm against the real one-node Slurm (conftest.py): an allocation whose tasks
keep their state from cell to cell, with every session semantic of the local and
Kubernetes backends (interrupt, a failing cell, a timeout, restart, stop, idle end, a dead
rank, a dead node, a killed supervisor). Each test leaves nothing in squeue.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import zlib

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs import sessions
from jupyterlab_mlcluster.jobs.storage.series import read_all
from jupyterlab_mlcluster.runtime.payload import Payload
from jupyterlab_mlcluster.runtime.protocol import encode_record
from jupyterlab_mlcluster.runtime.session_channel import HELLO

ORIGIN = {"kind": "test"}


@pytest.fixture(scope="module")
def home(slurm, tmp_path_factory):
    """One store and settings directory for the module's tests (each its own session)."""
    root = tmp_path_factory.mktemp("slurm-sessions")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLCLUSTER_STORE_DIR", str(root / "store"))
        mp.setenv("JUPYTER_CONFIG_DIR", str(root / "jupyter-config"))
        mp.setenv("MLCLUSTER_BACKEND", "slurm")
        mp.setenv("MLCLUSTER_WARM_POOL", "0")
        yield root


def service_with(home, **settings):
    from jupyterlab_mlcluster.jobs.service import JobService

    config = home / "jupyter-config"
    config.mkdir(exist_ok=True)
    values = {"slurm_poll_interval": 0.2, "kill_grace_period": 3.0, **settings}
    (config / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": {"session_interrupt_grace": 10.0, **values}})
    )
    return JobService()  # with the settings above (each job carries its submitter's)


@pytest.fixture
def service(home, slurm):
    svc = service_with(home)
    yield svc
    for record in svc.store.list_jobs()[0]:
        if not record.final:
            svc.cancel(record.id)
    slurm.wait_empty(60)


def cell(service, name: str, source: str, options: dict | None = None, **push):
    record, _ = sessions.submit_cell(
        service, name, dict(options or {}), Payload(source=source, push=push), origin=ORIGIN
    )
    return record


def run(service, name: str, source: str, options: dict | None = None, timeout=120, **push):
    return service.wait(cell(service, name, source, options, **push).id, timeout=timeout)


def lines(service, job_id: str) -> list[str]:
    return sorted(
        f"{item['rank']}:{item['line']}"
        for item in service.logs(job_id)[0]
        if item["stream"] != "system"
    )


def _channel(service, holder_id: str, rank: int) -> tuple[str, int]:
    """Where a task listens: the signed record in its report file names host and port."""
    report = service.store.job_dir(holder_id) / "slurm" / "attempt-0" / f"rank-{rank}.control"
    match = re.search(rb'"session_channel","host":"([^"]+)","port":(\d+)', report.read_bytes())
    assert match is not None, report.read_bytes()[-500:]
    return match.group(1).decode(), int(match.group(2))


def holder_of(service, record):
    return service.store.get_job(record.origin["session_job"])


def test_a_slurm_session_keeps_its_allocation_and_state_across_cells(service, slurm, tmp_path):
    first = run(
        service,
        "s",
        "import os, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.full((2,), float(dist.get_rank() + 1))\n"
        "print('rank', dist.get_rank(), 'built', flush=True)\n"
        "os.environ['SLURM_JOB_ID']\n",
        {"workers": 2},
        timeout=180,
    )
    assert first.state == "succeeded", first.error
    allocation = service.result(first.id)[1]
    holder = holder_of(service, first)
    assert (holder.backend, holder.state) == ("slurm", "running")
    assert [j.split()[0] for j in slurm.jobs()] == [allocation]
    assert lines(service, first.id) == ["0:rank 0 built", "1:rank 1 built"]

    # Attack: a stranger on the node's network, without the job's key, dials a rank's
    # port: the handshake fails and the connection closes without running anything.
    marker = tmp_path / "pwned"
    evil = Payload(source=f"open({str(marker)!r}, 'w').write('ran')\n")
    with socket.create_connection(_channel(service, holder.id, 1), timeout=10) as stranger:
        reader = stranger.makefile("rb")
        assert reader.readline().startswith(HELLO)
        forged = {"type": "hello", "rank_nonce": "guess", "nonce": "n"}
        stranger.sendall(encode_record(forged, b"k" * 32, 1))
        data = base64.b64encode(zlib.compress(evil.dumps())).decode()
        command = {"type": "cell", "seq": 10**9, "job": "x", "payload_data": data, "env": {}}
        stranger.sendall(encode_record(command, b"k" * 32, 1))
        try:
            assert reader.readline() == b""  # closed without a word
        except ConnectionResetError:
            pass  # closed with our bytes unread: a reset, still not a word back
    refused = (
        "1:mlcluster session: rank 1 refused a connection that did not prove the session's key"
    )
    wait_for(lambda: refused in lines(service, holder.id), 30, message="the refusal said")
    assert not marker.exists()

    # Same tasks, same globals, same process group: the all-reduce sums both ranks'.
    second = run(
        service,
        "s",
        "dist.all_reduce(model)\n"
        "print('rank', dist.get_rank(), 'sum', model.tolist(), flush=True)\n"
        "import jupyterlab_mlcluster as mlc\n"
        "mlc.log(step=0, total=model.sum().item() + dist.get_rank())\n"
        "(os.environ['SLURM_JOB_ID'], model.tolist(), x)\n",
        x=7,
    )
    assert second.state == "succeeded", second.error
    assert service.result(second.id) == ("value", (allocation, [3.0, 3.0], 7))
    # mlc.log in a session cell: that cell's series, not the session's (issue 35).
    logged = read_all(service.store.job_dir(second.id), None)["series"]
    assert {(s["name"], s["rank"]): s["values"] for s in logged} == {
        ("total", 0): [6.0],
        ("total", 1): [7.0],
    }
    assert read_all(service.store.job_dir(holder.id), None)["series"] == []
    assert lines(service, second.id) == ["0:rank 0 sum [3.0, 3.0]", "1:rank 1 sum [3.0, 3.0]"]

    # A failing rank fails the cell with its traceback; the other is interrupted.
    failing = run(
        service,
        "s",
        "if dist.get_rank() == 1:\n    raise ValueError('bad rank 1')\ntime.sleep(120)\n",
        timeout=60,
    )
    assert failing.state == "failed" and failing.failed_rank == 1
    assert "ValueError: bad rank 1" in failing.error

    # A cancel interrupts the cell on every rank (KeyboardInterrupt); the state stays.
    sleeping = cell(service, "s", "print('asleep', flush=True)\ntime.sleep(300)\n")
    wait_for(lambda: len(lines(service, sleeping.id)) == 2, 60, message="the cell runs")
    service.cancel(sleeping.id, wait=False)
    done = service.wait(sleeping.id, timeout=60)
    assert done.state == "cancelled" and done.reason.startswith("cancelled by user")
    assert "0:KeyboardInterrupt (rank 0)" in lines(service, sleeping.id)

    # A cell's timeout interrupts it, and is that cell's only.
    slow = run(service, "s", "time.sleep(120)\n", {"timeout": 1}, timeout=60)
    assert slow.state == "failed" and "timed out after 1s" in slow.error
    kept = run(service, "s", "model.tolist()\n")
    assert service.result(kept.id) == ("value", [3.0, 3.0])
    assert holder_of(service, kept).restarts == 0
    assert sessions.get_session(service, None, "s").cells == 6

    # A restart: fresh ranks on a fresh allocation; the state is lost.
    sessions.restart_session(service, None, "s", timeout=120)
    fresh = run(service, "s", "import os\n('model' in globals(), os.environ['SLURM_JOB_ID'])\n")
    assert fresh.state == "succeeded", fresh.error
    assert service.result(fresh.id)[1][0] is False
    assert service.result(fresh.id)[1][1] != allocation
    assert holder_of(service, fresh).restarts == 1

    # Stop: every rank runs its atexit handlers, and the allocation goes.
    marker = str(tmp_path / "atexit-")
    run(
        service,
        "s",
        "import atexit, os\natexit.register(lambda: open(m + os.environ['RANK'], 'w').write('bye'))\n",
        m=marker,
    )
    info = sessions.stop_session(service, None, "s")
    assert info.holder.state == "cancelled"
    assert (info.holder.reason or "").startswith("stopped by user")
    assert sorted(p.name for p in tmp_path.glob("atexit-*")) == ["atexit-0", "atexit-1"]
    slurm.wait_empty(60)


def test_an_idle_slurm_session_ends_and_frees_its_allocation(home, service, slurm):
    idle = service_with(home, session_idle_timeout=2.0)
    first = run(idle, "idle", "x = 1\n", {"workers": 1})
    assert first.state == "succeeded", first.error
    holder = holder_of(idle, first)
    ended = wait_for(lambda: (r := idle.store.get_job(holder.id)).final and r, 60)
    assert ended.state == "succeeded" and "without a cell" in ended.reason
    slurm.wait_empty(60)
    # The next cell starts a fresh session, saying the last one had ended.
    record, note = sessions.submit_cell(
        service, "idle", {}, Payload(source="'x' in globals()"), origin=ORIGIN
    )
    assert note is not None and "had ended" in note
    assert service.wait(record.id, timeout=120).state == "succeeded"
    assert service.result(record.id) == ("value", False)
    sessions.stop_session(service, None, "idle")


def test_a_rank_that_dies_ends_the_session_and_the_next_cell_says_so(service, slurm):
    assert run(service, "dies", "x = 1\n", {"workers": 1}).state == "succeeded"
    dying = run(service, "dies", "import os\nos._exit(3)\n", timeout=60)
    assert dying.state == "failed" and "the session ended" in dying.error
    holder = holder_of(service, dying)
    assert holder.state == "failed" and "exit code 3" in holder.error, holder.error
    with pytest.raises(sessions.SessionEnded, match="state is lost"):
        cell(service, "dies", "x\n")
    slurm.wait_empty(60)


def test_a_node_failure_ends_the_session_saying_so(service, slurm):
    first = run(service, "node", "x = 1\n", {"workers": 1})
    assert first.state == "succeeded", first.error
    holder = holder_of(service, first)
    node = f"nodename={slurm.node}"
    try:
        slurm.run("scontrol", "update", node, "state=down", "reason=mlcluster-test")
        ended = wait_for(lambda: (r := service.store.get_job(holder.id)).final and r, 60)
    finally:
        slurm.run("scontrol", "update", node, "state=resume", check=False)
        wait_for(slurm.idle, 30, message="the node back")
    assert ended.state == "failed"
    assert "a node of the allocation failed (Slurm: NODE_FAIL)" in ended.error
    with pytest.raises(sessions.SessionEnded, match="NODE_FAIL"):
        cell(service, "node", "x\n")


def test_a_killed_supervisor_ends_the_session_and_its_allocation_goes(service, slurm):
    first = run(service, "orphan", "x = 1\n", {"workers": 1})
    assert first.state == "succeeded", first.error
    holder = holder_of(service, first)
    assert len(slurm.jobs()) == 1
    os.kill(holder.supervisor["pid"], signal.SIGKILL)
    # The next cell says so: refused at once if the session is settled by then, else
    # failed as soon as it is.
    try:
        after = service.wait(cell(service, "orphan", "x\n").id, timeout=60)
        assert after.state == "failed" and "state is lost" in after.error
    except sessions.SessionEnded as exc:
        assert "state is lost" in str(exc)
    assert service.store.get_job(holder.id).state == "failed"
    # The reaper cancels the allocation nobody supervises.
    wait_for(
        lambda: service.reap(force=True) is not None and not slurm.jobs(),
        60,
        message="the allocation cancelled",
    )


def test_a_rank_that_ignores_the_interrupt_restarts_the_session_saying_so(home, slurm):
    quick = service_with(home, session_interrupt_grace=2.0)
    first = run(quick, "stuck", "import signal, time\nx = 1\n", {"workers": 1})
    assert first.state == "succeeded", first.error
    stuck = run(
        quick,
        "stuck",
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(120)\n",
        {"timeout": 1},
        timeout=90,
    )
    assert stuck.state == "failed"
    assert "did not return within 2 s of the interrupt" in stuck.error, stuck.error
    assert "state was lost" in stuck.error
    # The session goes on, restarted: fresh ranks on a fresh allocation.
    fresh = run(quick, "stuck", "'x' in globals()\n")
    assert quick.result(fresh.id) == ("value", False)
    assert holder_of(quick, fresh).restarts == 1
    sessions.stop_session(quick, None, "stuck")
    slurm.wait_empty(60)
