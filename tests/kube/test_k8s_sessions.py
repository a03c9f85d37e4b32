"""Sessions on Kubernetes (issue 25), end to end against the API emulator.

The JobService starts the session for real and a real supervisor process drives it over
HTTP: the holder's objects built by the backend's own builders, then cells sent to the
pods over the authenticated session channel. The test plays the Job controller, the
scheduler and the kubelet (`ClusterPlayer`): each rank is the real worker runtime in a
local process with its pod's environment and the payload (and job key) read back from the
job's Secrets, listening on its channel; its output is the pod log. torch.distributed is
real (gloo, over the loopback interface).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import signal
import socket
import time
import zlib

import pytest
from helpers import process_gone, wait_for

from jupyterlab_mlcluster.jobs import sessions
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage.series import read_series
from jupyterlab_mlcluster.runtime.protocol import encode_record, job_key, key_path
from jupyterlab_mlcluster.runtime.session_channel import HELLO
from tests.kube.jobs_fixtures import code, log_text
from tests.kube.player import ClusterPlayer, RankRun, objects_of

pytestmark = pytest.mark.slow

ORIGIN = {"kind": "kernel"}


@dataclasses.dataclass
class Session:
    service: JobService
    holder_id: str
    runs: dict[int, RankRun]

    def cell(self, source: str, options: dict | None = None, **push):
        record, _ = sessions.submit_cell(
            self.service, "llm", dict(options or {}), code(source, **push), origin=ORIGIN
        )
        return record

    def run(self, source: str, timeout: float = 60, **push):
        record = self.cell(source, **push)
        return self.service.wait(record.id, timeout=timeout)

    @property
    def holder(self):
        return self.service.store.get_job(self.holder_id)


def start(service: JobService, player: ClusterPlayer, workers: int = 2, **options) -> Session:
    """The first cell starts the session; its pods are created and run for real."""
    first, _ = sessions.submit_cell(
        service,
        "llm",
        {"backend": "kubernetes", "workers": workers, **options},
        code("import os\nint(os.environ['RANK'])\n"),
        origin=ORIGIN,
    )
    holder_id = first.origin["session_job"]
    job = player.resumed(holder_id)
    runs = {}
    for rank, pod in player.create_pods(job).items():
        player.schedule(pod)
        runs[rank] = player.run_rank(pod, pod_ip="127.0.0.1")
        player.end_when_exited(runs[rank])
    final = service.wait(first.id, timeout=60)
    assert final.state == "succeeded", (final.error, [r.text for r in runs.values()])
    assert service.result(first.id) == ("value", 0)
    return Session(service, holder_id, runs)


def test_a_session_keeps_globals_and_the_process_group_across_cells(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    holder = session.holder
    assert (holder.backend, holder.state) == ("kubernetes", "running")
    # Built by the backend's builders: an Indexed Job, its pods running the session worker.
    (job,) = kube.list(
        "batch/v1", "Job", kube_namespace, label_selector=f"mlcluster.io/job-id={holder.id}"
    )
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MLCLUSTER_SESSION"] == "llm"

    first = session.run(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.full((2,), float(dist.get_rank() + 1))\n"
        "print('rank', dist.get_rank(), 'built', flush=True)\n"
    )
    assert first.state == "succeeded", first.error
    assert sorted(log_text(service, first.id)) == ["0:rank 0 built", "1:rank 1 built"]

    second = session.run(
        "dist.all_reduce(model)\n"
        "print('rank', dist.get_rank(), 'sum', model.tolist(), flush=True)\n"
        "{'rank': dist.get_rank(), 'sum': model.tolist(), 'x': x}\n",
        x=7,
    )
    assert second.state == "succeeded", second.error
    # Same processes, same globals, same process group: the all-reduce sums both ranks'.
    assert service.result(second.id) == ("value", {"rank": 0, "sum": [3.0, 3.0], "x": 7})
    assert sorted(log_text(service, second.id)) == [
        "0:rank 0 sum [3.0, 3.0]",
        "1:rank 1 sum [3.0, 3.0]",
    ]
    assert all(r.process.poll() is None for r in session.runs.values())
    assert second.origin["session_job"] == holder.id
    # mlc.log's points are the running cell's (its monitor, GET /jobs/{cell}/metrics), not
    # the session's, its last ones too (sent before the cell's end).
    logged = session.run(
        "import jupyterlab_mlcluster as mlc\nmlc.log(step=0, loss=float(dist.get_rank()))\n"
    )
    assert logged.state == "succeeded", logged.error

    def series(job_id: str) -> dict:
        data = read_series(service.store.job_dir(job_id), None)["series"]
        return {(s["name"], s["rank"]): s["values"] for s in data}

    assert series(logged.id) == {("loss", 0): [0.0], ("loss", 1): [1.0]}
    assert series(holder.id) == {}
    assert sessions.get_session(service, None, "llm").cells == 4
    # A partial line ends with its cell (issue 30): the rank's report starts on a line of its
    # own, so the pod log ends the line before the cell's end.
    partial = session.run("print('x', end='', flush=True)\n")
    after = session.run("print('y', flush=True)\n")
    assert sorted(log_text(service, partial.id)) == ["0:x", "1:x"]
    assert sorted(log_text(service, after.id)) == ["0:y", "1:y"]

    # stop: every rank runs its atexit handlers and exits; nothing is left in the cluster.
    info = sessions.stop_session(service, None, "llm")
    assert info.holder.state == "cancelled" and info.holder.reason.startswith("stopped by user")
    wait_for(
        lambda: objects_of(kube, kube_namespace, holder.id) == {},
        timeout=60,
        message="objects gone",
    )
    for run in session.runs.values():
        assert run.wait(30) == 0


def test_a_failing_rank_fails_the_cell_with_its_traceback_and_the_session_stays(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("import os, time\nrank = int(os.environ['RANK'])\nstate = 'kept'\n")
    failed = session.run(
        "if rank == 1:\n"
        "    raise ValueError('bad batch on rank 1')\n"
        "time.sleep(300)  # rank 0: interrupted when rank 1 fails\n"
    )
    assert failed.state == "failed" and failed.failed_rank == 1
    assert "ValueError: bad batch on rank 1" in failed.error
    report = service.error_report(failed.id)  # rank 1's own traceback, from its pod log
    assert report["rank"] == 1 and "raise ValueError('bad batch on rank 1')" in report["traceback"]
    # The other rank was interrupted in the cell's code, and said so.
    assert "0:KeyboardInterrupt (rank 0)" in log_text(service, failed.id)
    # The session lives on, state intact.
    assert session.holder.state == "running"
    after = session.run("state, rank")
    assert after.state == "succeeded", after.error
    assert service.result(after.id) == ("value", ("kept", 0))
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_interrupting_a_cell_stops_it_on_every_rank_and_keeps_the_session(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("import time\ncounter = 41\n")
    cell = session.cell("print('sleeping', flush=True)\ntime.sleep(300)\n")
    wait_for(
        lambda: len(log_text(service, cell.id)) == 2, timeout=60, message="both ranks sleeping"
    )
    final = service.cancel(cell.id, wait=True)
    assert final.state == "cancelled", (final.state, final.error)
    lines = log_text(service, cell.id)
    assert "0:KeyboardInterrupt (rank 0)" in lines and "1:KeyboardInterrupt (rank 1)" in lines
    assert session.holder.state == "running"
    after = session.run("counter + 1")
    assert service.result(after.id) == ("value", 42)
    assert all(r.process.poll() is None for r in session.runs.values())
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_dead_pod_ends_the_session_and_the_next_cell_says_so(k8s, player, kube, kube_namespace):
    service = k8s()
    session = start(service, player)
    cell = session.cell("import time\nprint('working', flush=True)\ntime.sleep(300)\n")
    wait_for(lambda: len(log_text(service, cell.id)) == 2, timeout=60, message="ranks working")
    session.runs[1].process.kill()  # an OOM kill, a node gone: the pod fails
    final = service.wait(cell.id, timeout=60)
    assert final.state == "failed" and final.failed_rank == 1, final.error
    assert "the session ended (its state is lost)" in final.error
    holder = session.holder
    assert holder.state == "failed" and "session ended" in holder.error
    # Nothing is left in the cluster; the other rank's pod went with the job object.
    wait_for(lambda: objects_of(kube, kube_namespace, holder.id) == {}, timeout=60)
    player.kill_deleted()
    with pytest.raises(sessions.SessionEnded, match="session 'llm' ended"):
        session.cell("1")
    # The one after starts a fresh session (a new holder, new pods).
    record, _ = sessions.submit_cell(service, "llm", {}, code("2"), origin=ORIGIN)
    assert record.origin["session_job"] != holder.id
    sessions.stop_session(service, None, "llm")
    wait_for(
        lambda: objects_of(kube, kube_namespace, record.origin["session_job"]) == {}, timeout=60
    )


def test_an_idle_session_ends_and_frees_its_pods(k8s, player, kube, kube_namespace):
    service = k8s(session_idle_timeout=3)
    session = start(service, player)
    holder = service.wait(session.holder_id, timeout=60)
    assert holder.state == "succeeded"
    assert "without a cell (MLClusterConfig.session_idle_timeout)" in holder.reason
    wait_for(lambda: objects_of(kube, kube_namespace, holder.id) == {}, timeout=60)
    # The ranks were asked to stop (atexit runs), not killed.
    for run in session.runs.values():
        assert run.wait(30) == 0


def test_another_user_cannot_see_run_in_or_stop_a_kubernetes_session(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("secret = 'alice only'\n")
    for call in (
        lambda: sessions.get_session(service, "mallory", "llm"),
        lambda: sessions.stop_session(service, "mallory", "llm"),
        lambda: sessions.restart_session(service, "mallory", "llm"),
    ):
        with pytest.raises(sessions.UnknownSession):
            call()
    assert sessions.list_sessions(service, "mallory") == []
    assert session.holder.state == "running"
    after = session.run("secret")
    assert service.result(after.id) == ("value", "alice only")
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def _channel(session: Session, rank: int) -> tuple[str, int]:
    """Where rank `rank` listens: the port its pod log names."""
    for line in session.runs[rank].text.splitlines():
        if '"session_channel"' in line:
            return "127.0.0.1", int(line.split('"port":')[1].split("}")[0])
    raise AssertionError("no session_channel record in the rank's output")


def test_attack_forged_or_replayed_commands_to_a_pod_are_refused(
    k8s, player, kube, kube_namespace, tmp_path
):
    service = k8s()
    session = start(service, player)
    marker = tmp_path / "pwned"
    evil = code(f"open({str(marker)!r}, 'w').write('ran')\n")
    payload = base64.b64encode(zlib.compress(evil.dumps(), 1)).decode()
    address = _channel(session, 1)

    # A stranger without the job's key: the handshake fails, the connection is closed.
    with socket.create_connection(address, timeout=10) as stranger:
        reader = stranger.makefile("rb")
        assert reader.readline().startswith(HELLO)
        stranger.sendall(
            encode_record({"type": "hello", "rank_nonce": "guess", "nonce": "n"}, b"k" * 32, 1)
        )
        stranger.sendall(
            encode_record(
                {"type": "cell", "seq": 10**9, "job": "x", "payload_data": payload, "env": {}},
                b"k" * 32,
                1,
            )
        )
        try:
            answer = reader.readline()
        except ConnectionResetError:
            # Closed while our bytes were still unread: the kernel sends a reset, not an
            # end of stream (a fresh-clone CI run saw it). Either way, not a word came back.
            answer = b""
        assert answer == b""  # closed without a word

    # Someone on the wire inside the authenticated stream (played here by completing the
    # handshake with the key, as the supervisor does): a command signed with another key,
    # and a genuine one replayed (its sequence number already used), are both refused.
    key = job_key(key_path(service.store.payload_path(session.holder_id)))
    with socket.create_connection(address, timeout=10) as hijack:
        reader = hijack.makefile("rb")
        nonce = reader.readline().rstrip(b"\n")[len(HELLO) :].decode()
        hijack.sendall(encode_record({"type": "hello", "rank_nonce": nonce, "nonce": "n1"}, key, 1))
        assert b"hello_ok" in reader.readline()
        cell = {"type": "cell", "job": "forged", "payload_data": payload, "env": {}}
        hijack.sendall(
            encode_record({**cell, "seq": 10**9}, b"k" * 32, 1)
            + encode_record({**cell, "seq": 1}, key, 1)
            + encode_record({"type": "stop", "seq": 2}, key, 1)
        )
        wait_for(
            lambda: session.runs[1].text.count("ignored a command") >= 3,
            timeout=30,
            message="the rank's refusals",
        )
    assert not marker.exists()
    assert "refused a connection that did not prove the session's key" in session.runs[1].text
    # The rank lives on; the supervisor's own channel (displaced by the hijack) reconnects.
    assert session.runs[1].process.poll() is None
    after = session.run("import os\nint(os.environ['RANK']) + 100")
    assert after.state == "succeeded", after.error
    assert service.result(after.id) == ("value", 100)
    assert not marker.exists()
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


# What a rank's own code can do to its end of the session channel (played from inside the
# rank, the only place that holds it): drop the supervisor's connection, or stop listening.
DROP_CHANNEL = """
import gc, os, socket
if os.environ["RANK"] == "1":
    (channel,) = [o for o in gc.get_objects() if type(o).__name__ == "CommandChannel"]
    if {stop_listening}:
        channel.server.shutdown(socket.SHUT_RDWR)
        channel.server.close()
    channel.current.shutdown(socket.SHUT_RDWR)
