"""Kubeflow Trainer v2 (TrainJob) against the API emulator, end to end.

The Trainer's published CRDs (v2.3.0, tests/kube/upstream) are served and its own
`torch-distributed` ClusterTrainingRuntime exists. The JobService submits for real and a
real supervisor drives the job over HTTP; the test plays the Trainer + JobSet + Job
controllers (`ClusterPlayer._trainer_pod`: pods named and labelled as they make them), the
scheduler and the kubelet, running the real worker runtime for each rank.
"""

from __future__ import annotations

import jsonschema
import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import SpecError
from tests.attacks import FORGING_CELL, assert_forgeries_refused, evil_result
from tests.kube.crds import trainer_schema
from tests.kube.jobs_fixtures import IMAGE, SLEEPY_CELL, cancel_running, code, log_text, spec_of
from tests.kube.player import objects_of

TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")

CELL = """
import os
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}")
{"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "x": x}
"""


def wait_state(service, job_id, predicate, timeout=30, message="state"):
    def matching():
        record = service.store.get_job(job_id)
        return record if predicate(record) else None

    return wait_for(matching, timeout=timeout, message=message)


def as_built(obj: dict) -> dict:
    """The object as a client sent it: what the server added (uid, status, ...) removed."""
    meta = {
        k: v
        for k, v in obj["metadata"].items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": meta,
        "spec": obj["spec"],
    }


def test_a_4_rank_cell_becomes_one_trainjob_preferred_over_pytorchjob(
    training_operator, trainer, k8s, player, kube, kube_namespace
):
    service = k8s()
    record = service.submit(spec_of(workers=4, cpus=0.5, timeout="10m"), code(CELL, x=41))
    job = player.job_object(record.id)
    assert (job["apiVersion"], job["kind"]) == TRAINJOB
    # Valid against the Trainer's published schema, made strict (no field it would prune).
    jsonschema.Draft202012Validator(trainer_schema()).validate(as_built(job))
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    assert spec["trainer"]["image"] == IMAGE
    assert (spec["trainer"]["numNodes"], spec["trainer"]["numProcPerNode"]) == (4, 1)
    assert spec["trainer"]["resourcesPerNode"]["limits"] == {"cpu": "500m"}
    assert spec["activeDeadlineSeconds"] == 600
    # Nothing else made a job object: one TrainJob, no PyTorchJob.
    assert kube.list("kubeflow.org/v1", "PyTorchJob", kube_namespace) == []
    secrets = kube.list(
        "v1", "Secret", kube_namespace, label_selector=f"mlcluster.io/job-id={record.id}"
    )
    assert [ref["kind"] for s in secrets for ref in s["metadata"]["ownerReferences"]] == [
        "TrainJob"
    ] * len(secrets)

    runs = player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", (final.error, [r.text for r in runs.values()])
    assert service.result(record.id) == ("value", {"rank": 0, "world": 4, "x": 41})
    assert [r.state for r in final.ranks] == ["succeeded"] * 4
    name = job["metadata"]["name"]
    # Rank i is the pod of node i, named as JobSet names them.
    assert [r.host.rsplit("-", 1)[0] for r in final.ranks] == [
        f"{name}-node-0-{i}" for i in range(4)
    ]
    for rank in range(4):
        assert log_text(service, record.id, rank) == [f"{rank}:hello from rank {rank} of 4"]
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_a_failing_node_fails_the_job_with_its_traceback(
    trainer, k8s, player, kube, kube_namespace
):
    service = k8s()
    failing = 'import os\nif os.environ["RANK"] == "1":\n    raise ValueError("bad shard")\n'
    record = service.submit(spec_of(workers=2), code(failing))
    job = player.resumed(record.id)
    pods = player.create_pods(job)
    for pod in pods.values():
        player.schedule(pod)
    player.end_rank(player.run_rank(pods[1]))
    final = service.wait(record.id, timeout=60)
    player.kill_deleted()
    assert final.state == "failed"
    assert final.failed_rank == 1
    assert final.error == "rank 1 failed: ValueError: bad shard"
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_cancel_deletes_the_trainjob_and_its_pods(trainer, k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=2), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    kinds = {"Pod", "Secret", "TrainJob"}
    cancel_running(service, player, kube, kube_namespace, record.id, job, kinds)


