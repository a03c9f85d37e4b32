"""The Kubernetes backend against the API emulator, end to end.

The JobService submits for real and a real supervisor process drives the job over HTTP;
the test plays the Job controller / Training Operator, the scheduler and the kubelet
(`ClusterPlayer`), running the real worker runtime for each rank with the payload read
back from the job's Secrets and feeding its actual output as the pod log.
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import process_gone, wait_for

from jupyterlab_mlcluster.jobs.model import SpecError
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.jobs.storage.series import read_series
from tests.kube.helpers import Kube
from tests.kube.jobs_fixtures import IMAGE, SLEEPY_CELL, cancel_running, code, log_text, spec_of
from tests.kube.player import objects_of

CELL = """
import os
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}")
{"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "x": x}
"""


# -- the Indexed Job path ------------------------------------------------------------------------


def test_indexed_job_runs_the_cell_and_brings_the_result_back(k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=2), code(CELL, x=41))
    job = player.resumed(record.id)
    # No Training Operator here: an Indexed Job plus a headless Service, created suspended
    # and resumed once its owned Secrets and Service exist.
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    name = job["metadata"]["name"]
    service_obj = kube.get("v1", "Service", name, kube_namespace)
    (secret,) = kube.list(
        "v1", "Secret", kube_namespace, label_selector=f"mlcluster.io/job-id={record.id}"
    )
    for owned in (service_obj, secret):
        (ref,) = owned["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["blockOwnerDeletion"]) == (
            "Job",
            job["metadata"]["uid"],
            True,
        )
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE

    runs = player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", (final.error, runs[0].text, runs[1].text)
    assert service.result(record.id) == ("value", {"rank": 0, "world": 2, "x": 41})
    # Its JSON form travelled too (what a server serves: it never unpickles).
    assert service.result_data(record.id) == ("value", {"rank": 0, "world": 2, "x": 41})
    assert [r.state for r in final.ranks] == ["succeeded", "succeeded"]
    assert [r.exit_code for r in final.ranks] == [0, 0]
    # The pods are gone (foreground deletion), their output is not.
    assert objects_of(kube, kube_namespace, record.id) == {}
    assert log_text(service, record.id, 0) == ["0:hello from rank 0 of 2"]
    assert log_text(service, record.id, 1) == ["1:hello from rank 1 of 2"]


def record_of(service: JobService, job_id: str):
    return service.store.get_job(job_id)


def wait_state(
    service: JobService, job_id: str, predicate, timeout: float = 30, message: str = "state"
):
    """The job's record, once `predicate(record)` holds."""

    def matching():
        record = record_of(service, job_id)
        return record if predicate(record) else None

    return wait_for(matching, timeout=timeout, message=message)


def test_a_large_payload_travels_in_several_secrets(k8s, player, kube, kube_namespace):
    import hashlib

    blob = os.urandom(5 * 2**20)  # incompressible: 7 Secrets of at most 768 KiB
    service = k8s()
    record = service.submit(
        spec_of(workers=1), code("import hashlib\nhashlib.sha256(blob).hexdigest()", blob=blob)
    )
    player.resumed(record.id)
    secrets = kube.list(
        "v1", "Secret", kube_namespace, label_selector=f"mlcluster.io/job-id={record.id}"
    )
    assert len(secrets) == 7 and all(s["immutable"] for s in secrets)
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", hashlib.sha256(blob).hexdigest())
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_a_result_over_the_cap_fails_the_job_and_is_not_kept(k8s, player, kube, kube_namespace):
    """A pod's result past MLClusterConfig.max_result_mib is dropped as its chunks come (the
    supervisor's memory and the store's disk stay bounded) and the job fails saying why."""
    service = k8s(max_result_mib=1)
    record = service.submit(spec_of(workers=1), code("import os\nos.urandom(3 * 2**20)"))
    player.resumed(record.id)
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "failed" and "MLClusterConfig.max_result_mib" in final.error, final
    assert not service.store.result_path(record.id).exists()
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_a_pod_flooding_its_log_is_truncated_and_goes_on(k8s, player, kube, kube_namespace):
    """Output past MLClusterConfig.max_log_mib from a pod's log is dropped after one line
    saying so; the job runs on to its result."""
    service = k8s(max_log_mib=1)
    flood = "for i in range(30000):\n    print('y' * 100)\n'done'"
    record = service.submit(spec_of(workers=1), code(flood))
    player.resumed(record.id)
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", "done")
    lines = service.store.log_path(record.id, 0).read_text().splitlines()
    assert sum(1 for line in lines if "log truncated after 1 MiB" in line) == 1
    assert service.store.log_path(record.id, 0).stat().st_size < (1 << 20) + 4096


# -- the Training Operator path -------------------------------------------------------------------

FAILING_CELL = """
import os, time
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == "1":
    1 / 0
time.sleep(120)
"""


def test_pytorchjob_failing_rank_fails_the_job_with_its_traceback(
    training_operator, k8s, player, kube, kube_namespace
):
    service = k8s()
    record = service.submit(spec_of(workers=3), code(FAILING_CELL))
    job = player.resumed(record.id)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    pods = player.create_pods(job)
    assert sorted(pods) == [0, 1, 2]
    for pod in pods.values():
        player.schedule(pod)
    # (reachable here: the peers' own stack helpers answer, issue 33)
    runs = {rank: player.run_rank(pod, pod_ip="127.0.0.1") for rank, pod in pods.items()}
    wait_state(service, record.id, lambda r: r.state == "running", message="the job running")
    assert player.end_rank(runs[1]) == 1  # the kubelet reports the failed container

    final = service.wait(record.id, timeout=60)
    player.kill_deleted()
    assert final.state == "failed"
    assert final.failed_rank == 1
    # Where the peers were when it failed: read while rank 1 waited, before it exited.
    assert final.error.startswith("rank 1 failed: ZeroDivisionError: division by zero; ")
    # (those that had started by then: rank 2 may have been a turn late)
    assert "still in <module> (cell.py:6): time.sleep(120)" in final.error, final.error
    report = service.error_report(record.id)
    assert report["exc_type"] == "ZeroDivisionError" and "1 / 0" in report["traceback"]
    assert "line 5" in report["traceback"]
    assert [r.state for r in final.ranks] == ["cancelled", "failed", "cancelled"]
    assert final.ranks[1].exit_code == 1
    # Fail-fast: the other ranks' pods were deleted with the job, nothing is left.
    assert objects_of(kube, kube_namespace, record.id) == {}
    assert "rank 1 up" in "".join(log_text(service, record.id, 1))
    # The kernel's error display gets the rank's traceback.
    with pytest.raises(Exception) as raised:
        service.raise_for_state(final)
    assert "Traceback of rank 1" in str(raised.value) and "1 / 0" in str(raised.value)


# -- cancel, and gang scheduling through Volcano ------------------------------------------------------


def test_cancel_deletes_everything_including_the_podgroup(
    volcano, k8s, player, kube, kube_namespace
):
    service = k8s(kubernetes_gang="volcano", kubernetes_queue="training")
    record = service.submit(spec_of(workers=2, cpus=2, memory="1Gi"), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    (group,) = kube.list(
        "scheduling.volcano.sh/v1beta1",
        "PodGroup",
        kube_namespace,
        label_selector=f"mlcluster.io/job-id={record.id}",
    )
    assert group["spec"]["minMember"] == 2 and group["spec"]["queue"] == "training"
    assert group["spec"]["minResources"] == {"cpu": "4", "memory": "2Gi"}
    assert job["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    kinds = {"Pod", "Secret", "Service", "Job", "PodGroup"}
    cancel_running(service, player, kube, kube_namespace, record.id, job, kinds)


# -- conflicts ---------------------------------------------------------------------------------------

CONFLICT = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "reason": "Conflict",
    "code": 409,
    "message": "Operation cannot be fulfilled: the object has been modified; "
    "please apply your changes to the latest version and try again",
}


def test_conflicts_are_retried(k8s, player, kube, kube_namespace):
    import re

    jobs_path = re.compile(rf"/apis/batch/v1/namespaces/{kube_namespace}/jobs/[^/]+")
    secrets_path = f"/api/v1/namespaces/{kube_namespace}/secrets"
    kube.on_emulator(lambda e: e["patch", jobs_path][:2] << 409 << CONFLICT)
    kube.on_emulator(lambda e: e["post", secrets_path][:1] << 409 << CONFLICT)
    service = k8s()
    record = service.submit(spec_of(workers=1), code('print("resumed at last")\n6 * 7'))
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", 42)
    patches = kube.on_emulator(lambda e: len(list(e["patch", jobs_path])))
    posts = kube.on_emulator(lambda e: len(list(e["post", secrets_path])))
    assert (patches, posts) == (3, 2)  # two conflicts, then the resume; one, then the Secret
    rereads = kube.on_emulator(lambda e: len(list(e["get", jobs_path])))
    assert rereads >= 2  # the job object read again before each retry
    assert objects_of(kube, kube_namespace, record.id) == {}


# -- waiting for resources -------------------------------------------------------------------------------


def test_an_unschedulable_pod_is_a_readable_reason(k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=2, gpus_per_worker=1), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    wait_state(
        service,
        record.id,
        lambda r: r.reason == "waiting for the Job controller to create the pods",
        message="waiting for pods",
    )
    pods = player.create_pods(job)
    player.schedule(pods[0])
    kube.set_pod_unschedulable(
        kube_namespace, pods[1], "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    record_ = wait_state(
        service, record.id, lambda r: r.reason and "Insufficient" in r.reason, message="the reason"
    )
    assert record_.state == "queued"
    assert record_.reason == (
        "waiting for resources: rank 1 of 2 cannot be scheduled yet "
        "(0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"
    )
    assert [r.state for r in record_.ranks] == ["starting", "pending"]

    player.schedule(pods[1])
    kube.set_container_waiting(
        kube_namespace, pods[0], "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'
    )
    record_ = wait_state(
        service,
        record.id,
        lambda r: r.reason and "ImagePullBackOff" in r.reason,
        message="the image reason",
    )
    assert record_.state == "starting"
    assert (
        record_.reason == f'rank 0 cannot start: ImagePullBackOff: Back-off pulling image "{IMAGE}"'
    )
    final = service.cancel(record.id)
    assert final.state == "cancelled"
    assert objects_of(kube, kube_namespace, record.id) == {}


# -- restarts, timeout, a lost supervisor -------------------------------------------------------------

RESTARTING_CELL = """
import os
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("attempt", attempt, flush=True)
if attempt == 0 and os.environ["RANK"] == "0":
    raise RuntimeError("flaky first attempt")
attempt
"""


def test_max_restarts_recreates_the_job_and_the_second_attempt_succeeds(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    record = service.submit(spec_of(workers=2, max_restarts=1), code(RESTARTING_CELL))
    first = player.resumed(record.id)
    player.play(record.id, finish_job=False)

    # The first attempt failed; its objects are deleted and the job object made again.
    def recreated():
        job = player.job_object(record.id)
        return job if job["metadata"]["uid"] != first["metadata"]["uid"] else None

    second = wait_for(recreated, timeout=30, message="the second attempt")
    assert second["metadata"]["annotations"]["mlcluster.io/attempt"] == "1"
    assert service.store.get_job(record.id).restarts == 1
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert (final.restarts, final.error, final.failed_rank) == (1, None, None)
    assert service.result(record.id) == ("value", 1)
    assert service.error_report(record.id) is None
    lines, _ = service.logs(record.id, 0)
    texts = [item["line"] for item in lines]
    assert texts.index("attempt 0") < texts.index("attempt 1")
    assert (
        "rank 0 failed: RuntimeError: flaky first attempt; restarting all ranks (restart 1 of 1)"
        in "".join(texts)
    )
    assert objects_of(kube, kube_namespace, record.id) == {}


def test_timeout_stops_the_job(k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=1, timeout="2s"), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    assert job["spec"]["activeDeadlineSeconds"] == 2  # Kubernetes enforces it too
    (pod,) = player.create_pods(job).values()
    player.schedule(pod)
    player.run_rank(pod)
    started = time.monotonic()
    final = service.wait(record.id, timeout=30)
    player.kill_deleted()
    # (then where the rank was, or why it could not be read: issue 33)
    assert final.state == "failed" and final.error.startswith("timed out after 2s"), final.error
    assert 1.5 < time.monotonic() - started < 10
    assert objects_of(kube, kube_namespace, record.id) == {}


GATED_CELL = """
import os, time
from jupyterlab_mlcluster import log
log(loss=1.0)
print("before", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
log(loss=0.5)
print("after", flush=True)
"adopted"
"""  # waits for a file "go" in its working directory


def test_a_new_supervisor_adopts_the_job_and_resumes_its_logs(k8s, player, kube, kube_namespace):
    import signal

    service = k8s()
    record = service.submit(spec_of(workers=1), code(GATED_CELL))
    job = player.resumed(record.id)
    (pod,) = player.create_pods(job).values()
    player.schedule(pod)
    run = player.run_rank(pod)
    wait_for(lambda: log_text(service, record.id) == ["0:before"], message="the first line stored")
    wait_for(lambda: loss_steps(service, record.id) == [0], message="the first point stored")
    first = record_of(service, record.id).supervisor
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: process_gone(first["pid"]), message="the supervisor gone")
    service.reap(force=True)  # any reader notices; the job lives on in the cluster: respawn
    wait_for(
        lambda: (
            (record_of(service, record.id).supervisor or {}).get("pid") not in (None, first["pid"])
        ),
        message="a new supervisor",
    )
    wait_for(
        lambda: any(
            "supervisor restarted" in item["line"] for item in service.logs(record.id, 0)[0]
        ),
        message="the adoption",
    )
    (player.workdir / "go").touch()
    player.end_rank(run)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert service.result(record.id) == ("value", "adopted")
    # Adopted, not re-created; the log read again from its start, stored lines skipped.
    creates = kube.on_emulator(
        lambda e: len(list(e["post", f"/apis/batch/v1/namespaces/{kube_namespace}/jobs"]))
    )
    assert creates == 1
    assert log_text(service, record.id) == ["0:before", "0:after"]
    assert loss_steps(service, record.id) == [0, 1]  # the first point read again, kept once
    assert objects_of(kube, kube_namespace, record.id) == {}


def loss_steps(service: JobService, job_id: str) -> list:
    found = read_series(service.store.job_dir(job_id), ["loss"])["series"]
    return found[0]["steps"] if found else []


# -- Kueue --------------------------------------------------------------------------------------------


def test_kueue_admits_the_suspended_job(k8s, player, kube, kube_namespace):
    service = k8s(kubernetes_gang="kueue")
    with pytest.raises(SpecError, match="Kueue needs a queue"):
        service.submit(spec_of(workers=1), code("1"))
    record = service.submit(spec_of(workers=1, queue="team-a"), code(GATED_CELL))
    job = player.job_object(record.id)
    name = job["metadata"]["name"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    rec = wait_state(
        service, record.id, lambda r: r.reason and "Kueue" in r.reason, message="the Kueue reason"
    )
    assert rec.state == "queued"
    assert rec.reason == "waiting for Kueue to admit the job (queue team-a)"
    time.sleep(0.5)
    assert player.suspended(player.refresh(job))  # mlcluster leaves the resume to Kueue

    # Kueue admits it; it runs; Kueue preempts it (suspends; the Job controller deletes the pods).
    kube.patch("batch/v1", "Job", name, {"spec": {"suspend": False}}, kube_namespace)
    (pod,) = player.create_pods(player.resumed(record.id)).values()
    player.schedule(pod)
    player.run_rank(pod)
    wait_state(service, record.id, lambda r: r.state == "running", message="running")
    kube.patch("batch/v1", "Job", name, {"spec": {"suspend": True}}, kube_namespace)
    kube.delete("v1", "Pod", pod, kube_namespace)
    player.kill_deleted()
    # State and reason may reach the store in two writes: wait for the reason as well.
    rec = wait_state(
        service,
        record.id,
        lambda r: r.state == "queued" and r.reason and r.reason.startswith("preempted"),
        message="queued again",
    )
    assert rec.reason == (
        "preempted by Kueue (suspended again): waiting for Kueue to admit the job (queue team-a)"
    )

    # Admitted again: new pods run it to the end.
    (player.workdir / "go").touch()
    kube.patch("batch/v1", "Job", name, {"spec": {"suspend": False}}, kube_namespace)
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded" and service.result(record.id) == ("value", "adopted")


# -- refused at submit: nothing stored -------------------------------------------------------------


def test_no_reachable_cluster_is_a_clear_error_and_nothing_is_stored(k8s, tmp_path, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from tests.kube.fixtures import write_kubeconfig

    monkeypatch.setenv(
        "KUBECONFIG", str(write_kubeconfig(tmp_path / "dead.yaml", f"http://127.0.0.1:{port}"))
    )
    service = k8s()
    with pytest.raises(
        SpecError,
        match=rf"^the Kubernetes API server at http://127.0.0.1:{port} cannot be reached: "
        r"\[Errno 111\] Connection refused$",
    ):
        service.submit(spec_of(workers=1), code("1"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(SpecError, match="no Kubernetes cluster is configured"):
        k8s().submit(spec_of(workers=1), code("1"))
    assert service.store.list_jobs() == ([], 0)


def test_submit_refuses_what_cannot_run(k8s, kube_namespace):
    service = k8s(kubernetes_image="")
    with pytest.raises(SpecError, match="no container image for the ranks: pass --image"):
        service.submit(spec_of(workers=1), code("1"))
    service = k8s()
    with pytest.raises(SpecError, match=r"--priority 5: no PriorityClass is configured"):
        service.submit(spec_of(workers=1, priority=5), code("1"))
    with pytest.raises(SpecError, match="does not serve PodGroup"):
        k8s(kubernetes_gang="volcano").submit(spec_of(workers=1), code("1"))
    with pytest.raises(SpecError, match="does not serve PyTorchJob"):
        k8s(kubernetes_engine="pytorchjob").submit(spec_of(workers=1), code("1"))
    with pytest.raises(SpecError, match="workers must be at most 256"):
        service.submit(spec_of(workers=1000), code("1"))
    with pytest.raises(SpecError, match="env TORCHELASTIC_MAX_RESTARTS is set by mlcluster"):
        service.submit(spec_of(workers=1, env={"TORCHELASTIC_MAX_RESTARTS": "3"}), code("1"))
    with pytest.raises(SpecError, match="env MLCLUSTER_PAYLOAD: MLCLUSTER_"):
        service.submit(spec_of(workers=1, env={"MLCLUSTER_PAYLOAD": "x"}), code("1"))
    assert service.store.list_jobs() == ([], 0)


def test_the_notebook_pods_own_image_is_the_default(k8s, player, kube, kube_namespace, monkeypatch):
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "alice-notebook-0"},
            "spec": {
                "containers": [
                    {"name": "notebook", "image": "quay.io/alice/lab:7"},
                    {"name": "istio-proxy", "image": "istio/proxyv2:1.24"},
                ]
            },
        },
        kube_namespace,
    )
    monkeypatch.setenv("POD_NAME", "alice-notebook-0")  # the downward API
    service = k8s(kubernetes_image="", kubernetes_priority_classes={"10": "training-high"})
    record = service.submit(spec_of(workers=1, priority=10), code("1"))
    job = player.job_object(record.id)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["image"] == "quay.io/alice/lab:7"
    assert pod_spec["priorityClassName"] == "training-high"
    # --image wins over the notebook's
    other = service.submit(spec_of(workers=1, image="python:3.12"), code("1"))
    assert (
        player.job_object(other.id)["spec"]["template"]["spec"]["containers"][0]["image"]
        == "python:3.12"
    )
    for job_id in (record.id, other.id):
        assert service.cancel(job_id).state == "cancelled"


# -- the cluster's capacity -------------------------------------------------------------------------


@pytest.fixture
def nodes(kube: Kube):
    made = []

    def node(name: str, cpu: str, memory: str, gpus: int = 0) -> None:
        allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        kube.patch(
            "v1",
            "Node",
            name,
            {"status": {"allocatable": allocatable, "capacity": allocatable}},
            subresource="status",
        )
        made.append(name)

    yield node
    for name in made:
        kube.delete("v1", "Node", name)


def test_cluster_capacity_from_nodes_and_pod_requests(k8s, nodes, kube, kube_namespace):
    nodes("cpu-1", "8", "32Gi")
    nodes("gpu-1", "31500m", "120Gi", gpus=4)
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "busy"},
            "spec": {
                "nodeName": "gpu-1",
                "containers": [
                    {
                        "name": "c",
                        "image": "i",
                        "resources": {
                            "requests": {"cpu": "2500m", "memory": "8Gi"},
                            "limits": {"nvidia.com/gpu": "3"},
                        },
                    }
                ],
            },
        },
        kube_namespace,
    )
    service = k8s()
    backend = service.backend("kubernetes")
    assert backend.cluster() == {
        "gpus": {"total": 4, "free": 1},
        "cpus": {"total": 39.5, "free": 37.0},
        "memory": {"total": 152 * 2**30, "free": 144 * 2**30},
    }
    assert backend.capacity() == {
        "cpus": 39.5,
        "gpus": ["gpu-1/0", "gpu-1/1", "gpu-1/2", "gpu-1/3"],
        "memory": 152 * 2**30,
    }
    with pytest.raises(
        SpecError, match="each pod needs 8 GPU.s., but the largest node of this cluster has 4"
    ):
        service.submit(spec_of(workers=2, gpus_per_worker=8), code("1"))


