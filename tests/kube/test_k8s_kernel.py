"""`%%distributed --backend kubernetes` in a real kernel, against the API emulator: the magic,
its live monitor and `%distributed_jobs` work unchanged on this backend."""

from __future__ import annotations

import os

import pytest
from helpers import start_kernel, wait_for
from kernel_session import KernelSession, outputs, rank_texts

from tests.kube.player import objects_of

CELL = """%%distributed --backend kubernetes --workers 2 --push x
import os
print("rank", os.environ["RANK"], "says hi", flush=True)
x + int(os.environ["RANK"]) + 1
"""


@pytest.fixture
def kernel(store_dir):
    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))  # $KUBECONFIG: the emulator
    try:
        yield KernelSession(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def only_job(service):
    return wait_for(lambda: service.store.list_jobs()[0], timeout=60, message="the submitted job")[
        0
    ]


def test_the_magic_monitor_and_job_list_work_on_kubernetes(
    k8s, player, kernel, kube, kube_namespace
):
    service = k8s()
    kernel.execute("x = 20")
    msg_id = kernel.kc.execute(CELL)
    job = only_job(service)
    player.play(job.id)
    msgs, reply = kernel.collect(msg_id, timeout=120)
    assert reply["status"] == "ok", reply
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "21"
    assert rank_texts(msgs) == {0: "[rank 0] rank 0 says hi", 1: "[rank 1] rank 1 says hi"}
    record = service.store.get_job(job.id)
    assert (record.state, record.backend, record.origin["kind"]) == (
        "succeeded",
        "kubernetes",
        "kernel",
    )

    msgs, _ = kernel.execute("%distributed_jobs")
    (table,) = [m["data"] for m in outputs(msgs, "display_data")]
    assert job.id in table["text/plain"] and "kubernetes" in table["text/plain"]
    assert "succeeded" in table["text/plain"] and "2/2" in table["text/plain"]
    assert objects_of(kube, kube_namespace, job.id) == {}


def test_interrupting_the_kernel_cancels_the_job_in_the_cluster(
    k8s, player, kernel, kube, kube_namespace
):
    service = k8s()
    msg_id = kernel.kc.execute(
        '%%distributed --backend kubernetes --workers 2\nimport time\nprint("up", flush=True)\n'
        "time.sleep(300)\n"
    )
    job = only_job(service)
    resumed = player.resumed(job.id)
    for pod in player.create_pods(resumed).values():
        player.schedule(pod)
        player.run_rank(pod)
    wait_for(
        lambda: all(r.state == "running" for r in service.store.get_job(job.id).ranks),
        timeout=60,
        message="both ranks running",
    )
    kernel.km.interrupt_kernel()
    _, reply = kernel.collect(msg_id, timeout=60)
    player.kill_deleted()
    assert reply["status"] == "error"
    assert service.store.get_job(job.id).state == "cancelled"
    assert objects_of(kube, kube_namespace, job.id) == {}