"""


def test_a_dropped_channel_is_reconnected_and_the_session_goes_on(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("kept = 'still here'\n")
    dropped = session.run(DROP_CHANNEL.format(stop_listening=False))
    assert dropped.state == "succeeded", dropped.error
    wait_for(
        lambda: any(
            "the channel to rank 1 is back" in e["line"] for e in service.logs(session.holder_id)[0]
        ),
        timeout=30,
        message="the supervisor reconnecting",
    )
    system = [e["line"] for e in service.logs(session.holder_id)[0] if e["stream"] == "system"]
    assert any("the channel to rank 1 dropped" in line for line in system), system
    after = session.run("import os\n(kept, int(os.environ['RANK']))")
    assert service.result(after.id) == ("value", ("still here", 0))
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_rank_that_cannot_be_reached_ends_the_session_saying_so(
    k8s, player, kube, kube_namespace
):
    service = k8s(kubernetes_session_channel_timeout=3)
    session = start(service, player)
    session.run(DROP_CHANNEL.format(stop_listening=True))
    holder = service.wait(session.holder_id, timeout=60)  # no hang: it ends
    assert holder.state == "failed" and holder.failed_rank == 1
    assert "rank 1 could not be reached for 3 s" in holder.error, holder.error
    wait_for(lambda: objects_of(kube, kube_namespace, holder.id) == {}, timeout=60)
    player.kill_deleted()
    with pytest.raises(sessions.SessionEnded, match="rank 1 could not be reached"):
        session.cell("1")


# Rank 1's own code makes its port a tarpit (it accepts, and never greets): the
# supervisor's reconnect hangs there up to its connect and handshake timeouts (~15 s).
# Rank 0 prints on until cancelled.
TARPIT = """
import gc, os, socket, threading, time
if os.environ["RANK"] == "1":
    (channel,) = [o for o in gc.get_objects() if type(o).__name__ == "CommandChannel"]
    channel.server.shutdown(socket.SHUT_RDWR)
    channel.server.close()
    tarpit = socket.create_server(("", channel.port))
    held = []

    def hold():
        while True:
            held.append(tarpit.accept()[0])
            open({mark!r}, "a").write("dialled")

    threading.Thread(target=hold, daemon=True).start()
    channel.current.shutdown(socket.SHUT_RDWR)