# -- metrics and progress ----------------------------------------------------------------------------

WORKING_CELL = """
import time
from jupyterlab_mlcluster import log, progress
data = bytearray(64 * 2**20)  # resident memory the reports must show
for step in range(1, 4):
    progress(step, 3, desc="epoch")
    log(loss=1.0 / step)
    time.sleep(1.0)
len(data)
"""


def test_the_runtime_reports_metrics_and_progress_through_the_pod_log(
    k8s, player, kube, kube_namespace
):
    service = k8s()
    record = service.submit(spec_of(workers=1), code(WORKING_CELL))
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    assert final.ranks[0].progress == {"step": 3, "total": 3, "desc": "epoch"}
    # mlc.log's points came through the pod's log too (issue 35), and moved no progress bar.
    (loss,) = read_series(service.store.job_dir(record.id), ["loss"])["series"]
    assert loss["steps"] == [0, 1, 2] and loss["values"] == [1.0, 0.5, 1 / 3]
    (series,) = service.store.metrics_history(record.id).values()
    assert series and all(s["memory_bytes"] > 64 * 2**20 for s in series)
    assert all(s["gpu_util"] is None for s in series)  # no GPU here
    assert (
        log_text(service, record.id) == []
    )  # reports are not log lines, nor are their blank lines


