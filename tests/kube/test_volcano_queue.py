"""Volcano queue visibility against the API emulator: while a Volcano-gang job waits, its
PodGroup's phase and Unschedulable condition show in the job's reason, in `mlcluster jobs`
and the monitor's line, refreshed as they change. The test plays Volcano by patching the
PodGroup's status (scheduling.volcano.sh/v1beta1) as its scheduler does."""

from __future__ import annotations

import re
import time

import jsonschema
from helpers import wait_for

from jupyterlab_mlcluster.cli import format_jobs_table
from jupyterlab_mlcluster.kernel.job_html import status_line
from tests.kube.crds import trainer_runtime, trainer_schema
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of
from tests.kube.test_trainer_v2 import as_built

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


def test_a_trainjob_in_a_volcano_queue(trainer, volcano, k8s, player, kube, kube_namespace):
    """Trainer v2 + Volcano: the platform's runtime has `podGroupPolicy.volcano` (and the
    pods' schedulerName); the TrainJob names the queue (annotation) and its pods the group
    (runtimePatches); the Trainer makes the PodGroup after the TrainJob (played here, as
    its volcano plugin does); the job's reason leads with that PodGroup's word."""
    runtime = trainer_runtime("torch-distributed")
    runtime["metadata"]["name"] = "torch-distributed-volcano"
    runtime["spec"]["podGroupPolicy"] = {"volcano": {}}
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    node["template"]["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    jsonschema.Draft202012Validator(trainer_schema("ClusterTrainingRuntime")).validate(
        {k: v for k, v in runtime.items() if k != "status"}
    )
    kube.create(runtime)
    service = k8s(
        kubernetes_gang="volcano",
        kubernetes_queue="training",
        kubernetes_trainer_runtimes={"pytorch": "torch-distributed-volcano"},
    )
    record = service.submit(spec_of(workers=2, cpus=1), code("6 * 7"))
    job = player.resumed(record.id)
    name = job["metadata"]["name"]
    assert job["kind"] == "TrainJob"
    jsonschema.Draft202012Validator(trainer_schema()).validate(as_built(job))
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed-volcano"
    assert job["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "training"
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    (patch,) = job["spec"]["runtimePatches"]
    (node_patch,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod_patch = node_patch["template"]["spec"]["template"]
    assert pod_patch["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": name}
    assert "schedulerName" not in pod_patch["spec"]  # the runtime's: runtimePatches cannot
    assert "PodGroup" not in objects_of(kube, kube_namespace, record.id)  # the Trainer's to make

    # The Trainer's volcano plugin: a PodGroup named after the TrainJob, owned by it.
    kube.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {
                "name": name,
                "namespace": kube_namespace,
                "labels": {"mlcluster.io/job-id": record.id},
                "ownerReferences": [
                    {
                        "apiVersion": job["apiVersion"],
                        "kind": "TrainJob",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"minMember": 2, "queue": "training", "minResources": {"cpu": "2"}},
        }
    )
    pods = player.create_pods(job)
    for pod in pods.values():
        annotations = kube.get("v1", "Pod", pod, kube_namespace)["metadata"]["annotations"]
        assert annotations["scheduling.k8s.io/group-name"] == name
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Unschedulable",
                "status": "True",
                "reason": "NotEnoughResources",
                "message": NO_GPU,
            }
        ],
    }
    kube.patch(*PODGROUP, name, {"status": status}, kube_namespace, subresource="status")

    def waiting():
        rec = service.store.get_job(record.id)
        return rec if NO_GPU in (rec.reason or "") else None

    rec = wait_for(waiting, timeout=30, message="the PodGroup's word")
    assert rec.state == "queued"
    assert rec.reason.startswith(f"Volcano: PodGroup pending in queue training: {NO_GPU}")
    assert "Volcano: PodGroup pending in queue training" in format_jobs_table([rec])
    assert service.cancel(record.id).state == "cancelled"
    player.kill_deleted()
    assert objects_of(kube, kube_namespace, record.id) == {}
