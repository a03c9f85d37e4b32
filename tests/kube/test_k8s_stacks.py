"""Where a Kubernetes job's ranks are (issue 33), against the API emulator with the ranks run
for real (ClusterPlayer, each pod's IP 127.0.0.1): a pod has no SYS_PTRACE, so each rank's
own helper (runtime/stack_port.py) answers its supervisor, or the asking process, over its
pod's network, with records signed with the job's key; the answer says that reader.

The hang of a 2-rank gloo job folded by rank, then its sleeping rank failing while its peer
waits in all_reduce (the peer read while the failing rank waits); a cancel keeping where the
ranks were; a stall with --on-stall cancel; a straggler named from its pod log's progress. And the helper's exchange itself: it answers only an ask
signed with the job's key, and an answer not signed so is refused."""

from __future__ import annotations

import socket
import textwrap
import threading

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.backends.kubernetes import stacks
from jupyterlab_mlcluster.jobs import forensics
from jupyterlab_mlcluster.jobs.forensics.readers import ReadFailed
from jupyterlab_mlcluster.jobs.model import JobState
from jupyterlab_mlcluster.runtime import stack_port
from jupyterlab_mlcluster.runtime.protocol import encode_record
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.test_k8s_eviction import free_port

READER = "faulthandler (the rank's own helper) via its pod's stack port"

SLEEPERS = textwrap.dedent(
    """\
    import time

    def wait_here():
        time.sleep(600)

    print("ready", flush=True)
    wait_here()
    """
)

FAILING_PEER = textwrap.dedent(
    """\
    import os, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def train_step(t):
        dist.all_reduce(t)

    if dist.get_rank() == 1:
        print("ready", flush=True)
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.05)
        raise ValueError("bad shard")
    print("ready", flush=True)
    train_step(torch.ones(2))
    """
)


def run_pods(player, job, **env: str) -> dict:
    """The attempt's pods placed and started, reachable here (their IP is 127.0.0.1)."""
    env = {"MASTER_PORT": str(free_port()), **env}
    pods = player.create_pods(job)
    for pod in pods.values():
        player.schedule(pod)
    return {
        rank: player.run_rank(pod, extra_env=env, pod_ip="127.0.0.1") for rank, pod in pods.items()
    }


def ready(service, job: str, ranks: int) -> None:
    def all_said() -> bool:
        record = service.get(job)
        assert not record.final, (record.state, record.error, record.reason)
        lines, _ = service.logs(job)
        return len({line["rank"] for line in lines if line["line"] == "ready"}) == ranks

    wait_for(all_said, timeout=180, message=f"{ranks} ranks ready")


def test_a_hung_gloo_job_folds_by_rank_then_its_failing_rank_waits_while_its_peer_is_read(
    k8s, player, tmp_path
):
    """The one end-to-end proof: rank 0 waits in all_reduce for rank 1, which sleeps, then
    raises; its peer is read before its exit closes the gloo sockets."""
    service = k8s()
    job = service.submit(spec_of(workers=2), code(FAILING_PEER)).id
    go = tmp_path / "go"
    runs = run_pods(player, player.resumed(job), GO=str(go))
    ready(service, job, 2)

    def folded():
        report = service.stacks(job)
        text = "\n".join(forensics.fold_lines(report, main_only=True))
        return report if "all_reduce" in text and "time.sleep" in text else None

    report = wait_for(folded, timeout=60, message="rank 0 inside all_reduce, rank 1 asleep")
    assert report.complete, report.missing
    assert report.readers == [READER]
    lines = forensics.fold_lines(report, main_only=True)
    assert any(line.startswith("rank 0: all_reduce ← train_step (") for line in lines), lines
    assert any(line.startswith("rank 1: ") and "time.sleep(0.05)" in line for line in lines)
    # The helper's own thread is not one of the rank's.
    assert all(len(r.threads) <= 3 for r in report.ranks), [len(r.threads) for r in report.ranks]
    assert [r.rank for r in service.stacks(job, rank=1).ranks] == [1]
    with pytest.raises(forensics.NoSuchRank, match="no rank 2: its ranks are 0 to 1"):
        service.stacks(job, rank=2)
    with pytest.raises(forensics.StacksUnavailable, match="--native .* in a pod"):
        service.stacks(job, native=True)

    go.touch()
    assert player.end_rank(runs[1]) == 1
    final = service.wait(job, timeout=60)
    player.kill_deleted()
    assert final.state == JobState.FAILED and final.failed_rank == 1
    assert final.error.startswith("rank 1 failed: ValueError: bad shard; "), final.error
    assert "rank 0 was still in all_reduce ← train_step" in final.error, final.error
    kept = forensics.kept(service.store.job_dir(job))
    assert [k.why for k in kept] == ["failed"] and [r.rank for r in kept[0].ranks] == [0]
    assert service.stacks(job).why == "failed"  # a finished job: the stacks it kept