def test_a_missing_runtime_is_a_clear_error_and_nothing_is_created(
    trainer, k8s, kube, kube_namespace
):
    kube.delete("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "torch-distributed")
    trainer("jax-distributed")
    service = k8s()
    with pytest.raises(SpecError) as refused:
        service.submit(spec_of(workers=4), code("1"))
    message = str(refused.value)
    assert "'torch-distributed'" in message and "it has: jax-distributed" in message
    assert "kubernetes_trainer_runtimes" in message
    assert service.store.list_jobs()[0] == []
    assert kube.list(*TRAINJOB, kube_namespace) == []
    assert kube.list("v1", "Secret", kube_namespace) == []

    # A configured runtime that exists is used.
    service = k8s(kubernetes_trainer_runtimes={"pytorch": "jax-distributed"})
    record = service.submit(spec_of(workers=1), code("1"))
    wait_for(lambda: kube.list(*TRAINJOB, kube_namespace), message="the TrainJob")
    (job,) = kube.list(*TRAINJOB, kube_namespace)
    assert job["spec"]["runtimeRef"]["name"] == "jax-distributed"
    assert service.cancel(record.id).state == "cancelled"


def test_queue_puts_the_kueue_label_and_leaves_it_suspended(trainer, k8s, player, kube):
    service = k8s(kubernetes_gang="kueue")
    record = service.submit(spec_of(workers=2, queue="team-a"), code("1"))
    job = player.job_object(record.id)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    rec = wait_state(service, record.id, lambda r: r.reason and "Kueue" in r.reason)
    assert rec.state == "queued"
    assert player.suspended(player.refresh(job))  # mlcluster leaves the resume to Kueue
    assert service.cancel(record.id).state == "cancelled"


def test_kueue_position_moves_3_1_admitted_in_mlcluster_jobs_and_the_monitor(
    trainer, k8s, player, kube, kube_namespace
):
    """Kueue is played through the API: its LocalQueue, the job's Workload and the
    visibility API's pending workloads (positions 0-based), answered as they change."""
    from jupyterlab_mlcluster.cli import format_jobs_table
    from jupyterlab_mlcluster.kernel.job_html import status_line

    kueue = "/apis/kueue.x-k8s.io/v1beta1/namespaces/" + kube_namespace
    visibility = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/" + kube_namespace
    played = {"uid": None, "position": 2, "evicted": False}

    def workloads():
        if played["uid"] is None:
            return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadList", "items": []}
        conditions = [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set node: insufficient quota",
            }
        ]
        if played["evicted"]:
            conditions.append(
                {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by a"}
            )
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "WorkloadList",
            "items": [
                {
                    "metadata": {
                        "name": "trainjob-x-1a2b3",
                        "labels": {"kueue.x-k8s.io/job-uid": played["uid"]},
                    },
                    "status": {"conditions": conditions},
                }
            ],
        }

    def pending():
        items = []
        if played["position"] is not None:
            items = [
                {
                    "metadata": {"name": "trainjob-x-1a2b3"},
                    "localQueueName": "team-a",
                    "positionInLocalQueue": played["position"],
                    "positionInClusterQueue": played["position"] + 4,
                    "priority": 0,
                }
            ]
        return {"kind": "PendingWorkloadsSummary", "items": items}

    def play_kueue(e):
        e["get", f"{kueue}/localqueues/team-a"] << {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": "team-a", "namespace": kube_namespace},
            "spec": {"clusterQueue": "gpu-cq"},
        }
        e["get", f"{kueue}/workloads"] << (lambda: workloads())
        e["get", f"{visibility}/localqueues/team-a/pendingworkloads"] << (lambda: pending())

    kube.on_emulator(play_kueue)
    service = k8s(kubernetes_gang="kueue")
    record = service.submit(spec_of(workers=1, queue="team-a"), code(SLEEPY_CELL))
    job = player.job_object(record.id)
    played["uid"] = job["metadata"]["uid"]

    def shown(text):
        rec = wait_state(service, record.id, lambda r: r.reason and text in r.reason, message=text)
        table = format_jobs_table(service.store.list_jobs()[0])
        return rec, table, status_line(rec)

    rec, table, line = shown("position 3")
    assert rec.state == "queued"
    assert rec.reason.startswith("Kueue position 3 in LocalQueue team-a (ClusterQueue gpu-cq)")
    assert "insufficient quota" in rec.reason
    assert "Kueue position 3 in LocalQueue team-a (ClusterQueue gpu-cq)" in table
    assert "queued" in line and "Kueue position 3 in LocalQueue team-a" in line

    played["position"] = 0
    rec, table, line = shown("position 1")
    assert "Kueue position 1 in LocalQueue team-a" in table
    assert "Kueue position 1 in LocalQueue team-a" in line

    # Admitted: Kueue lifts the suspension; the job leaves the queue and runs.
    played["position"] = None
    kube.patch(*TRAINJOB, job["metadata"]["name"], {"spec": {"suspend": False}}, kube_namespace)
    (pod,) = player.create_pods(player.resumed(record.id)).values()
    player.schedule(pod)
    player.run_rank(pod)
    rec = wait_state(service, record.id, lambda r: r.state == "running", message="running")
    assert "Kueue" not in (rec.reason or "")
    assert "Kueue" not in status_line(rec)

    # Preempted: suspended again (its pods go), back in the queue, said as such.
    played.update(position=0, evicted=True)
    kube.patch(*TRAINJOB, job["metadata"]["name"], {"spec": {"suspend": True}}, kube_namespace)
    kube.delete("v1", "Pod", pod, kube_namespace)
    player.kill_deleted()
    rec, table, line = shown("preempted")
    assert rec.state == "queued"
    assert rec.reason.startswith(
        "preempted by Kueue (suspended again) [Preempted: by a], position 1 in LocalQueue team-a"
    )
    assert "preempted by Kueue" in table and "preempted by Kueue" in line
    assert service.cancel(record.id).state == "cancelled"
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_attack_forged_control_records_change_no_result_on_the_trainjob_path(
    trainer, k8s, player, kube, kube_namespace, tmp_path
):
    """The attack of test_attacks_jobs on the TrainJob engine: both ranks print forged
    result and progress records (mid-line, made-up MAC, another job's key, genuine but
    mid-line, rank 1 posing as rank 0) into their pod logs. The per-job report key reaches
    the Trainer's pods through runtimePatches (the payload volume), so only rank 0's own
    signed result counts and nothing forged is ever unpickled."""
    mark = tmp_path / "unpickled"
    service = k8s()
    record = service.submit(spec_of(workers=2), code(FORGING_CELL, evil=evil_result(mark)))
    assert (player.job_object(record.id)["kind"]) == "TrainJob"
    runs = player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", (final.error, [r.text for r in runs.values()])
    assert_forgeries_refused(service, final, mark)
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_jobs_status_shows_in_the_reason_and_a_failed_node_job_fails_early(
    trainer, k8s, player, kube, kube_namespace
):
    """The test plays the Trainer copying its JobSet's per-replicated-job counts into the
    TrainJob's `status.jobsStatus` (v2.3 CRD): while the pods are not there yet the reason
    says where the JobSet stands; a failed `node` child Job fails the job at once, before
    any Failed condition, and the job's objects are cleaned up."""
    from jupyterlab_mlcluster.cli import format_jobs_table
    from jupyterlab_mlcluster.kernel.job_html import status_line

    service = k8s()
    record = service.submit(spec_of(workers=2), code("6 * 7"))
    job = player.resumed(record.id)
    name = job["metadata"]["name"]

    def jobs_status(**counts):
        zero = dict.fromkeys(("active", "ready", "succeeded", "failed", "suspended"), 0)
        entry = {"name": "node", **zero, **counts}
        initializer = {"name": "dataset-initializer", **zero, "succeeded": 1}
        kube.patch(
            *TRAINJOB,
            name,
            {"status": {"jobsStatus": [initializer, entry]}},
            kube_namespace,
            subresource="status",
        )

    jobs_status(suspended=1)
    rec = wait_state(service, record.id, lambda r: "not resumed its JobSet" in (r.reason or ""))
    assert rec.state == "queued"
    assert "the Kubeflow Trainer (JobSet) to create the pods" in rec.reason
    jobs_status(active=1)
    rec = wait_state(service, record.id, lambda r: "0 of 1 ready" in (r.reason or ""))
    assert rec.reason.startswith("JobSet node job: 0 of 1 ready; waiting for")
    assert "JobSet node job: 0 of 1 ready" in format_jobs_table(service.store.list_jobs()[0])
    assert "JobSet node job: 0 of 1 ready" in status_line(rec)
    jobs_status(failed=1)
    final = service.wait(record.id, timeout=60)
    assert final.state == "failed"
    assert final.error == "the Kubeflow Trainer reports 1 failed node job(s) (jobsStatus)", (
        final.error
    )
    assert objects_of(kube, kube_namespace, record.id) == {}
