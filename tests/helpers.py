"""Helpers shared by the tests (imported as a plain module; fixtures stay in conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from jupyterlab_mlcluster.runtime.ports import reserve_port

REPO = Path(__file__).resolve().parent.parent

# Randomised tests (hypothesis, schemathesis, seeded scenarios) are deterministic by default:
# the same examples on every run, so CI only fails for a change in the code. MLCLUSTER_FUZZ=1
# explores instead: fresh random examples each run, and more of them (README, Development).
FUZZ = os.environ.get("MLCLUSTER_FUZZ", "") not in ("", "0")
FIXED_SEED = 20261123

# Waits for something to happen are convergence bounds, not speed checks (speed lives in
# bench/): on a loaded two-core machine running test files in parallel, a step that takes 1 s
# alone may take several. Every wait's bound is stretched by this factor; a passing test
# never waits longer for it.
WAIT_SCALE = float(os.environ.get("MLCLUSTER_TEST_WAIT_SCALE", "3"))


def examples(ci: int) -> int:
    """How many examples a property-based test tries: `ci`, or ten times as many when fuzzing."""
    return ci * 10 if FUZZ else ci


def scenario_seed() -> int:
    """The seed of a randomised scenario: fixed, or a new one when fuzzing (put it in the
    test's failure messages to replay it)."""
    import random

    return random.randrange(1 << 30) if FUZZ else FIXED_SEED


def job_processes(service, job_id: str) -> list[psutil.Process]:
    """Live processes (supervisor and ranks) of a job, matched by pid and start time."""
    from jupyterlab_mlcluster.jobs.running.processes import process_is

    found = []
    record = service.store.get_job(job_id)
    sup = record.supervisor or {}
    # A fleet (jobs/running/fleet.py) supervises other jobs too: it is this job's only
    # until the job is final.
    serves_job = not (sup.get("fleet") and record.final)
    candidates = [(sup.get("pid"), sup.get("create_time"))] if serves_job else []
    candidates += [(pid, started) for _rank, pid, started in service.store.rank_processes(job_id)]
    for pid, started in candidates:
        if process_is(pid, started):
            with contextlib.suppress(psutil.NoSuchProcess):  # it ended since: not left over
                found.append(psutil.Process(pid))
    return found


def assert_no_job_processes(service, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = [p for r in service.store.list_jobs()[0] for p in job_processes(service, r.id)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}")
        time.sleep(0.1)


def process_gone(pid: int) -> bool:
    """The process has exited (gone, or a zombie its parent has yet to reap). It may vanish
    between two looks, so asking about it is part of the answer."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyterlab_mlcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


async def rest_call(jp_fetch, method: str, *path: str, body: Any = None, **kwargs: Any) -> Any:
    """The server extension's REST API through pytest-jupyter's `jp_fetch`: `body` (unless
    str or bytes) is sent as JSON, and the response comes back whatever its status."""
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    if body is None and method in ("POST", "PUT", "PATCH"):
        body = ""  # tornado's client requires a body on these
    return await jp_fetch(
        "mlcluster",
        "api",
        *path,
        method=method,
        body=body,
        raise_error=False,
        allow_nonstandard_methods=True,
        **kwargs,
    )


def stop_process(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM `process`, and SIGKILL it if it has not exited `grace` seconds later."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(
    predicate,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
    error: type[Exception] = AssertionError,
):
    """`predicate()` once it is true, else `error` after `timeout` (stretched by WAIT_SCALE)."""
    timeout *= WAIT_SCALE
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def start_kernel(kernel_name: str = "python3", startup_timeout: float = 60, **kwargs: Any):
    """jupyter_client's start_new_kernel, over IPC sockets in a directory of its own. Over TCP
    the client picks free ports and the kernel binds them later: two test workers starting
    kernels at once can pick the same port, and the second kernel dies ('Address already in
    use', seen in a fresh-clone CI run)."""
    import tempfile

    from jupyter_client.manager import KernelManager

    sockets = tempfile.mkdtemp(prefix="mlcluster-kernel-")
    km = KernelManager(kernel_name=kernel_name, transport="ipc", ip=os.path.join(sockets, "k"))
    km.start_kernel(**kwargs)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=startup_timeout)
    except RuntimeError:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


def session_cell(service, session: str, source: str, origin: dict | None = None):
    """Submit `source` as a cell of the 2-rank session `session` (started by its first cell),
    run in this directory; its record, not waited on."""
    from jupyterlab_mlcluster.jobs import sessions
    from jupyterlab_mlcluster.runtime.payload import Payload

    record, _ = sessions.submit_cell(
        service,
        session,
        {"workers": 2},
        Payload(kind="code", source=source, cwd=os.getcwd()),
        origin=origin or {"kind": "python"},
    )
    return record


def free_port() -> int:
    """A port for a server a test starts, held until that server binds it, as a job's are
    (runtime/ports.py: a port only found free was taken by another test's program in CI)."""
    return reserve_port()