def test_a_pods_idle_gpus_flag_the_job(k8s, player, kube, kube_namespace, tmp_path):
    """A rank in a pod samples its own GPUs (the pod's CUDA_VISIBLE_DEVICES; utilisation from
    the test NVML file) and reports them in its log; the supervisor flags the job once they
    have idled for idle_gpu_after, and clears the flag when one works."""
    import json

    from jupyterlab_mlcluster.runtime import nvml

    gpus, release = tmp_path / "gpus.json", tmp_path / "release"
    gpus.write_text(json.dumps({"0": 0}))
    service = k8s(idle_gpu_after=1.0, metrics_interval=0.2)
    hold = f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)"
    record = service.submit(spec_of(workers=1, gpus_per_worker=1), code(hold))
    job = player.resumed(record.id)
    (pod,) = player.create_pods(job).values()
    player.schedule(pod)
    run = player.run_rank(pod, extra_env={nvml.TEST_FILE_ENV: str(gpus)})
    flagged = wait_state(service, record.id, lambda r: r.gpu_idle_since is not None, 60, "flag")
    assert flagged.state == "running" and flagged.ranks[0].metrics["gpu_util"] == 0
    assert flagged.to_json()["gpu_idle_since"] is not None
    gpus.write_text(json.dumps({"0": 60}))
    busy = wait_state(service, record.id, lambda r: r.gpu_idle_since is None, 60, "cleared")
    assert busy.state == "running"
    release.touch()
    assert player.end_rank(run) == 0
    player.finish_job(job, succeeded=True)
    assert service.wait(record.id, timeout=60).state == "succeeded"