def test_a_cancel_keeps_where_the_ranks_were_before_the_pods_go(k8s, player):
    service = k8s()
    job = service.submit(spec_of(workers=2, framework="none"), code(SLEEPERS)).id
    run_pods(player, player.resumed(job))
    ready(service, job, 2)
    wait_for(lambda: "wait_here" in str(service.stacks(job).folds()), timeout=60)
    record = service.cancel(job)
    player.kill_deleted()
    assert record.state == JobState.CANCELLED
    assert record.reason.startswith("cancelled by user; ranks 0, 1 were in wait_here ("), (
        record.reason
    )
    kept = forensics.kept(service.store.job_dir(job))
    assert [k.why for k in kept] == ["cancelled"] and {r.rank for r in kept[0].ranks} == {0, 1}


def test_a_stall_with_on_stall_cancel_ends_the_job_with_where(k8s, player):
    service = k8s()
    spec = spec_of(workers=2, framework="none", stall_after="3s", on_stall="cancel")
    job = service.submit(spec, code(SLEEPERS)).id
    run_pods(player, player.resumed(job))
    record = wait_for(lambda: (r := service.get(job)).final and r, timeout=120, message="its end")
    player.kill_deleted()
    assert record.state == JobState.CANCELLED
    assert record.reason.startswith("cancelled (--on-stall cancel): rank"), record.reason
    assert "stalled: no output, progress or CPU for 3s" in record.reason
    assert "no CPU figure" not in record.reason  # the ranks report their own
    assert "wait_here (" in record.reason, record.reason
    assert "stalled" in {k.why for k in forensics.kept(service.store.job_dir(job))}


SLOW_RANK = textwrap.dedent(
    """\
    import os, time
    import jupyterlab_mlcluster as mlc

    pause = 0.6 if os.environ["RANK"] == "1" else 0.1
    for step in range(100000):
        mlc.progress(step, desc="train")
        time.sleep(pause)
    """
)


def test_a_straggler_is_named_from_the_progress_in_its_pod_log(k8s, player):
    service = k8s(straggler_after=3)
    job = service.submit(spec_of(workers=2, framework="none"), code(SLOW_RANK)).id
    run_pods(player, player.resumed(job))

    def named():
        record = service.get(job)
        assert not record.final, (record.state, record.error)
        return record if record.straggler else None

    view = wait_for(named, timeout=120, message="the straggler named").to_json()["straggler"]
    assert view["ranks"] == [1], view
    assert view["median"] > 2 * view["rates"]["1"] > 0
    service.cancel(job)
    player.kill_deleted()


# -- the exchange itself -------------------------------------------------------------------


@pytest.fixture
def helper(tmp_path):
    """A rank's helper (this process's stacks), listening on a port of this machine; an
    ack touches tmp_path/ack."""
    server = socket.create_server(("127.0.0.1", 0))
    key = b"k" * 32
    ack = tmp_path / "ack"
    serving = stack_port._Helper(server, key, 3, threading.main_thread().ident, str(ack))
    threading.Thread(target=serving.serve, daemon=True).start()
    yield server.getsockname()[1], key, ack
    server.close()


def test_the_helper_answers_an_ask_signed_with_the_jobs_key(helper):
    port, key, ack = helper
    answer = stacks.ask("127.0.0.1", port, key, 3)
    dumped = stacks.rank_stacks(answer, 3)
    assert dumped.reader == READER
    main = next(t for t in dumped.threads if t.main)
    assert any(f.name.startswith("test_the_helper_answers") for f in main.frames)
    assert not ack.exists()
    assert stacks.ask("127.0.0.1", port, key, 3, ack=True)["type"] == "stacks_acked"
    assert ack.exists()  # a failing rank waiting for its peers to be read goes on


def test_an_ask_without_the_jobs_key_gets_no_stacks(helper):
    port, key, ack = helper
    with pytest.raises(ReadFailed, match="closed the connection without an answer"):
        stacks.ask("127.0.0.1", port, b"x" * 32, 3)  # another job's key
    with pytest.raises(ReadFailed, match="closed the connection without an answer"):
        stacks.ask("127.0.0.1", port, key, 2)  # signed for another rank
    with pytest.raises(ReadFailed, match="closed the connection without an answer"):
        stacks.ask("127.0.0.1", port, b"x" * 32, 3, ack=True)
    assert not ack.exists()  # nobody else lets a failing rank go


def _impostor(answer) -> int:
    """A server on the rank's port that answers every ask with `answer(nonce)`."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        with server:
            conn, _ = server.accept()
            with conn:
                conn.sendall(stack_port.HELLO + b"0" * 32 + b"\n")
                line = conn.recv(4096).split(b" ", 2)[2]
                conn.sendall(answer(line))

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def test_an_answer_not_signed_with_the_jobs_key_is_refused():
    import json

    def forged(ask: bytes) -> bytes:
        nonce = json.loads(ask)["nonce"]
        fake = {"type": "stacks_dump", "nonce": nonce, "main": 1, "text": "forged"}
        return encode_record(fake, b"x" * 32, 0)

    port = _impostor(forged)
    with pytest.raises(ReadFailed, match="not signed with the job's key"):
        stacks.ask("127.0.0.1", port, b"k" * 32, 0)


def test_an_answer_over_its_bound_is_refused_unread():
    port = _impostor(lambda ask: b"y" * (stacks.MAX_ANSWER + 70000))
    with pytest.raises(ReadFailed, match="over .* bytes"):
        stacks.ask("127.0.0.1", port, b"k" * 32, 0)