else:
    while True:
        print("tick", flush=True)
        time.sleep(0.1)
"""


def test_a_rank_that_never_answers_its_reconnect_holds_up_no_output_and_no_cancel(
    k8s, player, kube, kube_namespace, tmp_path
):
    service = k8s(kill_grace_period=2)
    session = start(service, player)
    mark = tmp_path / "dialled"
    cell = session.cell(TARPIT.format(mark=str(mark)))
    wait_for(mark.exists, timeout=60, message="the supervisor dialling rank 1's tarpit")

    def ticks() -> int:
        return sum(line == "0:tick" for line in log_text(service, cell.id))

    # While that dial hangs (10 s, the handshake's timeout), rank 0's output streams on and
    # a cancel is acted on at once: a dial inside the supervisor's loop held both.
    now, since = ticks(), time.monotonic()
    wait_for(lambda: ticks() >= now + 5, timeout=30, message="rank 0's output")
    assert time.monotonic() - since < 6, "rank 0's output waited for rank 1's dial"
    asked = time.monotonic()
    final = service.cancel(cell.id, wait=True)
    assert final.state == "cancelled", final.error
    assert time.monotonic() - asked < 6, "the cancel waited for rank 1's dial"
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)
    player.kill_deleted()


def fresh_pods(session: Session, player: ClusterPlayer) -> None:
    """The pods of the session's next attempt, played as the first ones were."""
    player.kill_deleted()
    job = player.resumed(session.holder_id)
    for rank, pod in player.create_pods(job).items():
        player.schedule(pod)
        session.runs[rank] = player.run_rank(pod, pod_ip="127.0.0.1")
        player.end_when_exited(session.runs[rank])