def test_the_metrics_api_is_used_when_served(metrics_api, k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=1), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    (pod,) = player.create_pods(job).values()
    player.schedule(pod)
    player.run_rank(pod)
    kube.create(
        {
            "apiVersion": "metrics.k8s.io/v1beta1",
            "kind": "PodMetrics",
            "metadata": {"name": pod, "labels": {"mlcluster.io/job-id": record.id}},
            "timestamp": "2026-01-01T00:00:00Z",
            "window": "15s",
            "containers": [{"name": "worker", "usage": {"cpu": "250m", "memory": "64Mi"}}],
        },
        kube_namespace,
    )
    rec = wait_state(
        service,
        record.id,
        lambda r: r.ranks[0].metrics.get("cpu_percent") == 25.0,
        timeout=20,
        message="metrics from the metrics API",
    )
    assert rec.ranks[0].metrics["memory_bytes"] == 64 * 2**20
    assert service.cancel(record.id).state == "cancelled"


# -- the CLI, and a cancel while the supervisor is gone ----------------------------------------------


def test_mlcluster_run_ships_the_script_to_the_cluster(k8s, player, kube, kube_namespace, tmp_path):
    from helpers import run_cli

    script = tmp_path / "train.py"
    script.write_text('import sys\nprint("args", sys.argv[1:])\n')
    service = k8s()
    done = run_cli(
        "run", "--backend", "kubernetes", "--workers", "1", "--no-wait", str(script), "--lr", "0.1"
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    player.play(job_id)
    final = service.wait(job_id, timeout=60)
    assert final.state == "succeeded", final.error
    assert log_text(service, job_id) == ["0:args ['--lr', '0.1']"]


def test_cancel_after_the_supervisor_died_still_deletes_the_job(k8s, player, kube, kube_namespace):
    import signal

    service = k8s()
    record = service.submit(spec_of(workers=1), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    supervisor = record_of(service, record.id).supervisor
    os.kill(supervisor["pid"], signal.SIGKILL)
    final = service.cancel(record.id)  # the reaper's cleanup_orphans deletes the job object
    assert final.state == "cancelled"
    wait_for(lambda: objects_of(kube, kube_namespace, record.id) == {}, message="the objects gone")
    assert kube.find("batch/v1", "Job", job["metadata"]["name"], kube_namespace) is None
