"""Volcano queue visibility against the API emulator: while a Volcano-gang job waits, its
PodGroup's phase and Unschedulable condition show in the job's reason, in `mlcluster jobs`
and the monitor's line, refreshed as they change. The test plays Volcano by patching the
PodGroup's status (scheduling.volcano.sh/v1beta1) as its scheduler does."""

from __future__ import annotations

import re
import time

from helpers import wait_for

from jupyterlab_mlcluster.cli import format_jobs_table
from jupyterlab_mlcluster.kernel.monitor import status_line
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of

PODGROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_podgroup_phase_and_conditions_show_in_mlcluster_jobs_and_the_monitor(
    volcano, k8s, player, kube, kube_namespace
):
    service = k8s(kubernetes_gang="volcano", kubernetes_queue="training")
    record = service.submit(spec_of(workers=3, cpus=1), code("6 * 7"))
    job = player.resumed(record.id)
    name = job["metadata"]["name"]
    pods = player.create_pods(job)  # Volcano leaves them unbound until the gang fits

    def volcano_says(phase, reason=None, message=None):
        conditions = []
        if reason:
            conditions.append(
                {"type": "Unschedulable", "status": "True", "reason": reason, "message": message}
            )
        status = {"phase": phase, "conditions": conditions}
        kube.patch(*PODGROUP, name, {"status": status}, kube_namespace, subresource="status")

    def shown(text):
        def matching():
            rec = service.store.get_job(record.id)
            return rec if text in (rec.reason or "") else None

        rec = wait_for(matching, timeout=30, message=text)
        return rec, format_jobs_table(service.store.list_jobs()[0]), status_line(rec)

    volcano_says("Pending", "NotEnoughResources", NO_GPU)
    rec, table, line = shown("3 Insufficient nvidia.com/gpu")
    assert rec.state == "queued"
    assert rec.reason.startswith(f"Volcano: PodGroup pending in queue training: {NO_GPU}")
    assert "Volcano: PodGroup pending in queue training" in table
    assert "Volcano: PodGroup pending in queue training: 0/3 nodes" in line

    volcano_says("Inqueue", "NotEnoughResources", "2/3 tasks in gang unschedulable")
    rec, table, line = shown("Volcano: PodGroup inqueue in queue training: 2/3 tasks")
    assert "PodGroup inqueue" in table and "PodGroup inqueue" in line

    volcano_says("Pending", "Evicted", "preempted by a higher-priority job")
    rec, table, line = shown("preempted/evicted")
    assert rec.reason.startswith(
        "Volcano: PodGroup preempted/evicted, waiting again in queue training [Evicted]"
    )
    assert "preempted/evicted" in table and "preempted/evicted" in line

    volcano_says("Running")
    for pod in pods.values():
        player.schedule(pod)
        player.end_rank(player.run_rank(pod))
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert "Volcano" not in (final.reason or "")
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_an_unreadable_podgroup_keeps_the_pods_reason(volcano, k8s, player, kube, kube_namespace):
    """RBAC refuses the PodGroup: the job still says what its pods say, and the supervisor
    backs off (2 s, then jittered and growing) instead of asking every tick."""
    path = re.compile(
        rf"/apis/scheduling.volcano.sh/v1beta1/namespaces/{kube_namespace}/podgroups/.+"
    )
    kube.on_emulator(lambda e: e["get", path] << 403)
    service = k8s(kubernetes_gang="volcano", kubernetes_queue="training")
    record = service.submit(spec_of(workers=2), code("6 * 7"))
    player.create_pods(player.resumed(record.id))

    def reason():
        rec = service.store.get_job(record.id)
        return rec.reason if rec.reason and "waiting for" in rec.reason else None

    text = wait_for(reason, timeout=30, message="the pods' reason")
    assert "Volcano" not in text
    time.sleep(6)  # an upper bound on the asks, not a timing race
    asked = kube.on_emulator(lambda e: len(list(e["get", path])))
    assert 1 <= asked <= 5, asked
    assert "Volcano" not in service.store.get_job(record.id).reason
    assert service.cancel(record.id).state == "cancelled"
    player.kill_deleted()
    assert objects_of(kube, kube_namespace, record.id) == {}