def test_restart_gives_the_session_fresh_pods_and_its_state_is_lost(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("x = 1\n")
    old = dict(session.runs)
    info = sessions.restart_session(service, None, "llm")
    assert info.holder.restarts == 1 and info.live
    for run in old.values():
        assert run.wait(30) == 0  # asked to stop first: atexit ran
    fresh_pods(session, player)
    after = session.run("'x' in globals()")
    assert after.state == "succeeded", after.error
    assert service.result(after.id) == ("value", False)
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_rank_that_ignores_the_interrupt_restarts_the_session_and_the_cell_says_so(
    k8s, player, kube, kube_namespace
):
    service = k8s(session_interrupt_grace=2)
    session = start(service, player)
    cell = session.cell(
        "import time\nprint('stubborn', flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(100)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
    )
    wait_for(lambda: len(log_text(service, cell.id)) == 2, timeout=60, message="ranks running")
    final = service.cancel(cell.id, wait=True)
    assert final.state == "cancelled"
    assert "did not return within 2 s of the interrupt" in final.reason, final.reason
    assert "state was lost" in final.reason
    wait_for(lambda: session.holder.restarts == 1, timeout=60, message="the restart")
    fresh_pods(session, player)
    after = session.run("'time' in globals()")
    assert service.result(after.id) == ("value", False)
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_session_whose_supervisor_dies_ends_and_leaves_nothing_running(
    k8s, player, kube, kube_namespace
):
    # Its ranks wait max(10 s, twice this) for a supervisor before they end by themselves.
    service = k8s(kubernetes_session_channel_timeout=1)
    session = start(service, player)
    session.run("x = 1\n")
    pid = session.holder.supervisor["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_gone(pid), timeout=30, message="the supervisor gone")
    # Nobody has looked yet (no reaper ran): the pods' ranks end on their own, atexit run,
    # so their pods free the node instead of idling forever.
    for run in session.runs.values():
        assert run.wait(60) == 0
        assert "heard from no supervisor for 10 s: ending" in run.text
    # The next look settles the session (its supervisor is lost: a session is not adopted)
    # and deletes its objects; the cell says the session ended.
    with pytest.raises(sessions.SessionEnded, match="session 'llm' ended"):
        session.cell("1")
    assert session.holder.state == "failed"
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_cell_too_large_for_the_pods_fails_saying_so_and_the_session_stays(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    big = os.urandom(2**20) * 97  # incompressible: more than a job's 96 MiB of payload
    too_big = session.run("len(big)", big=big)
    assert too_big.state == "failed"
    assert "more than 96 MiB after compression" in too_big.error, too_big.error
    after = session.run("import os\nint(os.environ['RANK'])")
    assert service.result(after.id) == ("value", 0)
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_api_faults_during_a_session_are_retried_and_nothing_is_left(
    k8s, player, kube, kube_namespace
):
    """The API server fails once where a session leans on it: a pod's log stream (the
    cells' output and reports) and the job's deletion at stop. Both are retried with
    kubeconn's backoff: the cells' output is complete and the objects go."""
    logs = re.compile(rf"/api/v1/namespaces/{kube_namespace}/pods/[^/]+/log")
    jobs = re.compile(rf"/apis/batch/v1/namespaces/{kube_namespace}/jobs/[^/]+")
    kube.on_emulator(lambda e: e["get", logs][:1] << 503)
    kube.on_emulator(lambda e: e["delete", jobs][:1] << 503)
    service = k8s()
    session = start(service, player)
    cell = session.run("import os\nprint('rank', os.environ['RANK'], 'here', flush=True)\n7")
    assert cell.state == "succeeded", cell.error
    assert sorted(log_text(service, cell.id)) == ["0:rank 0 here", "1:rank 1 here"]
    assert service.result(cell.id) == ("value", 7)
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)
    # Both faults were served (the retries are what got past them).
    assert kube.on_emulator(lambda e: len(list(e["delete", jobs]))) >= 2
    assert kube.on_emulator(lambda e: len(list(e["get", logs]))) >= 3  # 2 pods, 1 again


def test_a_cell_past_its_timeout_is_interrupted_and_the_session_stays(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    session = start(service, player)
    session.run("kept = 1\n")
    slow = session.cell("import time\ntime.sleep(300)\n", {"timeout": 2})
    final = service.wait(slow.id, timeout=60)
    assert final.state == "failed" and "timed out after 2s" in final.error, final.error
    assert "0:KeyboardInterrupt (rank 0)" in log_text(service, slow.id)
    after = session.run("kept + 1")
    assert service.result(after.id) == ("value", 2)
    sessions.stop_session(service, None, "llm")
    wait_for(lambda: objects_of(kube, kube_namespace, session.holder_id) == {}, timeout=60)


def test_a_session_waiting_for_its_pods_is_not_idle_and_stops_at_once(
    k8s, player, kube, kube_namespace
):
    service = k8s(session_idle_timeout=1)
    first, _ = sessions.submit_cell(
        service, "llm", {"backend": "kubernetes", "workers": 2}, code("1"), origin=ORIGIN
    )
    holder_id = first.origin["session_job"]
    player.resumed(holder_id)  # created and resumed; no node runs its pods (yet)
    deadline = time.monotonic() + 3  # three idle timeouts
    while time.monotonic() < deadline:
        assert not service.store.get_job(holder_id).final
        assert service.store.get_job(first.id).state == "starting"
        time.sleep(0.2)
    started = time.monotonic()
    info = sessions.stop_session(service, None, "llm")
    assert info.holder.state == "cancelled"
    assert time.monotonic() - started < 20  # no grace waited for ranks that never ran
    cell = service.store.get_job(first.id)
    assert cell.state == "failed" and "the session ended" in cell.error, cell.error
    wait_for(lambda: objects_of(kube, kube_namespace, holder_id) == {}, timeout=60)
